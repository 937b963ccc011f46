package layers

import (
	"context"
	"errors"
	"slices"
)

// The publish*.go files are the publication planner of §9.2–§9.8: it routes a captured
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
	// RouteGit: a path inside a git directory that publication never
	// carries (ClassifyGit: private or protected); see OutcomeGitPrivate.
	RouteGit = "git"
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
	// OutcomeGitPrivate: the session's own git state (index, logs,
	// COMMIT_EDITMSG, lock files …): never published, never a conflict.
	OutcomeGitPrivate = "git_private"
	// OutcomeGitProtected: a git file that can make git run a program
	// (config, hooks/, info/ …) or the removal of a git directory: the
	// session keeps its own copy, publication never carries it, and it is
	// not a rejection.
	OutcomeGitProtected = "git_protected"
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
	// Git configures the git route (refs mode, identities); contract A8.
	Git GitOptions

	// keepGit: a sync keeps the session's git-private and git-protected
	// changes verbatim in its new upper instead of leaving them out.
	keepGit bool
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
