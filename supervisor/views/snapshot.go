package views

// The snapshot view (§10.3): per sandbox, its record, resources, sessions
// with their running commands, and its layer stack's summary.

import (
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// Command is one running command of a sandbox.
type Command struct {
	SessionID string
	ID        string // the command session ID
	Cmd       string
}

// Sandbox is what snapshot shows of one sandbox, copied under its locks.
type Sandbox struct {
	ID         string
	State      string // lifecycle state
	Failed     bool   // State is the failed state
	Error      string // why it failed
	RuntimeDir string
	Stack      *layers.Stack // nil when it has none; only read
	Sessions   []Session
	Running    []Command // its running commands only
}

// SnapshotSource is what snapshot asks of one sandbox. No method may change
// the sandbox; a panic in any of them yields an unavailable node.
type SnapshotSource interface {
	Sandbox() Sandbox
	// Resources is the {latest, history} block of the sandbox and of each
	// session by ID.
	Resources() (sandbox map[string]any, bySession map[string]map[string]any, err error)
	// EventStore is the sandbox event store's counters.
	EventStore() any
	// NoSamples says why a resources block has no samples.
	NoSamples() string
}

// Snapshot is the fleet snapshot: one node per source, in the given order.
func Snapshot(srcs []SnapshotSource, nodes, depth int) map[string]any {
	out := []map[string]any{}
	for _, src := range srcs {
		out = append(out, SafeSnapshotNode(src, nodes, depth))
	}
	return map[string]any{"sandboxes": out}
}

// SafeSnapshotNode builds one node; a failure yields an unavailable node.
func SafeSnapshotNode(src SnapshotSource, nodes, depth int) (node map[string]any) {
	defer func() {
		if r := recover(); r != nil {
			sb := src.Sandbox()
			msg := obs.BoundedError(fmt.Sprintf("building the snapshot failed: %v", r))
			node = map[string]any{"sandbox_id": sb.ID, "lifecycle_state": sb.State, "availability": "unavailable",
				"sampled_at_unix_ms": time.Now().UnixMilli(), "errors": []string{msg}, "error": msg}
		}
	}()
	return SnapshotNode(src, nodes, depth)
}

// sortedSessions is a copy of ss ordered by ID.
func sortedSessions(ss []Session) []Session {
	out := append([]Session(nil), ss...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// SnapshotNode is the snapshot of one sandbox; nodes and depth bound every
// layer's size walk.
func SnapshotNode(src SnapshotSource, nodes, depth int) map[string]any {
	sb := src.Sandbox()
	errs := []string{}
	availability := "available"
	sbRes, wsRes, rerr := src.Resources()
	switch {
	case rerr != nil:
		availability, errs = "partial", append(errs, obs.BoundedError(rerr.Error()))
		sbRes = map[string]any{"latest": nil, "history": []any{}}
	case sbRes["latest"] == nil:
		// No samples: the sandbox has no live session, or none was taken yet.
		availability, errs = "partial", append(errs, src.NoSamples())
	}
	node := map[string]any{
		"sandbox_id": sb.ID, "lifecycle_state": sb.State, "sampled_at_unix_ms": time.Now().UnixMilli(),
		"daemon": map[string]any{"daemon_pid": os.Getpid(), "runtime_dir": sb.RuntimeDir,
			"event_store": src.EventStore()}, // the sandbox event store's SinkStats
		"resources": sbRes,
	}
	if sb.Failed && sb.Error != "" {
		errs = append(errs, obs.BoundedError("sandbox failed: "+sb.Error))
	}
	// Running commands by session.
	running := map[string][]map[string]any{}
	for _, cmd := range sb.Running {
		running[cmd.SessionID] = append(running[cmd.SessionID], map[string]any{
			"namespace_execution_id": cmd.ID, "operation": "exec_command",
			"lifecycle_state": "running", "command": cmd.Cmd})
	}
	workspaces := []map[string]any{}
	for _, r := range sortedSessions(sb.Sessions) {
		pid := r.HolderPid
		var holder any
		fds := 0
		if pid > 0 {
			holder = pid
			fds = 1 // the control channel
		}
		execs := running[r.ID]
		if execs == nil {
			execs = []map[string]any{}
		}
		sort.Slice(execs, func(i, j int) bool {
			return execs[i]["namespace_execution_id"].(string) < execs[j]["namespace_execution_id"].(string)
		})
		fds += len(execs) // one PTY master per running command
		res := wsRes[r.ID]
		if res == nil {
			res = map[string]any{"latest": nil, "history": []any{}}
		}
		workspaces = append(workspaces, map[string]any{
			"workspace_id": r.ID, "agent": r.Agent, "lifecycle_state": "active",
			"finalization_state": r.State, "network_profile": r.NetworkProfile, "finalize_policy": r.FinalizePolicy,
			"overlay_driver": r.OverlayDriver, "holder_pid": holder,
			"layers":                      map[string]any{"base_root_hash": layers.ManifestRootHash(r.Lease), "layer_count": len(r.Lease)},
			"namespace_fd_count":          fds,
			"resources":                   res,
			"active_namespace_executions": execs,
		})
	}
	node["workspaces"] = workspaces
	if sb.Stack == nil {
		errs = append(errs, "no layer stack")
		node["stack"] = nil
	} else {
		sum, err := SummarizeStack(sb.Stack, nodes, depth)
		if err != nil {
			errs = append(errs, obs.BoundedError("layer stack: "+err.Error()))
			node["stack"] = nil
		} else {
			node["stack"] = map[string]any{"layer_count": len(sum.Layers), "layers_bytes": sum.TotalBytes,
				"layers_allocated_bytes": sum.TotalAllocated, "storage_allocated_bytes": sum.StorageAllocated,
				"staging_entry_count": sum.StagingEntries, "active_leases": len(sum.Leases), "estimated": sum.Estimated}
		}
	}
	if sb.Failed || node["stack"] == nil {
		availability = "unavailable"
	}
	node["availability"] = availability
	node["errors"] = errs
	return node
}
