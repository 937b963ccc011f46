package workspace

import (
	"context"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/attribution"
)

// forkSource is what a fork takes of its source session: the chain its new
// lease pins, and the upper dir and attribution copied before its holder
// starts.
type forkSource struct {
	ss   *Session
	rec  SessionRecord
	base layers.Manifest
}

// Fork runs fork_workspace_session: a new explicit session (own ID, holder,
// agent label and network profile; network "" = the source's) whose view
// equals src's current view — src's chain leased again and src's upper dir
// copied — and which is independent of src afterwards.
//
// src's gate is held throughout, so no file operation, publish or destroy
// changes src during the copy. A source with running commands is refused
// (operation_failed naming them): their writes would race the copy.
// Implicit sessions are refused as publish refuses them (not_found).
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
	if running := src.Running(); len(running) > 0 {
		return nil, catalog.Errorf(catalog.OperationFailed, "workspace session %s has running commands: its upper dir cannot be copied consistently", src.ID()).
			With("workspace_session_id", src.ID()).With("active_command_session_ids", running)
	}
	rec := src.Record()
	if network == "" {
		network = rec.NetworkProfile
	}
	from := &forkSource{ss: src, rec: rec, base: src.Base()}
	ss, err := h.open(ctx, sb, PolicyNoOp, network, agent, from)
	if err != nil {
		return nil, err
	}
	h.event(ctx, sb, "workspace_session.forked", map[string]any{"workspace_session_id": ss.ID(), "forked_from": src.ID()})
	return ss, nil
}

// copyFrom gives the new session ss (directories made, holder not started)
// a copy of from's upper dir and attribution.
func (h *Holders) copyFrom(ctx context.Context, sb *Sandbox, from *forkSource, ss *Session) error {
	src := from.ss
	sp, cctx := h.spanCtx(ctx, sb, "workspace_session.copy_upper", map[string]any{"workspace_session_id": ss.ID(), "forked_from": src.ID()})
	err := layers.CopyUpper(cctx, src.Upper(), ss.Upper())
	sp.Done(err, nil)
	if err != nil {
		return catalog.Errorf(catalog.OperationFailed, "workspace fork failed at copy: %v", err).
			With("stage", "copy").With("workspace_session_id", src.ID())
	}
	srcW := attribution.Workspace{ID: src.ID(), Agent: from.rec.Agent, Dir: src.Dir, Upper: src.Upper(), Log: h.Log}
	dstW := attribution.Workspace{ID: ss.ID(), Agent: ss.Rec.Agent, Dir: ss.Dir, Upper: ss.Upper(), Log: h.Log}
	if err := src.Attr.Fork(ctx, srcW, &ss.Attr, dstW); err != nil {
		return catalog.Errorf(catalog.OperationFailed, "workspace fork failed at attribution: %v", err).
			With("stage", "attribution").With("workspace_session_id", src.ID())
	}
	return nil
}
