package supervisor

// Thin handlers of the read-only views: they check arguments, copy the
// plain inputs out of the sandboxes (views_adapt.go) and call package views.

import (
	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/doctor"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/views"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

func (s *Supervisor) health(c *call) (any, error) {
	all := s.sandboxes.All()
	nSandboxes, failed := len(all), false
	for _, sb := range all {
		sb.Mu.Lock()
		failed = failed || sb.Rec.State == stateFailed
		sb.Mu.Unlock()
	}
	cg := views.Cgroup{Reason: s.cgroups.ReasonOr("")}
	if s.cgroups != nil && s.cgroups.Delegated {
		cg = views.Cgroup{Delegated: true, Path: s.cgroups.Root}
	}
	return views.Health(views.HealthInput{
		Version: s.version, Started: s.started, Kernel: doctor.KernelRelease(),
		UserNS: s.probes.UserNS, KernelOverlay: s.probes.KernelOverlay, FuseOverlay: s.probes.FuseOverlay,
		FuseDevice: s.probes.FuseDevice, Docker: views.Availability{Available: s.docker.Available, Reason: s.docker.Reason},
		StoreErr: s.store.Ping(c.ctx), DataDir: s.dirs.Data,
		Sandboxes: nSandboxes, Sessions: workspace.CountSessions(s.allSandboxes()), RunningCommands: workspace.CountRunning(s.allSandboxes()), AnyFailed: failed,
		Cgroup: cg, Network: s.netHelperStatus(), EventStore: obsStats(s.obs, nil),
	}), nil
}

func (s *Supervisor) daemon(c *call) (any, error) {
	scope := "supervisor"
	sbs := s.sandboxesSorted()
	if c.sb != nil {
		scope, sbs = "sandbox", []*sandbox{c.sb}
	}
	return views.Daemon(views.DaemonInput{Scope: scope, Started: s.started, Holders: holderViews(sbs),
		Usage: views.RuntimeUsage{
			ActiveRequests: s.active.Load(),
			ActiveCommands: workspace.CountRunning(s.allSandboxes()),
			LiveSessions:   workspace.CountSessions(s.allSandboxes()),
			AdmissionInUse: len(s.conns),
		}}), nil
}

func (s *Supervisor) topology(c *call) (any, error) {
	return views.Topology("/proc", sessionViews(sessionsSorted(c.sb))), nil
}

func (s *Supervisor) walkBounds() (nodes, depth int) {
	nodes, depth = s.cfg.Observability.Sampling.MaxWalkNodes, s.cfg.Observability.Sampling.MaxWalkDepth
	if nodes < 1 {
		nodes = 1024
	}
	if depth < 1 {
		depth = 64
	}
	return nodes, depth
}

func (s *Supervisor) layerstack(c *call) (any, error) {
	sb := c.sb
	if c.args.Has("workspace_id") && c.args.Has("layer_id") {
		return nil, catalog.Errorf(catalog.InvalidRequest, "workspace_id and layer_id are mutually exclusive")
	}
	var window int64 = -1
	if c.args.Has("window_ms") {
		w, err := s.windowMs(c)
		if err != nil {
			return nil, err
		}
		window = w
	}
	limit := uint64(s.cfg.Observability.Views.LayerDeltaDefaultLimit)
	if v, explicit := c.req.Args["limit"]; explicit && v != nil {
		limit = c.args.Uint("limit")
		if maxL := uint64(s.cfg.Observability.Views.LayerDeltaMaxLimit); limit > maxL {
			return nil, catalog.RangeError("limit", 1, maxL)
		}
	}
	if sb.Stack == nil {
		return nil, catalog.Errorf(catalog.OperationFailed, "sandbox %s has no layer stack", sb.Rec.ID).With("sandbox_id", sb.Rec.ID)
	}
	nodes, depth := s.walkBounds()
	switch {
	case c.args.Has("layer_id"):
		out, err := views.LayerstackLayer(sb.Stack, c.args.String("layer_id"), int(limit), depth)
		if err != nil {
			return nil, err
		}
		return out, nil
	case c.args.Has("workspace_id"):
		id := c.args.String("workspace_id")
		ss, e := workspace.LookupSession(sb, id)
		if e != nil {
			return nil, e
		}
		return views.LayerstackWorkspace(sb.Stack, id, ss.Record().Lease.Layers, ss.Upper(), nodes, depth), nil
	}
	out, err := views.Layerstack(sb.Stack, nodes, depth)
	if err != nil {
		return nil, err
	}
	running, pending := sb.SquashState()
	out["squash"] = map[string]any{"running": running, "autosquash_pending": pending}
	if window >= 0 {
		trend, err := stackTrend(resourceView(s.cfg, s.obs), sb, window)
		if err != nil {
			return nil, err
		}
		out["trend"] = trend
	}
	return out, nil
}

func (s *Supervisor) snapshot(c *call) (any, error) {
	nodes, depth := s.walkBounds()
	if c.sb != nil {
		return views.SnapshotNode(snapshotSource{s, c.sb}, nodes, depth), nil
	}
	var srcs []views.SnapshotSource
	for _, sb := range s.sandboxesSorted() {
		srcs = append(srcs, snapshotSource{s, sb})
	}
	return views.Snapshot(srcs, nodes, depth), nil
}
