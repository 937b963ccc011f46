package supervisor

// Thin handlers of the workspace operations whose domain logic lives in
// supervisor/workspace.

import (
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

func (s *Supervisor) diffWorkspaceSession(c *call) (any, error) {
	filters, e := workspace.DiffFilters(c.args.Array("paths"))
	if e != nil {
		return nil, e
	}
	res, err := workspace.Diff(c.ctx, c.sb, workspace.DiffRequest{ID: c.args.String("workspace_session_id"),
		Against: c.args.String("against"), MaxBytes: int64(c.args.Uint("max_bytes")), Paths: filters,
		ExpansionLimit: s.cfg.Runtime.Publish.ExpansionLimit})
	if err != nil {
		return nil, err
	}
	return res, nil
}
