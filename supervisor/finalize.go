package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// publishSession captures a session's upper dir and resolves it against the
// current head (§9): exactly one layer or nothing. After a commit the
// committed files' line attribution is recorded (§11.2); drain names the
// command whose completion published an implicit session.
func (s *Supervisor) publishSession(ctx context.Context, sb *sandbox, ss *session, opt layers.PublishOptions, drain *command) (*layers.Plan, layers.PublishResult, error) {
	base := ss.Base()
	sp := spanFrom(ctx).child("workspace_session.capture_changes", map[string]any{"workspace_session_id": ss.ID()})
	cs, err := layers.Capture(ctx, ss.Upper(), sb.Stack.View(base))
	sp.done(err, nil)
	if err != nil {
		return nil, layers.PublishResult{}, fmt.Errorf("capture: %w", err)
	}
	defer cs.Close()
	sp = spanFrom(ctx).child("layerstack.publish", map[string]any{"base": base.Revision(), "dry_run": opt.DryRun})
	plan, res, err := sb.Stack.PublishChangeset(ctx, base, cs, opt)
	added := 0
	if err == nil && !opt.DryRun && !res.NoOp {
		added = 1
	}
	sp.done(err, map[string]any{"bytes": res.Bytes, "revision": res.Revision, "no_op": res.NoOp, "layers_added": added})
	if err != nil || opt.DryRun || res.NoOp {
		return plan, res, err
	}
	s.notifyAutosquash(sb, "layer_committed")
	owner := sessionOwner(ss.ID(), ss.Rec.Agent)
	if drain != nil {
		owner.CommandSessionID = drain.Rec.CommandSessionID
	}
	s.recordLayerOrigin(ctx, sb, res, owner)
	files := make([]auditFile, 0, len(plan.Committed))
	for _, cf := range plan.Committed {
		if cf.Kind != layers.ChangeWrite {
			continue
		}
		f := auditFile{Path: cf.Path, Wholesale: cf.Route == "ignored", Owner: owner}
		// The session's own version of the file (for a merge it differs from
		// what was committed) carries the per-line writers of §11.3.
		// Read beneath the upper dir's Root, as capture did.
		if data, rerr := cs.Root.ReadFile(cf.Path); rerr == nil {
			f.Session, f.SessionContent = s.sessionLineOwners(ss, cf.Path, data), data
		}
		files = append(files, f)
	}
	_ = s.recordPublishAudit(ctx, sb, plan.HeadManifest, res, files) // logged inside; never fails a publish
	return plan, res, nil
}

// finalizeImplicit ends an implicit session (§6.6): quiesce (the holder and
// its PID namespace die), capture, publish, destroy. It returns the fields
// the draining command reports. A rejected publish keeps the upper dir as a
// recovery artifact so no agent's work vanishes (§9.9).
func (s *Supervisor) finalizeImplicit(ctx context.Context, sb *sandbox, ss *session, drain *command) map[string]any {
	attrs := map[string]any{"workspace_session_id": ss.ID()}
	if drain != nil {
		attrs["command_session_id"] = drain.Rec.CommandSessionID
	}
	fsp, ctx := s.spanCtx(ctx, sb, "finalize", "workspace_session.finalize", attrs)
	extra := s.finalize(ctx, sb, ss, drain)
	var ferr error
	if extra["finalization_failed"] == true {
		ferr = errors.New("finalization failed")
	}
	fsp.done(ferr, map[string]any{"publish_rejected": extra["publish_rejected"] == true})
	return extra
}

// finalize is finalizeImplicit's work.
func (s *Supervisor) finalize(ctx context.Context, sb *sandbox, ss *session, drain *command) map[string]any {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.Runtime.Workspace.FinalizeTimeoutS*float64(time.Second)))
	defer cancel()
	ss.Gate.Lock()
	defer ss.Gate.Unlock()
	if ss.IsGone() {
		return map[string]any{} // destroyed while we waited: nothing left to publish
	}
	ss.SetState(workspace.SessFinalizing)
	ss.Mu.Lock()
	h := ss.Holder
	ss.Holder = nil
	ss.Mu.Unlock()
	if h != nil {
		_ = h.Close(0) // SIGKILL of the whole PID namespace: nothing writes during capture
	}
	opt := workspace.PublishOptions(s.cfg, s.protected)
	opt.Implicit = true
	psp, pctx := s.spanCtx(ctx, sb, "", "workspace_session.publish", map[string]any{"workspace_session_id": ss.ID(), "dry_run": false})
	plan, res, err := s.publishSession(pctx, sb, ss, opt, drain)
	pattrs := map[string]any{"no_op": res.NoOp, "revision": res.Revision, "committed": err == nil && !res.NoOp, "destroyed": false, "stage": "publish"}
	if plan != nil {
		pattrs["source_count"], pattrs["ignored_count"] = plan.RouteSummary.SourceCount, plan.RouteSummary.IgnoredCount
	}
	psp.done(err, pattrs)
	extra := map[string]any{}
	var rej *layers.Rejection
	switch {
	case err == nil:
		extra["publish"] = workspace.PublishObject(plan, res, false)
	default:
		if !errors.As(err, &rej) {
			msg := err.Error()
			rej = &layers.Rejection{Reason: "publish_error", Message: &msg, Conflicts: []layers.RejectedPath{}}
		}
		body := workspace.RejectionBody(rej)
		if artifact := s.teardown.KeepRecoveryArtifact(ctx, sb, ss, rej.Reason, body); artifact != "" {
			body["recovery_artifact"] = artifact
		}
		extra["publish_rejected"], extra["publish_reject_class"], extra["publish_rejection"] = true, rej.Reason, body
		s.eventCtx(ctx, sb, "workspace_session.finalize.publish_failed", map[string]any{"workspace_session_id": ss.ID(),
			"reject_class": rej.Reason, "detail": err.Error(), "conflict_paths": conflictPaths(rej)})
	}
	s.persistOutcome(ctx, sb, drain, extra)
	if _, err := s.teardown.DestroySession(ctx, sb, ss, 0); err != nil {
		ss.SetState(workspace.SessFinalizeFailed)
		extra["finalization_failed"], extra["finalization_failure_class"], extra["finalization_attempts"] = true, "holder_finalization_destroy_failed", 1
	}
	s.bump(ctx, sb)
	return extra
}
