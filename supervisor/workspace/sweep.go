package workspace

import (
	"context"
	"errors"
	"strings"

	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
)

// SweepRemount is one session's step of the squash's remount sweep (§8.6
// step 4, A4): it takes the session's gate (waiting with ctx), moves the
// session onto its base with res's substitutions with Remount and names the outcome in the
// contract's words. Decisions:
//
//   - A session that is finalizing or restoring when the sweep reaches it
//     is left "leased" with reason "session_state:<state>": finalization
//     ends it anyway, and a start-up restore runs without its gate.
//   - Pins map to the contract's reasons by the first pin's kind: cwd and
//     root → pinned:cwd_pinned_workspace, fd → pinned:fd_pinned_workspace,
//     mapping → pinned:mapped_file_pinned_workspace; a process the holder
//     could not inspect counts as a cwd pin. class_detail is the holder's
//     message naming the processes and their commands.
//   - ErrSwapUnsupported → "unsupported:<driver>_lower_swap" with the
//     holder's reason in class_detail.
//   - A holder that died meanwhile, or a request given up before the swap
//     began, leaves the session "leased" (quiesce_failed:holder_exited,
//     quiesce_failed:cancelled): nothing changed, and a dead holder is
//     restarted over the recorded chain by the holder watch.
//   - Anything else is "faulty" and the session is destroyed (contract): the
//     holder reported a failure it does not classify, so whether its
//     /workspace still matches the recorded chain is not known.
func (h *Holders) SweepRemount(ctx context.Context, sb *Sandbox, ss *Session, res layers.SquashResult) sandbox.RemountOutcome {
	if err := ss.LockGate(ctx); err != nil {
		return sandbox.RemountOutcome{Disposition: "leased", Reason: "quiesce_failed:gate_wait", ClassDetail: sweepDetail(err.Error())}
	}
	defer ss.Gate.Unlock()
	if ss.IsGone() {
		return sandbox.RemountOutcome{Disposition: "session_gone"}
	}
	if st := ss.State(); st == SessFinalizing || st == SessRestoring {
		return sandbox.RemountOutcome{Disposition: "leased", Reason: "session_state:" + st}
	}
	// Under the gate: nothing else moves the session meanwhile.
	target, changed := res.Substitute(ss.Base())
	if !changed {
		return sandbox.RemountOutcome{Disposition: "identity"}
	}
	err := h.Remount(ctx, sb, ss, target, "")
	if err == nil {
		return sandbox.RemountOutcome{Disposition: "remounted"}
	}
	var pinned *nsholder.PinnedError
	switch {
	case errors.As(err, &pinned):
		return sandbox.RemountOutcome{Disposition: "leased", Reason: PinReason(pinned.Pins), ClassDetail: sweepDetail(pinned.Error())}
	case errors.Is(err, nsholder.ErrFreezeTimeout):
		return sandbox.RemountOutcome{Disposition: "leased", Reason: "quiesce_failed:freeze_timeout", ClassDetail: sweepDetail(err.Error())}
	case errors.Is(err, nsholder.ErrSwapUnsupported):
		return sandbox.RemountOutcome{Disposition: "leased", Reason: "unsupported:" + ss.Rec.OverlayDriver + "_lower_swap", ClassDetail: sweepDetail(err.Error())}
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		// Remount checks the context before it begins; nothing changed.
		return sandbox.RemountOutcome{Disposition: "leased", Reason: "quiesce_failed:cancelled", ClassDetail: sweepDetail(err.Error())}
	case errors.Is(err, nsholder.ErrExited) || holderDead(ss):
		// Its death is handled by the holder watch (a new holder over the
		// recorded, old chain), which waits for the gate we hold: never
		// destroy an explicit session's work for it.
		return sandbox.RemountOutcome{Disposition: "leased", Reason: "quiesce_failed:holder_exited", ClassDetail: sweepDetail(err.Error())}
	}
	out := sandbox.RemountOutcome{Disposition: "faulty", ClassDetail: sweepDetail(err.Error()), LeaseErrors: []string{}}
	h.Log.Warn("remount sweep: session faulty, destroying it", "workspace_session_id", ss.ID(), "err", err)
	if _, derr := h.Teardown.DestroySession(context.WithoutCancel(ctx), sb, ss, 0); derr != nil {
		out.LeaseErrors = append(out.LeaseErrors, derr.Error())
	}
	return out
}

// holderDead reports whether the session's holder process has exited.
func holderDead(ss *Session) bool {
	h := ss.CurrentHolder()
	if h == nil {
		return true
	}
	select {
	case <-h.Done():
		return true
	default:
		return false
	}
}

// PinReason is the contract's reason (§8.6) for the first classified pin:
// the squash sweep's leased reason and a refused sync's.
func PinReason(pins []nsholder.Pin) string {
	for _, p := range pins {
		switch p.Kind {
		case "fd":
			return "pinned:fd_pinned_workspace"
		case "mapping":
			return "pinned:mapped_file_pinned_workspace"
		case "cwd", "root":
			return "pinned:cwd_pinned_workspace"
		}
	}
	return "pinned:cwd_pinned_workspace"
}

// sweepDetail bounds a class_detail text.
func sweepDetail(s string) string {
	if len(s) > 512 {
		return strings.ToValidUTF8(s[:512], "") + "…"
	}
	return s
}
