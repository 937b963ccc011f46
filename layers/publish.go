package layers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"
)

// This file is the publication planner of §9.2–§9.8: it routes a captured
// changeset, resolves every path against the current head, and commits the
// result as exactly one layer (through Update, so with the durability order
// of §8.8) or nothing.

// Strategy decides a path changed on both sides (§9.4).
type Strategy string

// The strategies.
const (
	StrategyMerge  Strategy = "merge"
	StrategyOurs   Strategy = "ours"
	StrategyTheirs Strategy = "theirs"
	StrategyReject Strategy = "reject"
)

// Valid reports whether s is one of the four strategies.
func (s Strategy) Valid() bool {
	switch s {
	case StrategyMerge, StrategyOurs, StrategyTheirs, StrategyReject:
		return true
	}
	return false
}

// Routes of a plan path (§9.2). A protected change keeps route "source".
const (
	RouteSource  = "source"
	RouteIgnored = "ignored"
)

// Outcomes of a plan path (§9.5).
const (
	OutcomeUnchangedHead = "unchanged_head"
	OutcomeApplied       = "applied"
	OutcomeMerged        = "merged"
	OutcomeOurs          = "ours"
	OutcomeTheirs        = "theirs"
	OutcomeConflict      = "conflict"
	OutcomeProtected     = "protected"
)

// conflict_reason vocabulary (§9.5).
const (
	ConflictReasonTextOverlap        = "text_overlap"
	ConflictReasonNotText            = "not_text"
	ConflictReasonTooLarge           = "too_large"
	ConflictReasonDeleteModify       = "delete_modify"
	ConflictReasonTypeChange         = "type_change"
	ConflictReasonSymlink            = "symlink"
	ConflictReasonMode               = "mode"
	ConflictReasonDirectoryStructure = "directory_structure"
	ConflictReasonChangedOnBothSides = "changed_on_both_sides"
)

// Rejection reasons (§9.8). route_preparation_failed is not produced: an
// unreadable .gitignore contributes nothing (§9.2).
const (
	RejectInvalidBaseRevision          = "invalid_base_revision"
	RejectProtectedPath                = "protected_path"
	RejectSourceConflict               = "source_conflict"
	RejectOpaqueDirProtectedDescendant = "opaque_dir_protected_descendant"
	RejectOpaqueDirMixedRoutes         = "opaque_dir_mixed_routes"
	RejectOpaqueDirExpansionLimit      = "opaque_dir_expansion_limit"
	RejectRoutePreparationFailed       = "route_preparation_failed"
)

// Defaults of PublishOptions (runtime.publish.*) and fixed limits.
const (
	DefaultMaxPlanPaths               = 10000
	DefaultExpansionLimit             = 4096
	DefaultMergeMaxFileBytes    int64 = 8 << 20
	DefaultMergeMaxEditDistance       = 200000
	maxRejectedPaths                  = 10000
	maxResolvedPaths                  = 1000
	maxHunksPerPath                   = 50
)

// PublishOptions configures PublishChangeset.
type PublishOptions struct {
	DefaultStrategy Strategy            // "" means merge
	Resolutions     map[string]Strategy // normalized path → strategy; each must name a plan path
	// Implicit finalization: unsupported_special_file drops are dropped
	// silently, DefaultStrategy and Resolutions are ignored (always merge).
	Implicit       bool
	Protected      *Patterns // runtime.publish.protected_paths (nil = none); ".wh." components are always protected
	MaxPlanPaths   int       // plan listing limit (0 → 10000)
	ExpansionLimit int       // opaque/structural expansion limit (0 → 4096)
	Merge          MergeOptions
	DryRun         bool // plan against the current head without the writer lock, commit nothing
}

// Plan is the publication plan of §9.6. Its JSON is the contract's plan
// object; the other fields feed the publish result.
type Plan struct {
	BaseRevision    Revision   `json:"base_revision"`
	HeadRevision    Revision   `json:"head_revision"`
	DefaultStrategy Strategy   `json:"default_strategy"`
	Truncated       bool       `json:"truncated"`
	Paths           []PlanPath `json:"paths"`
	Conflicts       []PlanPath `json:"conflicts"`

	RouteSummary   RouteSummary   `json:"-"`
	OutcomeSummary OutcomeSummary `json:"-"`
	// WouldCommit: no conflict/protected outcome, no rejection, and the
	// result is not a no-op. After a real publish: a layer was committed.
	WouldCommit bool       `json:"-"`
	Rejection   *Rejection `json:"-"`

	// HeadManifest is the head the plan was resolved against (the previous
	// head of a commit). NewHead is the committed manifest (zero unless a
	// layer was committed); Committed lists its counted paths (§11.2).
	HeadManifest Manifest        `json:"-"`
	NewHead      Manifest        `json:"-"`
	Committed    []CommittedFile `json:"-"`

	all []PlanPath // every plan path (Paths may be truncated)
}

// PlanPath is one entry of plan.paths / plan.conflicts.
type PlanPath struct {
	Path           string         `json:"path"`
	Change         ChangeKind     `json:"change"` // a protected drop is listed as "write"
	Route          string         `json:"route"`
	Strategy       Strategy       `json:"strategy"`
	Outcome        string         `json:"outcome"`
	ConflictReason string         `json:"conflict_reason,omitempty"`
	Base           *Fingerprint   `json:"base"`
	Head           *Fingerprint   `json:"head"`
	Session        *Fingerprint   `json:"session"` // the session's result
	Hunks          []ConflictHunk `json:"hunks,omitempty"`
}

// RouteSummary counts source and ignored changes (carriers excluded).
type RouteSummary struct {
	SourceCount  int `json:"source_count"`
	IgnoredCount int `json:"ignored_count"`
}

// OutcomeSummary counts the plan's outcomes.
type OutcomeSummary struct {
	UnchangedHead int `json:"unchanged_head"`
	Applied       int `json:"applied"`
	Merged        int `json:"merged"`
	Ours          int `json:"ours"`
	Theirs        int `json:"theirs"`
	Conflict      int `json:"conflict"`
	Protected     int `json:"protected"`
}

// Rejection is the publish_rejection object of §9.8; it is also the error
// PublishChangeset returns for a rejected (non-dry-run) publish.
type Rejection struct {
	Path           string          `json:"path"`
	Reason         string          `json:"reason"`
	SourceConflict *SourceConflict `json:"source_conflict"`
	ProtectedDrop  *ProtectedDrop  `json:"protected_drop"`
	Message        *string         `json:"message"`
	Conflicts      []RejectedPath  `json:"conflicts"`
}

// SourceConflict is publish_rejection.source_conflict.
type SourceConflict struct {
	Path     string      `json:"path"`
	Expected Fingerprint `json:"expected"` // base
	Actual   Fingerprint `json:"actual"`   // head
}

// ProtectedDrop is publish_rejection.protected_drop.
type ProtectedDrop struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// RejectedPath is one entry of publish_rejection.conflicts.
type RejectedPath struct {
	Path           string         `json:"path"`
	Reason         string         `json:"reason"`
	Strategy       Strategy       `json:"strategy"`
	ConflictReason string         `json:"conflict_reason,omitempty"`
	Expected       *Fingerprint   `json:"expected,omitempty"`
	Actual         *Fingerprint   `json:"actual,omitempty"`
	Session        *Fingerprint   `json:"session,omitempty"`
	ProtectedDrop  *ProtectedDrop `json:"protected_drop,omitempty"`
	Hunks          []ConflictHunk `json:"hunks"`
}

func (r *Rejection) Error() string {
	msg := "workspace session publish was rejected: " + r.Reason
	if r.Path != "" {
		msg += " at " + r.Path
	}
	if r.Message != nil {
		msg += ": " + *r.Message
	}
	if n := len(r.Conflicts); n > 1 {
		msg += fmt.Sprintf(" (%d rejected paths)", n)
	}
	return msg
}

// ResolutionError reports an invalid resolutions entry or strategy
// (invalid_request): a path that is not a plan path, or an unknown strategy.
type ResolutionError struct {
	Path     string   // "" for default_strategy
	Strategy Strategy // set for an unknown strategy
	Unknown  bool     // Path is not a plan path
}

func (e *ResolutionError) Error() string {
	if e.Unknown {
		return "unknown resolution path: " + e.Path
	}
	if e.Path == "" {
		return fmt.Sprintf("invalid default_strategy %q", e.Strategy)
	}
	return fmt.Sprintf("invalid strategy %q for resolution path %s", e.Strategy, e.Path)
}

// ResolvedPath is one entry of resolved_paths.
type ResolvedPath struct {
	Path     string   `json:"path"`
	Outcome  string   `json:"outcome"`
	Strategy Strategy `json:"strategy"`
}

// ResolvedPaths lists every merged, ours and theirs path (at most 1000), in
// path order, from the full plan (not the truncated listing).
func (p *Plan) ResolvedPaths() []ResolvedPath {
	out := []ResolvedPath{}
	for _, pp := range p.all {
		switch pp.Outcome {
		case OutcomeMerged, OutcomeOurs, OutcomeTheirs:
			if len(out) == maxResolvedPaths {
				return out
			}
			out = append(out, ResolvedPath{Path: pp.Path, Outcome: pp.Outcome, Strategy: pp.Strategy})
		}
	}
	return out
}

// CommittedFile describes one counted path written by a committed layer, for
// line attribution (§11.2): the previous content is Path in
// Plan.HeadManifest's view (PreviousHead is its fingerprint), the committed
// content is Path in Plan.NewHead's view.
type CommittedFile struct {
	Path    string
	Kind    ChangeKind // what the layer holds at Path
	Route   string
	Outcome string // unchanged_head, applied, merged, ours (theirs: head's version re-materialized)
	// Merged: the content is the 3-way merge of base, head and session
	// (not the session's bytes).
	Merged bool
	// SessionSource is the session's upper file of a write, relative to the
	// changeset's Root ("" when the change had in-memory Data or is not a
	// write).
	SessionSource string
	PreviousHead  Fingerprint
}

// PublishChangeset resolves a captured changeset (base = the session's
// leased manifest) against the current head under the exclusive writer lock
// (§9.5) and commits exactly one layer or nothing (§9.8).
//
// A rejection returns the plan and a *Rejection error; the manifest is
// untouched. An invalid resolution returns a *ResolutionError and no plan.
// PublishResult.NoOp reports an empty result or one equal to the head layer.
//
// With DryRun the plan is computed against the head of this moment (pinned by
// a short lease, without the writer lock) and nothing is written; a
// rejection is then reported in Plan.Rejection with a nil error, and
// PublishResult.NoOp predicts the no-op test.
func (s *Stack) PublishChangeset(ctx context.Context, base Manifest, cs *Changeset, opt PublishOptions) (*Plan, PublishResult, error) {
	if cs == nil {
		cs = &Changeset{}
	}
	opt, err := normalizePublishOptions(opt)
	if err != nil {
		return nil, PublishResult{}, err
	}
	if opt.DryRun {
		return s.dryRun(ctx, base, cs, opt)
	}
	var pr *planResult
	res, err := s.Update(ctx, func(v *View) ([]Change, error) {
		var perr error
		pr, perr = s.plan(ctx, base, v.Manifest(), v, cs, opt)
		if perr != nil {
			return nil, perr
		}
		if pr.plan.Rejection != nil {
			return nil, pr.plan.Rejection
		}
		return pr.layer, nil
	})
	if pr == nil {
		return nil, res, err
	}
	plan := pr.plan
	if err != nil {
		if plan.Rejection != nil && errors.Is(err, plan.Rejection) {
			return plan, PublishResult{Revision: plan.HeadRevision}, plan.Rejection
		}
		return plan, res, err
	}
	if !res.NoOp {
		plan.WouldCommit = true
		head := plan.HeadManifest
		plan.NewHead = Manifest{SchemaVersion: SchemaVersion, Version: head.Version + 1,
			Layers: append([]LayerRef{{LayerID: res.LayerID, Path: layersDirName + "/" + res.LayerID}}, head.Layers...)}
		plan.Committed = pr.committed
	}
	return plan, res, nil
}

func (s *Stack) dryRun(ctx context.Context, base Manifest, cs *Changeset, opt PublishOptions) (*Plan, PublishResult, error) {
	head, err := s.Head()
	if err != nil {
		return nil, PublishResult{}, fmt.Errorf("publish dry run: %w", err)
	}
	lease := s.AcquireAt(head, "publish-dry-run")
	defer func() { _, _ = lease.Release() }()
	hv := s.View(head)
	pr, err := s.plan(ctx, base, head, hv, cs, opt)
	if err != nil {
		return nil, PublishResult{}, err
	}
	res := PublishResult{Revision: head.Revision()}
	if pr.plan.Rejection != nil {
		return pr.plan, res, nil
	}
	noop := len(pr.layer) == 0
	if !noop {
		if noop, err = s.wouldBeNoOp(head, hv, pr.layer); err != nil {
			return nil, PublishResult{}, fmt.Errorf("publish dry run: %w", err)
		}
	}
	res.NoOp = noop
	pr.plan.WouldCommit = !noop
	return pr.plan, res, nil
}

func normalizePublishOptions(opt PublishOptions) (PublishOptions, error) {
	if opt.Implicit {
		opt.DefaultStrategy = StrategyMerge
		opt.Resolutions = nil
	}
	if opt.DefaultStrategy == "" {
		opt.DefaultStrategy = StrategyMerge
	}
	if !opt.DefaultStrategy.Valid() {
		return opt, &ResolutionError{Strategy: opt.DefaultStrategy}
	}
	for _, p := range sortedKeys(opt.Resolutions) {
		if st := opt.Resolutions[p]; !st.Valid() {
			return opt, &ResolutionError{Path: p, Strategy: st}
		}
	}
	if opt.MaxPlanPaths <= 0 {
		opt.MaxPlanPaths = DefaultMaxPlanPaths
	}
	if opt.ExpansionLimit <= 0 {
		opt.ExpansionLimit = DefaultExpansionLimit
	}
	if opt.Merge.MaxFileBytes <= 0 {
		opt.Merge.MaxFileBytes = DefaultMergeMaxFileBytes
	}
	if opt.Merge.MaxEditDistance <= 0 {
		opt.Merge.MaxEditDistance = DefaultMergeMaxEditDistance
	}
	return opt, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

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
			if !known[p] {
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
		baseWalks: make(map[string]walkResult)}
	p.ign = NewIgnorer(p.bv)
	for _, c := range changes {
		p.changed[c.Path] = true
	}

	entries := make([]*planEntry, 0, len(changes)+len(drops))
	for _, c := range changes {
		entries = append(entries, &planEntry{change: c})
	}
	for i := range drops {
		entries = append(entries, &planEntry{drop: &drops[i]})
	}
	slices.SortStableFunc(entries, func(a, b *planEntry) int { return strings.Compare(a.path(), b.path()) })

	var dropped []string    // paths whose session change is dropped, with everything below
	var keptOpaque []string // opaque directories the layer writes
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := p.planEntry(e); err != nil {
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
		if len(e.writes) > 0 && e.drop == nil {
			w := e.writes[0]
			cf := CommittedFile{Path: e.path(), Kind: w.Kind, Route: e.pp.Route, Outcome: e.pp.Outcome,
				Merged: e.merged, PreviousHead: e.hSide.fp}
			if w.Kind == ChangeWrite && w.Source != "" && w.Root == e.change.Root && w.Source == e.change.Source {
				cf.SessionSource = w.Source
			}
			pr.committed = append(pr.committed, cf)
		}
	}
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

func (o *OutcomeSummary) add(outcome string) {
	switch outcome {
	case OutcomeUnchangedHead:
		o.UnchangedHead++
	case OutcomeApplied:
		o.Applied++
	case OutcomeMerged:
		o.Merged++
	case OutcomeOurs:
		o.Ours++
	case OutcomeTheirs:
		o.Theirs++
	case OutcomeConflict:
		o.Conflict++
	case OutcomeProtected:
		o.Protected++
	}
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

func (p *planner) strategy(path string) Strategy {
	if st, ok := p.opt.Resolutions[path]; ok {
		return st
	}
	return p.opt.DefaultStrategy
}

// protected reports route 1 of §9.2.
func (p *planner) protected(path string, isDir bool) bool {
	return Protected(path, isDir, p.opt.Protected)
}

// Protected reports whether a publish may not write path (§9.2): a path
// component starting with ".wh." (reserved for whiteouts) or a match of the
// configured protected patterns (nil = none). Sessionless writes use the
// same rule.
func Protected(path string, isDir bool, patterns *Patterns) bool {
	for _, comp := range strings.Split(path, "/") {
		if hiddenName(comp) {
			return true
		}
	}
	return patterns.Match(path, isDir)
}

// emptyDigest is the SHA-256 of no bytes (the content of an absent base).
const emptyDigest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

func fpPtr(f Fingerprint) *Fingerprint { return &f }

// planEntry routes and resolves one entry.
func (p *planner) planEntry(e *planEntry) error {
	path := e.path()
	e.pp = PlanPath{Path: path, Route: RouteSource, Strategy: p.strategy(path)}
	b, h, err := p.sides(path)
	if err != nil {
		return err
	}
	e.bSide, e.hSide = b, h
	e.pp.Base, e.pp.Head = fpPtr(b.fp), fpPtr(h.fp)

	if e.drop != nil { // a protected drop (§9.2)
		e.pp.Change = ChangeWrite
		e.pp.Session = &Fingerprint{Kind: "other"}
		if e.pp.Strategy == StrategyTheirs && !p.opt.Implicit {
			e.pp.Outcome = OutcomeTheirs
			return nil
		}
		e.pp.Outcome, e.reject, e.bucket = OutcomeProtected, RejectProtectedPath, bucketProtected
		return nil
	}

	c := e.change
	e.pp.Change = c.Kind
	sfp, err := sessionFingerprint(c)
	if err != nil {
		return err
	}
	e.pp.Session = &sfp
	isDir := c.Kind == ChangeDirectory || c.Kind == ChangeOpaqueDir || (c.Kind == ChangeDelete && b.kind() == KindDir)
	if p.protected(path, isDir) {
		e.pp.Outcome, e.reject, e.bucket = OutcomeProtected, RejectProtectedPath, bucketProtected
		return nil
	}
	route := RouteSource
	if p.ign.Ignored(path, isDir) {
		route = RouteIgnored
	}
	if c.Kind == ChangeOpaqueDir && b.kind() == KindDir {
		// §9.3: an opaque directory expands to its visible base descendants.
		w, err := p.baseWalk(path)
		if err != nil {
			return err
		}
		if w.overflow {
			e.pp.Outcome, e.reject, e.bucket = OutcomeConflict, RejectOpaqueDirExpansionLimit, bucketOpaque
			e.message = fmt.Sprintf("opaque directory %s has more than %d visible descendants in the base", path, p.opt.ExpansionLimit)
			return nil
		}
		var sources, ignored int
		for _, d := range w.entries {
			if p.protected(d.Path, d.Kind == KindDir) {
				e.pp.Outcome, e.reject, e.bucket = OutcomeProtected, RejectOpaqueDirProtectedDescendant, bucketOpaque
				e.message = "protected descendant " + d.Path
				return nil
			}
			if p.ign.Ignored(d.Path, d.Kind == KindDir) {
				ignored++
			} else {
				sources++
			}
		}
		switch {
		case sources > 0 && ignored > 0:
			e.pp.Outcome, e.reject, e.bucket = OutcomeConflict, RejectOpaqueDirMixedRoutes, bucketOpaque
			e.message = fmt.Sprintf("opaque directory %s replaces %d source and %d ignored paths", path, sources, ignored)
			return nil
		case ignored > 0:
			route = RouteIgnored
		case sources > 0:
			route = RouteSource
		}
	}
	e.pp.Route = route
	if route == RouteIgnored {
		e.pp.Outcome = OutcomeApplied // never validated; last writer wins
		e.writes = []Change{c}
		return nil
	}
	return p.resolve(e)
}

// resolve applies the table of §9.5 to a source-routed change.
func (p *planner) resolve(e *planEntry) error {
	c, b, h := e.change, e.bSide, e.hSide
	st := e.pp.Strategy
	if !p.headChanged {
		e.pp.Outcome, e.writes = OutcomeUnchangedHead, []Change{c}
		return nil
	}
	headEqBase := h.fp.Equal(b.fp)
	if !headEqBase {
		if !b.exists && h.kind() == KindDir && (c.Kind == ChangeDirectory || c.Kind == ChangeOpaqueDir) {
			e.pp.Outcome = OutcomeMerged // both created the directory; head's stays
			return nil
		}
		if sessionEqualsHead(c, *e.pp.Session, h) {
			if st == StrategyReject {
				p.conflict(e, ConflictReasonChangedOnBothSides, nil)
				return nil
			}
			e.pp.Outcome = OutcomeMerged // nothing to write
			return nil
		}
	}
	structural, err := p.ancestorsMoved(c.Path)
	if err != nil {
		return err
	}
	if !structural && b.kind() == KindDir {
		diff, overflow, err := p.subtreeDiffers(c.Path, b, h)
		if err != nil {
			return err
		}
		if overflow {
			e.pp.Outcome, e.reject, e.bucket = OutcomeConflict, RejectOpaqueDirExpansionLimit, bucketOpaque
			e.message = fmt.Sprintf("%s has more than %d visible descendants in base and head", c.Path, p.opt.ExpansionLimit)
			return nil
		}
		structural = diff
	}
	switch {
	case structural:
		p.unclean(e, ConflictReasonDirectoryStructure, nil)
		return nil
	case headEqBase:
		e.pp.Outcome, e.writes = OutcomeUnchangedHead, []Change{c}
		return nil
	case st == StrategyReject:
		p.conflict(e, ConflictReasonChangedOnBothSides, nil)
		return nil
	}
	bk, hk := b.kind(), h.kind()
	if c.Kind == ChangeWrite && hk == KindFile && (bk == KindFile || bk == "") {
		return p.merge3(e)
	}
	var reason string
	sk := sessionKind(c)
	switch {
	case hk == "" || sk == "":
		reason = ConflictReasonDeleteModify
	case hk != sk || (bk != "" && bk != hk):
		reason = ConflictReasonTypeChange
	case hk == KindSymlink:
		reason = ConflictReasonSymlink
	case hk == KindDir:
		reason = ConflictReasonDirectoryStructure
	default:
		reason = ConflictReasonTypeChange // "other" entries
	}
	p.unclean(e, reason, nil)
	return nil
}

// conflict marks e as a source conflict.
func (p *planner) conflict(e *planEntry, reason string, hunks []ConflictHunk) {
	if len(hunks) > maxHunksPerPath {
		hunks = hunks[:maxHunksPerPath]
	}
	e.pp.Outcome, e.pp.ConflictReason, e.pp.Hunks = OutcomeConflict, reason, hunks
	e.reject, e.bucket, e.writes = RejectSourceConflict, bucketSource, nil
}

// unclean applies the strategy to a path that does not merge cleanly.
func (p *planner) unclean(e *planEntry, reason string, hunks []ConflictHunk) {
	switch e.pp.Strategy {
	case StrategyOurs:
		e.pp.Outcome, e.pp.ConflictReason, e.writes = OutcomeOurs, reason, []Change{e.change}
	case StrategyTheirs:
		e.pp.Outcome, e.pp.ConflictReason, e.writes = OutcomeTheirs, reason, nil
		e.dropping = true
	case StrategyReject:
		p.conflict(e, ConflictReasonChangedOnBothSides, nil)
	default:
		p.conflict(e, reason, hunks)
	}
}

// merge3 resolves a session write against a head file (§9.5, §9.7).
func (p *planner) merge3(e *planEntry) error {
	c, b, h := e.change, e.bSide, e.hSide
	var bm *fs.FileMode
	if b.exists {
		m := b.e.Mode.Perm()
		bm = &m
	}
	mode, modeOK := mergeMode(bm, h.e.Mode.Perm(), c.Mode.Perm())

	// Trivial content cases (as in Merge3) are decided by digest, for any
	// size and any bytes, and streamed rather than read.
	baseDigest := emptyDigest
	if b.exists {
		baseDigest = b.fp.Digest
	}
	hd, sd := h.fp.Digest, e.pp.Session.Digest
	if hd == sd || hd == baseDigest || sd == baseDigest {
		if !modeOK {
			p.unclean(e, ConflictReasonMode, nil)
			return nil
		}
		e.pp.Outcome = OutcomeMerged
		switch {
		case hd == sd && mode == h.e.Mode.Perm():
			// head's content and mode: nothing to write
		case hd == sd || hd == baseDigest: // the session's content
			w := c
			w.Mode = mode
			e.writes = []Change{w}
		case mode == h.e.Mode.Perm():
			// head's content and mode: nothing to write
		default: // head's content with the merged mode
			e.merged = true
			e.writes = []Change{{Kind: ChangeWrite, Path: c.Path, Source: h.e.HostPath, Mode: mode, MTime: c.MTime}}
		}
		return nil
	}

	sessionSize := int64(len(c.Data))
	if c.Source != "" {
		f, fi, err := c.OpenSource()
		if err != nil {
			return fmt.Errorf("publish %s: session file: %w", c.Path, err)
		}
		f.Close()
		sessionSize = fi.Size()
	}
	var res MergeResult
	if h.e.Size > p.opt.Merge.MaxFileBytes || b.e.Size > p.opt.Merge.MaxFileBytes || sessionSize > p.opt.Merge.MaxFileBytes {
		res.Reason = ConflictReasonTooLarge
	} else {
		var baseBytes []byte
		if b.exists {
			data, err := readHostFile(b.e.HostPath)
			if err != nil {
				return fmt.Errorf("publish %s: base: %w", c.Path, err)
			}
			baseBytes = data
		}
		headBytes, err := readHostFile(h.e.HostPath)
		if err != nil {
			return fmt.Errorf("publish %s: head: %w", c.Path, err)
		}
		sessionBytes := c.Data
		if c.Source != "" {
			if sessionBytes, err = readSource(c); err != nil {
				return fmt.Errorf("publish %s: session file: %w", c.Path, err)
			}
		}
		res = Merge3(baseBytes, headBytes, sessionBytes, p.opt.Merge)
		if res.Clean && modeOK {
			e.pp.Outcome, e.merged = OutcomeMerged, true
			if string(res.Merged) == string(headBytes) && mode == h.e.Mode.Perm() {
				return nil // the merge is head's version: nothing to write
			}
			e.writes = []Change{{Kind: ChangeWrite, Path: c.Path, Data: res.Merged, Mode: mode, MTime: c.MTime}}
			return nil
		}
	}
	reason, hunks := res.Reason, res.Hunks
	if res.Clean || reason == "" {
		reason, hunks = ConflictReasonMode, nil
	}
	p.unclean(e, reason, hunks)
	return nil
}

// mergeMode is the 3-way mode rule of §9.5 (base nil: absent).
func mergeMode(base *fs.FileMode, head, session fs.FileMode) (fs.FileMode, bool) {
	switch {
	case base != nil && head == *base:
		return session, true
	case base != nil && session == *base:
		return head, true
	case head == session:
		return head, true
	}
	return 0, false
}

// materialize makes an entry whose outcome keeps head's version write that
// version again, because an opaque ancestor in the layer hides head below it.
func (p *planner) materialize(e *planEntry) error {
	if e.pp.Outcome == OutcomeMerged && e.pp.Session.Equal(*e.pp.Head) {
		e.writes = []Change{e.change} // equal to head's version
		if e.change.Kind == ChangeOpaqueDir {
			e.writes[0].Kind = ChangeDirectory
		}
		return p.copyHeadBelow(e)
	}
	h := e.hSide
	switch h.kind() {
	case "":
		return nil
	case KindFile:
		e.writes = []Change{{Kind: ChangeWrite, Path: e.path(), Source: h.e.HostPath, Mode: h.e.Mode.Perm(), MTime: h.e.ModTime}}
		return nil
	case KindSymlink:
		e.writes = []Change{{Kind: ChangeSymlink, Path: e.path(), Target: h.e.Target, MTime: h.e.ModTime}}
		return nil
	case KindDir:
		e.writes = []Change{{Kind: ChangeDirectory, Path: e.path(), Mode: h.e.Mode}}
		return p.copyHeadBelow(e)
	}
	return nil
}

// copyHeadBelow adds head's visible subtree below a materialized directory
// (paths the session changes itself are left to their own entries).
func (p *planner) copyHeadBelow(e *planEntry) error {
	if e.hSide.kind() != KindDir {
		return nil
	}
	w, err := walkView(p.ctx, p.hv, e.path(), p.opt.ExpansionLimit)
	if err != nil {
		return err
	}
	if w.overflow {
		e.pp.Outcome, e.reject, e.bucket = OutcomeConflict, RejectOpaqueDirExpansionLimit, bucketOpaque
		e.message = fmt.Sprintf("%s has more than %d visible descendants in head", e.path(), p.opt.ExpansionLimit)
		e.writes = nil
		return nil
	}
	var skip []string
	for _, d := range w.entries {
		if p.changed[d.Path] || slices.ContainsFunc(skip, func(s string) bool { return isBelow(d.Path, s) }) {
			skip = append(skip, d.Path)
			continue
		}
		switch d.Kind {
		case KindFile:
			e.writes = append(e.writes, Change{Kind: ChangeWrite, Path: d.Path, Source: d.HostPath, Mode: d.Mode.Perm(), MTime: d.ModTime})
		case KindSymlink:
			e.writes = append(e.writes, Change{Kind: ChangeSymlink, Path: d.Path, Target: d.Target, MTime: d.ModTime})
		case KindDir:
			e.writes = append(e.writes, Change{Kind: ChangeDirectory, Path: d.Path, Mode: d.Mode})
		}
	}
	return nil
}

// sessionEqualsHead: the session's result at the path equals head's version,
// content and mode.
func sessionEqualsHead(c Change, sfp Fingerprint, h side) bool {
	if !sfp.Equal(h.fp) {
		return false
	}
	switch c.Kind {
	case ChangeWrite:
		return c.Mode.Perm() == h.e.Mode.Perm()
	case ChangeDirectory, ChangeOpaqueDir:
		return dirMode(c.Mode) == h.e.Mode
	}
	return true
}

func sessionKind(c Change) EntryKind {
	switch c.Kind {
	case ChangeWrite:
		return KindFile
	case ChangeSymlink:
		return KindSymlink
	case ChangeDirectory, ChangeOpaqueDir:
		return KindDir
	}
	return ""
}

// ancestorsMoved reports whether an ancestor of path that the session does
// not change itself is no longer the directory the session wrote into: a
// directory in base that head deleted or replaced, or a non-directory in head
// (the change would silently replace head's entry). Ancestors at or above a
// changed ancestor are that change's business.
func (p *planner) ancestorsMoved(path string) (bool, error) {
	for a := parentOf(path); a != ""; a = parentOf(a) {
		if p.changed[a] {
			return false, nil
		}
		k, ok := p.dirCache[a]
		if !ok {
			b, err := p.stat(p.bv, a, false)
			if err != nil {
				return false, err
			}
			h, err := p.stat(p.hv, a, false)
			if err != nil {
				return false, err
			}
			k = [2]EntryKind{b.kind(), h.kind()}
			p.dirCache[a] = k
		}
		bk, hk := k[0], k[1]
		if (hk != "" && hk != KindDir) || (hk == "" && bk == KindDir) {
			return true, nil
		}
	}
	return false, nil
}

// subtreeDiffers is the structural check of §9.5: whether any visible
// descendant of path in base ∪ head has different fingerprints (overflow:
// more than the expansion limit).
func (p *planner) subtreeDiffers(path string, b, h side) (diff, overflow bool, err error) {
	bw := walkResult{}
	if b.kind() == KindDir {
		if bw, err = p.baseWalk(path); err != nil {
			return false, false, err
		}
	}
	hw := walkResult{}
	if h.kind() == KindDir {
		if hw, err = walkView(p.ctx, p.hv, path, p.opt.ExpansionLimit); err != nil {
			return false, false, err
		}
	}
	if bw.overflow || hw.overflow {
		return false, true, nil
	}
	union := make(map[string][2]*Entry, len(bw.entries)+len(hw.entries))
	for i := range bw.entries {
		d := &bw.entries[i]
		union[d.Path] = [2]*Entry{d, nil}
	}
	for i := range hw.entries {
		d := &hw.entries[i]
		u := union[d.Path]
		u[1] = d
		union[d.Path] = u
	}
	if len(union) > p.opt.ExpansionLimit {
		return false, true, nil
	}
	for _, u := range union {
		if u[0] == nil || u[1] == nil {
			diff = true
			continue
		}
		same, err := sameEntry(*u[0], *u[1])
		if err != nil {
			return false, false, err
		}
		if !same {
			diff = true
		}
	}
	return diff, false, nil
}

func (p *planner) baseWalk(path string) (walkResult, error) {
	if w, ok := p.baseWalks[path]; ok {
		return w, nil
	}
	w, err := walkView(p.ctx, p.bv, path, p.opt.ExpansionLimit)
	if err != nil {
		return walkResult{}, err
	}
	p.baseWalks[path] = w
	return w, nil
}

// walkView lists the visible descendants of dir (pre-order, sorted), at most
// limit of them (overflow when there are more).
func walkView(ctx context.Context, v *View, dir string, limit int) (walkResult, error) {
	var w walkResult
	var rec func(d string) error
	rec = func(d string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		es, err := v.ReadDir(d)
		if err != nil {
			return err
		}
		for _, e := range es {
			if len(w.entries) == limit {
				w.overflow = true
				return nil
			}
			w.entries = append(w.entries, e)
			if e.Kind == KindDir {
				if err := rec(e.Path); err != nil || w.overflow {
					return err
				}
			}
		}
		return nil
	}
	if err := rec(dir); err != nil {
		return walkResult{}, fmt.Errorf("publish: expand %q: %w", dir, err)
	}
	return w, nil
}

// sameEntry compares the fingerprints of two visible entries.
func sameEntry(a, b Entry) (bool, error) {
	if a.Kind != b.Kind {
		return false, nil
	}
	switch a.Kind {
	case KindDir:
		return true, nil
	case KindSymlink:
		return a.Target == b.Target, nil
	case KindFile:
		if a.HostPath == b.HostPath {
			return true, nil
		}
		if a.Size != b.Size || (a.Mode&0o111 != 0) != (b.Mode&0o111 != 0) {
			return false, nil
		}
		x, err := hashHostFile(a.HostPath)
		if err != nil {
			return false, err
		}
		y, err := hashHostFile(b.HostPath)
		if err != nil {
			return false, err
		}
		return x == y, nil
	}
	return a.HostPath == b.HostPath, nil
}

// sides returns the base and head state of path.
func (p *planner) sides(path string) (b, h side, err error) {
	if b, err = p.stat(p.bv, path, true); err != nil {
		return
	}
	if !p.headChanged {
		return b, b, nil
	}
	if h, err = p.stat(p.hv, path, false); err != nil {
		return
	}
	if h.exists && b.exists && h.e.Kind == b.e.Kind && h.e.HostPath == b.e.HostPath {
		h.fp = b.fp
		return
	}
	h.fp, err = fingerprintOf(h)
	return
}

// stat reads one path of a view; paths no layer can hold are absent.
func (p *planner) stat(v *View, path string, withFP bool) (side, error) {
	e, err := v.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid):
		return side{fp: Fingerprint{Kind: "absent"}}, nil
	case err != nil:
		return side{}, fmt.Errorf("publish: %w", err)
	}
	sd := side{exists: true, e: e}
	if withFP {
		if sd.fp, err = fingerprintOf(sd); err != nil {
			return side{}, err
		}
	}
	return sd, nil
}

func fingerprintOf(sd side) (Fingerprint, error) {
	if !sd.exists {
		return Fingerprint{Kind: "absent"}, nil
	}
	switch sd.e.Kind {
	case KindDir:
		return Fingerprint{Kind: "directory"}, nil
	case KindSymlink:
		return Fingerprint{Kind: "symlink", Target: sd.e.Target}, nil
	case KindFile:
		d, err := hashHostFile(sd.e.HostPath)
		if err != nil {
			return Fingerprint{}, fmt.Errorf("publish: fingerprint %s: %w", sd.e.Path, err)
		}
		x := sd.e.Mode&0o111 != 0
		return Fingerprint{Kind: "file", Digest: d, Executable: &x}, nil
	}
	return Fingerprint{Kind: "other"}, nil
}

// sessionFingerprint is the fingerprint of the session's result at the path.
func sessionFingerprint(c Change) (Fingerprint, error) {
	switch c.Kind {
	case ChangeWrite:
		var d string
		if c.Source != "" {
			var err error
			if d, err = hashSource(c); err != nil {
				return Fingerprint{}, fmt.Errorf("publish %s: session file: %w", c.Path, err)
			}
		} else {
			sum := sha256.Sum256(c.Data)
			d = hex.EncodeToString(sum[:])
		}
		x := c.Mode&0o111 != 0
		return Fingerprint{Kind: "file", Digest: d, Executable: &x}, nil
	case ChangeSymlink:
		return Fingerprint{Kind: "symlink", Target: c.Target}, nil
	case ChangeDirectory, ChangeOpaqueDir:
		return Fingerprint{Kind: "directory"}, nil
	case ChangeDelete:
		return Fingerprint{Kind: "absent"}, nil
	}
	return Fingerprint{}, fmt.Errorf("publish %s: unknown change kind %q", c.Path, c.Kind)
}

// openHostFile opens the regular file p of a published layer (written by
// the supervisor, not by a session: only the last component is not
// followed). Files of a session's upper dir are opened with
// Change.OpenSource, beneath their Root.
func openHostFile(p string) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", p, ErrNotRegular)
	}
	return f, fi, nil
}

func hashHostFile(p string) (string, error) { return hashSource(Change{Source: p}) }

func readHostFile(p string) ([]byte, error) { return readSource(Change{Source: p}) }

// hashSource is the SHA-256 of a write's source file.
func hashSource(c Change) (string, error) {
	f, _, err := c.OpenSource()
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// readSource is the content of a write's source file.
func readSource(c Change) ([]byte, error) {
	f, _, err := c.OpenSource()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// wouldBeNoOp predicts commit's no-op test (§8.3) for a dry run: the layer
// would have the head layer's stored digest and exactly its modes.
func (s *Stack) wouldBeNoOp(head Manifest, v *View, changes []Change) (bool, error) {
	if len(head.Layers) == 0 {
		return false, nil
	}
	ref := head.Layers[0]
	have, err := layerModes(s.LayerDir(ref))
	if err != nil {
		return false, err
	}
	want, err := simulateModes(v, changes)
	if err != nil {
		return false, err
	}
	if len(have) != len(want) {
		return false, nil
	}
	for p, m := range want {
		if hm, ok := have[p]; !ok || hm != m {
			return false, nil
		}
	}
	stored, err := s.StoredDigest(ref.LayerID)
	if err != nil {
		return false, nil
	}
	digest, err := ComputeLayerDigest(changes)
	if err != nil {
		return false, err
	}
	return digest == stored, nil
}

// simulateModes is the modes map layerBuilder would record for changes on v.
func simulateModes(v *View, changes []Change) (map[string]fs.FileMode, error) {
	built := map[string]bool{"": true}
	modes := make(map[string]fs.FileMode)
	var ensure func(rel string) error
	ensure = func(rel string) error {
		if built[rel] {
			return nil
		}
		if err := ensure(parentOf(rel)); err != nil {
			return err
		}
		mode := fs.FileMode(0o755)
		e, err := v.Lstat(rel)
		switch {
		case err == nil && e.Kind == KindDir:
			mode = dirMode(e.Mode)
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return err
		}
		built[rel] = true
		modes[rel] = fs.ModeDir | mode
		return nil
	}
	for _, c := range aggregateChanges(changes) {
		if err := ensure(parentOf(c.Path)); err != nil {
			return nil, err
		}
		built[c.Path] = true
		switch c.Kind {
		case ChangeWrite:
			modes[c.Path] = c.Mode.Perm()
		case ChangeDirectory, ChangeOpaqueDir:
			modes[c.Path] = fs.ModeDir | dirMode(c.Mode)
		}
	}
	return modes, nil
}
