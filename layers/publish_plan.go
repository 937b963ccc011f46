package layers

import (
	"fmt"
)

// Plan is the publication plan of §9.6. Its JSON is the contract's plan
// object; the other fields feed the publish result.
type Plan struct {
	BaseRevision    Revision   `json:"base_revision"`
	HeadRevision    Revision   `json:"head_revision"`
	DefaultStrategy Strategy   `json:"default_strategy"`
	Truncated       bool       `json:"truncated"`
	Paths           []PlanPath `json:"paths"`
	Conflicts       []PlanPath `json:"conflicts"`
	// GitRefs: the ref decisions of the git route (contract A8).
	GitRefs []GitRefUpdate `json:"git_refs,omitempty"`

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
	GitPrivate    int `json:"git_private"`
	GitProtected  int `json:"git_protected"`
	GitObject     int `json:"git_object"`
	GitRef        int `json:"git_ref"`
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
	// Content is what the layer holds at Path when the planner read the
	// session's file once (small files, SessionSource set); nil means read
	// it from the layer or the session.
	Content      []byte
	PreviousHead Fingerprint
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
	case OutcomeGitPrivate:
		o.GitPrivate++
	case OutcomeGitProtected:
		o.GitProtected++
	case OutcomeGitObject:
		o.GitObject++
	case OutcomeGitRef:
		o.GitRef++
	}
}
