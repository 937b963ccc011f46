package supervisor

import (
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/views"
)

// recoverySummary is what one start-up recovery (§4.5) did. It is reported
// as the system event supervisor.recovered — the contract names the
// per-item events (workspace_session.restored, command.interrupted, the boot
// sweep's layerstack.squash) but no summary; one event lets a user (and the
// crash test) see at a glance what a restart found and repaired.
type recoverySummary struct {
	RemovedSandboxes      []string // creating rolled back, stopping/stopped completed
	FailedSandboxes       []string // manifest missing or unreadable
	RestoredSessions      []string // explicit sessions with a new holder
	RestoreFailedSessions []string
	KeptFailedSessions    []string // restore_failed/finalize_failed before the restart
	FinalizedSessions     []string // implicit sessions finalized
	InterruptedCommands   int
	RemovedSessionDirs    int // session directories without a record
	SweptLayers           []string
	SweptStagingEntries   int
}

func (r *recoverySummary) removeSandbox(id, state string) {
	r.RemovedSandboxes = append(r.RemovedSandboxes, id+" ("+state+")")
}

func (r *recoverySummary) sweep(res layers.SweepResult) {
	r.SweptLayers = append(r.SweptLayers, res.RemovedLayerIDs...)
	r.SweptStagingEntries += res.RemovedStagingEntries
}

// recovered records the summary event and logs it.
func (s *Supervisor) recovered(r *recoverySummary) {
	eventIn(s.obs, nil, s.obs.SyntheticTrace("recovery"), "supervisor.recovered", map[string]any{
		"removed_sandboxes":       views.NonNil(r.RemovedSandboxes),
		"failed_sandboxes":        views.NonNil(r.FailedSandboxes),
		"restored_sessions":       views.NonNil(r.RestoredSessions),
		"restore_failed_sessions": views.NonNil(r.RestoreFailedSessions),
		"kept_failed_sessions":    views.NonNil(r.KeptFailedSessions),
		"finalized_sessions":      views.NonNil(r.FinalizedSessions),
		"interrupted_commands":    r.InterruptedCommands,
		"removed_session_dirs":    r.RemovedSessionDirs,
		"swept_layers":            views.NonNil(r.SweptLayers),
		"swept_staging_entries":   r.SweptStagingEntries,
	})
}

// bootSweepEvent reports a sandbox's start-up sweep (§8.7, §10.2) when it
// removed something or was skipped.
func (s *Supervisor) bootSweepEvent(sb *sandbox, res layers.SweepResult) {
	if len(res.RemovedLayerIDs) == 0 && res.RemovedStagingEntries == 0 && res.SkippedReason == "" {
		return
	}
	var skipped any
	if res.SkippedReason != "" {
		skipped = res.SkippedReason
	}
	eventIn(s.obs, sb, s.obs.SyntheticTrace("recovery"), "layerstack.squash", map[string]any{
		"boot_sweep": true, "removed_layer_ids": views.NonNil(res.RemovedLayerIDs),
		"removed_staging_entries": res.RemovedStagingEntries, "skipped_reason": skipped,
	})
}
