package supervisor

import (
	"errors"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// explicitSession is the explicit session id of a publish or sync and
// its parsed resolutions. Implicit sessions publish themselves (§5.1), so
// they are not found here.
func explicitSession(c *call, id string) (*workspace.Session, map[string]layers.Strategy, error) {
	ss, e := workspace.LookupSession(c.sb, id)
	if e != nil {
		return nil, nil, e
	}
	if ss.Implicit() {
		return nil, nil, workspace.NotFoundSession(id)
	}
	resolutions, err := workspace.ParseResolutions(c.args.Array("resolutions"))
	if err != nil {
		return nil, nil, err
	}
	return ss, resolutions, nil
}

func (s *Supervisor) publishWorkspaceSession(c *call) (any, error) {
	id := c.args.String("workspace_session_id")
	ss, resolutions, err := explicitSession(c, id)
	if err != nil {
		return nil, err
	}
	dry := c.args.Bool("dry_run")
	keep := c.args.Bool("keep") && !dry
	ss.Gate.Lock()
	defer ss.Gate.Unlock()
	if e := ss.Admit(); e != nil {
		return nil, e
	}
	running := ss.Running()
	// A kept session stays frozen from the capture to its new upper, so
	// its commands may go on running.
	if !dry && !keep && len(running) > 0 {
		return nil, catalog.Errorf(catalog.OperationFailed, "workspace session has active command sessions").
			With("workspace_session_id", id).With("active_command_session_ids", running)
	}
	opt := workspace.PublishOptions(s.cfg, s.protected)
	opt.DefaultStrategy = layers.Strategy(c.args.String("default_strategy"))
	opt.Resolutions = resolutions
	opt.DryRun = dry
	opt.Git.RefMode = layers.GitRefMode(c.args.String("git_refs"))
	if keep {
		return s.publishKeep(c, ss, opt)
	}
	plan, res, err := s.publisher.Publish(c.ctx, c.sb, ss, opt, nil)
	if err := publishError(id, err); err != nil {
		return nil, err
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

// publishError maps a failed publish to the contract's envelope; nil for nil.
func publishError(id string, err error) error {
	var re *layers.ResolutionError
	var rej *layers.Rejection
	switch {
	case errors.As(err, &re):
		return catalog.Errorf(catalog.InvalidRequest, "%s", re.Error()).With("path", re.Path)
	case errors.As(err, &rej):
		return catalog.Errorf(catalog.OperationFailed, "workspace session publish was rejected").
			With("workspace_session_id", id).With("stage", "publish").With("session_retained", true).
			With("publish_rejection", workspace.RejectionBody(rej))
	case err != nil:
		return catalog.Errorf(catalog.OperationFailed, "workspace session publish failed: %v", err).
			With("workspace_session_id", id).With("stage", "capture").With("session_retained", true)
	}
	return nil
}

// publishKeep is publish keep:true: publish, then the session continues on
// the new head with an empty upper (workspace.Publisher.PublishKeep).
func (s *Supervisor) publishKeep(c *call, ss *workspace.Session, opt layers.PublishOptions) (any, error) {
	id := ss.ID()
	plan, res, out, err := s.publisher.PublishKeep(c.ctx, c.sb, ss, opt)
	var ke *workspace.KeepError
	if errors.As(err, &ke) {
		s.bump(c.ctx, c.sb)
		e := syncError(id, "keep", ke.Err)
		if ce, ok := e.(*catalog.Error); ok {
			e = ce.With("publish_completed", true).With("layer_committed", !res.NoOp).With("publish", workspace.PublishObject(plan, res, true)).
				With("destroyed", false).With("recovery_operation", "sync_workspace_session")
		}
		return nil, e
	}
	if err != nil {
		if errors.Is(err, workspace.ErrNoHolder) || errors.Is(err, nsholder.ErrFreezeTimeout) || errors.Is(err, nsholder.ErrSwapUnsupported) {
			return nil, syncError(id, "freeze", err)
		}
		return nil, publishError(id, err)
	}
	s.bump(c.ctx, c.sb)
	return map[string]any{"workspace_session_id": id, "dry_run": false, "publish": workspace.PublishObject(plan, res, true),
		"destroyed": false, "kept": true, "base_revision": out.Revision, "active_command_session_ids": ss.Running()}, nil
}
