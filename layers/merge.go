package layers

import (
	"bytes"
	"math"
	"strings"
	"unicode/utf8"
)

// 3-way line merge of one file at publish time (contract §9.7). Merge3 is a
// pure function of its three inputs; the mode rule and the per-strategy
// outcome (§9.5) belong to the caller.

// MergeOptions bounds the merge (§9.7).
type MergeOptions struct {
	MaxFileBytes    int64 // runtime.publish.merge_max_file_bytes, 8 MiB; 0 means 8 MiB
	MaxEditDistance int   // runtime.publish.merge_max_edit_distance, 200000; 0 means 200000; beyond it the diff degrades to delete-all/insert-all
}

// ConflictHunk is one conflicting region, lines 1-based in base.
//
// BaseStartLine is the first base line of the region; for a region that
// covers no base line (an insertion on both sides) it is the base line the
// insertions precede, len(base lines)+1 at the end of the file, and
// BaseLineCount is 0. Each text is the exact bytes of the region in base,
// head and session (line terminators included), cut to at most 4096 bytes at
// a UTF-8 boundary, with TextTruncated set when any of the three was cut.
type ConflictHunk struct {
	BaseStartLine int    `json:"base_start_line"`
	BaseLineCount int    `json:"base_line_count"`
	BaseText      string `json:"base_text"`
	HeadText      string `json:"head_text"`
	SessionText   string `json:"session_text"`
	TextTruncated bool   `json:"text_truncated"`
}

// MergeResult: Clean with Merged bytes, or not clean with Reason
// "text_overlap" | "not_text" | "too_large" and Hunks (text_overlap only;
// ≤ 50, texts ≤ 4096 bytes, TextTruncated when cut — cut at a UTF-8
// boundary). Merged is never nil when Clean and never aliases an input.
type MergeResult struct {
	Clean  bool
	Merged []byte
	Reason string
	Hunks  []ConflictHunk
}

const (
	m3DefaultMaxFileBytes    int64 = 8 << 20
	m3DefaultMaxEditDistance       = 200000
	m3MaxHunks                     = 50
	m3MaxHunkText                  = 4096

	m3ReasonOverlap  = "text_overlap"
	m3ReasonNotText  = "not_text"
	m3ReasonTooLarge = "too_large"
)

// Merge3 merges head's and session's changes to base line by line.
//
// Trivial cases come first and hold for any bytes: head == session gives
// that content, head == base gives session, session == base gives head.
// Otherwise all three must be at most MaxFileBytes (else "too_large") and
// contain no NUL byte and be valid UTF-8 (else "not_text").
//
// Lines are split and compared by the module's one line rule (linediff.go:
// terminators "\r\n", "\n" and lone "\r" stay inside their line, a last
// line without one is a line of its own), so terminators and a missing final
// newline survive byte for byte, and blame sees the same changed lines. Each
// side is diffed against base with Myers' algorithm (minimal line edit
// script). When its edit distance exceeds
// MaxEditDistance, or the search exceeds a fixed work budget (m3DiffBudget),
// the side degrades to one coarse region replacing everything between the
// common prefix and suffix, which conflicts with any change of the other side
// inside or touching it.
//
// Regions of the two sides are grouped (transitively) when their base ranges
// overlap or they start at the same base line; a group changed by one side
// takes that side, one changed by both takes the common replacement when both
// turn the group's base lines into the same lines, and is otherwise a
// conflicting hunk ("text_overlap"). Replacements that only touch each other
// (lines 3-4 on one side, line 5 on the other) merge cleanly; two different
// insertions at the same point conflict, and so does an insertion right
// before or right after a block the other side replaced or deleted (m3Linked).
func Merge3(base, head, session []byte, opt MergeOptions) MergeResult {
	switch {
	case bytes.Equal(head, session):
		return m3Clean(head)
	case bytes.Equal(head, base):
		return m3Clean(session)
	case bytes.Equal(session, base):
		return m3Clean(head)
	}
	maxBytes := opt.MaxFileBytes
	if maxBytes <= 0 {
		maxBytes = m3DefaultMaxFileBytes
	}
	// Line ids are int32: refuse what could not be numbered (only reachable
	// with a configured limit far above the default).
	total := int64(len(base)) + int64(len(head)) + int64(len(session))
	if int64(len(base)) > maxBytes || int64(len(head)) > maxBytes || int64(len(session)) > maxBytes ||
		total >= math.MaxInt32 {
		return MergeResult{Reason: m3ReasonTooLarge}
	}
	if !m3IsText(base) || !m3IsText(head) || !m3IsText(session) {
		return MergeResult{Reason: m3ReasonNotText}
	}
	limit := opt.MaxEditDistance
	if limit <= 0 {
		limit = m3DefaultMaxEditDistance
	}

	lt := m3Lines{ids: make(map[string]int32)}
	b, h, s := lt.split(base), lt.split(head), lt.split(session)
	hr := m3Diff(b, h, limit, len(lt.texts))
	sr := m3Diff(b, s, limit, len(lt.texts))
	return lt.combine(b, h, s, hr, sr, max(len(head), len(session)))
}

func m3Clean(content []byte) MergeResult {
	merged := make([]byte, len(content))
	copy(merged, content)
	return MergeResult{Clean: true, Merged: merged}
}

func m3IsText(p []byte) bool {
	return bytes.IndexByte(p, 0) < 0 && utf8.Valid(p)
}

// text joins the lines ids, cut to at most limit bytes at a UTF-8 boundary.
func (lt *m3Lines) text(ids []int32, limit int) (string, bool) {
	var sb strings.Builder
	for _, id := range ids {
		s := lt.texts[id]
		if sb.Len()+len(s) > limit {
			cut := limit - sb.Len()
			for cut > 0 && !utf8.RuneStart(s[cut]) {
				cut--
			}
			sb.WriteString(s[:cut])
			return sb.String(), true
		}
		sb.WriteString(s)
	}
	return sb.String(), false
}

func (lt *m3Lines) appendLines(dst []byte, ids []int32) []byte {
	for _, id := range ids {
		dst = append(dst, lt.texts[id]...)
	}
	return dst
}

// combine groups the regions of both sides and builds the result.
func (lt *m3Lines) combine(base, head, sess []int32, hr, sr []m3Region, sizeHint int) MergeResult {
	merged := make([]byte, 0, sizeHint)
	var hunks []ConflictHunk
	conflict := false
	pos, i, j := 0, 0, 0
	for i < len(hr) || j < len(sr) {
		hi0, si0 := i, j
		g := m3Group{ge: -1, last: -1, sticky: -1}
		if j >= len(sr) || (i < len(hr) && hr[i].bs <= sr[j].bs) {
			g.add(hr[i])
			i++
		} else {
			g.add(sr[j])
			j++
		}
		gs := g.last
		// Regions of one side never touch, so this grows the group exactly by
		// the other side's regions linked to a member (m3Linked).
		for {
			if i < len(hr) && g.joins(hr[i]) {
				g.add(hr[i])
				i++
				continue
			}
			if j < len(sr) && g.joins(sr[j]) {
				g.add(sr[j])
				j++
				continue
			}
			break
		}
		ge := g.ge
		hg, sg := hr[hi0:i], sr[si0:j]
		var take []int32
		switch {
		case len(sg) == 0:
			take = m3SideLines(head, hg, gs, ge)
		case len(hg) == 0:
			take = m3SideLines(sess, sg, gs, ge)
		default:
			ht, st := m3SideLines(head, hg, gs, ge), m3SideLines(sess, sg, gs, ge)
			if m3EqualIDs(ht, st) {
				take = ht
				break
			}
			conflict = true
			if len(hunks) < m3MaxHunks {
				hk := ConflictHunk{BaseStartLine: gs + 1, BaseLineCount: ge - gs}
				var t1, t2, t3 bool
				hk.BaseText, t1 = lt.text(base[gs:ge], m3MaxHunkText)
				hk.HeadText, t2 = lt.text(ht, m3MaxHunkText)
				hk.SessionText, t3 = lt.text(st, m3MaxHunkText)
				hk.TextTruncated = t1 || t2 || t3
				hunks = append(hunks, hk)
			}
		}
		if !conflict {
			merged = lt.appendLines(merged, base[pos:gs])
			merged = lt.appendLines(merged, take)
		}
		pos = ge
	}
	if conflict {
		return MergeResult{Reason: m3ReasonOverlap, Hunks: hunks}
	}
	merged = lt.appendLines(merged, base[pos:])
	return MergeResult{Clean: true, Merged: merged}
}

// m3Group tracks a group being built: the largest end and start of its
// members, and the largest end of a coarse member.
type m3Group struct{ ge, last, sticky int }

func (g *m3Group) add(r m3Region) {
	g.ge, g.last = max(g.ge, r.be), max(g.last, r.bs)
	if r.coarse {
		g.sticky = max(g.sticky, r.be)
	}
}

// joins reports whether r, starting at or after every member, is linked to
// one: it starts inside the span, at a member's start, at the span's end as
// an insertion or a coarse region, or at or before a coarse member's end.
func (g *m3Group) joins(r m3Region) bool {
	return r.bs < g.ge || r.bs == g.last || r.bs <= g.sticky ||
		(r.bs == g.ge && (r.bs == r.be || r.coarse))
}

// m3Linked is the grouping rule between a region of each side: their base
// ranges overlap, they start at the same base line, or one is an insertion
// at a point of the other's range including its end. Replacements that only
// touch (lines 3-4 and line 5) stay apart; an insertion right after a
// replaced or deleted block is grouped with it like one right before it
// (two insertions at one point: the block's new lines and the insertion).
// A coarse region (degraded diff) no longer knows where its insertions lie,
// so it is linked to every region touching it.
func m3Linked(h, s m3Region) bool {
	switch {
	case h.bs == s.bs:
		return true
	case h.coarse || s.coarse:
		return h.bs <= s.be && s.bs <= h.be
	case h.bs == h.be:
		return s.bs <= h.bs && h.bs <= s.be
	case s.bs == s.be:
		return h.bs <= s.bs && s.bs <= h.be
	}
	return h.bs < s.be && s.bs < h.be
}

// m3SideLines returns a side's lines for the base span [gs, ge), given the
// side's regions inside the span (none: the span is unchanged on that side).
func m3SideLines(side []int32, rs []m3Region, gs, ge int) []int32 {
	first, last := rs[0], rs[len(rs)-1]
	return side[first.ns-(first.bs-gs) : last.ne+(ge-last.be)]
}

func m3EqualIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}
