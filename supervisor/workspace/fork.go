package workspace

import (
	"context"
	"errors"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/attribution"
)

// forkSource is what a fork takes of its source session: the chain its new
// lease pins, and the upper dir and attribution copied before its holder
// starts.
type forkSource struct {
	ss      *Session
	rec     SessionRecord
	base    layers.Manifest
	running []string // src's running commands: frozen around the copy
}

// freezer is what a fork needs of a holder to copy a session whose
// commands run (*nsholder.Client).
type freezer interface {
	Freeze(ctx context.Context, budget time.Duration) error
	Thaw(ctx context.Context) error
}

// Fork runs fork_workspace_session: a new explicit session (own ID, holder,
// agent label and network profile; network "" = the source's) whose view
// equals src's current view — src's chain leased again and src's upper dir
// copied — and which is independent of src afterwards.
//
// src's gate is held throughout, so no file operation, publish, destroy or
// new command changes src during the copy; running commands are frozen
// around it (SIGSTOP, their writes flushed to the upper; a freeze that
// fails refuses the fork with operation_failed naming them) and go on
// afterwards in src only. Implicit sessions are refused as publish refuses
// them (not_found).
// On any failure nothing of the new session is left: no directory, no
// lease, no record.
func (h *Holders) Fork(ctx context.Context, sb *Sandbox, src *Session, network string, agent *string) (*Session, error) {
	if src.Implicit() {
		return nil, NotFoundSession(src.ID()) // implicit sessions are nobody's to fork (§5.1)
	}
	src.Gate.Lock()
	defer src.Gate.Unlock()
	if e := src.Admit(); e != nil {
		return nil, e
	}
	rec := src.Record()
	if network == "" {
		network = rec.NetworkProfile
	}
	from := &forkSource{ss: src, rec: rec, base: src.Base(), running: src.Running()}
	ss, _, err := h.open(ctx, sb, PolicyNoOp, network, agent, from, true)
	if err != nil {
		return nil, err
	}
	h.event(ctx, sb, "workspace_session.forked", map[string]any{"workspace_session_id": ss.ID(), "forked_from": src.ID()})
	return ss, nil
}

// copyFrom gives the new session ss (directories made, holder not started)
// a copy of from's upper dir and attribution.
func (h *Holders) copyFrom(ctx context.Context, sb *Sandbox, from *forkSource, ss *Session) (err error) {
	src := from.ss
	if len(from.running) > 0 {
		thaw, ferr := h.freeze(ctx, src, from.running)
		if ferr != nil {
			return ferr
		}
		defer func() {
			if terr := thaw(); terr != nil && err == nil {
				err = terr
			}
		}()
	}
	sp, cctx := h.spanCtx(ctx, sb, "workspace_session.copy_upper", map[string]any{"workspace_session_id": ss.ID(), "forked_from": src.ID()})
	err = layers.CopyUpper(cctx, src.Upper(), ss.Upper())
	sp.Done(err, nil)
	if err != nil {
		return catalog.Errorf(catalog.OperationFailed, "workspace fork failed at copy: %v", err).
			With("stage", "copy").With("workspace_session_id", src.ID())
	}
	srcW := attribution.Workspace{ID: src.ID(), Agent: from.rec.Agent, Dir: src.Dir, Upper: src.Upper(), Log: h.Log}
	dstW := attribution.Workspace{ID: ss.ID(), Agent: ss.Rec.Agent, Dir: ss.Dir, Upper: ss.Upper(), Base: sb.Stack.View(from.base), Log: h.Log}
	if err := src.Attr.Fork(ctx, srcW, from.running, &ss.Attr, dstW); err != nil {
		return catalog.Errorf(catalog.OperationFailed, "workspace fork failed at attribution: %v", err).
			With("stage", "attribution").With("workspace_session_id", src.ID())
	}
	return nil
}

// freeze stops src's running commands for the copy; thaw continues them
// and fails when the freeze ended early (the safety limit: src ran during
// the copy, which is then not a consistent view).
func (h *Holders) freeze(ctx context.Context, src *Session, running []string) (thaw func() error, err error) {
	refuse := func(err error) error {
		return catalog.Errorf(catalog.OperationFailed, "workspace fork failed at freeze: the source's running commands could not be stopped: %v", err).
			With("stage", "freeze").With("workspace_session_id", src.ID()).With("active_command_session_ids", running)
	}
	fz, ok := src.CurrentHolder().(freezer)
	if !ok {
		return nil, refuse(errors.New("its holder cannot freeze"))
	}
	budget := time.Duration(h.Cfg.Runtime.Layerstack.FreezeBudgetS * float64(time.Second))
	if err := fz.Freeze(ctx, budget); err != nil {
		return nil, refuse(err)
	}
	return func() error {
		// Detached: a cancelled request must not leave the source stopped.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := fz.Thaw(tctx); err != nil {
			return catalog.Errorf(catalog.OperationFailed, "workspace fork failed at thaw: %v", err).
				With("stage", "freeze").With("workspace_session_id", src.ID()).With("active_command_session_ids", running)
		}
		return nil
	}, nil
}
