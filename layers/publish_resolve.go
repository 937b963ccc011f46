package layers

import (
	"fmt"
	"io/fs"
	"slices"
)

// emptyDigest is the SHA-256 of no bytes (the content of an absent base).
const emptyDigest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

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
