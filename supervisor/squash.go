package supervisor

// squash_layerstacks (§3.2, §8.6): fold runs of layers into S layers, then
// the remount sweep over the sandbox's live sessions.
//
// Decisions beyond the contract's text:
//
//   - The remount sweep never migrates a session in this version: the kernel
//     driver's same-upperdir coexistence probe is not implemented, so a
//     kernel session whose chain contains a squashed block is "leased" with
//     reason "unsupported:kernel_gate_not_proven" (the contract's own
//     answer when the probe is not proven), and a FUSE session likewise with
//     "unsupported:fuse_lower_swap" until the holder can swap its lower
//     chain. A leased session keeps its lease (and so its layers) and its
//     view unchanged; its layers are collected when it ends.
//   - blocked_reasons name the lease owners that pin replaced layers:
//     "pinned_by:<owner>" (owner e.g. "workspace-session:ws-…").
//   - Autosquash waits 250 ms after the first notification (later ones
//     coalesce into it), then squashes when head has at least
//     squash_at_n_layers layers. A manual squash in flight makes it skip
//     (decision "in_flight"); the next commit evaluates again.
//   - The squash read-holds the sandbox gate (destroy waits) and a per-sandbox
//     flag refuses a second squash with operation_conflict.

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

type squashedBlock struct {
	SquashedLayerID  string   `json:"squashed_layer_id"`
	ReplacedLayerIDs []string `json:"replaced_layer_ids"`
	ReplacedLayers   string   `json:"replaced_layers"` // reclaimed | leased
	BlockedReasons   []string `json:"blocked_reasons,omitempty"`
}

type sweptSession struct {
	SessionID   string `json:"session_id"`
	Disposition string `json:"disposition"` // session_gone | identity | migrated | leased | faulty
	Reason      string `json:"reason,omitempty"`
}

type squashResult struct {
	ManifestVersion int             `json:"manifest_version"`
	SquashedBlocks  []squashedBlock `json:"squashed_blocks"`
	SweptSessions   []sweptSession  `json:"swept_sessions"`
}

func (s *Supervisor) squashLayerstacks(c *call) (any, error) {
	id := c.args.String("sandbox_id")
	sb, done, e := s.readStack(id)
	if e != nil {
		return nil, e
	}
	defer done()
	if !sb.squashing.CompareAndSwap(false, true) {
		return nil, catalog.Errorf(catalog.OperationConflict, "layerstack squash already in flight").
			With("sandbox_id", id).With("conflict", "squash_in_flight")
	}
	defer sb.squashing.Store(false)

	out, err := s.squash(c.ctx, sb, c.progress)
	if err != nil {
		return nil, catalog.Errorf(catalog.OperationFailed, "squash %s: %v", id, err).With("sandbox_id", id)
	}
	return out, nil
}

// squash runs §8.6 on a ready sandbox whose squash flag the caller holds.
func (s *Supervisor) squash(ctx context.Context, sb *sandbox, progress func(string)) (squashResult, error) {
	before, err := sb.Stack.Head()
	if err != nil {
		return squashResult{}, err
	}
	progress("squash: planning over " + strconv.Itoa(len(before.Layers)) + " layers")
	sp, fctx := s.spanCtx(ctx, sb, "squash", "layerstack.squash.flatten", map[string]any{"layers": len(before.Layers)})
	res, err := sb.Stack.Squash(fctx)
	sp.done(err, map[string]any{"blocks": len(res.Blocks)})
	if err != nil {
		return squashResult{}, err
	}
	out := squashResult{ManifestVersion: res.Manifest.Version, SquashedBlocks: []squashedBlock{}, SweptSessions: []sweptSession{}}
	if len(res.Blocks) == 0 {
		return out, nil
	}
	progress("squash: committed manifest version " + strconv.Itoa(res.Manifest.Version) + ", " + strconv.Itoa(len(res.Blocks)) + " blocks")

	sweep, _ := s.spanCtx(ctx, sb, "squash", "layerstack.squash.remount_sweep", nil)
	sb.Mu.Lock()
	sessions := make([]*session, 0, len(sb.sessions))
	for _, ss := range sb.sessions {
		sessions = append(sessions, ss)
	}
	driver := sb.Rec.OverlayDriver
	sb.Mu.Unlock()
	slices.SortFunc(sessions, func(a, b *session) int { return strings.Compare(a.id(), b.id()) })
	for _, ss := range sessions {
		sw := sweptSession{SessionID: ss.id()}
		switch _, changed := res.Substitute(ss.base()); {
		case ss.isGone():
			sw.Disposition = "session_gone"
		case !changed:
			sw.Disposition = "identity"
		case driver == "fuse":
			sw.Disposition, sw.Reason = "leased", "unsupported:fuse_lower_swap"
		default:
			sw.Disposition, sw.Reason = "leased", "unsupported:kernel_gate_not_proven"
		}
		out.SweptSessions = append(out.SweptSessions, sw)
	}
	sweep.done(nil, map[string]any{"sessions": len(out.SweptSessions)})

	sb.Stack.LeasedBy(&res)
	for _, b := range res.Blocks {
		sq := squashedBlock{SquashedLayerID: b.SquashedLayerID, ReplacedLayerIDs: b.ReplacedLayerIDs, ReplacedLayers: "reclaimed"}
		if len(b.Leased) > 0 {
			sq.ReplacedLayers = "leased"
			for _, o := range b.Leased {
				sq.BlockedReasons = append(sq.BlockedReasons, "pinned_by:"+o)
			}
		}
		out.SquashedBlocks = append(out.SquashedBlocks, sq)
	}
	s.bump(ctx, sb)
	return out, nil
}

// notifyAutosquash queues an autosquash evaluation of sb (§8.6): at start
// and after every committed layer.
func (s *Supervisor) notifyAutosquash(sb *sandbox, reason string) {
	n := s.cfg.Runtime.Layerstack.Autosquash.SquashAtNLayers
	if n == nil || sb.Stack == nil || s.draining.Load() {
		return
	}
	if !sb.autoQueued.CompareAndSwap(false, true) {
		sb.autoCoalesced.Add(1)
		return
	}
	queued := time.Now()
	s.inflight.Add(1) // shutdown waits for a running autosquash
	go func() {
		defer s.inflight.Done()
		time.Sleep(250 * time.Millisecond)
		sb.autoQueued.Store(false)
		s.autosquash(sb, *n, reason, queued, sb.autoCoalesced.Swap(0))
	}()
}

func (s *Supervisor) autosquash(sb *sandbox, threshold int, reason string, queued time.Time, coalesced int64) {
	ctx := context.Background()
	sb.Mu.Lock()
	stopping := sb.Rec.State == stateStopping
	sb.Mu.Unlock()
	if stopping {
		return // destroyed meanwhile: its layer stack is (being) removed
	}
	head, err := sb.Stack.Head()
	if err != nil {
		s.log.Warn("autosquash: read head", "sandbox", sb.Rec.ID, "err", err)
		return
	}
	decision := "below_threshold"
	if len(head.Layers) >= threshold {
		decision = "squash"
	}
	sp, ctx := s.spanCtx(ctx, sb, "autosquash", "layerstack.autosquash.evaluate",
		map[string]any{"observed_layers": len(head.Layers), "threshold": threshold})
	defer func() { sp.done(nil, map[string]any{"decision": decision}) }()
	if decision != "squash" {
		return
	}
	if !sb.Gate.TryRLock() {
		decision = "sandbox_busy"
		return
	}
	defer sb.Gate.RUnlock()
	sb.Mu.Lock()
	ready := sb.Rec.State == stateReady
	sb.Mu.Unlock()
	if !ready {
		decision = "sandbox_busy"
		return
	}
	if !sb.squashing.CompareAndSwap(false, true) {
		decision = "in_flight"
		return
	}
	defer sb.squashing.Store(false)
	attrs := map[string]any{"policy": "squash_at_n_layers", "threshold": threshold, "observed_layers": len(head.Layers),
		"decision": decision, "trigger_reason": reason, "queue_delay_ms": time.Since(queued).Milliseconds(),
		"coalesced_notifications": coalesced}
	sp.event("layerstack.autosquash.triggered", attrs)
	start := time.Now()
	out, err := s.squash(ctx, sb, func(string) {})
	if err != nil {
		attrs["error"] = boundedError(err.Error())
		sp.event("layerstack.autosquash.failed", attrs)
		return
	}
	after, _ := sb.Stack.Head()
	attrs["before_layers"], attrs["after_layers"] = len(head.Layers), len(after.Layers)
	attrs["blocks_committed"] = len(out.SquashedBlocks)
	attrs["squash_duration_ms"] = time.Since(start).Milliseconds()
	attrs["total_convergence_ms"] = time.Since(queued).Milliseconds()
	attrs["status"] = "completed"
	sp.event("layerstack.autosquash.completed", attrs)
}
