package workspace

import (
	"context"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/nsholder"
)

// SpareHolder is a sandbox's holder started ahead of its next implicit
// session (#18): an implicit exec_command creates a session, and starting
// its holder (the supervisor binary's start, its namespaces) was most of
// what such a command cost. The session that takes the spare only sends it
// its Config. The next spare is started when that session ends (after its
// command's reply, RefillSpare), not while its command runs: on a small
// machine a holder's start competes with the command for the CPU.
// Guarded by the sandbox's Mu (it lives in sb.Work).
type SpareHolder struct {
	spare    *nsholder.Spare
	starting chan struct{} // non-nil while a refill is under way; closed when it ends
	closed   bool          // the sandbox's sessions were stopped: no more spares
}

// takeSpare removes and returns sb's spare if cfg's session can use it; a
// spare that does not fit is closed. A spare still starting is waited for
// (bounded by ctx): it is further along than a holder started now. Without
// a spare, a refill is started at once (this session pays a holder's start
// anyway); with one, when the session ends.
func (h *Holders) takeSpare(ctx context.Context, sb *Sandbox, cfg nsholder.Config) *nsholder.Spare {
	sb.Mu.Lock()
	starting := sb.Work.Spare.starting
	sb.Mu.Unlock()
	if starting != nil {
		select {
		case <-starting:
		case <-ctx.Done():
		}
	}
	sb.Mu.Lock()
	sp := sb.Work.Spare.spare
	sb.Work.Spare.spare = nil
	sb.Mu.Unlock()
	if sp != nil && !sp.Fits(cfg) {
		sp.Close()
		sp = nil
	}
	if sp == nil {
		h.refillSpare(sb, cfg.IDMapping, cfg.IsolatedNetwork)
	}
	return sp
}

// RefillSpare starts sb's next spare for an implicit session (shared
// network) in the background, unless it has one or one is starting.
func (h *Holders) RefillSpare(sb *Sandbox) {
	h.refillSpare(sb, h.Cfg.Sandbox.IDMapping, false)
}

// refillSpare starts a new spare in the background unless sb has one, one
// is starting, or its sessions were stopped.
func (h *Holders) refillSpare(sb *Sandbox, idMapping string, isolated bool) {
	sb.Mu.Lock()
	w := &sb.Work.Spare
	if w.spare != nil || w.starting != nil || w.closed {
		sb.Mu.Unlock()
		return
	}
	done := make(chan struct{})
	w.starting = done
	sb.Mu.Unlock()
	started := sb.GoBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(h.Cfg.Runtime.Workspace.SetupTimeoutS*float64(time.Second)))
		defer cancel()
		sp, err := nsholder.StartSpare(ctx, h.Self, idMapping, isolated)
		sb.Mu.Lock()
		w.starting = nil
		keep := err == nil && w.spare == nil && !w.closed
		if keep {
			w.spare = sp
		}
		sb.Mu.Unlock()
		close(done)
		if err != nil {
			h.Log.Warn("start a spare holder", "sandbox", sb.Rec.ID, "err", err)
		} else if !keep {
			sp.Close()
		}
	})
	if !started {
		sb.Mu.Lock()
		w.starting = nil
		sb.Mu.Unlock()
		close(done)
	}
}

// CloseSpare kills sb's spare holder and starts no other: its sessions are
// being stopped (destroy, shutdown).
func CloseSpare(sb *Sandbox) {
	sb.Mu.Lock()
	sp := sb.Work.Spare.spare
	sb.Work.Spare.spare, sb.Work.Spare.closed = nil, true
	sb.Mu.Unlock()
	if sp != nil {
		sp.Close()
	}
}

// SparePid is the pid of sb's spare holder, 0 when it has none.
func SparePid(sb *Sandbox) int {
	sb.Mu.Lock()
	sp := sb.Work.Spare.spare
	sb.Mu.Unlock()
	if sp == nil {
		return 0
	}
	return sp.Pid()
}
