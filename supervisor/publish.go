package supervisor

import (
	"errors"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

func (s *Supervisor) publishWorkspaceSession(c *call) (any, error) {
	id := c.args.String("workspace_session_id")
	ss, e := workspace.LookupSession(c.sb, id)
	if e != nil {
		return nil, e
	}
	if ss.Implicit() {
		return nil, workspace.NotFoundSession(id) // implicit sessions publish themselves (§5.1)
	}
	resolutions, err := workspace.ParseResolutions(c.args.Array("resolutions"))
	if err != nil {
		return nil, err
	}
	dry := c.args.Bool("dry_run")
	ss.Gate.Lock()
	defer ss.Gate.Unlock()
	if e := ss.Admit(); e != nil {
		return nil, e
	}
	running := ss.Running()
	if !dry && len(running) > 0 {
		return nil, catalog.Errorf(catalog.OperationFailed, "workspace session has active command sessions").
			With("workspace_session_id", id).With("active_command_session_ids", running)
	}
	opt := workspace.PublishOptions(s.cfg, s.protected)
	opt.DefaultStrategy = layers.Strategy(c.args.String("default_strategy"))
	opt.Resolutions = resolutions
	opt.DryRun = dry
	plan, res, err := s.publisher.Publish(c.ctx, c.sb, ss, opt, nil)
	var re *layers.ResolutionError
	var rej *layers.Rejection
	switch {
	case errors.As(err, &re):
		return nil, catalog.Errorf(catalog.InvalidRequest, "%s", re.Error()).With("path", re.Path)
	case errors.As(err, &rej):
		return nil, catalog.Errorf(catalog.OperationFailed, "workspace session publish was rejected").
			With("workspace_session_id", id).With("stage", "publish").With("session_retained", true).
			With("publish_rejection", workspace.RejectionBody(rej))
	case err != nil:
		return nil, catalog.Errorf(catalog.OperationFailed, "workspace session publish failed: %v", err).
			With("workspace_session_id", id).With("stage", "capture").With("session_retained", true)
	}
	if dry {
		return map[string]any{"workspace_session_id": id, "dry_run": true, "would_commit": plan.WouldCommit,
			"publish": workspace.PublishObjectDry(plan, res), "plan": plan, "destroyed": false, "active_command_session_ids": running}, nil
	}
	pub := workspace.PublishObject(plan, res, true)
	grace := time.Duration(c.args.Float("grace_s") * float64(time.Second))
	bytes, derr := s.teardown.DestroySession(c.ctx, c.sb, ss, grace)
	s.bump(c.ctx, c.sb)
	if derr != nil {
		ss.SetState(workspace.SessFinalizeFailed)
		return nil, catalog.Errorf(catalog.OperationFailed, "workspace session was published but could not be closed").
			With("workspace_session_id", id).With("stage", "destroy").With("publish_completed", true).
			With("layer_committed", !res.NoOp).With("publish", pub).With("destroyed", false).
			With("session_state", workspace.SessFinalizeFailed).With("recovery_operation", "destroy_workspace_session")
	}
	return map[string]any{"workspace_session_id": id, "dry_run": false, "publish": pub, "destroyed": true,
		"evicted_upperdir_bytes": bytes}, nil
}
