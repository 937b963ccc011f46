package workspace

import (
	"sync"
	"sync/atomic"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
)

// Admission (§6.7, §13) is check-and-reserve under one supervisor-wide lock:
// a request that passes the caps takes a slot before it spawns anything, so
// concurrent requests can never together exceed a cap. The slot counts as a
// running command (or live session) until the real one enters its map, in
// the same critical section of sb.Mu that consumes the slot, or until the
// request fails and releases it. Counts taken under Admission's lock can only fall
// or stay equal meanwhile (only admission raises them), so a check is never
// too lenient.

// Admission holds the supervisor-wide admission lock and the caps.
type Admission struct {
	mu  sync.Mutex
	cfg *config.Config
	// all lists every registered sandbox.
	all func() []*Sandbox
}

// NewAdmission admits against cfg's caps over the sandboxes all returns.
func NewAdmission(cfg *config.Config, all func() []*Sandbox) *Admission {
	return &Admission{cfg: cfg, all: all}
}

type slotKind int

const (
	slotCommand slotKind = iota
	slotSession
)

// Slot is one reserved admission.
type Slot struct {
	sb   *Sandbox
	kind slotKind
	gone atomic.Bool // consumed or released
}

func pendingSlots(sb *Sandbox, k slotKind) *int {
	if k == slotCommand {
		return &sb.Work.PendingCommands
	}
	return &sb.Work.PendingSessions
}

// Release gives an unused slot back (a failed request); it is a no-op once
// the slot was consumed.
func (sl *Slot) Release() {
	if sl == nil {
		return
	}
	sl.sb.Mu.Lock()
	sl.ReleaseLocked()
	sl.sb.Mu.Unlock()
}

// ReleaseLocked is Release for a caller holding sb.Mu: the caller that puts
// the command or session into its map consumes the slot in the same step.
func (sl *Slot) ReleaseLocked() {
	if sl == nil || !sl.gone.CompareAndSwap(false, true) {
		return
	}
	*pendingSlots(sl.sb, sl.kind)--
}

// admittedCommands is the sandbox's running commands plus reserved slots.
func admittedCommands(sb *Sandbox) int {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	n := sb.Work.PendingCommands
	for _, c := range sb.Work.Commands {
		if !c.Terminal() {
			n++
		}
	}
	return n
}

// admittedSessions is the sandbox's live sessions plus reserved slots.
func admittedSessions(sb *Sandbox) int {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	return len(sb.Work.Sessions) + sb.Work.PendingSessions
}

// Command reserves a command slot in sb or says which cap is full.
func (a *Admission) Command(sb *Sandbox) (*Slot, *catalog.Error) {
	return a.admit(sb, slotCommand, admittedCommands, "command admission refused", "max_active_commands",
		a.cfg.Runtime.Command.MaxActivePerSandbox, a.cfg.Supervisor.MaxActiveCommands)
}

// Session reserves a session slot in sb or says which cap is full.
func (a *Admission) Session(sb *Sandbox) (*Slot, *catalog.Error) {
	return a.admit(sb, slotSession, admittedSessions, "workspace session limit reached", "max_workspace_sessions",
		a.cfg.Runtime.Workspace.MaxSessionsPerSandbox, a.cfg.Supervisor.MaxSessions)
}

// admit checks the per-sandbox cap, then the supervisor-wide one, and
// reserves a slot of kind k, all under Admission's lock; count is what a sandbox
// already holds of that kind (running or live, plus reserved).
func (a *Admission) admit(sb *Sandbox, k slotKind, count func(*Sandbox) int, msg, capField string, perSandbox, perSupervisor int) (*Slot, *catalog.Error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if count(sb) >= perSandbox {
		return nil, catalog.Errorf(catalog.ServerBusy, "%s", msg).With(capField, perSandbox).With("limit_scope", "sandbox")
	}
	total := 0
	for _, o := range a.all() {
		total += count(o)
	}
	if total >= perSupervisor {
		return nil, catalog.Errorf(catalog.ServerBusy, "%s", msg).With(capField, perSupervisor).With("limit_scope", "supervisor")
	}
	return a.reserve(sb, k), nil
}

func (a *Admission) reserve(sb *Sandbox, k slotKind) *Slot {
	sb.Mu.Lock()
	*pendingSlots(sb, k)++
	sb.Mu.Unlock()
	return &Slot{sb: sb, kind: k}
}
