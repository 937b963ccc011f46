package layers

import (
	"bytes"
	"math"
)

// The one line diff of the module: the 3-way merge (Merge3), blame's line
// origins (LineOrigins) and diff rendering (TextEdits) all split and compare
// lines here, so they cannot disagree about which lines changed.
//
// The line rule: a line ends after "\r\n", "\n" or a lone "\r" and keeps
// that terminator; text after the last terminator is a last line of its own
// (a missing final newline); a leading BOM is part of the first line. Lines
// are equal only when their bytes are, terminator included. Why:
//
//   - The merge writes lines back byte for byte (contract §9.7), so a side
//     that only changed line endings or the final newline has changed those
//     lines; if the comparison ignored terminators, a clean merge would
//     silently drop that change. Blame must see the same lines, so a line
//     whose terminator changed is attributed to whoever changed it, as git
//     does ("\ No newline at end of file").
//   - Counting each terminator as one line end gives exactly the lines
//     file_read numbers (CRLF and lone CR read as LF, one trailing newline
//     starting no line), so blame's line numbers are file_read's. Only a
//     file holding nothing but a BOM differs: one empty line here, none for
//     file_read.
//   - Splitting on lone "\r" too (the merge used to keep it inside a line)
//     only makes the merge finer on old Mac text; the bytes still survive.

// lineLen returns the length of the first line of data (terminator
// included); data is not empty.
func lineLen(data []byte) int {
	i := bytes.IndexAny(data, "\r\n")
	switch {
	case i < 0:
		return len(data)
	case data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n':
		return i + 2
	}
	return i + 1
}

// SplitLines splits text by the line rule above; each line keeps its
// terminator, so joining them gives text back.
func SplitLines(text []byte) [][]byte {
	var out [][]byte
	for len(text) > 0 {
		n := lineLen(text)
		out = append(out, text[:n:n])
		text = text[n:]
	}
	return out
}

// LineHunk is one change of a line diff: lines [OldStart, OldEnd) of the old
// text became lines [NewStart, NewEnd) of the new one (0-based, half-open;
// OldStart == OldEnd is an insertion before old line OldStart).
type LineHunk struct {
	OldStart, OldEnd int
	NewStart, NewEnd int
}

// DiffLines returns the hunks of a minimal line edit script from old to new
// (the merge's diff: Myers, lines by the rule above). Beyond an edit
// distance of 200000 lines, or the work budget, it degrades to one hunk
// between the common prefix and suffix, as the merge does.
func DiffLines(old, new []byte) []LineHunk {
	lt := m3Lines{ids: make(map[string]int32)}
	a, b := lt.split(old), lt.split(new)
	regs := m3Diff(a, b, m3DefaultMaxEditDistance, len(lt.texts))
	out := make([]LineHunk, len(regs))
	for i, r := range regs {
		out[i] = LineHunk{OldStart: r.bs, OldEnd: r.be, NewStart: r.ns, NewEnd: r.ne}
	}
	return out
}

// LineOrigins maps each line of new to the index of the line of old it is
// kept from by DiffLines, or -1 for a line new introduces.
func LineOrigins(old, new []byte) []int {
	n := 0
	for rest := new; len(rest) > 0; n++ {
		rest = rest[lineLen(rest):]
	}
	out := make([]int, n)
	i, j := 0, 0
	keep := func(upto int) {
		for ; j < upto; i, j = i+1, j+1 {
			out[j] = i
		}
	}
	for _, h := range DiffLines(old, new) {
		keep(h.NewStart)
		for ; j < h.NewEnd; j++ {
			out[j] = -1
		}
		i = h.OldEnd
	}
	keep(n)
	return out
}

// TextEdit replaces bytes [Start, End) of the old text by New: a hunk of
// DiffLines in the byte form diff printers take.
type TextEdit struct {
	Start, End int
	New        string
}

// TextEdits returns the hunks of DiffLines(old, new) as byte edits of old,
// whole lines each.
func TextEdits(old, new []byte) []TextEdit {
	offsets := func(text []byte) []int {
		out := []int{0}
		for pos := 0; pos < len(text); {
			pos += lineLen(text[pos:])
			out = append(out, pos)
		}
		return out
	}
	oa, ob := offsets(old), offsets(new)
	hunks := DiffLines(old, new)
	out := make([]TextEdit, len(hunks))
	for k, h := range hunks {
		out[k] = TextEdit{Start: oa[h.OldStart], End: oa[h.OldEnd], New: string(new[ob[h.NewStart]:ob[h.NewEnd]])}
	}
	return out
}

// m3DiffBudget bounds the work of one Myers search (diagonal visits plus
// snake steps, a few nanoseconds each) so that a pathological input, such as
// a large file shuffled on one side, cannot hold the publish lock for long:
// beyond it the diff degrades as beyond the edit distance cap. Usual edits
// need far less (moving 5% of a 200,000-line file: about 10^8). A variable
// for tests only.
var m3DiffBudget = 1 << 27

// m3Lines interns lines: equal lines of the three files share one id.
type m3Lines struct {
	ids   map[string]int32
	texts []string
}

func (lt *m3Lines) split(data []byte) []int32 {
	out := make([]int32, 0, bytes.Count(data, []byte{'\n'})+1)
	for len(data) > 0 {
		n := lineLen(data)
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

// m3Region is one change of a side: base lines [bs, be) are replaced by the
// side's lines [ns, ne). bs == be is a pure insertion before base line bs.
// The regions of one side are sorted and separated by at least one unchanged
// line. coarse marks the single region of a side whose diff degraded
// (edit distance beyond the cap).
type m3Region struct {
	bs, be, ns, ne int
	coarse         bool
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
