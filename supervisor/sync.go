package supervisor

import (
	"errors"
	"strings"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// syncWorkspaceSession is sync_workspace_session (issue #19): the session
// moves onto the current head, keeping its own changes.
func (s *Supervisor) syncWorkspaceSession(c *call) (any, error) {
	id := c.args.String("workspace_session_id")
	ss, resolutions, err := explicitSession(c, id)
	if err != nil {
		return nil, err
	}
	dry := c.args.Bool("dry_run")
	ss.Gate.Lock()
	defer ss.Gate.Unlock()
	if e := ss.Admit(); e != nil {
		return nil, e
	}
	pub := workspace.PublishOptions(s.cfg, s.protected)
	opt := layers.SyncOptions{DefaultStrategy: layers.Strategy(c.args.String("default_strategy")), Resolutions: resolutions,
		Merge: pub.Merge, MaxPlanPaths: pub.MaxPlanPaths, ExpansionLimit: pub.ExpansionLimit, DryRun: dry,
		Git: layers.GitOptions{RefMode: layers.GitRefMode(c.args.String("git_refs"))}}
	plan, out, err := s.publisher.Sync(c.ctx, c.sb, ss, opt)
	if err != nil {
		return nil, syncError(id, "sync", err)
	}
	if !dry && !out.NoOp {
		s.bump(c.ctx, c.sb)
	}
	res := map[string]any{"workspace_session_id": id, "dry_run": dry, "sync": workspace.SyncObject(plan, out, dry),
		"active_command_session_ids": ss.Running()}
	if dry {
		res["would_commit"], res["plan"] = plan.WouldCommit && plan.Rejection == nil, plan
	}
	return res, nil
}

// syncError maps a failed sync (or the sync step of publish keep:true) to
// the contract's envelope: a rejection as publish's, with every path
// listed; a process pinning the kernel overlay names its commands.
func syncError(id, stage string, err error) error {
	var re *layers.ResolutionError
	var rej *layers.Rejection
	var pin *nsholder.PinnedError
	var deep *workspace.ChainDepthError
	switch {
	case errors.As(err, &deep):
		return catalog.Wrap(catalog.OperationFailed, err, "workspace session sync refused (stage %s): %v", stage, deep).
			With("workspace_session_id", id).With("stage", stage).With("session_retained", true).
			With("reason", "chain_too_deep").With("layer_count", deep.Layers).With("max_chain_depth", deep.Max)
	case errors.As(err, &re):
		return catalog.Errorf(catalog.InvalidRequest, "%s", re.Error()).With("path", re.Path)
	case errors.As(err, &rej):
		return catalog.Errorf(catalog.OperationFailed, "workspace session sync was rejected").
			With("workspace_session_id", id).With("stage", stage).With("session_retained", true).
			With("publish_rejection", workspace.RejectionBody(rej))
	case errors.As(err, &pin):
		cmds, procs := []string{}, make([]map[string]any, 0, len(pin.Pins))
		seen := map[string]bool{}
		for _, p := range pin.Pins {
			if p.Owner != "" && !seen[p.Owner] {
				seen[p.Owner] = true
				cmds = append(cmds, p.Owner)
			}
			procs = append(procs, map[string]any{"pid": p.Pid, "command_session_id": nullable(p.Owner), "kind": p.Kind, "path": p.Path})
		}
		return catalog.Errorf(catalog.OperationFailed, "workspace session sync refused: /workspace is in use by command(s) %s (working directory or open files in it; the kernel overlay cannot move them)",
			strings.Join(cmds, ", ")).
			With("workspace_session_id", id).With("stage", stage).With("session_retained", true).
			With("reason", workspace.PinReason(pin.Pins)).With("pinned_command_session_ids", cmds).With("pins", procs)
	case errors.Is(err, nsholder.ErrFreezeTimeout):
		return catalog.Errorf(catalog.OperationFailed, "workspace session sync failed: the session's processes did not stop in time: %v", err).
			With("workspace_session_id", id).With("stage", stage).With("session_retained", true).With("reason", "quiesce_failed:freeze_timeout")
	case errors.Is(err, nsholder.ErrSwapUnsupported):
		return catalog.Errorf(catalog.OperationFailed, "workspace session sync is not supported here: %v", err).
			With("workspace_session_id", id).With("stage", stage).With("session_retained", true).With("reason", "unsupported:lower_swap")
	}
	return catalog.Errorf(catalog.OperationFailed, "workspace session sync failed: %v", err).
		With("workspace_session_id", id).With("stage", stage).With("session_retained", true)
}
