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
// its Config; a new spare is started in the background for the next one.
// Guarded by the sandbox's Mu (it lives in sb.Work).
type SpareHolder struct {
	spare    *nsholder.Spare
	starting bool // a refill is under way
	closed   bool // the sandbox's sessions were stopped: no more spares
}

// takeSpare removes and returns sb's spare if cfg's session can use it; a
// spare that does not fit is closed. Either way a refill is started.
func (h *Holders) takeSpare(sb *Sandbox, cfg nsholder.Config) *nsholder.Spare {
	sb.Mu.Lock()
	sp := sb.Work.Spare.spare
	sb.Work.Spare.spare = nil
	sb.Mu.Unlock()
	if sp != nil && !sp.Fits(cfg) {
		sp.Close()
		sp = nil
	}
	h.refillSpare(sb, cfg.IDMapping, cfg.IsolatedNetwork)
	return sp
}

// refillSpare starts a new spare in the background unless sb has one, one
// is starting, or its sessions were stopped.
func (h *Holders) refillSpare(sb *Sandbox, idMapping string, isolated bool) {
	sb.Mu.Lock()
	w := &sb.Work.Spare
	if w.spare != nil || w.starting || w.closed {
		sb.Mu.Unlock()
		return
	}
	w.starting = true
	sb.Mu.Unlock()
	started := sb.GoBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(h.Cfg.Runtime.Workspace.SetupTimeoutS*float64(time.Second)))
		defer cancel()
		sp, err := nsholder.StartSpare(ctx, h.Self, idMapping, isolated)
		sb.Mu.Lock()
		w.starting = false
		keep := err == nil && w.spare == nil && !w.closed
		if keep {
			w.spare = sp
		}
		sb.Mu.Unlock()
		if err != nil {
			h.Log.Warn("start a spare holder", "sandbox", sb.Rec.ID, "err", err)
		} else if !keep {
			sp.Close()
		}
	})
	if !started {
		sb.Mu.Lock()
		w.starting = false
		sb.Mu.Unlock()
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
