package sandbox

// squash_layerstacks (§3.2, §8.6): fold runs of layers into S layers, then
// the remount sweep over the sandbox's live sessions.
//
// Decisions beyond the contract's text:
//
//   - The remount sweep moves every live session whose chain contains a
//     replaced block onto the substituted chain (Occupant.Remount: lease
//     the new chain first, the holder swaps its lowers, the record and
//     lease follow, the old lease is released), runtime.layerstack.
//     remount_sweep_width sessions at a time, and reports it "remounted"
//     (A4's name for §8.6's "migrated"). FUSE sessions swap in place with
//     commands running; kernel sessions are frozen, and one with a process
//     whose cwd, root, descriptor or mapping is inside /workspace is
//     "leased" with a pinned:* reason (the holder's message, naming the
//     commands, in class_detail), keeping its lease and view; its layers
//     are collected when it ends. A swap the holder cannot do is "leased"
//     with "unsupported:<driver>_lower_swap"; a failure the holder does not
//     classify is "faulty" and the session is destroyed.
//   - Replaced layers whose holders all moved are reclaimed before the
//     result returns: each moved session's old lease is released, which
//     garbage collects them (§8.7).
//   - The sweep waits for each session's gate with the request's context
//     (autosquash: with no deadline; gates are held only briefly); a wait
//     the request gives up is "leased" with "quiesce_failed:gate_wait".
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
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

type SquashedBlock struct {
	SquashedLayerID  string   `json:"squashed_layer_id"`
	ReplacedLayerIDs []string `json:"replaced_layer_ids"`
	ReplacedLayers   string   `json:"replaced_layers"` // reclaimed | leased
	BlockedReasons   []string `json:"blocked_reasons,omitempty"`
}

type SweptSession struct {
	SessionID   string `json:"session_id"`
	Disposition string `json:"disposition"` // session_gone | identity | remounted | leased | faulty
	Reason      string `json:"reason,omitempty"`
	ClassDetail string `json:"class_detail,omitempty"`
	leaseErrors []string
}

// FaultySession is a session the sweep destroyed (§8.6).
type FaultySession struct {
	SessionID   string   `json:"session_id"`
	ClassDetail string   `json:"class_detail"`
	LeaseErrors []string `json:"lease_errors"`
}

type SquashResult struct {
	ManifestVersion int             `json:"manifest_version"`
	SquashedBlocks  []SquashedBlock `json:"squashed_blocks"`
	SweptSessions   []SweptSession  `json:"swept_sessions"`
	FaultySessions  []FaultySession `json:"faulty_sessions,omitempty"`
}

// RemountOutcome is what moving one session onto its substituted chain did.
type RemountOutcome struct {
	Disposition string // remounted | identity | leased | faulty | session_gone
	Reason      string // leased: pinned:*, quiesce_failed:*, unsupported:*, session_state:*
	ClassDetail string
	LeaseErrors []string // faulty: what destroying the session failed at
}

// Span is one traced step of a squash, as the supervisor's span store
// records it.
type Span interface {
	Done(err error, attrs map[string]any)
	Event(name string, attrs map[string]any)
}

// Occupant is a live session as the remount sweep sees it.
type Occupant interface {
	ID() string
	// Base is the manifest the session's view is on (a remount changes
	// its chain, never its content).
	Base() layers.Manifest
	Gone() bool
	// Remount moves the session onto its base with res's substitutions
	// applied (identity when they change nothing), taking the session's
	// gate with ctx.
	Remount(ctx context.Context, res layers.SquashResult) RemountOutcome
}

// Squasher runs manual and automatic squashes (§8.6) of the sandboxes of
// one registry. Its function fields are the supervisor's services it uses.
type Squasher[W any] struct {
	Log *slog.Logger
	// Span opens a span of sb (a child when ctx carries one).
	Span func(ctx context.Context, sb *Sandbox[W], origin, name string, attrs map[string]any) (Span, context.Context)
	// Bump records a client-visible change of sb.
	Bump func(ctx context.Context, sb *Sandbox[W])
	// Occupants are sb's live sessions; the caller holds nothing.
	Occupants func(sb *Sandbox[W]) []Occupant
	// Width is runtime.layerstack.remount_sweep_width: sessions moved at
	// once.
	Width int
	// Threshold is runtime.layerstack.autosquash.squash_at_n_layers (nil:
	// autosquash off).
	Threshold *int
	// Draining reports a supervisor shutdown: no new autosquash starts.
	Draining func() bool
	// Track registers background work shutdown waits for; the returned
	// function ends it.
	Track func() (done func())
	// Bounded shortens an error text for an event attribute.
	Bounded func(string) string
}

// Run is squash_layerstacks on the ready sandbox id.
func (q *Squasher[W]) Run(ctx context.Context, reg *Registry[W], id string, progress func(string)) (SquashResult, error) {
	sb, done, e := reg.ReadStack(id)
	if e != nil {
		return SquashResult{}, e
	}
	defer done()
	if !sb.squashing.CompareAndSwap(false, true) {
		return SquashResult{}, catalog.Errorf(catalog.OperationConflict, "layerstack squash already in flight").
			With("sandbox_id", id).With("conflict", "squash_in_flight")
	}
	defer sb.squashing.Store(false)

	out, err := q.squash(ctx, sb, progress)
	if err != nil {
		return SquashResult{}, catalog.Errorf(catalog.OperationFailed, "squash %s: %v", id, err).With("sandbox_id", id)
	}
	return out, nil
}

// squash runs §8.6 on a ready sandbox whose squash flag the caller holds.
func (q *Squasher[W]) squash(ctx context.Context, sb *Sandbox[W], progress func(string)) (SquashResult, error) {
	before, err := sb.Stack.Head()
	if err != nil {
		return SquashResult{}, err
	}
	progress("squash: planning over " + strconv.Itoa(len(before.Layers)) + " layers")
	sp, fctx := q.Span(ctx, sb, "squash", "layerstack.squash.flatten", map[string]any{"layers": len(before.Layers)})
	res, err := sb.Stack.Squash(fctx)
	sp.Done(err, map[string]any{"blocks": len(res.Blocks)})
	if err != nil {
		return SquashResult{}, err
	}
	out := SquashResult{ManifestVersion: res.Manifest.Version, SquashedBlocks: []SquashedBlock{}, SweptSessions: []SweptSession{}}
	if len(res.Blocks) == 0 {
		return out, nil
	}
	progress("squash: committed manifest version " + strconv.Itoa(res.Manifest.Version) + ", " + strconv.Itoa(len(res.Blocks)) + " blocks")

	sessions := q.Occupants(sb)
	sweep, sctx := q.Span(ctx, sb, "squash", "layerstack.squash.remount_sweep", map[string]any{"sessions": len(sessions)})
	slices.SortFunc(sessions, func(a, b Occupant) int { return strings.Compare(a.ID(), b.ID()) })
	progress("squash: remount sweep over " + strconv.Itoa(len(sessions)) + " sessions")
	out.SweptSessions = q.sweep(sctx, res, sessions)
	for _, sw := range out.SweptSessions {
		if sw.Disposition == "faulty" {
			out.FaultySessions = append(out.FaultySessions, FaultySession{SessionID: sw.SessionID, ClassDetail: sw.ClassDetail, LeaseErrors: sw.leaseErrors})
		}
	}
	counts := map[string]any{}
	for _, sw := range out.SweptSessions {
		n, _ := counts[sw.Disposition].(int)
		counts[sw.Disposition] = n + 1
	}
	sweep.Done(nil, counts)

	sb.Stack.LeasedBy(&res)
	for _, b := range res.Blocks {
		sq := SquashedBlock{SquashedLayerID: b.SquashedLayerID, ReplacedLayerIDs: b.ReplacedLayerIDs, ReplacedLayers: "reclaimed"}
		if len(b.Leased) > 0 {
			sq.ReplacedLayers = "leased"
			for _, o := range b.Leased {
				sq.BlockedReasons = append(sq.BlockedReasons, "pinned_by:"+o)
			}
		}
		out.SquashedBlocks = append(out.SquashedBlocks, sq)
	}
	q.Bump(ctx, sb)
	return out, nil
}

// sweep moves every session whose chain a block replaced onto the
// substituted chain, Width at a time; the result is in sessions' order.
func (q *Squasher[W]) sweep(ctx context.Context, res layers.SquashResult, sessions []Occupant) []SweptSession {
	out := make([]SweptSession, len(sessions))
	width := max(q.Width, 1)
	slots := make(chan struct{}, width)
	var wg sync.WaitGroup
	for i, ss := range sessions {
		out[i].SessionID = ss.ID()
		_, changed := res.Substitute(ss.Base())
		switch {
		case ss.Gone():
			out[i].Disposition = "session_gone"
			continue
		case !changed:
			out[i].Disposition = "identity"
			continue
		}
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			o := ss.Remount(ctx, res)
			out[i].Disposition, out[i].Reason, out[i].ClassDetail, out[i].leaseErrors = o.Disposition, o.Reason, o.ClassDetail, o.LeaseErrors
		})
	}
	wg.Wait()
	return out
}

// Notify queues an autosquash evaluation of sb (§8.6): at start
// and after every committed layer.
func (q *Squasher[W]) Notify(sb *Sandbox[W], reason string) {
	n := q.Threshold
	if n == nil || sb.Stack == nil || q.Draining() {
		return
	}
	if !sb.autoQueued.CompareAndSwap(false, true) {
		sb.autoCoalesced.Add(1)
		return
	}
	queued := time.Now()
	track := q.Track() // shutdown waits for a running autosquash
	sb.autoPending.Add(1)
	go func() {
		defer track()
		defer sb.autoPending.Add(-1)
		time.Sleep(250 * time.Millisecond)
		sb.autoQueued.Store(false)
		q.autosquash(sb, *n, reason, queued, sb.autoCoalesced.Swap(0))
	}()
}

func (q *Squasher[W]) autosquash(sb *Sandbox[W], threshold int, reason string, queued time.Time, coalesced int64) {
	// Nothing waits on an autosquash: it runs on its own context, and
	// shutdown waits for it through Track.
	ctx := context.Background()
	sb.Mu.Lock()
	stopping := sb.Rec.State == StateStopping
	sb.Mu.Unlock()
	if stopping {
		return // destroyed meanwhile: its layer stack is (being) removed
	}
	head, err := sb.Stack.Head()
	if err != nil {
		q.Log.Warn("autosquash: read head", "sandbox", sb.Rec.ID, "err", err)
		return
	}
	decision := "below_threshold"
	if len(head.Layers) >= threshold {
		decision = "squash"
	}
	sp, ctx := q.Span(ctx, sb, "autosquash", "layerstack.autosquash.evaluate",
		map[string]any{"observed_layers": len(head.Layers), "threshold": threshold})
	defer func() { sp.Done(nil, map[string]any{"decision": decision}) }()
	if decision != "squash" {
		return
	}
	if !sb.Gate.TryRLock() {
		decision = "sandbox_busy"
		return
	}
	defer sb.Gate.RUnlock()
	sb.Mu.Lock()
	ready := sb.Rec.State == StateReady
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
	sp.Event("layerstack.autosquash.triggered", attrs)
	start := time.Now()
	out, err := q.squash(ctx, sb, func(string) {})
	if err != nil {
		attrs["error"] = q.Bounded(err.Error())
		sp.Event("layerstack.autosquash.failed", attrs)
		return
	}
	after, _ := sb.Stack.Head()
	attrs["before_layers"], attrs["after_layers"] = len(head.Layers), len(after.Layers)
	attrs["blocks_committed"] = len(out.SquashedBlocks)
	remounted := 0
	for _, sw := range out.SweptSessions {
		if sw.Disposition == "remounted" {
			remounted++
		}
	}
	attrs["swept_sessions"], attrs["remounted_sessions"] = len(out.SweptSessions), remounted
	attrs["squash_duration_ms"] = time.Since(start).Milliseconds()
	attrs["total_convergence_ms"] = time.Since(queued).Milliseconds()
	attrs["status"] = "completed"
	sp.Event("layerstack.autosquash.completed", attrs)
}
