package supervisor

import (
	"context"
	"syscall"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

func (s *Supervisor) execCommand(c *call) (any, error) {
	start := time.Now()
	sb := c.sb
	sl, e := s.admission.Command(sb)
	if e != nil {
		return nil, e
	}
	defer sl.Release() // a no-op once spawn put the command in sb.Work.commands
	var ss *session
	var first []statedb.Row // a new implicit session's record, stored with its command's
	if c.args.Has("workspace_session_id") {
		var e *catalog.Error
		if ss, e = workspace.LookupSession(sb, c.args.String("workspace_session_id")); e != nil {
			return nil, e
		}
	} else {
		rec, err := statedb.Row{}, error(nil)
		if ss, rec, err = s.holders.NewImplicit(c.ctx, sb); err != nil {
			return nil, err
		}
		first = append(first, rec)
	}
	cmd, err := s.cmds.Spawn(c.ctx, sb, ss, c.args.String("cmd"), sl, first...)
	if err != nil {
		if ss.Implicit() && len(ss.Running()) == 0 {
			_, _ = s.teardown.DestroySession(context.Background(), sb, ss, 0)
		}
		return nil, err
	}
	if c.args.Has("timeout_ms") {
		d := time.Duration(c.args.Uint("timeout_ms")) * time.Millisecond
		cmd.Mu.Lock()
		cmd.Timer = time.AfterFunc(d, func() { s.cmds.Kill(cmd, workspace.CmdTimedOut, syscall.SIGTERM, 100*time.Millisecond) })
		cmd.Mu.Unlock()
	}
	workspace.WaitYield(cmd, s.cmds.Yield(c.args.Uint("yield_time_ms")))
	return cmd.YieldOutput(start), nil
}

func (s *Supervisor) writeCommandStdin(c *call) (any, error) {
	res, err := s.cmds.WriteStdin(c.ctx, c.sb, c.args.String("command_session_id"), c.args.String("stdin"),
		s.cmds.Yield(c.args.Uint("yield_time_ms")))
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (s *Supervisor) readCommandLines(c *call) (any, error) {
	res, err := s.cmds.ReadLines(c.sb, c.args.String("command_session_id"), c.args.Uint("start_offset"), c.args.Uint("limit"))
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (s *Supervisor) listCommands(c *call) (any, error) {
	return workspace.ListCommands(c.sb, c.args.String("workspace_session_id"), c.args.String("status"), int(c.args.Uint("limit"))), nil
}
