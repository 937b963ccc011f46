package workspace

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
)

// Commands ends, retains and looks up a sandbox's commands (§6): what
// happens to a command after its holder reports it, whoever started it.
type Commands struct {
	Cfg *config.Config
	DB  *statedb.DB
	Log *slog.Logger
	// Data is the data directory; a command's transcript is below
	// Data/commands/<id>.
	Data string
	// Bump records a client-visible change of sb (§4.4).
	Bump func(ctx context.Context, sb *Sandbox)
}

// RunningCount is the number of sb's commands that are not terminal.
func RunningCount(sb *Sandbox) int {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	n := 0
	for _, c := range sb.Work.Commands {
		if !c.Terminal() {
			n++
		}
	}
	return n
}

func (m *Commands) Yield(ms uint64) time.Duration {
	ms = min(ms, uint64(m.Cfg.Runtime.Command.MaxYieldMs))
	return time.Duration(ms) * time.Millisecond
}

func (m *Commands) TranscriptOptions() TranscriptOptions {
	return TranscriptOptions{
		MaxBytes:    m.Cfg.Runtime.Command.MaxTranscriptBytes,
		WindowBytes: int64(m.Cfg.Runtime.Command.MaxTranscriptWindowBytes),
		IdleCommit:  100 * time.Millisecond,
		Now:         time.Now,
	}
}

func WaitYield(cmd *Command, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-cmd.Done:
	case <-t.C:
	}
}

// DrainOutput gives the PTY reader a moment to copy the last output, then
// stops it (a background process may keep the terminal open forever).
func DrainOutput(cmd *Command) {
	select {
	case <-cmd.ReadEOF:
	case <-time.After(200 * time.Millisecond):
		_ = cmd.Proc.PTY.Close()
		<-cmd.ReadEOF
	}
}

// Finish makes a command terminal: status from its exit or from why
// we ended it, or interrupted when its holder vanished.
func (m *Commands) Finish(sb *Sandbox, cmd *Command, interrupt string, extra map[string]any) {
	if cmd.Terminal() {
		return
	}
	DrainOutput(cmd)
	_ = cmd.Proc.PTY.Close()
	_ = cmd.Transcript.Close()
	now := time.Now()
	cmd.Mu.Lock()
	if cmd.Timer != nil {
		cmd.Timer.Stop()
	}
	r := &cmd.Rec
	ended := now.UTC().Format("2006-01-02T15:04:05.000Z")
	r.EndedAt, r.EndedUnixMs = &ended, now.UnixMilli()
	code := func(n int) *int { return &n }
	switch {
	case interrupt != "":
		r.Status, r.ExitCode, r.Interrupted, r.InterruptReason = CmdError, nil, true, interrupt
	case cmd.Forced == CmdTimedOut:
		r.Status, r.ExitCode = CmdTimedOut, code(124)
	case cmd.Forced == CmdCancelled:
		r.Status, r.ExitCode = CmdCancelled, code(130)
	case cmd.Exit != nil && cmd.Exit.Signaled():
		r.Status, r.ExitCode = CmdError, code(-int(cmd.Exit.Signal()))
	case cmd.Exit != nil && cmd.Exit.ExitStatus() == 0:
		r.Status, r.ExitCode = CmdOK, code(0)
	case cmd.Exit != nil:
		r.Status, r.ExitCode = CmdError, code(cmd.Exit.ExitStatus())
	default:
		r.Status, r.ExitCode = CmdError, nil
	}
	if len(extra) > 0 {
		r.Extra = extra
	}
	cmd.Final = false
	rec := *r
	cmd.Mu.Unlock()
	if err := m.DB.Put(context.Background(), statedb.KindCommand, rec.CommandSessionID, sb.Rec.ID, rec); err != nil {
		m.Log.Warn("persist command", "command", rec.CommandSessionID, "err", err)
	}
	close(cmd.Done)
	m.retain(sb, cmd)
	m.Bump(context.Background(), sb)
}

// Kill ends a command on our initiative (timeout, cancel): first sig
// to every process of the command, SIGKILL after grace.
func (m *Commands) Kill(cmd *Command, why string, sig syscall.Signal, grace time.Duration) {
	cmd.Mu.Lock()
	if cmd.Forced == "" {
		cmd.Forced = why
	}
	ss := cmd.Session
	cmd.Mu.Unlock()
	ss.Mu.Lock()
	h := ss.Holder
	ss.Mu.Unlock()
	if h == nil || cmd.Terminal() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.Signal(ctx, cmd.Proc.ID, sig)
	select {
	case <-cmd.Done:
		return
	case <-time.After(grace):
	}
	_ = h.Signal(ctx, cmd.Proc.ID, syscall.SIGKILL)
}

// retain applies the terminal-record cap (§6.7): FIFO eviction beyond
// runtime.command.max_terminal_entries, remembering evicted IDs.
func (m *Commands) retain(sb *Sandbox, cmd *Command) {
	sb.Mu.Lock()
	sb.Work.TerminalOrder = append(sb.Work.TerminalOrder, cmd.Rec.CommandSessionID)
	var evict []string
	for len(sb.Work.TerminalOrder) > m.Cfg.Runtime.Command.MaxTerminalEntries {
		evict = append(evict, sb.Work.TerminalOrder[0])
		sb.Work.TerminalOrder = sb.Work.TerminalOrder[1:]
	}
	for _, id := range evict {
		delete(sb.Work.Commands, id)
		sb.Work.Evicted[id] = true
	}
	sb.Mu.Unlock()
	for _, id := range evict {
		os.RemoveAll(filepath.Join(m.Data, "commands", id))
		_ = m.DB.Delete(context.Background(), statedb.KindCommand, id)
		_ = m.DB.Put(context.Background(), statedb.KindEvicted, id, sb.Rec.ID, map[string]string{"command_session_id": id})
	}
}

// LookupCommand finds a retained command, or says why not (§3.3).
func LookupCommand(sb *Sandbox, id string) (*Command, *catalog.Error) {
	sb.Mu.Lock()
	cmd := sb.Work.Commands[id]
	evicted := sb.Work.Evicted[id]
	sb.Mu.Unlock()
	if cmd != nil {
		return cmd, nil
	}
	reason := "unknown"
	if evicted {
		reason = "evicted"
	}
	return nil, catalog.Errorf(catalog.NotFound, "command not found: %s", id).With("command_session_id", id).With("reason", reason)
}
