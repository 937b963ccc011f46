package layers

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Check-order buckets of the singular rejection fields (§9.8).
const (
	bucketProtected = iota + 1
	bucketOpaque
	bucketSource
)

// planEntry is the planner's state of one plan path.
type planEntry struct {
	pp       PlanPath
	change   Change
	drop     *Drop
	bSide    side
	hSide    side
	reject   string // rejection reason when the path is rejected
	bucket   int
	message  string
	writes   []Change // what the layer gets for this path
	merged   bool
	dropping bool // the session's change here (and below) is dropped (theirs)
	// synthetic: a ref decision listed like a path where the session
	// changed no file (a ref only in packed-refs); planned by the git route.
	synthetic bool
}

// side is a path's state in one view.
type side struct {
	exists bool
	e      Entry
	fp     Fingerprint
}

func (sd side) kind() EntryKind {
	if !sd.exists {
		return ""
	}
	return sd.e.Kind
}

type planResult struct {
	plan      *Plan
	layer     []Change // nil/empty: nothing to commit
	committed []CommittedFile
}

type planner struct {
	ctx         context.Context
	opt         PublishOptions
	bv, hv      *View
	headChanged bool
	ign         *Ignorer
	changed     map[string]bool // paths with a counted session change
	dirCache    map[string][2]EntryKind
	baseWalks   map[string]walkResult
	loadBudget  int64 // bytes of session files the planner may still keep in memory
	git         *gitRoute
}

type walkResult struct {
	entries  []Entry
	overflow bool
}

// plan routes and resolves cs (against base) on the head view hv.
func (s *Stack) plan(ctx context.Context, base, head Manifest, hv *View, cs *Changeset, opt PublishOptions) (*planResult, error) {
	plan := &Plan{BaseRevision: base.Revision(), HeadRevision: head.Revision(), DefaultStrategy: opt.DefaultStrategy,
		Paths: []PlanPath{}, Conflicts: []PlanPath{}, HeadManifest: cloneManifest(head)}
	pr := &planResult{plan: plan}

	changes := aggregateChanges(cs.Changes)
	for _, c := range changes {
		if _, err := splitViewPath(c.Path); err != nil || c.Path == "" {
			return nil, fmt.Errorf("publish: invalid change path %q", c.Path)
		}
	}
	var drops []Drop
	for _, d := range cs.Drops {
		if opt.Implicit && d.Reason == DropUnsupportedSpecialFile {
			continue
		}
		drops = append(drops, d)
	}
	// Resolutions must name plan paths (§3.5), truncated listing or not.
	if len(opt.Resolutions) > 0 {
		known := make(map[string]bool, len(changes)+len(drops))
		for _, c := range changes {
			known[c.Path] = true
		}
		for _, d := range drops {
			known[d.Path] = true
		}
		for _, p := range sortedKeys(opt.Resolutions) {
			// A ref is listed like a path even when only packed-refs
			// changed: the git route checks those names.
			if !known[p] && ClassifyGit(p, false).Kind != GitRef {
				return nil, &ResolutionError{Path: p, Unknown: true}
			}
		}
	}

	// The base revision must be self-consistent (§9.3).
	if msg := s.checkBase(base); msg != "" {
		plan.Rejection = &Rejection{Reason: RejectInvalidBaseRevision, Message: &msg, Conflicts: []RejectedPath{}}
		return pr, nil
	}

	p := &planner{ctx: ctx, opt: opt, bv: s.View(base), hv: hv, headChanged: base.RootHash() != head.RootHash(),
		changed: make(map[string]bool, len(changes)), dirCache: make(map[string][2]EntryKind),
		baseWalks: make(map[string]walkResult), loadBudget: loadBudget}
	p.ign = NewIgnorer(p.bv)
	for _, c := range changes {
		p.changed[c.Path] = true
	}
	err := p.gitPrepare(s, base, head, changes)
	defer p.git.removeScratch()
	if err != nil {
		return nil, err
	}

	entries := make([]*planEntry, 0, len(changes)+len(drops))
	for _, c := range changes {
		entries = append(entries, &planEntry{change: c})
	}
	for i := range drops {
		entries = append(entries, &planEntry{drop: &drops[i]})
	}
	entries = append(entries, p.refEntries()...)
	slices.SortStableFunc(entries, func(a, b *planEntry) int { return strings.Compare(a.path(), b.path()) })

	var dropped []string    // paths whose session change is dropped, with everything below
	var keptOpaque []string // opaque directories the layer writes
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if e.synthetic {
			// planned by the git route
		} else if err := p.planEntry(e); err != nil {
			return nil, err
		}
		under := func(list []string) bool {
			for _, d := range list {
				if isBelow(e.path(), d) {
					return true
				}
			}
			return false
		}
		if e.drop == nil && e.pp.Outcome != OutcomeProtected && under(dropped) {
			// theirs at an ancestor drops every session change below it.
			e.pp.Outcome, e.pp.ConflictReason, e.pp.Hunks = OutcomeTheirs, "", nil
			e.reject, e.bucket, e.writes, e.merged = "", 0, nil, false
			e.dropping = true
		}
		if e.dropping {
			dropped = append(dropped, e.path())
		}
		if e.drop == nil && len(e.writes) == 0 && e.reject == "" && under(keptOpaque) {
			// An opaque ancestor in the layer hides head below it: what
			// stays as head has is written again.
			if err := p.materialize(e); err != nil {
				return nil, err
			}
		}
		if e.drop == nil && e.change.Kind == ChangeOpaqueDir && len(e.writes) == 1 && e.writes[0].Kind == ChangeOpaqueDir {
			keptOpaque = append(keptOpaque, e.path())
		}
	}

	// Summaries, listing, rejection.
	var rejected []*planEntry
	for _, e := range entries {
		if e.drop == nil && e.pp.Outcome != OutcomeProtected {
			switch e.pp.Route {
			case RouteSource:
				plan.RouteSummary.SourceCount++
			case RouteIgnored:
				plan.RouteSummary.IgnoredCount++
			}
		}
		plan.OutcomeSummary.add(e.pp.Outcome)
		plan.all = append(plan.all, e.pp)
		if len(plan.Paths) < opt.MaxPlanPaths {
			plan.Paths = append(plan.Paths, e.pp)
		} else {
			plan.Truncated = true
		}
		if e.reject != "" {
			rejected = append(rejected, e)
			if len(plan.Conflicts) < opt.MaxPlanPaths {
				plan.Conflicts = append(plan.Conflicts, e.pp)
			}
		}
	}
	if len(rejected) > 0 {
		plan.Rejection = buildRejection(rejected)
		return pr, nil
	}

	// The layer: the kept changes, then the carriers that still make sense.
	var layer []Change
	written := make(map[string]bool) // every proper ancestor of a written path
	for _, e := range entries {
		for _, w := range e.writes {
			layer = append(layer, w)
			for a := parentOf(w.Path); a != ""; a = parentOf(a) {
				if written[a] {
					break
				}
				written[a] = true
			}
		}
		if len(e.writes) > 0 && e.drop == nil && e.pp.Route != RouteGit {
			w := e.writes[0]
			cf := CommittedFile{Path: e.path(), Kind: w.Kind, Route: e.pp.Route, Outcome: e.pp.Outcome,
				Merged: e.merged, PreviousHead: e.hSide.fp}
			if w.Kind == ChangeWrite && w.Source != "" && w.Root == e.change.Root && w.Source == e.change.Source {
				cf.SessionSource = w.Source
				if w.loaded {
					cf.Content = w.content
				}
			}
			pr.committed = append(pr.committed, cf)
		}
	}
	gitWrites, err := p.gitFinish(s, base, head, publishedIn(p.hv, layer))
	if err != nil {
		return nil, err
	}
	plan.GitRefs = p.git.updates()
	layer = append(layer, gitWrites...)
	if len(layer) == 0 {
		return pr, nil // nothing to write: a no-op
	}
	carriers := aggregateChanges(cs.Carriers)
	for _, c := range carriers {
		if p.changed[c.Path] || c.Kind != ChangeDirectory {
			continue
		}
		if slices.ContainsFunc(dropped, func(d string) bool { return c.Path == d || isBelow(c.Path, d) }) {
			continue
		}
		if slices.ContainsFunc(keptOpaque, func(d string) bool { return isBelow(c.Path, d) }) {
			layer = append(layer, c)
			continue
		}
		h, err := p.stat(p.hv, c.Path, false)
		if err != nil {
			return nil, err
		}
		switch {
		case h.kind() == KindDir:
			c.Mode = h.e.Mode // never revert a mode head changed
			layer = append(layer, c)
		case written[c.Path]:
			layer = append(layer, c)
		}
	}
	pr.layer = aggregateChanges(layer)
	return pr, nil
}

func (e *planEntry) path() string {
	if e.drop != nil {
		return e.drop.Path
	}
	return e.change.Path
}

// isBelow reports whether p is a proper descendant of dir.
func isBelow(p, dir string) bool {
	return len(p) > len(dir) && p[len(dir)] == '/' && p[:len(dir)] == dir
}

// checkBase returns a message when the base manifest cannot be a view.
func (s *Stack) checkBase(base Manifest) string {
	if err := validateLayerRefs(base.Layers); err != nil {
		return err.Error()
	}
	for _, l := range base.Layers {
		fi, err := os.Lstat(s.LayerDir(l))
		if err != nil {
			return fmt.Sprintf("layer %s: %v", l.LayerID, err)
		}
		if !fi.IsDir() {
			return fmt.Sprintf("layer %s: not a directory", l.LayerID)
		}
	}
	return ""
}

func buildRejection(rejected []*planEntry) *Rejection {
	r := &Rejection{Conflicts: []RejectedPath{}}
	var first *planEntry
	for _, e := range rejected {
		if first == nil || e.bucket < first.bucket {
			first = e
		}
		if len(r.Conflicts) == maxRejectedPaths {
			continue
		}
		rp := RejectedPath{Path: e.path(), Reason: e.reject, Strategy: e.pp.Strategy, ConflictReason: e.pp.ConflictReason,
			Expected: e.pp.Base, Actual: e.pp.Head, Session: e.pp.Session, Hunks: e.pp.Hunks}
		if rp.Hunks == nil {
			rp.Hunks = []ConflictHunk{}
		}
		if e.drop != nil {
			rp.ProtectedDrop = &ProtectedDrop{Path: e.drop.Path, Reason: e.drop.Reason}
		}
		r.Conflicts = append(r.Conflicts, rp)
	}
	r.Path, r.Reason = first.path(), first.reject
	if first.message != "" {
		m := first.message
		r.Message = &m
	}
	switch {
	case first.drop != nil:
		r.ProtectedDrop = &ProtectedDrop{Path: first.drop.Path, Reason: first.drop.Reason}
	case first.reject == RejectSourceConflict:
		r.SourceConflict = &SourceConflict{Path: first.path(), Expected: *first.pp.Base, Actual: *first.pp.Head}
	}
	return r
}
