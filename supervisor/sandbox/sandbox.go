package sandbox

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// Sandbox is a live registry entry. Gate is read-held by every request that
// works on the sandbox and write-held by destroy, so teardown never races a
// write; Mu guards Rec and whatever of Work its owner says it guards.
type Sandbox[W any] struct {
	Gate  sync.RWMutex
	Mu    sync.Mutex
	Rec   Record
	Dir   string
	Stack *layers.Stack
	// ImageEnv is the image config's Env (nil for "host"), loaded at
	// creation and recovery.
	ImageEnv []string
	// Work is what lives in the sandbox (sessions, commands), owned by the
	// workspace layer and never looked into here.
	Work W

	// Background work that writes below Dir without holding Gate (holder
	// event loops, implicit finalization): removal waits for it (GoBackground).
	bgMu          sync.Mutex
	bgClosed      bool
	bg            sync.WaitGroup
	squashing     atomic.Bool  // a squash (manual or automatic) runs
	autoQueued    atomic.Bool  // an autosquash evaluation is queued
	autoCoalesced atomic.Int64 // notifications folded into the queued one
	// autoPending counts autosquash evaluations queued or running (from
	// the queueing to the evaluation's end), so that "none pending and no
	// squash running" has no gap between the two flags.
	autoPending atomic.Int32
}

// SquashState reports whether a squash (manual or automatic) runs and
// whether an autosquash evaluation is queued or running: the layerstack
// view's squash object, for a client that must not race one.
func (sb *Sandbox[W]) SquashState() (running, autosquashPending bool) {
	return sb.squashing.Load(), sb.autoPending.Load() > 0
}

// New returns an entry for rec whose directory is dir.
func New[W any](rec Record, dir string, work W) *Sandbox[W] {
	return &Sandbox[W]{Rec: rec, Dir: dir, Work: work}
}

// GoBackground runs f on its own goroutine unless the sandbox is being
// removed; StopBackground waits for every f started.
func (sb *Sandbox[W]) GoBackground(f func()) bool {
	sb.bgMu.Lock()
	defer sb.bgMu.Unlock()
	if sb.bgClosed {
		return false
	}
	sb.bg.Go(f)
	return true
}

// StopBackground refuses new background work and waits for the running
// work to end, so nothing writes below the sandbox's directory while it is
// removed. The callers have stopped the sessions first (their holders
// closed, which ends the holder event loops).
func (sb *Sandbox[W]) StopBackground() {
	sb.bgMu.Lock()
	sb.bgClosed = true
	sb.bgMu.Unlock()
	sb.bg.Wait()
}

func (sb *Sandbox[W]) BusyError() *catalog.Error {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	return catalog.Errorf(catalog.OperationConflict, "sandbox %s is %s", sb.Rec.ID, sb.Rec.State).
		With("sandbox_id", sb.Rec.ID).With("state", sb.Rec.State)
}

// View returns a copy of the record with layer_count read from the head.
func (sb *Sandbox[W]) View() Record {
	sb.Mu.Lock()
	rec := sb.Rec
	sb.Mu.Unlock()
	rec.LiveWorkspaceSessions = append([]string{}, rec.LiveWorkspaceSessions...)
	if sb.Stack != nil {
		if m, err := sb.Stack.Head(); err == nil {
			rec.LayerCount = len(m.Layers)
		}
	}
	return rec
}

// State is the record's state, read under Mu.
func (sb *Sandbox[W]) State() string {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	return sb.Rec.State
}

// NowRFC3339 is the contract's timestamp format, in UTC with milliseconds.
func NowRFC3339() string { return time.Now().UTC().Format("2006-01-02T15:04:05.000Z") }

func NotFound(id string) *catalog.Error {
	return catalog.Errorf(catalog.NotFound, "sandbox not found: %s", id).With("sandbox_id", id)
}
