package layers

import (
	"fmt"
	"strings"
)

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

	sfp, err := sessionFingerprint(&e.change, &p.loadBudget)
	if err != nil {
		return err
	}
	c := e.change
	e.pp.Change = c.Kind
	e.pp.Session = &sfp
	isDir := c.Kind == ChangeDirectory || c.Kind == ChangeOpaqueDir || (c.Kind == ChangeDelete && b.kind() == KindDir)
	if p.protected(path, isDir) {
		e.pp.Outcome, e.reject, e.bucket = OutcomeProtected, RejectProtectedPath, bucketProtected
		return nil
	}
	if p.gitEntry(e, c, isDir) {
		return nil
	}
	if outcome := gitOutcome(path, c.Kind, isDir); outcome != "" {
		// Never published, never a conflict (contract A8). A sync keeps
		// the session's own copy as it is.
		e.pp.Route, e.pp.Outcome = RouteGit, outcome
		if p.opt.keepGit {
			e.writes = []Change{c}
		}
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

// gitOutcome routes a change inside a git directory that publication never
// carries: private state, protected files, and the removal or replacement
// of a git directory itself (the head keeps its repository whole). It
// returns "" for every other change (objects, refs, the directories git
// makes, and ordinary paths).
func gitOutcome(path string, kind ChangeKind, isDir bool) string {
	g := ClassifyGit(path, isDir)
	switch g.Kind {
	case GitPrivate:
		return OutcomeGitPrivate
	case GitProtected:
		return OutcomeGitProtected
	case GitDirItself:
		if kind == ChangeDelete || kind == ChangeOpaqueDir {
			return OutcomeGitProtected
		}
	}
	return ""
}
