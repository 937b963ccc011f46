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
// Lines end after each "\n" and keep it ("\r\n" stays inside the line, a last
// line without "\n" is a line of its own), so terminators and a missing final
// newline survive byte for byte. Each side is diffed against base with Myers'
// algorithm (minimal line edit script). When its edit distance exceeds
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

// m3DiffBudget bounds the work of one Myers search (diagonal visits plus
// snake steps, a few nanoseconds each) so that a pathological input, such as
// a large file shuffled on one side, cannot hold the publish lock for long:
// beyond it the diff degrades as beyond the edit distance cap. Usual edits
// need far less (moving 5% of a 200,000-line file: about 10^8). A variable
// for tests only.
var m3DiffBudget = 1 << 27

func m3Clean(content []byte) MergeResult {
	merged := make([]byte, len(content))
	copy(merged, content)
	return MergeResult{Clean: true, Merged: merged}
}

func m3IsText(p []byte) bool {
	return bytes.IndexByte(p, 0) < 0 && utf8.Valid(p)
}

// m3Lines interns lines: equal lines of the three files share one id.
type m3Lines struct {
	ids   map[string]int32
	texts []string
}

func (lt *m3Lines) split(data []byte) []int32 {
	out := make([]int32, 0, bytes.Count(data, []byte{'\n'})+1)
	for len(data) > 0 {
		n := len(data)
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			n = i + 1
		}
		line := data[:n]
		data = data[n:]
		id, ok := lt.ids[string(line)]
		if !ok {
			id = int32(len(lt.texts))
			s := string(line)
			lt.ids[s] = id
			lt.texts = append(lt.texts, s)
		}
		out = append(out, id)
	}
	return out
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

// m3Region is one change of a side: base lines [bs, be) are replaced by the
// side's lines [ns, ne). bs == be is a pure insertion before base line bs.
// The regions of one side are sorted and separated by at least one unchanged
// line. coarse marks the single region of a side whose diff degraded
// (edit distance beyond the cap).
type m3Region struct {
	bs, be, ns, ne int
	coarse         bool
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

// m3Diff returns the regions of a minimal line edit script from a to b, or,
// when its edit distance exceeds limit or finding it exceeds the work budget,
// the single coarse region covering all but the common prefix and suffix.
// nids bounds the line ids.
//
// Lines present in only one of the two middles can never match: they are
// marked at once and Myers runs on the rest (same LCS, so still minimal),
// which keeps the usual edits (new or removed text) cheap whatever the size.
func m3Diff(a, b []int32, limit, nids int) []m3Region {
	lo := 0
	for lo < len(a) && lo < len(b) && a[lo] == b[lo] {
		lo++
	}
	ea, eb := len(a), len(b)
	for ea > lo && eb > lo && a[ea-1] == b[eb-1] {
		ea--
		eb--
	}
	if ea == lo && eb == lo {
		return nil
	}
	if ea == lo || eb == lo {
		return []m3Region{{bs: lo, be: ea, ns: lo, ne: eb}}
	}
	whole := []m3Region{{bs: lo, be: ea, ns: lo, ne: eb, coarse: true}}
	am, bm := a[lo:ea], b[lo:eb]
	ca, cb := make([]int32, nids), make([]int32, nids)
	for _, id := range am {
		ca[id]++
	}
	for _, id := range bm {
		cb[id]++
	}
	// Σ |count_a(line) − count_b(line)| bounds the distance from below: a
	// rewrite is refused in O(n+m).
	lb := 0
	for id := range ca {
		lb += int(max(ca[id]-cb[id], cb[id]-ca[id]))
	}
	if lb > limit {
		return whole
	}
	delA, insB := make([]bool, len(a)), make([]bool, len(b))
	var ka, kb []int32 // kept positions in am, bm
	var a2, b2 []int32
	for i, id := range am {
		if cb[id] == 0 {
			delA[lo+i] = true
		} else {
			ka, a2 = append(ka, int32(i)), append(a2, id)
		}
	}
	for j, id := range bm {
		if ca[id] == 0 {
			insB[lo+j] = true
		} else {
			kb, b2 = append(kb, int32(j)), append(b2, id)
		}
	}
	limit -= len(am) - len(a2) + len(bm) - len(b2)
	if len(a2) > 0 || len(b2) > 0 {
		z := (min(limit, len(a2)+len(b2))+1)/2 + 2
		d := m3Differ{
			a: a2, b: b2,
			delA: make([]bool, len(a2)), insB: make([]bool, len(b2)),
			fd: make([]int, 2*z+1), bd: make([]int, 2*z+1), z: z,
			budget: m3DiffBudget,
		}
		if !d.compare(0, len(a2), 0, len(b2), limit) {
			return whole
		}
		for p, del := range d.delA {
			if del {
				delA[lo+int(ka[p])] = true
			}
		}
		for p, ins := range d.insB {
			if ins {
				insB[lo+int(kb[p])] = true
			}
		}
	}
	return m3Regions(delA, insB)
}

// m3Regions turns the marks of an edit script into maximal change regions.
func m3Regions(delA, insB []bool) []m3Region {
	var out []m3Region
	i, j := 0, 0
	for i < len(delA) || j < len(insB) {
		if (i < len(delA) && delA[i]) || (j < len(insB) && insB[j]) {
			r := m3Region{bs: i, ns: j}
			for i < len(delA) && delA[i] {
				i++
			}
			for j < len(insB) && insB[j] {
				j++
			}
			r.be, r.ne = i, j
			out = append(out, r)
			continue
		}
		i++
		j++
	}
	return out
}

// m3Differ is the linear-space variant of Myers' O(ND) algorithm, after GNU
// diffutils' diffseq.h (compareseq/diag) without its heuristics: the script
// is minimal. delA marks deleted lines of a, insB inserted lines of b.
type m3Differ struct {
	a, b       []int32
	delA, insB []bool
	fd, bd     []int // furthest x per diagonal, forward and backward, indexed k-mid+z
	z          int
	budget     int // diagonal visits and snake steps left
}

// compare diffs a[xoff:xlim] with b[yoff:ylim]; false when the edit distance
// exceeds limit (only checked for the outermost call: the halves are cheaper)
// or the work budget runs out.
func (d *m3Differ) compare(xoff, xlim, yoff, ylim, limit int) bool {
	for xoff < xlim && yoff < ylim && d.a[xoff] == d.b[yoff] {
		xoff++
		yoff++
	}
	for xlim > xoff && ylim > yoff && d.a[xlim-1] == d.b[ylim-1] {
		xlim--
		ylim--
	}
	switch {
	case xoff == xlim:
		for y := yoff; y < ylim; y++ {
			d.insB[y] = true
		}
		return true
	case yoff == ylim:
		for x := xoff; x < xlim; x++ {
			d.delA[x] = true
		}
		return true
	}
	xmid, ymid, ok := d.diag(xoff, xlim, yoff, ylim, limit)
	if !ok {
		return false
	}
	if (xmid == xoff && ymid == yoff) || (xmid == xlim && ymid == ylim) {
		// Cannot happen once prefix and suffix are trimmed (the distance is
		// then at least 2 and splits in two non-empty halves); stay finite.
		for x := xoff; x < xlim; x++ {
			d.delA[x] = true
		}
		for y := yoff; y < ylim; y++ {
			d.insB[y] = true
		}
		return true
	}
	return d.compare(xoff, xmid, yoff, ymid, math.MaxInt) && d.compare(xmid, xlim, ymid, ylim, math.MaxInt)
}

// diag finds a point (xmid, ymid) of a minimal path from (xoff, yoff) to
// (xlim, ylim) by searching forward and backward at once. The region must
// start and end with differing lines. false when the distance exceeds limit.
func (d *m3Differ) diag(xoff, xlim, yoff, ylim, limit int) (int, int, bool) {
	a, b, fd, bd, z := d.a, d.b, d.fd, d.bd, d.z
	dmin, dmax := xoff-ylim, xlim-yoff // valid diagonals
	fmid, bmid := xoff-yoff, xlim-ylim // centres of the two searches
	fmin, fmax, bmin, bmax := fmid, fmid, bmid, bmid
	odd := (fmid-bmid)&1 != 0
	fo, bo := z-fmid, z-bmid // index offsets
	fd[fmid+fo] = xoff
	bd[bmid+bo] = xlim
	for c := 1; ; c++ {
		// Distance found in this round: 2c-1 forward (odd), 2c backward.
		if cost := 2*c - m3B2i(odd); cost > limit {
			return 0, 0, false
		}
		if fmin > dmin {
			fmin--
			fd[fmin-1+fo] = -1
		} else {
			fmin++
		}
		if fmax < dmax {
			fmax++
			fd[fmax+1+fo] = -1
		} else {
			fmax--
		}
		for k := fmax; k >= fmin; k -= 2 {
			tlo, thi := fd[k-1+fo], fd[k+1+fo]
			x := thi
			if tlo >= thi {
				x = tlo + 1
			}
			y := x - k
			x0 := x
			for x < xlim && y < ylim && a[x] == b[y] {
				x++
				y++
			}
			if d.budget -= 1 + x - x0; d.budget < 0 {
				return 0, 0, false
			}
			fd[k+fo] = x
			if odd && bmin <= k && k <= bmax && bd[k+bo] <= x {
				return x, y, true
			}
		}
		if bmin > dmin {
			bmin--
			bd[bmin-1+bo] = math.MaxInt
		} else {
			bmin++
		}
		if bmax < dmax {
			bmax++
			bd[bmax+1+bo] = math.MaxInt
		} else {
			bmax--
		}
		for k := bmax; k >= bmin; k -= 2 {
			tlo, thi := bd[k-1+bo], bd[k+1+bo]
			x := tlo
			if tlo >= thi {
				x = thi - 1
			}
			y := x - k
			x0 := x
			for x > xoff && y > yoff && a[x-1] == b[y-1] {
				x--
				y--
			}
			if d.budget -= 1 + x0 - x; d.budget < 0 {
				return 0, 0, false
			}
			bd[k+bo] = x
			if !odd && fmin <= k && k <= fmax && x <= fd[k+fo] {
				return x, y, true
			}
		}
	}
}

func m3B2i(v bool) int {
	if v {
		return 1
	}
	return 0
}
