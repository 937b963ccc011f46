package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// RecoverHooks are the supervisor's parts in a start-up recovery (§4.5).
type RecoverHooks[W any] struct {
	// Leases are the layer chains the sandbox's persisted sessions hold;
	// the boot sweep keeps them.
	Leases func(ctx context.Context, sb *Sandbox[W]) [][]layers.LayerRef
	// Removed reports a sandbox removed: creating rolled back, stopping
	// and stopped completed.
	Removed func(id, state string)
	// Swept reports the boot sweep of a reopened sandbox.
	Swept func(sb *Sandbox[W], res layers.SweepResult)
	// Reopened is called for every sandbox put back into the registry,
	// ready or failed, to restore what lives in it.
	Reopened func(ctx context.Context, sb *Sandbox[W])
}

// Recover rebuilds the registry from the persisted records at start:
// creating ones are rolled back, stopping ones finished, the rest reopened
// and swept; a sandbox whose layer stack cannot be opened is kept as
// failed.
func (m *Manager[W]) Recover(ctx context.Context, recs []*Record, h RecoverHooks[W]) {
	for _, rec := range recs {
		sb := New(*rec, m.Dir(rec.ID), m.NewWork())
		sb.Rec.LiveWorkspaceSessions = []string{} // rebuilt from the session records
		switch rec.State {
		case StateCreating, StateStopping, StateStopped:
			m.Log.Info("recovery: removing sandbox", "sandbox", rec.ID, "state", rec.State)
			if err := m.Remove(ctx, sb); err != nil {
				m.Log.Error("recovery: remove sandbox", "sandbox", rec.ID, "err", err)
			}
			h.Removed(rec.ID, rec.State)
			continue
		}
		st, err := layers.Open(filepath.Join(sb.Dir, "layerstack"))
		if err == nil {
			if head, herr := st.Head(); herr != nil || len(head.Layers) == 0 {
				err = fmt.Errorf("layerstack manifest of %s is missing or empty", rec.ID)
			}
		}
		if err == nil {
			sb.Stack = st
			var res layers.SweepResult
			res, err = st.Sweep(h.Leases(ctx, sb))
			if err == nil {
				h.Swept(sb, res)
			}
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			sb.Rec.State, sb.Rec.Error = StateFailed, err.Error()
			_ = m.Store.PutSandbox(ctx, &sb.Rec)
			m.Log.Error("recovery: sandbox failed", "sandbox", rec.ID, "err", err)
		}
		m.Reg.Put(sb)
		h.Reopened(ctx, sb)
	}
}
