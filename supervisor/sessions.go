package supervisor

import (
	"time"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

func (s *Supervisor) createWorkspaceSession(c *call) (any, error) {
	var agent *string
	if c.args.Has("agent") {
		a := c.args.String("agent")
		agent = &a
	}
	ss, err := s.holders.New(c.ctx, c.sb, workspace.PolicyNoOp, c.args.String("network_profile"), agent)
	if err != nil {
		return nil, err
	}
	s.bump(c.ctx, c.sb)
	return sessionResult(ss.Record()), nil
}

// sessionResult is what create_workspace_session returns (§3.5).
func sessionResult(rec workspace.SessionRecord) map[string]any {
	return map[string]any{
		"workspace_session_id": rec.WorkspaceSessionID, "network_profile": rec.NetworkProfile, "finalize_policy": rec.FinalizePolicy,
		"agent": rec.Agent, "created_at": rec.CreatedAt, "base_revision": rec.BaseRevision, "overlay_driver": rec.OverlayDriver,
	}
}

func (s *Supervisor) forkWorkspaceSession(c *call) (any, error) {
	src, e := workspace.LookupSession(c.sb, c.args.String("workspace_session_id"))
	if e != nil {
		return nil, e
	}
	var agent *string
	if c.args.Has("agent") {
		a := c.args.String("agent")
		agent = &a
	}
	ss, err := s.holders.Fork(c.ctx, c.sb, src, c.args.String("network_profile"), agent)
	if err != nil {
		return nil, err
	}
	s.bump(c.ctx, c.sb)
	out := sessionResult(ss.Record())
	out["forked_from"] = src.ID()
	return out, nil
}

func (s *Supervisor) listWorkspaceSessions(c *call) (any, error) {
	return workspace.ListSessions(c.ctx, c.sb), nil
}

func (s *Supervisor) destroyWorkspaceSession(c *call) (any, error) {
	res, err := s.teardown.Destroy(c.ctx, c.sb, c.args.String("workspace_session_id"),
		time.Duration(c.args.Float("grace_s")*float64(time.Second)))
	if err != nil {
		return nil, err
	}
	return res, nil
}
