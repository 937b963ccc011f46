package workspace

// The live session and command types and a sandbox's tables of them: the
// per-sandbox value (W) of sandbox.Sandbox.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/attribution"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
)

// Sandbox is a registry entry carrying a sandbox's Tables.
type Sandbox = sandbox.Sandbox[*Tables]

// Session states (§5.5).
const (
	SessActive         = "active"
	SessFinalizing     = "finalizing"
	SessFinalizeFailed = "finalize_failed"
	SessRestoring      = "restoring"
	SessRestoreFailed  = "restore_failed"
)

const (
	PolicyNoOp    = "no_op"                // explicit sessions
	PolicyPublish = "publish_then_destroy" // implicit sessions
)

// SessionRecord is the persisted session (§5.5).
type SessionRecord struct {
	WorkspaceSessionID string          `json:"workspace_session_id"`
	SandboxID          string          `json:"sandbox_id"`
	Agent              *string         `json:"agent"`
	NetworkProfile     string          `json:"network_profile"`
	FinalizePolicy     string          `json:"finalize_policy"`
	State              string          `json:"state"`
	CreatedAt          string          `json:"created_at"`
	BaseRevision       layers.Revision `json:"base_revision"`
	Lease              LeaseRecord     `json:"lease"`
	OverlayDriver      string          `json:"overlay_driver"`
	// ForkedFrom is the source of a session made by fork_workspace_session.
	ForkedFrom string `json:"forked_from,omitempty"`
}

type LeaseRecord struct {
	LeaseID string            `json:"lease_id"`
	Layers  []layers.LayerRef `json:"layers"`
}

// Holder is what a session uses of its holder process (*nsholder.Client):
// its life, its command runner, its file operations and its loopback dial.
type Holder interface {
	Pid() int
	Done() <-chan struct{}
	Events() <-chan nsholder.Event
	Close(grace time.Duration) error
	// Quiesce kills every process of the session but the holder and
	// returns once they are reaped.
	Quiesce(ctx context.Context) error
	CommandRunner
	FileHolder
	LoopbackDialer
	Swapper
}

// Session is a live workspace session. gate is its admission gate (§5.5):
// starting commands, file operations, publish and destroy are serialized on
// it, so a file operation never races a finalization. mu guards the rest.
type Session struct {
	Gate sync.Mutex
	Attr attribution.Tracker // checkpoints, activity captures, FUSE write ranges

	Mu     sync.Mutex
	Rec    SessionRecord
	Dir    string
	Holder Holder
	Lease  *layers.Lease
	Ledger map[string]*Command // running commands
	Gone   bool                // destroyed: whoever waited at the gate finds it gone
	// Forwards are the session's forward_port listeners by target port
	// (network.go); they end with the session.
	Forwards map[int]*Forward
}

func (ss *Session) IsGone() bool {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	return ss.Gone
}

func (ss *Session) ID() string { return ss.Rec.WorkspaceSessionID }

func (ss *Session) Upper() string { return filepath.Join(ss.Dir, "upper") }

func (ss *Session) Implicit() bool { return ss.Rec.FinalizePolicy == PolicyPublish }

// Base is the session's leased manifest: its frozen view (§5.3).
// A remount changes it (under mu).
func (ss *Session) Base() layers.Manifest {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	return layers.Manifest{SchemaVersion: layers.SchemaVersion, Version: ss.Rec.BaseRevision.ManifestVersion, Layers: ss.Rec.Lease.Layers}
}

func (ss *Session) State() string {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	return ss.Rec.State
}

func (ss *Session) SetState(st string) {
	ss.Mu.Lock()
	ss.Rec.State = st
	ss.Mu.Unlock()
}

// Running returns the IDs of the session's running commands, sorted.
func (ss *Session) Running() []string {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	ids := make([]string, 0, len(ss.Ledger))
	for id := range ss.Ledger {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func NotFoundSession(id string) *catalog.Error {
	return catalog.Errorf(catalog.NotFound, "workspace session not found: %s", id).With("workspace_session_id", id)
}

// LookupSession finds a live session of the sandbox.
func LookupSession(sb *Sandbox, id string) (*Session, *catalog.Error) {
	sb.Mu.Lock()
	ss := sb.Work.Sessions[id]
	sb.Mu.Unlock()
	if ss == nil {
		return nil, NotFoundSession(id)
	}
	return ss, nil
}

// CurrentHolder is the session's holder, nil once it has exited.
func (ss *Session) CurrentHolder() Holder {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	return ss.Holder
}

// Enter is the one way a request reaches a live session's holder: it takes
// the session's gate (publish, destroy and the other file operations wait
// for it), checks that the session admits work and that its holder still
// runs. On success the caller holds the gate until it calls release.
func (ss *Session) Enter() (h Holder, release func(), e *catalog.Error) {
	ss.Gate.Lock()
	if e := ss.Admit(); e != nil {
		ss.Gate.Unlock()
		return nil, nil, e
	}
	if h = ss.CurrentHolder(); h == nil {
		ss.Gate.Unlock()
		return nil, nil, catalog.Errorf(catalog.OperationFailed, "holder exited").With("workspace_session_id", ss.ID())
	}
	return h, ss.Gate.Unlock, nil
}

// Admit checks that a session accepts commands and file operations (§5.5).
func (ss *Session) Admit() *catalog.Error {
	if ss.IsGone() {
		return NotFoundSession(ss.ID())
	}
	switch st := ss.State(); st {
	case SessActive:
		return nil
	case SessFinalizing, SessRestoring:
		return catalog.Errorf(catalog.OperationConflict, "workspace session %s is %s", ss.ID(), st).
			With("workspace_session_id", ss.ID()).With("session_state", st)
	default:
		return catalog.Errorf(catalog.OperationFailed, "workspace session %s is %s", ss.ID(), st).
			With("workspace_session_id", ss.ID()).With("session_state", st)
	}
}

// sessionObject is the contract's session object (§3.5).
func (ss *Session) Object(ctx context.Context) map[string]any {
	ss.Mu.Lock()
	rec := ss.Rec
	var pid any
	if ss.Holder != nil {
		pid = ss.Holder.Pid()
	}
	ss.Mu.Unlock()
	return map[string]any{
		"workspace_session_id": rec.WorkspaceSessionID, "agent": rec.Agent, "network_profile": rec.NetworkProfile,
		"finalize_policy": rec.FinalizePolicy, "state": rec.State, "created_at": rec.CreatedAt,
		"base_revision": rec.BaseRevision, "overlay_driver": rec.OverlayDriver,
		"active_command_session_ids": ss.Running(), "upper_bytes": DirBytes(ctx, ss.Upper()), "holder_pid": pid,
		"forwards": ss.ForwardObjects(),
	}
}

// RemoveTree deletes a directory that may contain the mode-000 work dir the
// kernel overlay leaves behind, and entries a session made (so never by
// joined path: layers.RemoveAll). Best effort: callers that must know check
// that the directory is gone (removeSandbox) or call RemoveTreeErr.
func RemoveTree(dir string) {
	_ = RemoveTreeErr(context.Background(), dir)
}

// treeSelf is the supervisor's binary (SetTreeSelf), which RemoveTreeErr
// starts in its rmtree mode; "" leaves subordinate-ID trees in place.
var treeSelf atomic.Pointer[string]

// SetTreeSelf names the supervisor's binary for RemoveTreeErr; the
// supervisor calls it once at start. It is process-wide because the trees
// it serves are removed from package-level paths (teardown in the
// background, boot recovery, sandbox removal).
func SetTreeSelf(self string) { treeSelf.Store(&self) }

// RemoveTreeErr is RemoveTree that reports whether dir is gone. A session
// with sandbox.id_mapping subid may leave entries owned by its subordinate
// IDs (chown -R 1000:1000 d): the supervisor may not remove what is inside
// such a directory, so what is left is removed again inside a user
// namespace mapped as the session's was (nsholder.RemoveMapped), where the
// supervisor's user is root over those IDs.
func RemoveTreeErr(ctx context.Context, dir string) error {
	err := layers.RemoveAll(dir)
	if _, serr := os.Lstat(dir); errors.Is(serr, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = fmt.Errorf("remove %s: still present", dir)
	}
	self := treeSelf.Load()
	if self == nil || *self == "" {
		return err
	}
	if merr := nsholder.RemoveMapped(ctx, *self, filepath.Clean(dir)); merr != nil {
		return fmt.Errorf("%w (and with subordinate IDs mapped: %w)", err, merr)
	}
	return nil
}

// DirBytes sums the sizes of the regular files below dir, a tree a session
// controls (best effort; symlinks are never followed, see walkUpperTree).
func DirBytes(ctx context.Context, dir string) int64 {
	var n int64
	_ = WalkUpperTree(ctx, dir, func(_ string, fi fs.FileInfo) error {
		if fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// WalkUpperTree walks a tree a session controls (its upper dir, a recovery
// artifact) through a layers.Root: descriptor-relative, never following a
// symlink, so a directory the session swaps for a symlink to a host
// directory cannot lead the supervisor there.
func WalkUpperTree(ctx context.Context, dir string, fn layers.WalkFunc) error {
	root, err := layers.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	return root.Walk(ctx, fn)
}

// HolderPid is the session's live holder PID, 0 without a holder.
func (ss *Session) HolderPid() int {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	if ss.Holder == nil {
		return 0
	}
	return ss.Holder.Pid()
}

func (ss *Session) Record() SessionRecord {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	return ss.Rec
}

// Network profiles.
const (
	NetShared   = "shared"
	NetIsolated = "isolated"
	NetOffline  = "offline"
)

// maxForwards is the per-session forward limit (§3.6).
const MaxForwards = 16

// ForwardObjects lists a session's forwards by target port.
func (ss *Session) ForwardObjects() []map[string]any {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	ports := make([]int, 0, len(ss.Forwards))
	for p := range ss.Forwards {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	out := make([]map[string]any, 0, len(ports))
	for _, p := range ports {
		out = append(out, ss.Forwards[p].Object())
	}
	return out
}

// CloseForwards ends every forward of a session (§5.7).
func (ss *Session) CloseForwards() {
	ss.Mu.Lock()
	fs := ss.Forwards
	ss.Forwards = nil
	ss.Mu.Unlock()
	for _, f := range fs {
		f.Close()
	}
}

// LoopbackDialer reaches 127.0.0.1:port inside a session's own network
// namespace.
type LoopbackDialer interface {
	DialLoopback(ctx context.Context, port int, timeout time.Duration) (net.Conn, error)
}

// AddForward returns the session's forward to target, opening its
// listener when there is none yet.
func (ss *Session) AddForward(target int) (*Forward, bool, *catalog.Error) {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	if ss.Gone {
		return nil, false, NotFoundSession(ss.ID())
	}
	if f := ss.Forwards[target]; f != nil {
		return f, true, nil
	}
	if len(ss.Forwards) >= MaxForwards {
		return nil, false, catalog.Errorf(catalog.ServerBusy, "forward limit reached for workspace session %s", ss.ID()).
			With("max_forwards", MaxForwards).With("workspace_session_id", ss.ID())
	}
	f, err := ListenForward(target)
	if err != nil {
		return nil, false, catalog.Errorf(catalog.OperationFailed, "forward_port: %v", err)
	}
	if ss.Forwards == nil {
		ss.Forwards = map[int]*Forward{}
	}
	ss.Forwards[target] = f
	return f, false, nil
}

// FileHolder is the holder's file operations, resolved beneath /workspace
// without following symlinks.
type FileHolder interface {
	Lstat(ctx context.Context, path string) (nsholder.FileInfo, error)
	ReadFile(ctx context.Context, path string, max int64) ([]byte, nsholder.FileInfo, error)
	ReadDir(ctx context.Context, path string) ([]nsholder.FileInfo, error)
	WriteFile(ctx context.Context, path string, data []byte, mode *fs.FileMode) (created bool, err error)
}

// Command statuses (§3.3).
const (
	CmdRunning   = "running"
	CmdOK        = "ok"
	CmdError     = "error"
	CmdTimedOut  = "timed_out"
	CmdCancelled = "cancelled"
)

// CommandRunner starts and signals a session's commands in its holder.
type CommandRunner interface {
	Spawn(ctx context.Context, req nsholder.SpawnRequest) (*nsholder.Process, error)
	// Signal sends sig to every process of command id.
	Signal(ctx context.Context, id uint64, sig syscall.Signal) error
}

// CommandRecord is the persisted command (§6.7). Extra holds the optional
// terminal fields (publish, publish_rejected, finalization_failed, …) that
// are copied into every output object.
type CommandRecord struct {
	CommandSessionID   string         `json:"command_session_id"`
	SandboxID          string         `json:"sandbox_id"`
	Cmd                string         `json:"cmd"`
	WorkspaceSessionID string         `json:"workspace_session_id"`
	Status             string         `json:"status"`
	ExitCode           *int           `json:"exit_code"`
	StartedAt          string         `json:"started_at"`
	EndedAt            *string        `json:"ended_at"`
	Interrupted        bool           `json:"interrupted"`
	InterruptReason    string         `json:"interrupt_reason,omitempty"`
	Extra              map[string]any `json:"extra,omitempty"`
	StartedUnixMs      int64          `json:"started_unix_ms"`
	EndedUnixMs        int64          `json:"ended_unix_ms,omitempty"`
}

// Command is a running or retained command. done is closed when it is terminal.
type Command struct {
	Mu         sync.Mutex
	Rec        CommandRecord
	Dir        string
	Transcript *Transcript
	Proc       *nsholder.Process
	Session    *Session
	Cursor     int
	Exit       *syscall.WaitStatus // root process status, from the holder
	Forced     string              // timed_out or cancelled: we ended it
	Final      bool                // finalizing: exited, implicit session being finalized
	Done       chan struct{}
	ReadEOF    chan struct{} // closed when the PTY reader stopped
	Timer      *time.Timer
}

func (c *Command) Terminal() bool {
	select {
	case <-c.Done:
		return true
	default:
		return false
	}
}

// YieldOutput returns the rows since the yield cursor and advances it.
func (c *Command) YieldOutput(start time.Time) map[string]any {
	c.Mu.Lock()
	cursor := c.Cursor
	c.Mu.Unlock()
	rows, first, end, trunc := c.Transcript.Since(cursor)
	c.Mu.Lock()
	if end > c.Cursor {
		c.Cursor = end
	}
	c.Mu.Unlock()
	return c.Output(rows, first, end, trunc, start)
}

// Output is the command output object (§3.3).
func (c *Command) Output(rows []string, first, end, truncBefore int, start time.Time) map[string]any {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	r := c.Rec
	text := strings.Join(rows, "\n")
	total := time.Since(time.UnixMilli(r.StartedUnixMs)).Seconds()
	if r.EndedUnixMs != 0 {
		total = float64(r.EndedUnixMs-r.StartedUnixMs) / 1000
	}
	status, exit := r.Status, any(r.ExitCode)
	if status == CmdRunning {
		exit = nil
		if c.Final && c.Exit != nil {
			exit = c.Exit.ExitStatus()
		}
	}
	out := map[string]any{
		"status": status, "exit_code": exit, "wall_time_seconds": time.Since(start).Seconds(),
		"command_total_time_seconds": total, "start_offset": first, "end_offset": end, "total_lines": c.Transcript.Total(),
		"original_token_count": TokenCount(text), "output": text,
		"command_session_id": r.CommandSessionID, "workspace_session_id": r.WorkspaceSessionID,
	}
	if truncBefore > 0 {
		out["truncated_before"] = truncBefore
	}
	if c.Final && status == CmdRunning {
		out["finalizing"] = true
	}
	if r.Interrupted {
		out["interrupted"], out["interrupt_reason"] = true, r.InterruptReason
	}
	if err := c.Transcript.Err(); err != nil {
		// The rows above are real but live only in memory (transcript.go).
		out["transcript_lost"], out["transcript_error"] = true, err.Error()
	}
	for k, v := range r.Extra {
		out[k] = v
	}
	return out
}

// occupants are a sandbox's live sessions and commands, guarded by the
// sandbox's Mu.
type Tables struct {
	Sessions      map[string]*Session // live sessions
	Commands      map[string]*Command // running and retained terminal commands
	TerminalOrder []string            // retained terminal commands, oldest first
	Evicted       map[string]bool     // IDs evicted from retention
	// Admission slots reserved by requests still starting their command
	// or session (admission.go).
	PendingCommands, PendingSessions int
	Spare                            SpareHolder // the next implicit session's holder (spare.go)
}

func NewTables() *Tables {
	return &Tables{Sessions: map[string]*Session{}, Commands: map[string]*Command{}, Evicted: map[string]bool{}}
}

// Dial connects to 127.0.0.1:port inside a session with its own
// network namespace, through its holder. It is the one way into such a
// session, for forward_port's listeners and the HTTP /forward/isolated=…
// routes alike; timeout is http.forward.connect_timeout_s.
func (ss *Session) Dial(ctx context.Context, port int, timeout time.Duration) (net.Conn, error) {
	ss.Mu.Lock()
	h, gone := ss.Holder, ss.Gone
	ss.Mu.Unlock()
	if gone || h == nil {
		return nil, fmt.Errorf("dial %s:%d: %w", ss.ID(), port, nsholder.ErrExited)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+time.Second)
	defer cancel()
	c, err := h.DialLoopback(ctx, port, timeout)
	if err != nil {
		return nil, fmt.Errorf("dial %s:%d: %w", ss.ID(), port, err)
	}
	return c, nil
}

// ListSessions is list_workspace_sessions (§3.5): sb's live sessions in
// creation order.
func ListSessions(ctx context.Context, sb *Sandbox) map[string]any {
	sb.Mu.Lock()
	all := make([]*Session, 0, len(sb.Work.Sessions))
	for _, ss := range sb.Work.Sessions {
		all = append(all, ss)
	}
	sb.Mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].ID() < all[j].ID() }) // IDs sort by creation time
	out := make([]map[string]any, 0, len(all))
	for _, ss := range all {
		out = append(out, ss.Object(ctx))
	}
	return map[string]any{"workspace_sessions": out}
}
