package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
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
	IDs  *statedb.IDs
	Obs  *obs.Registry
	Attr SessionHooks
	// Bump records a client-visible change of sb (§4.4).
	Bump func(ctx context.Context, sb *Sandbox)
	// Revise advances sb's activity revision like Bump but returns the
	// sandbox record instead of storing it: a command's start and end store
	// it with the command's record in one commit.
	Revise func(sb *Sandbox) statedb.Row
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
	e := m.End(sb, cmd, interrupt, extra)
	if e == nil {
		return
	}
	// The terminal record is durable before anyone sees the command end;
	// the sandbox's new activity revision and the records of the commands
	// it evicts ride in the same commit.
	if err := m.DB.PutRows(context.Background(), e.Rows()...); err != nil {
		m.Log.Warn("persist command", "command", e.Rec.CommandSessionID, "err", err)
	}
	e.Apply()
}

// Ending is a command's terminal record, built by End but neither stored
// nor seen yet: its rows go into a commit of the caller's choice (an
// implicit session's finalization stores them with the session record's
// removal), then Apply makes the end visible.
type Ending struct {
	m       *Commands
	sb      *Sandbox
	cmd     *Command
	Rec     CommandRecord // the terminal record; the caller may still add to Rec.Extra
	evicted []string
}

// End builds cmd's terminal record (Finish without the commit), or returns
// nil when cmd is already terminal. The command's output is drained and
// its terminal and transcript are closed.
func (m *Commands) End(sb *Sandbox, cmd *Command, interrupt string, extra map[string]any) *Ending {
	if cmd.Terminal() {
		return nil
	}
	DrainOutput(cmd)
	_ = cmd.Proc.PTY.Close()
	_ = cmd.Transcript.Close()
	now := time.Now()
	cmd.Mu.Lock()
	if cmd.Timer != nil {
		cmd.Timer.Stop()
	}
	r := cmd.Rec
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
	cmd.Mu.Unlock()
	return &Ending{m: m, sb: sb, cmd: cmd, Rec: r, evicted: m.retain(sb, cmd)}
}

// RecordRow is the terminal record's row alone.
func (e *Ending) RecordRow() statedb.Row {
	return statedb.Row{Kind: statedb.KindCommand, ID: e.Rec.CommandSessionID, SandboxID: e.sb.Rec.ID, Rec: e.Rec}
}

// Rows are the terminal record, the sandbox's advanced activity revision
// (§4.4) and the removal of the commands the end evicts (§6.7); call once.
func (e *Ending) Rows() []statedb.Row {
	rows := []statedb.Row{e.RecordRow(), e.m.Revise(e.sb)}
	for _, id := range e.evicted {
		rows = append(rows, statedb.Row{Kind: statedb.KindCommand, ID: id, Delete: true},
			statedb.Row{Kind: statedb.KindEvicted, ID: id, SandboxID: e.sb.Rec.ID, Rec: map[string]string{"command_session_id": id}})
	}
	return rows
}

// Apply makes the end visible once its rows are stored: the record in
// memory, Done closed (waiting requests answer), the evicted transcripts
// removed.
func (e *Ending) Apply() {
	e.cmd.Mu.Lock()
	e.cmd.Rec = e.Rec
	e.cmd.Final = false
	e.cmd.Mu.Unlock()
	close(e.cmd.Done)
	for _, id := range e.evicted {
		os.RemoveAll(filepath.Join(e.m.Data, "commands", id))
	}
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
	h := ss.CurrentHolder()
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
// runtime.command.max_terminal_entries, remembering evicted IDs. It
// returns the evicted IDs, whose records and transcripts the caller
// removes.
func (m *Commands) retain(sb *Sandbox, cmd *Command) []string {
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
	return evict
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

// commandEnv builds the environment from scratch (§6.1).
// An image sandbox starts from the image's Env (§5.4), whose PATH replaces
// the supervisor's; every variable set below overrides an image one.
func (m *Commands) commandEnv(sb *Sandbox, wsID, cmdID string) []string {
	sbID := sb.Rec.ID
	path := os.Getenv("PATH")
	if sb.Rec.Rootfs != "host" {
		path = ""
		if v, ok := envLookup(sb.ImageEnv, "PATH"); ok {
			path = v
		}
	}
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	term := os.Getenv("TERM")
	if term == "" {
		term = "xterm-256color"
	}
	env := []string{"PATH=" + path, "HOME=/root", "USER=root", "LOGNAME=root", "TERM=" + term}
	for _, k := range []string{"LANG", "LC_ALL", "TZ", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
		"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	// Git refreshes the session's private index; ctimes are not trusted (doc.go).
	env = append(env, "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=core.trustCtime", "GIT_CONFIG_VALUE_0=false", "SANDBOX_ID="+sbID, "WORKSPACE_SESSION_ID="+wsID, "COMMAND_SESSION_ID="+cmdID)
	keys := make([]string, 0, len(m.Cfg.Runtime.Command.Env))
	for k := range m.Cfg.Runtime.Command.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+m.Cfg.Runtime.Command.Env[k])
	}
	return mergeEnv(sb.ImageEnv, env)
}

// Spawn starts one command in a session through its holder.
// sl is the command's admission slot, consumed when the command enters
// sb.Work.commands. first are the rows of an implicit session's record
// (Holders.NewImplicit): they are stored with the command's running
// record, in one commit before the command starts, so that nothing the
// command writes exists without its session's record.
func (m *Commands) Spawn(ctx context.Context, sb *Sandbox, ss *Session, cmdline string, sl *Slot, first ...statedb.Row) (*Command, error) {
	h, release, e := ss.Enter()
	if e != nil {
		return nil, e
	}
	defer release()
	id := m.IDs.New("cmd-")
	dir := filepath.Join(m.Data, "commands", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create transcript directory: %w", err)
	}
	tr, err := NewTranscript(filepath.Join(dir, "transcript.log"), m.TranscriptOptions())
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("create transcript: %w", err)
	}
	now := time.Now()
	cmd := &Command{
		Dir: dir, Transcript: tr, Session: ss, Done: make(chan struct{}), ReadEOF: make(chan struct{}),
		Rec: CommandRecord{CommandSessionID: id, SandboxID: sb.Rec.ID, Cmd: cmdline, WorkspaceSessionID: ss.ID(),
			Status: CmdRunning, StartedAt: now.UTC().Format("2006-01-02T15:04:05.000Z"), StartedUnixMs: now.UnixMilli()},
	}
	// The holder may report a fast command's exit right after Spawn returns;
	// holding ss.mu until the command is in the ledger makes commandEvent
	// wait for it instead of dropping the event.
	_, sp := obs.Start(obs.WithScope(ctx, m.Obs, scope(sb)), "holder.exec", map[string]any{"workspace_session_id": ss.ID(), "command_session_id": id})
	// Revised before ss.mu is taken: Revise takes sb.mu, which is never
	// taken inside ss.mu.
	rev := m.Revise(sb)
	running := statedb.Row{Kind: statedb.KindCommand, ID: id, SandboxID: sb.Rec.ID, Rec: cmd.Rec}
	ss.Mu.Lock()
	if len(first) > 0 {
		if err := m.DB.PutRows(ctx, append(first, running, rev)...); err != nil {
			ss.Mu.Unlock()
			sp.Done(err, nil)
			tr.Close()
			os.RemoveAll(dir)
			m.Bump(ctx, sb) // the revision did not reach the database
			return nil, fmt.Errorf("persist session and command: %w", err)
		}
	}
	proc, err := h.Spawn(ctx, nsholder.SpawnRequest{
		Cmd: cmdline, Env: m.commandEnv(sb, ss.ID(), id), Dir: "/workspace",
		Rows: uint16(m.Cfg.Runtime.Command.PtyRows), Cols: uint16(m.Cfg.Runtime.Command.PtyCols),
		Owner: id,
	})
	sp.Done(err, nil)
	if err != nil {
		if len(first) > 0 {
			// The running record was stored: the command never ran.
			if err := m.DB.PutRows(ctx, statedb.Row{Kind: statedb.KindCommand, ID: id, Delete: true}); err != nil {
				m.Log.Warn("remove command record", "command", id, "err", err)
			}
		}
		ss.Mu.Unlock()
		tr.Close()
		os.RemoveAll(dir)
		if errors.Is(err, nsholder.ErrNoShell) {
			return nil, catalog.Errorf(catalog.OperationFailed, "no shell in rootfs")
		}
		return nil, catalog.Errorf(catalog.OperationFailed, "spawn command: %w", err).With("workspace_session_id", ss.ID())
	}
	cmd.Proc = proc
	ss.Ledger[id] = cmd
	// Persist the running record before the holder's exit event can be
	// handled (it waits for ss.mu): afterwards finishCommand owns the record,
	// and a later put of "running" would overwrite its terminal state. The
	// sandbox's activity revision (§4.4) is stored in the same commit.
	if len(first) == 0 {
		if err := m.DB.PutRows(ctx, running, rev); err != nil {
			m.Log.Warn("persist command", "command", id, "err", err)
		}
	}
	ss.Mu.Unlock()
	go func() {
		defer close(cmd.ReadEOF)
		buf := make([]byte, 32<<10)
		for {
			n, err := proc.PTY.Read(buf)
			if n > 0 {
				_, _ = tr.Write(buf[:n])
			}
			if err != nil {
				return // EIO once every slave holder is gone, or closed by finishCommand
			}
		}
	}()
	sb.Mu.Lock()
	sb.Work.Commands[id] = cmd
	sl.ReleaseLocked()
	sb.Mu.Unlock()
	return cmd, nil
}

// envLookup finds name in a KEY=VALUE list.
func envLookup(env []string, name string) (string, bool) {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v, true
		}
	}
	return "", false
}

// mergeEnv returns base overridden by over, one entry per name, base's
// order first.
func mergeEnv(base, over []string) []string {
	if len(base) == 0 {
		return over
	}
	idx := map[string]int{}
	var out []string
	for _, list := range [][]string{base, over} {
		for _, kv := range list {
			k, _, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				continue
			}
			if i, seen := idx[k]; seen {
				out[i] = kv
				continue
			}
			idx[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// Load restores a sandbox's command records at start: commands that
// were running become terminal with interrupted:true (§4.5).
func (m *Commands) Load(ctx context.Context, sb *Sandbox) (interrupted int) {
	var recs []CommandRecord
	_ = m.DB.List(ctx, statedb.KindCommand, sb.Rec.ID, func(b []byte) error {
		var r CommandRecord
		if err := json.Unmarshal(b, &r); err != nil {
			return err
		}
		recs = append(recs, r)
		return nil
	})
	sort.Slice(recs, func(i, j int) bool { return recs[i].CommandSessionID < recs[j].CommandSessionID })
	for _, r := range recs {
		dir := filepath.Join(m.Data, "commands", r.CommandSessionID)
		tr, err := OpenTranscript(filepath.Join(dir, "transcript.log"), m.TranscriptOptions())
		if err != nil {
			m.Log.Warn("reopen transcript", "command", r.CommandSessionID, "err", err)
			continue
		}
		_ = tr.Close()
		if r.Status == CmdRunning {
			now := time.Now()
			ended := now.UTC().Format("2006-01-02T15:04:05.000Z")
			r.Status, r.ExitCode, r.Interrupted, r.InterruptReason = CmdError, nil, true, "supervisor_restart"
			r.EndedAt, r.EndedUnixMs = &ended, now.UnixMilli()
			_ = m.DB.Put(ctx, statedb.KindCommand, r.CommandSessionID, sb.Rec.ID, r)
			event(ctx, m.Obs, sb, "command.interrupted", map[string]any{"command_session_id": r.CommandSessionID, "interrupt_reason": "supervisor_restart"})
			interrupted++
		}
		done := make(chan struct{})
		close(done)
		cmd := &Command{Rec: r, Dir: dir, Transcript: tr, Done: done}
		sb.Work.Commands[r.CommandSessionID] = cmd
		sb.Work.TerminalOrder = append(sb.Work.TerminalOrder, r.CommandSessionID)
	}
	_ = m.DB.List(ctx, statedb.KindEvicted, sb.Rec.ID, func(b []byte) error {
		var m map[string]string
		if err := json.Unmarshal(b, &m); err == nil {
			sb.Work.Evicted[m["command_session_id"]] = true
		}
		return nil
	})
	return interrupted
}

// CountSessions is the number of live sessions in sbs.
func CountSessions(sbs []*Sandbox) int {
	n := 0
	for _, sb := range sbs {
		sb.Mu.Lock()
		n += len(sb.Work.Sessions)
		sb.Mu.Unlock()
	}
	return n
}

// CountRunning is the number of running commands in sbs.
func CountRunning(sbs []*Sandbox) (total int) {
	for _, sb := range sbs {
		total += RunningCount(sb)
	}
	return total
}

// SessionHooks are what the end of a command does beyond the command:
// attribution of the session's changes (§11.3) and the finalization of an
// implicit session (§6.6). The root package implements them.
type SessionHooks interface {
	// FuseCommandEnd checkpoints the files a FUSE session's command wrote.
	FuseCommandEnd(sb *Sandbox, ss *Session, cmd string)
	// KernelCommandEnd credits what changed in ss (kernel driver) to
	// commandID, approximately when others ran meanwhile, and records the
	// file activity of ss since the last capture.
	KernelCommandEnd(ctx context.Context, sb *Sandbox, ss *Session, commandID string, approximate bool)
	// FinalizeImplicit publishes an implicit session and destroys it.
	FinalizeImplicit(ctx context.Context, sb *Sandbox, ss *Session, drain *Command) map[string]any
}

// Event applies one holder event.
func (m *Commands) Event(sb *Sandbox, ss *Session, ev nsholder.Event) {
	ss.Mu.Lock()
	var cmd *Command
	for _, c := range ss.Ledger {
		if c.Proc.ID == ev.ID {
			cmd = c
			break
		}
	}
	ss.Mu.Unlock()
	if cmd == nil {
		return
	}
	if ev.Exited {
		st := ev.Status
		cmd.Mu.Lock()
		cmd.Exit = &st
		cmd.Mu.Unlock()
	}
	if ev.Done {
		m.done(sb, ss, cmd)
	}
}

// done runs when a command's process group is gone: it leaves the
// ledger; the command that drains an implicit session's ledger stays
// running (finalizing) until the session is published and destroyed (§6.6).
func (m *Commands) done(sb *Sandbox, ss *Session, cmd *Command) {
	ss.Mu.Lock()
	delete(ss.Ledger, cmd.Rec.CommandSessionID)
	others := len(ss.Ledger)
	drained := others == 0 && ss.Implicit()
	ss.Mu.Unlock()
	if ss.Rec.OverlayDriver == "fuse" {
		// FUSE driver (§11.3): the writers are known per handle; the files
		// written since their last checkpoint are checkpointed now.
		m.Attr.FuseCommandEnd(sb, ss, cmd.Rec.CommandSessionID)
	} else {
		// Kernel driver attribution (§11.3): what changed is credited to the
		// command that ended, approximately when others ran meanwhile.
		m.Attr.KernelCommandEnd(context.Background(), sb, ss, cmd.Rec.CommandSessionID, others > 0)
	}
	if !drained {
		m.Finish(sb, cmd, "", nil)
		return
	}
	cmd.Mu.Lock()
	cmd.Final = true
	cmd.Mu.Unlock()
	DrainOutput(cmd)
	finalize := func() {
		extra := m.Attr.FinalizeImplicit(context.Background(), sb, ss, cmd)
		m.Finish(sb, cmd, "", extra)
	}
	if !sb.GoBackground(finalize) {
		// The sandbox is being destroyed: nothing is published (§4.3).
		m.Finish(sb, cmd, "supervisor_restart", nil)
	}
}

// WriteStdin is write_command_stdin (§3.3): text goes to command id's
// terminal (a ^C cancels the command instead), then its output is awaited
// for yield.
func (m *Commands) WriteStdin(ctx context.Context, sb *Sandbox, id, text string, yield time.Duration) (map[string]any, error) {
	start := time.Now()
	cmd, e := LookupCommand(sb, id)
	if e != nil {
		return nil, e
	}
	if len(text) > m.Cfg.Runtime.Command.MaxStdinBytes {
		return nil, catalog.Errorf(catalog.InvalidRequest, "stdin exceeds %d bytes", m.Cfg.Runtime.Command.MaxStdinBytes)
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
		go m.Kill(cmd, CmdCancelled, syscall.SIGINT, 500*time.Millisecond)
		_ = ss
		WaitYield(cmd, time.Second)
		m.Bump(ctx, sb)
		return cmd.YieldOutput(start), nil
	}
	deadline := time.Duration(m.Cfg.Runtime.Command.StdinWriteDeadlineS * float64(time.Second))
	_ = cmd.Proc.PTY.SetWriteDeadline(time.Now().Add(deadline))
	n, err := cmd.Proc.PTY.Write([]byte(text))
	_ = cmd.Proc.PTY.SetWriteDeadline(time.Time{})
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, catalog.Errorf(catalog.OperationFailed, "stdin_backpressure: the command did not read its input within %gs", deadline.Seconds()).
				With("bytes_written", n)
		}
		return nil, catalog.Errorf(catalog.OperationFailed, "write stdin: %w", err).With("bytes_written", n)
	}
	m.Bump(ctx, sb)
	WaitYield(cmd, yield)
	return cmd.YieldOutput(start), nil
}

// ReadLines is read_command_lines (§3.3): limit rows of command id's
// transcript from startOffset.
func (m *Commands) ReadLines(sb *Sandbox, id string, startOffset, limit uint64) (map[string]any, error) {
	start := time.Now()
	cmd, e := LookupCommand(sb, id)
	if e != nil {
		return nil, e
	}
	limit = min(limit, uint64(m.Cfg.Runtime.Command.ReadLinesMax))
	off := min(startOffset, math.MaxInt32)
	rows, first, end, trunc := cmd.Transcript.Rows(int(off), int(limit))
	return cmd.Output(rows, first, end, trunc, start), nil
}

// ListCommands is list_commands (§3.3): sb's retained commands of session
// wantSess and status wantStatus ("" for any), newest first, at most limit.
func ListCommands(sb *Sandbox, wantSess, wantStatus string, limit int) map[string]any {
	sb.Mu.Lock()
	all := make([]*Command, 0, len(sb.Work.Commands))
	for _, cmd := range sb.Work.Commands {
		all = append(all, cmd)
	}
	sb.Mu.Unlock()
	var recs []CommandRecord
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
	return map[string]any{"commands": out, "truncated": truncated}
}
