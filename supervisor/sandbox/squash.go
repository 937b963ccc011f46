package sandbox

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
	"log/slog"
	"slices"
	"strconv"
	"strings"
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
	Disposition string `json:"disposition"` // session_gone | identity | migrated | leased | faulty
	Reason      string `json:"reason,omitempty"`
}

type SquashResult struct {
	ManifestVersion int             `json:"manifest_version"`
	SquashedBlocks  []SquashedBlock `json:"squashed_blocks"`
	SweptSessions   []SweptSession  `json:"swept_sessions"`
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
	// Base is the manifest the session's view was frozen at.
	Base() layers.Manifest
	Gone() bool
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

	sweep, _ := q.Span(ctx, sb, "squash", "layerstack.squash.remount_sweep", nil)
	sessions := q.Occupants(sb)
	sb.Mu.Lock()
	driver := sb.Rec.OverlayDriver
	sb.Mu.Unlock()
	slices.SortFunc(sessions, func(a, b Occupant) int { return strings.Compare(a.ID(), b.ID()) })
	for _, ss := range sessions {
		sw := SweptSession{SessionID: ss.ID()}
		switch _, changed := res.Substitute(ss.Base()); {
		case ss.Gone():
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
	sweep.Done(nil, map[string]any{"sessions": len(out.SweptSessions)})

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
	go func() {
		defer track()
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
	attrs["squash_duration_ms"] = time.Since(start).Milliseconds()
	attrs["total_convergence_ms"] = time.Since(queued).Milliseconds()
	attrs["status"] = "completed"
	sp.Event("layerstack.autosquash.completed", attrs)
}
