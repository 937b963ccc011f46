package supervisor

import (
	"sync/atomic"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// Admission (§6.7, §13) is check-and-reserve under one supervisor-wide lock:
// a request that passes the caps takes a slot before it spawns anything, so
// concurrent requests can never together exceed a cap. The slot counts as a
// running command (or live session) until the real one enters its map, in
// the same critical section of sb.Mu that consumes the slot, or until the
// request fails and releases it. Counts taken under admitMu can only fall
// or stay equal meanwhile (only admission raises them), so a check is never
// too lenient.

type slotKind int

const (
	slotCommand slotKind = iota
	slotSession
)

// slot is one reserved admission.
type slot struct {
	sb   *sandbox
	kind slotKind
	gone atomic.Bool // consumed or released
}

func pendingSlots(sb *sandbox, k slotKind) *int {
	if k == slotCommand {
		return &sb.Work.PendingCommands
	}
	return &sb.Work.PendingSessions
}

// release gives an unused slot back (a failed request); it is a no-op once
// the slot was consumed.
func (sl *slot) release() {
	if sl == nil {
		return
	}
	sl.sb.Mu.Lock()
	sl.releaseLocked()
	sl.sb.Mu.Unlock()
}

// releaseLocked is release for a caller holding sb.Mu: the caller that puts
// the command or session into its map consumes the slot in the same step.
func (sl *slot) releaseLocked() {
	if sl == nil || !sl.gone.CompareAndSwap(false, true) {
		return
	}
	*pendingSlots(sl.sb, sl.kind)--
}

func (s *Supervisor) allSandboxes() []*sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := make([]*sandbox, 0, s.sandboxes.Len())
	for _, sb := range s.sandboxes.All() {
		all = append(all, sb)
	}
	return all
}

// admittedCommands is the sandbox's running commands plus reserved slots.
func admittedCommands(sb *sandbox) int {
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
func admittedSessions(sb *sandbox) int {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	return len(sb.Work.Sessions) + sb.Work.PendingSessions
}

// admitCommand reserves a command slot in sb or says which cap is full.
func (s *Supervisor) admitCommand(sb *sandbox) (*slot, *catalog.Error) {
	return s.admit(sb, slotCommand, admittedCommands, "command admission refused", "max_active_commands",
		s.cfg.Runtime.Command.MaxActivePerSandbox, s.cfg.Supervisor.MaxActiveCommands)
}

// admitSession reserves a session slot in sb or says which cap is full.
func (s *Supervisor) admitSession(sb *sandbox) (*slot, *catalog.Error) {
	return s.admit(sb, slotSession, admittedSessions, "workspace session limit reached", "max_workspace_sessions",
		s.cfg.Runtime.Workspace.MaxSessionsPerSandbox, s.cfg.Supervisor.MaxSessions)
}

// admit checks the per-sandbox cap, then the supervisor-wide one, and
// reserves a slot of kind k, all under admitMu; count is what a sandbox
// already holds of that kind (running or live, plus reserved).
func (s *Supervisor) admit(sb *sandbox, k slotKind, count func(*sandbox) int, msg, capField string, perSandbox, perSupervisor int) (*slot, *catalog.Error) {
	s.admitMu.Lock()
	defer s.admitMu.Unlock()
	if count(sb) >= perSandbox {
		return nil, catalog.Errorf(catalog.ServerBusy, "%s", msg).With(capField, perSandbox).With("limit_scope", "sandbox")
	}
	total := 0
	for _, o := range s.allSandboxes() {
		total += count(o)
	}
	if total >= perSupervisor {
		return nil, catalog.Errorf(catalog.ServerBusy, "%s", msg).With(capField, perSupervisor).With("limit_scope", "supervisor")
	}
	return s.reserve(sb, k), nil
}

func (s *Supervisor) reserve(sb *sandbox, k slotKind) *slot {
	sb.Mu.Lock()
	*pendingSlots(sb, k)++
	sb.Mu.Unlock()
	return &slot{sb: sb, kind: k}
}
