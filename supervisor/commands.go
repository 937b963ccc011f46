package supervisor

import (
	"context"
	"errors"
	"math"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
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
	if c.args.Has("workspace_session_id") {
		var e *catalog.Error
		if ss, e = workspace.LookupSession(sb, c.args.String("workspace_session_id")); e != nil {
			return nil, e
		}
	} else {
		var err error
		if ss, err = s.newSession(c.ctx, sb, workspace.PolicyPublish, "shared", nil); err != nil {
			return nil, err
		}
	}
	cmd, err := s.cmds.Spawn(c.ctx, sb, ss, c.args.String("cmd"), sl)
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
	s.bump(c.ctx, sb)
	workspace.WaitYield(cmd, s.cmds.Yield(c.args.Uint("yield_time_ms")))
	return cmd.YieldOutput(start), nil
}

func (s *Supervisor) writeCommandStdin(c *call) (any, error) {
	start := time.Now()
	cmd, e := workspace.LookupCommand(c.sb, c.args.String("command_session_id"))
	if e != nil {
		return nil, e
	}
	text := c.args.String("stdin")
	if len(text) > s.cfg.Runtime.Command.MaxStdinBytes {
		return nil, catalog.Errorf(catalog.InvalidRequest, "stdin exceeds %d bytes", s.cfg.Runtime.Command.MaxStdinBytes)
	}
	cmd.Mu.Lock()
	final := cmd.Final
	cmd.Mu.Unlock()
	if cmd.Terminal() || final {
		cmd.Mu.Lock()
		st := cmd.Rec.Status
		cmd.Mu.Unlock()
		return nil, catalog.Errorf(catalog.OperationFailed, "command already completed").With("status", st)
	}
	if strings.ContainsRune(text, '\u0003') {
		cmd.Mu.Lock()
		ss := cmd.Session
		cmd.Mu.Unlock()
		go s.cmds.Kill(cmd, workspace.CmdCancelled, syscall.SIGINT, 500*time.Millisecond)
		_ = ss
		workspace.WaitYield(cmd, time.Second)
		s.bump(c.ctx, c.sb)
		return cmd.YieldOutput(start), nil
	}
	deadline := time.Duration(s.cfg.Runtime.Command.StdinWriteDeadlineS * float64(time.Second))
	_ = cmd.Proc.PTY.SetWriteDeadline(time.Now().Add(deadline))
	n, err := cmd.Proc.PTY.Write([]byte(text))
	_ = cmd.Proc.PTY.SetWriteDeadline(time.Time{})
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, catalog.Errorf(catalog.OperationFailed, "stdin_backpressure: the command did not read its input within %gs", deadline.Seconds()).
				With("bytes_written", n)
		}
		return nil, catalog.Errorf(catalog.OperationFailed, "write stdin: %v", err).With("bytes_written", n)
	}
	s.bump(c.ctx, c.sb)
	workspace.WaitYield(cmd, s.cmds.Yield(c.args.Uint("yield_time_ms")))
	return cmd.YieldOutput(start), nil
}

func (s *Supervisor) readCommandLines(c *call) (any, error) {
	start := time.Now()
	cmd, e := workspace.LookupCommand(c.sb, c.args.String("command_session_id"))
	if e != nil {
		return nil, e
	}
	limit := min(c.args.Uint("limit"), uint64(s.cfg.Runtime.Command.ReadLinesMax))
	off := min(c.args.Uint("start_offset"), math.MaxInt32)
	rows, first, end, trunc := cmd.Transcript.Rows(int(off), int(limit))
	return cmd.Output(rows, first, end, trunc, start), nil
}

func (s *Supervisor) listCommands(c *call) (any, error) {
	c.sb.Mu.Lock()
	all := make([]*command, 0, len(c.sb.Work.Commands))
	for _, cmd := range c.sb.Work.Commands {
		all = append(all, cmd)
	}
	c.sb.Mu.Unlock()
	wantSess, wantStatus := c.args.String("workspace_session_id"), c.args.String("status")
	var recs []commandRecord
	for _, cmd := range all {
		cmd.Mu.Lock()
		r := cmd.Rec
		cmd.Mu.Unlock()
		if (wantSess != "" && r.WorkspaceSessionID != wantSess) || (wantStatus != "" && r.Status != wantStatus) {
			continue
		}
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool {
		if recs[i].StartedUnixMs != recs[j].StartedUnixMs {
			return recs[i].StartedUnixMs > recs[j].StartedUnixMs
		}
		return recs[i].CommandSessionID > recs[j].CommandSessionID
	})
	limit := int(c.args.Uint("limit"))
	truncated := len(recs) > limit
	if truncated {
		recs = recs[:limit]
	}
	out := make([]map[string]any, 0, len(recs))
	for _, r := range recs {
		m := map[string]any{"command_session_id": r.CommandSessionID, "cmd": r.Cmd, "status": r.Status, "exit_code": r.ExitCode,
			"started_at": r.StartedAt, "ended_at": r.EndedAt, "workspace_session_id": r.WorkspaceSessionID, "interrupted": r.Interrupted}
		if len([]rune(r.Cmd)) > 4096 {
			m["cmd"], m["cmd_truncated"] = string([]rune(r.Cmd)[:4096]), true
		}
		out = append(out, m)
	}
	return map[string]any{"commands": out, "truncated": truncated}, nil
}
