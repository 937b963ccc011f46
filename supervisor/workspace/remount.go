package workspace

// Remount: the one way a live session moves onto another lower chain
// (issue 19): the squash's remount sweep (§8.6 step 4) moves sessions onto
// the squashed chain; sync and publish-keep move them onto a new head with
// a new upper.
//
// Decisions:
//
//   - Order (no instant without a pin, contract §8.6): lease the target
//     first, swap the holder, persist the record naming the new lease, then
//     release the old lease, which garbage collects the layers nobody else
//     holds. A crash before the persisted record leaves the old lease in the
//     database and its layers on disk (the next start restores the session
//     on the old chain, which the squash did not change in content); a
//     crash after it leaves the old layers unpinned, and the start-up sweep
//     removes them.
//   - The caller holds ss.Gate, so no command starts, no file operation,
//     publish or destroy runs during the move. Request handlers take the
//     sandbox gate (a try-read-lock) before a session's gate and the squash
//     does the same, so the sweep cannot deadlock with a publish or exec:
//     it waits for that session's gate (LockGate, with the request's
//     context) while the sandbox gate is only read-held.
//   - The swap itself runs on a context that is not cancelled with the
//     request: the holder bounds it (freeze budget), and a swap abandoned
//     half-way would leave the session's chain unknown to the supervisor.
//   - BaseRevision becomes target.Revision(). For a squash, target is the
//     session's old base with the substitutions applied, so its manifest
//     version stays the old one (only the root hash and layer count
//     change): attribution reads the audit "as of" that version, and a
//     squash changes no content, so blame and file activity stay as they
//     were.
//   - A session without a holder (restore_failed) has nothing to swap: its
//     records move, and its next holder starts over the new chain.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
)

// Swapper is a holder's lower-chain swap (*nsholder.Client).
type Swapper interface {
	SwapLower(ctx context.Context, req nsholder.SwapRequest) error
}

// LockGate takes ss.Gate, or gives up when ctx ends (then the caller holds
// nothing). Gate holders are short (spawn, file operation, publish,
// destroy), so waiting is normally brief.
func (ss *Session) LockGate(ctx context.Context) error {
	if ss.Gate.TryLock() {
		return nil
	}
	got := make(chan struct{})
	go func() {
		ss.Gate.Lock()
		close(got)
	}()
	select {
	case <-got:
		return nil
	case <-ctx.Done():
		go func() {
			<-got
			ss.Gate.Unlock()
		}()
		return fmt.Errorf("workspace session %s: wait for its gate: %w", ss.ID(), ctx.Err())
	}
}

// Remount moves the live session ss of sb onto the chain of target (a
// manifest whose layers are in sb's stack). The caller holds ss.Gate.
// upper is "" to keep the session's upper, or ss.Upper() after a new upper
// directory was renamed into place there (sync, publish with keep): it is
// nsholder.SwapRequest.Upper, and the holder moves onto it together with
// the new lowers.
//
// On error nothing changed: the target lease is released and the session
// still runs on, and is recorded on, its old chain (and the holder on the
// upper it had). Errors keep the holder's causes for errors.Is:
// nsholder.ErrSwapPinned (a *PinnedError), ErrFreezeTimeout,
// ErrSwapUnsupported, fs.ErrInvalid (e.g. upper is not the session's),
// *ChainDepthError (a target deeper than the session's chain and than
// runtime.workspace.max_chain_depth). The
// exception is an error wrapping ErrRemountUnsettled: the swap happened but
// the record could not be written (and, with upper "", not undone either),
// so holder and persisted record disagree; with upper set the session is
// left on the new chain in memory, the old lease kept, for the caller to
// settle (the sweep reports it faulty and destroys the session).
//
// A caller that froze the session (nsholder Client.Freeze) keeps it
// frozen across the swap and thaws it afterwards.
func (h *Holders) Remount(ctx context.Context, sb *Sandbox, ss *Session, target layers.Manifest, upper string) error {
	if len(target.Layers) == 0 {
		return fmt.Errorf("remount %s: empty target chain", ss.ID())
	}
	if ss.IsGone() {
		return NotFoundSession(ss.ID())
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("remount %s: %w", ss.ID(), err)
	}
	ss.Mu.Lock()
	hl, oldLease, oldRec := ss.Holder, ss.Lease, ss.Rec
	ss.Mu.Unlock()
	from := ss.Base()
	if len(target.Layers) > len(from.Layers) {
		// Deeper than the limit: refused before the holder tries (the
		// kernel overlay would refuse past 500 lowers with a bare EINVAL).
		// A shorter chain is always taken (a squash's sweep), even when
		// still too deep for a lowered limit.
		if err := checkDepth(h.Cfg, len(target.Layers), "the target chain"); err != nil {
			return fmt.Errorf("remount %s: %w", ss.ID(), err)
		}
	}

	lease := sb.Stack.AcquireAt(target, "workspace-session:"+ss.ID())
	sctx := context.WithoutCancel(ctx)
	budget := time.Duration(h.Cfg.Runtime.Layerstack.FreezeBudgetS * float64(time.Second))
	swap := func(m layers.Manifest) error {
		if hl == nil {
			return nil
		}
		err := hl.SwapLower(sctx, nsholder.SwapRequest{Lowers: sb.Stack.LayerDirs(m), Upper: upper, FreezeBudget: budget})
		if errors.Is(err, nsholder.ErrSwapInvalidate) {
			// Swapped; only the kernel's caches may be stale for their
			// timeout (a minute at most), which no data depends on.
			h.Log.Warn("remount: kernel cache invalidation refused", "workspace_session_id", ss.ID(), "err", err)
			return nil
		}
		return err
	}
	sp, sctx2 := h.spanCtx(sctx, sb, "workspace_session.remount", map[string]any{"workspace_session_id": ss.ID(),
		"from": from.Revision(), "to": target.Revision(), "lowers": len(target.Layers)})
	if err := swap(target); err != nil {
		sp.Done(err, nil)
		_, _ = lease.Release()
		return fmt.Errorf("remount %s: %w", ss.ID(), err)
	}

	ss.Mu.Lock()
	ss.Rec.BaseRevision = target.Revision()
	ss.Rec.Lease = LeaseRecord{LeaseID: lease.ID(), Layers: target.Layers}
	ss.Lease = lease
	rec := ss.Rec
	ss.Mu.Unlock()
	if err := h.DB.Put(sctx2, statedb.KindSession, rec.WorkspaceSessionID, sb.Rec.ID, rec); err != nil {
		if upper != "" {
			// The holder serves the new upper, which the old chain does
			// not go with: no way back from here. The old lease stays
			// (the persisted record still names it), for the caller to
			// settle.
			sp.Done(err, nil)
			return fmt.Errorf("remount %s: persist the record: %w", ss.ID(), errors.Join(err, ErrRemountUnsettled))
		}
		// The record still names the old chain: go back to it, so memory,
		// holder and database agree again.
		ss.Mu.Lock()
		ss.Rec.BaseRevision, ss.Rec.Lease, ss.Lease = oldRec.BaseRevision, oldRec.Lease, oldLease
		ss.Mu.Unlock()
		if berr := swap(from); berr != nil {
			sp.Done(err, map[string]any{"swap_back_error": berr.Error()})
			// The target lease stays: the holder may serve its layers.
			return fmt.Errorf("remount %s: persist the record: %w; swap back: %w", ss.ID(), errors.Join(err, ErrRemountUnsettled), berr)
		}
		sp.Done(err, nil)
		_, _ = lease.Release()
		return fmt.Errorf("remount %s: persist the record: %w", ss.ID(), err)
	}
	var removed []string
	if oldLease != nil {
		var err error
		if removed, err = oldLease.Release(); err != nil {
			h.Log.Warn("remount: release the old lease", "workspace_session_id", ss.ID(), "err", err)
		}
	}
	sp.Done(nil, map[string]any{"layers_removed": len(removed)})
	h.event(sctx2, sb, "lease.released", map[string]any{"workspace_session_id": ss.ID(), "revision": oldRec.BaseRevision, "reason": "remount"})
	h.event(sctx2, sb, "lease.acquired", map[string]any{"workspace_session_id": ss.ID(), "revision": rec.BaseRevision, "reason": "remount"})
	return nil
}

// ErrRemountUnsettled marks a Remount failure after which the session's
// holder may serve either chain.
var ErrRemountUnsettled = errors.New("remount left the session's chain unknown")
