package supervisor

import (
	"context"
	"syscall"
	"time"
)

// stopSessions ends every session of a sandbox: running commands are
// signalled (SIGTERM, exit grace, SIGKILL). With destroy, every session is
// destroyed (destroy_sandbox: nothing is published); without, implicit
// sessions are finalized and explicit ones left persisted with their holder
// stopped (supervisor shutdown, §4.5).
func (s *Supervisor) stopSessions(ctx context.Context, sb *sandbox, destroy bool, progress func(string)) {
	sb.Mu.Lock()
	all := make([]*session, 0, len(sb.Work.Sessions))
	for _, ss := range sb.Work.Sessions {
		all = append(all, ss)
	}
	sb.Mu.Unlock()
	grace := time.Duration(s.cfg.Runtime.Workspace.ExitGraceS * float64(time.Second))
	for _, ss := range all {
		progress("stopping workspace session " + ss.ID())
		for _, id := range ss.Running() {
			ss.Mu.Lock()
			cmd := ss.Ledger[id]
			ss.Mu.Unlock()
			if cmd != nil {
				s.interrupt(sb, ss, cmd, grace)
			}
		}
		switch {
		case destroy:
			// The gate waits for a background finalization of this
			// session to end; then there is nothing left to destroy.
			ss.Gate.Lock()
			if !ss.IsGone() {
				_, _ = s.destroySession(ctx, sb, ss, grace)
			}
			ss.Gate.Unlock()
		case ss.Implicit():
			s.finalizeImplicit(ctx, sb, ss, nil)
		default:
			ss.Mu.Lock()
			h := ss.Holder
			ss.Holder = nil
			ss.Mu.Unlock()
			if h != nil {
				_ = h.Close(grace)
			}
		}
	}
}

// interrupt ends a running command because its session is going away: it
// is reported with interrupted:true (supervisor_restart).
func (s *Supervisor) interrupt(sb *sandbox, ss *session, cmd *command, grace time.Duration) {
	ss.Mu.Lock()
	h := ss.Holder
	delete(ss.Ledger, cmd.Rec.CommandSessionID)
	ss.Mu.Unlock()
	if h != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = h.Signal(ctx, cmd.Proc.ID, syscall.SIGTERM)
		select {
		case <-cmd.Done:
		case <-time.After(grace):
			_ = h.Signal(ctx, cmd.Proc.ID, syscall.SIGKILL)
		}
		cancel()
	}
	s.cmds.Finish(sb, cmd, "supervisor_restart", nil)
}

// shutdown stops every sandbox's sessions when the supervisor exits.
func (s *Supervisor) shutdown(ctx context.Context) {
	s.mu.Lock()
	all := make([]*sandbox, 0, s.sandboxes.Len())
	for _, sb := range s.sandboxes.All() {
		all = append(all, sb)
	}
	s.mu.Unlock()
	for _, sb := range all {
		s.stopSessions(ctx, sb, false, func(string) {})
	}
}
