package workspace

// Sync of a live session onto the current head (sync_workspace_session,
// issue #19) and the "publish and keep working" path of publish keep:true.
//
// The order of a sync, with the session's gate held:
//
//  1. lease the head (the target) so no squash collects it meanwhile;
//  2. freeze the session (its processes stop and what they wrote reaches
//     the upper dir);
//  3. layers.SyncUpper: plan against the target and, unless rejected,
//     exchange the upper dir for its new version (journaled);
//  4. Remount: the holder swaps onto the target chain over the new upper,
//     the session's record, lease and base move to the target — from here
//     the sync has happened (the persisted record is the commit point that
//     start-up recovery reads, see settleSync);
//  5. attribution follows the new upper, CompleteSync drops the old upper;
//  6. thaw.
//
// Any failure before 4 completes puts the old upper back (AbortSync) and
// thaws: nothing changed.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
)

// Freezer stops and resumes every process of a session (the holder's
// Freeze/Thaw): a sync captures the upper dir of a frozen session.
type Freezer interface {
	Freeze(ctx context.Context, budget time.Duration) error
	Thaw(ctx context.Context) error
}

// SyncOutcome is what a sync did.
type SyncOutcome struct {
	Previous layers.Revision // the session's base before
	Revision layers.Revision // its base after (the target; Previous for a rejection)
	// NoOp: the session already was on the head, nothing moved.
	NoOp bool
	// Changed: the upper dir's content changed (merges, copy-ups the head
	// made obsolete), as layers.SyncResult.Changed.
	Changed bool
}

// ErrNoHolder is a sync of a session whose holder has exited.
var ErrNoHolder = errors.New("the session's holder has exited")

// Sync brings ss onto the current head (see the file comment). The caller
// holds ss.Gate and has admitted the session. opt's Base, Target and Upper
// are set here. A rejection returns the plan and a *layers.Rejection; an
// invalid resolution a *layers.ResolutionError; nsholder's errors
// (ErrSwapPinned with its *PinnedError, ErrFreezeTimeout,
// ErrSwapUnsupported) stay visible to errors.Is/As.
func (p *Publisher) Sync(ctx context.Context, sb *Sandbox, ss *Session, opt layers.SyncOptions) (*layers.Plan, SyncOutcome, error) {
	prev := ss.Base()
	out := SyncOutcome{Previous: prev.Revision(), Revision: prev.Revision()}
	lease, err := sb.Stack.Acquire("sync:" + ss.ID())
	if err != nil {
		return nil, out, fmt.Errorf("sync %s: lease head: %w", ss.ID(), err)
	}
	defer func() { _, _ = lease.Release() }() // Remount holds its own lease of the target
	target := lease.Manifest()
	opt.Base, opt.Target, opt.Upper = prev, target, ss.Upper()
	opt.Git = GitOptions(ctx, p.Cfg, sb, ss, opt.Git.RefMode)
	same := target.Revision() == prev.Revision()
	if !same && !opt.DryRun && len(target.Layers) > len(prev.Layers) {
		// Before the freeze: nothing to undo (Remount checks again).
		if err := checkDepth(p.Cfg, len(target.Layers), "the head"); err != nil {
			return nil, out, fmt.Errorf("sync %s: %w", ss.ID(), err)
		}
	}
	if opt.DryRun || same {
		// Nothing to move (or only a plan asked for): the plan of the
		// session's changes against the head, nothing written.
		opt.DryRun = true
		plan, res, err := sb.Stack.SyncUpper(ctx, opt)
		if err != nil {
			return plan, out, err
		}
		out.NoOp, out.Changed = same, res.Changed && !same
		if !same {
			out.Revision = target.Revision()
		}
		return plan, out, nil
	}
	thaw, err := p.freeze(ctx, ss)
	if err != nil {
		return nil, out, err
	}
	defer thaw()
	return p.syncFrozen(ctx, sb, ss, opt, out)
}

// freeze stops the session's processes for a sync or a publish that keeps
// the session; thaw resumes them (detached from ctx: a cancelled request
// must not leave the session stopped).
func (p *Publisher) freeze(ctx context.Context, ss *Session) (thaw func(), err error) {
	if p.Remount == nil {
		return nil, fmt.Errorf("sync %s: %w", ss.ID(), nsholder.ErrSwapUnsupported)
	}
	fz, ok := ss.CurrentHolder().(Freezer)
	if !ok {
		return nil, fmt.Errorf("sync %s: %w", ss.ID(), ErrNoHolder)
	}
	budget := time.Duration(p.Cfg.Runtime.Layerstack.FreezeBudgetS * float64(time.Second))
	sp := obs.From(ctx).Child("holder.freeze", map[string]any{"workspace_session_id": ss.ID()})
	err = fz.Freeze(ctx, budget)
	sp.Done(err, nil)
	if err != nil {
		return nil, fmt.Errorf("sync %s: freeze: %w", ss.ID(), err)
	}
	return func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := fz.Thaw(tctx); err != nil {
			p.Log.Warn("thaw after sync", "workspace_session_id", ss.ID(), "err", err)
		}
	}, nil
}

// syncFrozen is steps 3-5 of a sync of a frozen session; opt is complete.
func (p *Publisher) syncFrozen(ctx context.Context, sb *Sandbox, ss *Session, opt layers.SyncOptions, out SyncOutcome) (*layers.Plan, SyncOutcome, error) {
	prev, target := opt.Base, opt.Target
	sp := obs.From(ctx).Child("layerstack.sync", map[string]any{"base": prev.Revision(), "target": target.Revision()})
	plan, res, err := sb.Stack.SyncUpper(ctx, opt)
	sp.Done(err, map[string]any{"changed": res.Changed})
	if err != nil {
		return plan, out, err // SyncUpper changed nothing on failure
	}
	hangFailpoint(ss, "exchanged")
	if err := p.Remount(ctx, sb, ss, target, ss.Upper()); err != nil {
		if errors.Is(err, ErrRemountUnsettled) {
			// The holder may serve the new upper: keep both trees and the
			// journal; the next start settles them from the record.
			return plan, out, fmt.Errorf("sync %s: %w", ss.ID(), err)
		}
		if aerr := layers.AbortSync(ss.Upper()); aerr != nil {
			err = errors.Join(err, aerr)
		}
		return plan, out, fmt.Errorf("sync %s: %w", ss.ID(), err)
	}
	hangFailpoint(ss, "remounted")
	p.Attr.SessionSynced(ctx, sb, ss, res)
	if err := layers.CompleteSync(ss.Upper()); err != nil {
		// The session runs on the new upper and its record says so: the
		// old one left at the staging name is removed at the next start.
		p.Log.Warn("complete sync", "workspace_session_id", ss.ID(), "err", err)
	}
	out.Revision, out.Changed = target.Revision(), res.Changed
	p.event(ctx, sb, "workspace_session.synced", map[string]any{"workspace_session_id": ss.ID(),
		"previous_base_revision": out.Previous, "base_revision": out.Revision, "changed": res.Changed})
	return plan, out, nil
}

// KeepError is a publish with keep:true whose layer was committed but
// whose session could not move onto the new head: the session stays where
// it was, its changes are in the head, and a sync_workspace_session later
// moves it.
type KeepError struct{ Err error }

func (e *KeepError) Error() string {
	return "published, but the session could not move onto the new head: " + e.Err.Error()
}
func (e *KeepError) Unwrap() error { return e.Err }

// PublishKeep publishes ss like Publish and then moves the live session
// onto the new head with everything it published out of its upper dir:
// the sync after the publish resolves every path the publish carried as
// the head's (theirs), so the upper ends empty while the holder, its
// processes and the id stay. The session is frozen across both, so no
// write falls between the capture and the new upper. A crash between the
// two leaves a session on its old base whose upper holds what the head
// already has: harmless, a later sync or publish resolves it.
func (p *Publisher) PublishKeep(ctx context.Context, sb *Sandbox, ss *Session, popt layers.PublishOptions) (*layers.Plan, layers.PublishResult, SyncOutcome, error) {
	prev := ss.Base()
	out := SyncOutcome{Previous: prev.Revision(), Revision: prev.Revision()}
	thaw, err := p.freeze(ctx, ss)
	if err != nil {
		return nil, layers.PublishResult{}, out, err
	}
	defer thaw()
	plan, res, err := p.Publish(ctx, sb, ss, popt, nil)
	if err != nil {
		return plan, res, out, err
	}
	lease, err := sb.Stack.Acquire("sync:" + ss.ID())
	if err != nil {
		return plan, res, out, &KeepError{Err: fmt.Errorf("lease head: %w", err)}
	}
	defer func() { _, _ = lease.Release() }()
	sopt := layers.SyncOptions{Base: prev, Target: lease.Manifest(), Upper: ss.Upper(), DefaultStrategy: layers.StrategyTheirs,
		Merge: popt.Merge, MaxPlanPaths: popt.MaxPlanPaths, ExpansionLimit: popt.ExpansionLimit, Git: GitOptions(ctx, p.Cfg, sb, ss, popt.Git.RefMode)}
	if sopt.Target.Revision() == prev.Revision() {
		out.NoOp = true // nothing was committed and nobody else published: the session is on the head
		return plan, res, out, nil
	}
	if len(sopt.Target.Layers) > len(prev.Layers) {
		if err := checkDepth(p.Cfg, len(sopt.Target.Layers), "the head"); err != nil {
			return plan, res, out, &KeepError{Err: err}
		}
	}
	_, out, err = p.syncFrozen(ctx, sb, ss, sopt, out)
	if err != nil {
		return plan, res, out, &KeepError{Err: err}
	}
	return plan, res, out, nil
}

// SyncObject is sync_workspace_session's sync object: the publish summary
// counts of the session's changes against the head (published_paths are
// the session's changes kept), the base move, and the planner's summaries.
func SyncObject(plan *layers.Plan, out SyncOutcome, dryRun bool) map[string]any {
	o := map[string]any{"no_op": out.NoOp, "base_revision": out.Revision, "previous_base_revision": out.Previous}
	if plan == nil {
		o["result"] = "no_op"
		return o
	}
	sum := PublishSummary(plan.OutcomeSummary, out.NoOp, dryRun, plan.Rejection != nil)
	switch sum["result"] {
	case "published":
		sum["result"] = "synced"
	case "would_publish":
		sum["result"] = "would_sync"
	}
	for k, v := range sum {
		o[k] = v
	}
	o["kept_paths"] = sum["published_paths"]
	delete(o, "published_paths")
	o["route_summary"], o["outcome_summary"] = plan.RouteSummary, plan.OutcomeSummary
	if !dryRun {
		o["resolved_paths"] = plan.ResolvedPaths()
	}
	return o
}

// settleSync finishes or undoes, at start-up and before the session's
// holder starts, a sync that a crash interrupted. The persisted session
// record is the commit point (Remount writes the new base into it after
// the holder swapped): a record already on the sync's target keeps the new
// upper, any other record gets the old upper back. The holder of the
// interrupted sync died with the supervisor, so no live view is left to
// consult. rec is updated when the record has to go back to the sync's
// base; changed reports it.
func settleSync(upper string, rec *SessionRecord) (changed bool, err error) {
	found, err := layers.InspectSync(upper)
	if err != nil {
		return false, err
	}
	if !found.Found {
		_, err := layers.RecoverSync(upper) // a staging tree of a crash before the journal
		return false, err
	}
	if rec.BaseRevision == found.Target.Revision() {
		if found.Synced {
			_, err := layers.RecoverSync(upper)
			return false, err
		}
		// The record moved but the upper did not (not a state the sync
		// writes; a hand-edited or torn state): go back to the base whole.
		rec.BaseRevision = found.Base.Revision()
		rec.Lease.Layers = found.Base.Layers
		changed = true
	}
	return changed, layers.AbortSync(upper)
}

// hangFailpoint holds a sync at a step for a minute when the test
// failpoints are enabled (layers.FailpointEnv) and the session directory
// has the marker hang-sync-<step>: the crash test kills the supervisor
// there, between the exchange of the upper and the record (exchanged) or
// between the record and CompleteSync (remounted).
func hangFailpoint(ss *Session, step string) {
	if os.Getenv(layers.FailpointEnv) != "1" {
		return
	}
	if os.Remove(filepath.Join(ss.Dir, "hang-sync-"+step)) == nil {
		time.Sleep(time.Minute)
	}
}
