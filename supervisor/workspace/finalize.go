package workspace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/attribution"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
)

// PublishHooks are what a committed publish asks of the rest of the
// supervisor: attribution of the session's lines, the audit records, and
// the notices of a new layer (autosquash, the git trace of its origin).
type PublishHooks interface {
	// LayerCommitted tells the supervisor a publish by owner committed res.
	LayerCommitted(ctx context.Context, sb *Sandbox, res layers.PublishResult, owner attribution.LineOwner)
	// SessionLineOwners is the owner of each line of content, the
	// session's version of path; called before the session is removed.
	SessionLineOwners(ss *Session, path string, content []byte) []attribution.LineOwner
	// RecordPublishAudit appends the audit records of a committed publish;
	// it logs its own failures.
	RecordPublishAudit(ctx context.Context, sb *Sandbox, prev layers.Manifest, res layers.PublishResult, files []attribution.AuditFile) error
	// SessionSynced moves the session's attribution (checkpoints, the
	// file activity capture state) onto its new upper dir after a sync;
	// the session's base is already the new one.
	SessionSynced(ctx context.Context, sb *Sandbox, ss *Session, res layers.SyncResult)
}

// Publisher captures a session's upper dir and publishes it (§9), and
// finalizes implicit sessions (§6.6).
type Publisher struct {
	Cfg       *config.Config
	DB        *statedb.DB
	Log       *slog.Logger
	Obs       *obs.Registry
	Protected *layers.Patterns // runtime.publish.protected_paths
	Teardown  *Teardown
	Attr      PublishHooks
	// Bump records a client-visible change of sb (§4.4); Revise advances
	// the revision and returns the sandbox record for the caller's own
	// transaction (Commands.Revise).
	Bump   func(ctx context.Context, sb *Sandbox)
	Revise func(sb *Sandbox) statedb.Row
	// Remount moves a live session onto target over the upper dir at
	// upper (Holders.Remount): sync and publish keep:true.
	Remount func(ctx context.Context, sb *Sandbox, ss *Session, target layers.Manifest, upper string) error
}

// event records an event in sb's store, in the trace of the span ctx
// carries (as its child), or outside any request when there is none.
func (p *Publisher) event(ctx context.Context, sb *Sandbox, name string, attrs map[string]any) {
	sp := obs.From(ctx)
	p.Obs.Record(scope(sb), sp.Trace(), sp.ID(), name, attrs)
}

// Publish captures a session's upper dir and resolves it against the
// current head (§9): exactly one layer or nothing. After a commit the
// committed files' line attribution is recorded (§11.2); drain names the
// command whose completion published an implicit session.
func (p *Publisher) Publish(ctx context.Context, sb *Sandbox, ss *Session, opt layers.PublishOptions, drain *Command) (*layers.Plan, layers.PublishResult, error) {
	base := ss.Base()
	sp := obs.From(ctx).Child("workspace_session.capture_changes", map[string]any{"workspace_session_id": ss.ID()})
	cs, err := layers.Capture(ctx, ss.Upper(), sb.Stack.View(base))
	sp.Done(err, nil)
	if err != nil {
		return nil, layers.PublishResult{}, fmt.Errorf("capture: %w", err)
	}
	defer cs.Close()
	opt.Git = GitOptions(ctx, p.Cfg, sb, ss, opt.Git.RefMode)
	sp = obs.From(ctx).Child("layerstack.publish", map[string]any{"base": base.Revision(), "dry_run": opt.DryRun})
	plan, res, err := sb.Stack.PublishChangeset(ctx, base, cs, opt)
	added := 0
	if err == nil && !opt.DryRun && !res.NoOp {
		added = 1
	}
	sp.Done(err, map[string]any{"bytes": res.Bytes, "revision": res.Revision, "no_op": res.NoOp, "layers_added": added})
	if err != nil || opt.DryRun || res.NoOp {
		return plan, res, err
	}
	owner := attribution.SessionOwner(ss.ID(), ss.Rec.Agent)
	if drain != nil {
		owner.CommandSessionID = drain.Rec.CommandSessionID
	}
	p.Attr.LayerCommitted(ctx, sb, res, owner)
	files := make([]attribution.AuditFile, 0, len(plan.Committed))
	for _, cf := range plan.Committed {
		if cf.Kind != layers.ChangeWrite {
			continue
		}
		f := attribution.AuditFile{Path: cf.Path, Wholesale: cf.Route == "ignored", Owner: owner, Committed: cf.Content}
		// The session's own version of the file (for a merge it differs from
		// what was committed) carries the per-line writers of §11.3.
		// cf.Content is that version when the planner kept the bytes it
		// fingerprinted; otherwise read it beneath the upper dir's Root, as
		// capture did.
		data, rerr := cf.Content, error(nil)
		if data == nil {
			data, rerr = cs.Root.ReadFile(cf.Path)
		}
		if rerr == nil {
			f.Session, f.SessionContent = p.Attr.SessionLineOwners(ss, cf.Path, data), data
		}
		files = append(files, f)
	}
	_ = p.Attr.RecordPublishAudit(ctx, sb, plan.HeadManifest, res, files) // logged inside; never fails a publish
	return plan, res, nil
}

// FinalizeImplicit ends an implicit session (§6.6): quiesce (the holder and
// its PID namespace die), capture, publish, destroy. It returns the fields
// the draining command reports. A rejected publish keeps the upper dir as a
// recovery artifact so no agent's work vanishes (§9.9).
func (p *Publisher) FinalizeImplicit(ctx context.Context, sb *Sandbox, ss *Session, drain *Command) map[string]any {
	attrs := map[string]any{"workspace_session_id": ss.ID()}
	if drain != nil {
		attrs["command_session_id"] = drain.Rec.CommandSessionID
	}
	ctx, fsp := obs.Start(obs.WithScope(ctx, p.Obs, scope(sb)), "workspace_session.finalize", attrs)
	extra := p.finalize(ctx, sb, ss, drain)
	var ferr error
	if extra["finalization_failed"] == true {
		ferr = errors.New("finalization failed")
	}
	fsp.Done(ferr, map[string]any{"publish_rejected": extra["publish_rejected"] == true})
	return extra
}

// finalize is FinalizeImplicit's work.
func (p *Publisher) finalize(ctx context.Context, sb *Sandbox, ss *Session, drain *Command) map[string]any {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(p.Cfg.Runtime.Workspace.FinalizeTimeoutS*float64(time.Second)))
	defer cancel()
	ss.Gate.Lock()
	defer ss.Gate.Unlock()
	if ss.IsGone() {
		return map[string]any{} // destroyed while we waited: nothing left to publish
	}
	ss.SetState(SessFinalizing)
	ss.Mu.Lock()
	h := ss.Holder
	ss.Holder = nil
	ss.Mu.Unlock()
	// Every session process is SIGKILLed and reaped before the capture, so
	// nothing writes during it. The holder itself, which runs nothing of
	// the session's, outlives the reply: its exit (the kernel's teardown of
	// its namespaces and mounts) is the slowest part of a quiesce and
	// changes nothing a client can see, so the session's teardown ends it
	// in the background before the directory goes. A holder that cannot
	// quiesce is killed outright, as is one whose session's upper dir
	// becomes a recovery artifact (nothing may still mount it then).
	h = p.quiesce(ctx, ss, h)
	opt := PublishOptions(p.Cfg, p.Protected)
	opt.Implicit = true
	pctx, psp := obs.Start(obs.WithScope(ctx, p.Obs, scope(sb)), "workspace_session.publish", map[string]any{"workspace_session_id": ss.ID(), "dry_run": false})
	plan, res, err := p.Publish(pctx, sb, ss, opt, drain)
	pattrs := map[string]any{"no_op": res.NoOp, "revision": res.Revision, "committed": err == nil && !res.NoOp, "destroyed": false, "stage": "publish"}
	if plan != nil {
		pattrs["source_count"], pattrs["ignored_count"] = plan.RouteSummary.SourceCount, plan.RouteSummary.IgnoredCount
	}
	psp.Done(err, pattrs)
	extra := map[string]any{}
	var rej *layers.Rejection
	switch {
	case err == nil:
		extra["publish"] = PublishObject(plan, res, false)
	default:
		if h != nil {
			_ = h.Close(0)
			h = nil
		}
		if !errors.As(err, &rej) {
			msg := err.Error()
			rej = &layers.Rejection{Reason: "publish_error", Message: &msg, Conflicts: []layers.RejectedPath{}}
		}
		body := RejectionBody(rej)
		if artifact := p.Teardown.KeepRecoveryArtifact(ctx, sb, ss, rej.Reason, body); artifact != "" {
			body["recovery_artifact"] = artifact
		}
		extra["publish_rejected"], extra["publish_reject_class"], extra["publish_rejection"] = true, rej.Reason, body
		p.event(ctx, sb, "workspace_session.finalize.publish_failed", map[string]any{"workspace_session_id": ss.ID(),
			"reject_class": rej.Reason, "detail": err.Error(), "conflict_paths": conflictPaths(rej)})
	}
	// One commit: the draining command's terminal record with the outcome,
	// the session record's removal and the sandbox's activity revision
	// (§4.4). The command ends (its request answers) only afterwards, once
	// the session is gone (§6.6).
	var end *Ending
	var rows []statedb.Row
	if drain != nil {
		end = p.Teardown.Cmds.End(sb, drain, "", maps.Clone(extra))
	}
	if end != nil {
		rows = end.Rows()
	} else {
		rows = append(outcomeRows(sb, drain, extra), p.Revise(sb))
	}
	if _, err := p.Teardown.destroy(ctx, sb, ss, 0, h, rows); err != nil {
		ss.SetState(SessFinalizeFailed)
		extra["finalization_failed"], extra["finalization_failure_class"], extra["finalization_attempts"] = true, "holder_finalization_destroy_failed", 1
		if end != nil {
			end.Rec.Extra = maps.Clone(extra)
			if err := p.DB.PutRows(ctx, end.RecordRow()); err != nil {
				p.Log.Warn("persist command", "command", end.Rec.CommandSessionID, "err", err)
			}
		}
		p.Bump(ctx, sb) // the revision did not reach the database
	}
	if end != nil {
		end.Apply()
	}
	return extra
}

// quiesce kills every process of ss but its holder h and returns h, still
// to be closed; when that fails, h is killed with them and nil returned.
func (p *Publisher) quiesce(ctx context.Context, ss *Session, h Holder) Holder {
	if h == nil {
		return nil
	}
	if err := h.Quiesce(ctx); err != nil {
		p.Log.Warn("quiesce holder; killing it", "workspace_session_id", ss.ID(), "err", err)
		_ = h.Close(0) // SIGKILL of the whole PID namespace
		return nil
	}
	return h
}

// outcomeRows is the draining command's record with the finalization
// outcome, stored in the transaction that removes the session record: a
// crash after the removal must not lose what was published (the restart
// then reports the command interrupted, with the outcome).
func outcomeRows(sb *Sandbox, drain *Command, extra map[string]any) []statedb.Row {
	if drain == nil || len(extra) == 0 {
		return nil
	}
	drain.Mu.Lock()
	rec := drain.Rec
	drain.Mu.Unlock()
	rec.Extra = make(map[string]any, len(extra))
	for k, v := range extra {
		rec.Extra[k] = v
	}
	return []statedb.Row{{Kind: statedb.KindCommand, ID: rec.CommandSessionID, SandboxID: sb.Rec.ID, Rec: rec}}
}

// conflictPaths lists at most 20 rejected paths of a publish rejection.
func conflictPaths(rej *layers.Rejection) []string {
	out := []string{}
	if rej == nil {
		return out
	}
	for _, c := range rej.Conflicts {
		if len(out) == 20 {
			break
		}
		out = append(out, c.Path)
	}
	return out
}
