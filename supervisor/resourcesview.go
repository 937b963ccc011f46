package supervisor

// The resource sampler's wiring and the resources/cgroup handlers (§10.2,
// §10.3): which sandboxes and sessions are sampled, and the arguments and
// envelopes of the views. Measuring, storing and reading samples is
// package resources.

import (
	"context"
	"fmt"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/resources"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/views"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// cgroups is the delegated cgroup subtree (§10.2); nil-safe.
type cgroups = resources.Cgroups

// setupCgroups detects and prepares the delegated subtree (resources.SetupCgroups).
func setupCgroups(mount, selfFile string) *cgroups { return resources.SetupCgroups(mount, selfFile) }

// runSampler samples until ctx ends.
func (s *Supervisor) runSampler(ctx context.Context) {
	if !s.obs.ResourcesEnabled() {
		return
	}
	resources.Run(ctx, time.Duration(s.cfg.Observability.ResourceStats.SampleIntervalMs)*time.Millisecond, s.sampleOnce)
}

// sampleOnce writes one round of samples of every ready sandbox with a
// live session.
func (s *Supervisor) sampleOnce(withStack bool) {
	var groups []resources.Group
	for _, sb := range s.sandboxesSorted() {
		// Hold the sandbox's gate like a request does, so destroy never
		// removes the directory while a sample is being written into it;
		// a sandbox being destroyed is skipped.
		if !sb.Gate.TryRLock() {
			continue
		}
		defer sb.Gate.RUnlock()
		sb.Mu.Lock()
		state := sb.Rec.State
		sb.Mu.Unlock()
		if state != stateReady {
			continue
		}
		g := resources.Group{ID: sb.Rec.ID, Store: s.obs.Resources(scopeOf(sb))}
		for _, ss := range sessionsSorted(sb) {
			g.Sessions = append(g.Sessions, &resources.Session{ID: ss.ID(), Pid: ss.HolderPid()})
		}
		if withStack && sb.Stack != nil {
			stack := sb.Stack
			g.Stack = func() (*resources.StackMetrics, error) {
				nodes, depth := s.walkBounds()
				sum, err := views.SummarizeStack(stack, nodes, depth)
				if err != nil {
					return nil, err
				}
				return &resources.StackMetrics{LayerCount: len(sum.Layers), LayersBytes: sum.TotalBytes,
					LayersAllocatedBytes: sum.TotalAllocated, StorageAllocatedBytes: sum.StorageAllocated,
					StagingEntryCount: sum.StagingEntries, ActiveLeases: len(sum.Leases)}, nil
			}
		}
		if len(g.Sessions) > 0 {
			groups = append(groups, g)
		}
	}
	resources.Sample(s.cgroups, "/proc", groups)
}

// resourceView reads the resource samples of reg.
func resourceView(cfg *config.Config, reg *obs.Registry) resources.View {
	return resources.View{Reg: reg, SampleIntervalMs: cfg.Observability.ResourceStats.SampleIntervalMs}
}

// windowMs validates window_ms against observability.views.resource_window_ms.
func (s *Supervisor) windowMs(c *call) (int64, error) {
	w := c.args.Uint("window_ms")
	if maxW := s.cfg.Observability.Views.ResourceWindowMs; w > uint64(maxW) {
		return 0, catalog.Errorf(catalog.InvalidRequest, "window_ms exceeds max (%d)", maxW).With("max", maxW)
	}
	return int64(w), nil
}

// storeError is a failed read of a resource store; %v until catalog.Error
// carries a cause (Errorf formats with Sprintf).
func storeError(err error) error {
	return catalog.Errorf(catalog.OperationFailed, "%v", err)
}

// resources is the resources operation (§10.3).
func (s *Supervisor) resources(c *call) (any, error) {
	window, err := s.windowMs(c)
	if err != nil {
		return nil, err
	}
	v := resourceView(s.cfg, s.obs)
	since := time.Now().UnixMilli() - window
	if c.sb != nil {
		series, err := v.Series(c.ctx, scopeOf(c.sb), resources.ScopeSandbox, since, obs.MaxRecords, 1)
		if err != nil {
			return nil, storeError(err)
		}
		availability, errs := "available", []string{}
		if len(series) == 0 {
			availability, errs = "partial", []string{v.NoSamples("sandbox", window)}
		}
		return map[string]any{"view": "resources", "scope": "sandbox", "sandbox_id": c.sb.Rec.ID, "source": "supervisor_disk",
			"availability": availability, "errors": errs, "series": series}, nil
	}
	fleet := map[string]any{}
	availability, errs := "available", []string{}
	for _, sb := range s.sandboxesSorted() {
		node := map[string]any{"availability": "available", "errors": []string{}, "current": nil}
		cur, err := v.Current(c.ctx, scopeOf(sb), since)
		switch {
		case err != nil:
			node["availability"], node["errors"] = "unavailable", []string{obs.BoundedError(storeError(err).Error())}
		case cur == nil:
			node["availability"], node["errors"] = "partial", []string{v.NoSamples("sandbox", window)}
		default:
			node["current"] = cur
		}
		if node["availability"] != "available" {
			availability = "partial"
			errs = append(errs, sb.Rec.ID+": "+node["errors"].([]string)[0])
		}
		fleet[sb.Rec.ID] = node
	}
	if len(errs) > 16 {
		errs = append(errs[:16], fmt.Sprintf("… and %d more", len(errs)-16))
	}
	return map[string]any{"view": "resources", "scope": "fleet", "availability": availability, "errors": errs, "sandboxes": fleet}, nil
}

// cgroupView is the cgroup operation (§10.3): the samples of the sandbox or
// of one live session, and the processes of that scope.
func (s *Supervisor) cgroupView(c *call) (any, error) {
	window, err := s.windowMs(c)
	if err != nil {
		return nil, err
	}
	scope := c.args.String("scope")
	sessions := sessionsSorted(c.sb)
	cgPath := s.cgroups.SandboxPath(c.sb.Rec.ID)
	if scope != resources.ScopeSandbox {
		ss, e := workspace.LookupSession(c.sb, scope)
		if e != nil {
			return nil, e
		}
		sessions = []*session{ss}
		cgPath = s.cgroups.SessionPath(scope)
	}
	v := resourceView(s.cfg, s.obs)
	// The topology (≤ 512 rows) takes up to about half of the response.
	series, err := v.Series(c.ctx, scopeOf(c.sb), scope, time.Now().UnixMilli()-window, obs.MaxRecords/2, 0.5)
	if err != nil {
		return nil, storeError(err)
	}
	availability, errs := "available", []string{}
	if len(series) == 0 {
		what := "session"
		if scope == resources.ScopeSandbox {
			what = "sandbox"
		}
		availability, errs = "partial", []string{v.NoSamples(what, window)}
	}
	out := map[string]any{"view": "cgroup", "scope": scope, "availability": availability, "errors": errs,
		"series": series, "topology": buildTopology("/proc", sessions), "cgroup_delegated": s.cgroups != nil && s.cgroups.Delegated}
	if cgPath != "" {
		out["cgroup_path"] = cgPath
	} else {
		out["cgroup_path"] = nil
	}
	return out, nil
}

// snapshotResources is snapshot's resources blocks: {latest, history} for
// the sandbox and each session, from the samples of the last minute.
func snapshotResources(v resources.View, sb *sandbox) (sandboxRes map[string]any, bySession map[string]map[string]any, err error) {
	sandboxRes, bySession, err = v.Snapshot(context.Background(), scopeOf(sb), len(sessionsSorted(sb)))
	if err != nil {
		return nil, nil, storeError(err)
	}
	return sandboxRes, bySession, nil
}

// stackTrend is layerstack's trend: the stack samples of the window.
func stackTrend(v resources.View, sb *sandbox, windowMs int64) ([]resources.Point, error) {
	series, err := v.Series(context.Background(), scopeOf(sb), resources.ScopeStack, time.Now().UnixMilli()-windowMs, obs.MaxRecords/2, 0.5)
	if err != nil {
		return nil, storeError(err)
	}
	return series, nil
}

// snapshotWindowMs is the window snapshot's resources come from.
const snapshotWindowMs = resources.SnapshotWindowMs
