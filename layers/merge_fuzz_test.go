package layers

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// FuzzMerge3 checks Merge3 on arbitrary bytes (no panic, result shape,
// symmetry, the trivial identities, a valid and — for small inputs — minimal
// diff) and on a base and two sides generated from seed by random line edits,
// where every line is unique so that the expected outcome is known:
//
//   - a pair of changes of the two sides that overlap or start at the same
//     base line and differ (in particular both changing one base line
//     differently, or two different insertions at one point) is a conflict,
//     never dropped;
//   - without such a pair the merge is clean and equals applying both sides'
//     changes (when the edit distance stays under the cap);
//   - a clean merge holds exactly the base lines both sides kept plus every
//     line either side added, in an order consistent with both sides.
//
// The f.Add seeds run in plain `go test`.
func FuzzMerge3(f *testing.F) {
	f.Add([]byte("a\nb\nc\n"), []byte("a\nB\nc\n"), []byte("a\nb\nC\n"), uint64(1), uint8(1))
	f.Add([]byte("a\nb\nc\n"), []byte("a\nX\nc\n"), []byte("a\nY\nc\n"), uint64(2), uint8(0))
	f.Add([]byte("a\r\nb\r\nc"), []byte("a\r\nb\r\nc\n"), []byte("A\r\nb\r\nc"), uint64(3), uint8(2))
	f.Add([]byte(""), []byte("x\n"), []byte("y\n"), uint64(4), uint8(3))
	f.Add([]byte("x\nx\nx\ny\nx\n"), []byte("x\ny\nx\nx\n"), []byte("y\nx\nx\nx\nx\n"), uint64(5), uint8(4))
	f.Add([]byte("\x00\xff\n"), []byte("\xc3\x28"), []byte("ok\n"), uint64(6), uint8(5))
	f.Add([]byte("é\n€\n"), []byte("é\n€\n𝄞\n"), []byte("E\n€\n"), uint64(7), uint8(8))
	for seed := range uint64(40) {
		f.Add([]byte{}, []byte{}, []byte{}, seed*7919+11, uint8(seed))
	}
	f.Fuzz(func(t *testing.T, base, head, session []byte, seed uint64, knob uint8) {
		opt := MergeOptions{}
		if knob%4 == 0 {
			opt.MaxEditDistance = 1 + int(knob/4)%6
		}
		if knob%16 == 5 {
			opt.MaxFileBytes = int64(1 + int(knob)%64)
		}
		m3FuzzArbitrary(t, base, head, session, opt)
		m3FuzzGenerated(t, seed, knob, opt)
	})
}

func m3FuzzArbitrary(t *testing.T, base, head, session []byte, opt MergeOptions) {
	r := Merge3(base, head, session, opt)
	m3CheckShape(t, base, r)
	m3CheckSwapped(t, r, Merge3(base, session, head, opt))
	m3CheckIdentities(t, base, head, opt)
	m3CheckIdentities(t, base, session, opt)
	if r.Clean && m3IsText(base) && m3IsText(head) && m3IsText(session) && !m3IsText(r.Merged) {
		t.Fatalf("merge of text is not text: %q", r.Merged)
	}
	if !m3IsText(head) || !m3IsText(session) || !m3IsText(base) {
		return
	}
	lt := m3Lines{ids: make(map[string]int32)}
	b, h := lt.split(base), lt.split(head)
	limit := opt.MaxEditDistance
	if limit <= 0 {
		limit = m3DefaultMaxEditDistance
	}
	regs := m3Diff(b, h, limit, len(lt.texts))
	m3CheckRegions(t, b, h, regs)
	if len(b) <= 300 && len(h) <= 300 {
		d := len(b) + len(h) - 2*m3LCS(b, h)
		if cost := m3RegionCost(regs); d <= limit && cost != d || d > limit && len(regs) != 1 {
			t.Fatalf("diff cost %d, distance %d, limit %d: %v", cost, d, limit, regs)
		}
	}
}

// m3CheckIdentities: Merge3(b, x, x) = Merge3(b, b, x) = Merge3(b, x, b) = x.
func m3CheckIdentities(t *testing.T, b, x []byte, opt MergeOptions) {
	t.Helper()
	for k, r := range []MergeResult{Merge3(b, x, x, opt), Merge3(b, b, x, opt), Merge3(b, x, b, opt)} {
		if !r.Clean || !bytes.Equal(r.Merged, x) {
			t.Fatalf("identity %d: got %+v, want %q", k, r, x)
		}
	}
}

// m3Op is what a side does at base position p: insert lines before base line
// p, then keep it, delete it, or replace it (p == len(base): insert at end).
type m3Op struct {
	pre  []string
	del  bool
	repl []string
}

func m3FuzzGenerated(t *testing.T, seed uint64, knob uint8, opt MergeOptions) {
	rng := rand.New(rand.NewPCG(seed, uint64(knob)))
	nb := rng.IntN(14)
	if rng.IntN(4) == 0 {
		nb = rng.IntN(60)
	}
	baseL := make([]string, nb)
	for i := range baseL {
		baseL[i] = fmt.Sprintf("b%d%s", i, m3Term(rng))
	}
	if nb > 0 && rng.IntN(4) == 0 {
		baseL[nb-1] = strings.TrimRight(baseL[nb-1], "\r\n")
	}
	fresh := 0
	newLine := func(side string) string {
		fresh++
		s := fmt.Sprintf("%s%d", side, fresh)
		if rng.IntN(5) == 0 {
			s += "é€"
		}
		return s + m3Term(rng)
	}
	genOps := func(side string, other []m3Op) []m3Op {
		ops := make([]m3Op, nb+1)
		rate := 1 + rng.IntN(4) // edit density
		for p := range ops {
			if other != nil && rng.IntN(3) == 0 {
				ops[p] = other[p] // the same change on both sides
				continue
			}
			if rng.IntN(10) < rate {
				for range 1 + rng.IntN(2) {
					ops[p].pre = append(ops[p].pre, newLine(side))
				}
			}
			if p == nb {
				continue
			}
			switch x := rng.IntN(10); {
			case x < rate:
				ops[p].del = true
			case x < 2*rate:
				ops[p].del = true
				for range 1 + rng.IntN(2) {
					ops[p].repl = append(ops[p].repl, newLine(side))
				}
			case x == 9 && p == nb-1:
				// Toggle the final newline of the last line.
				ops[p].del = true
				if l := baseL[p]; strings.HasSuffix(l, "\n") {
					ops[p].repl = []string{strings.TrimRight(l, "\r\n")}
				} else {
					ops[p].repl = []string{l + "\n"}
				}
			}
		}
		return ops
	}
	render := func(ops []m3Op) string {
		var sb strings.Builder
		for p, op := range ops {
			for _, l := range op.pre {
				sb.WriteString(l)
			}
			if p == nb {
				break
			}
			if op.del {
				for _, l := range op.repl {
					sb.WriteString(l)
				}
			} else {
				sb.WriteString(baseL[p])
			}
		}
		return sb.String()
	}
	hOps := genOps("h", nil)
	sOps := genOps("s", hOps)
	base := strings.Join(baseL, "")
	head, sess := render(hOps), render(sOps)
	if rng.IntN(8) == 0 {
		sess = head
	}

	r := Merge3([]byte(base), []byte(head), []byte(sess), opt)
	m3CheckShape(t, []byte(base), r)
	m3CheckIdentities(t, []byte(base), []byte(head), opt)
	if r.Reason == "too_large" {
		return
	}
	// The lines as Merge3 sees them (a line without "\n" followed by more text
	// fuses with it: still unique, just another new line).
	bl, hl, sl := m3SplitLines(base), m3SplitLines(head), m3SplitLines(sess)
	hc, ok1 := m3Canonical(bl, hl)
	sc, ok2 := m3Canonical(bl, sl)
	if !ok1 || !ok2 {
		t.Fatalf("generator produced repeated lines: %q %q %q", base, head, sess)
	}
	conflict, clean := false, []m3CanonRegion(nil)
	for _, h := range hc {
		for _, s := range sc {
			linked := m3Linked(m3Region{bs: h.bs, be: h.be}, m3Region{bs: s.bs, be: s.be})
			if linked && (h.bs != s.bs || h.be != s.be || !slices.Equal(h.lines, s.lines)) {
				conflict = true
			}
		}
	}
	if conflict {
		if r.Clean {
			t.Fatalf("overlapping changes merged cleanly\nbase %q\nhead %q\nsess %q\n got %q", base, head, sess, r.Merged)
		}
		if r.Reason != "text_overlap" {
			t.Fatalf("reason %q", r.Reason)
		}
		return
	}
	if r.Clean {
		m3CheckCleanContent(t, bl, hl, sl, m3SplitLines(string(r.Merged)), base, head, sess)
	}
	limit := opt.MaxEditDistance
	if limit <= 0 {
		limit = m3DefaultMaxEditDistance
	}
	if m3RegionsCost(hc) > limit || m3RegionsCost(sc) > limit {
		return // a degraded side may conflict where the exact diff does not
	}
	// No differing overlap: clean and equal to applying both sides.
	clean = append(clean, hc...)
	for _, s := range sc {
		if !slices.ContainsFunc(hc, func(h m3CanonRegion) bool {
			return h.bs == s.bs && h.be == s.be && slices.Equal(h.lines, s.lines)
		}) {
			clean = append(clean, s)
		}
	}
	slices.SortStableFunc(clean, func(x, y m3CanonRegion) int { return x.bs - y.bs })
	var want strings.Builder
	pos := 0
	for _, c := range clean {
		want.WriteString(strings.Join(bl[pos:c.bs], ""))
		want.WriteString(strings.Join(c.lines, ""))
		pos = c.be
	}
	want.WriteString(strings.Join(bl[pos:], ""))
	if !r.Clean || string(r.Merged) != want.String() {
		t.Fatalf("disjoint changes\nbase %q\nhead %q\nsess %q\n got %+v\nwant %q", base, head, sess, r, want.String())
	}
}

func m3Term(rng *rand.Rand) string {
	if rng.IntN(6) == 0 {
		return "\r\n"
	}
	return "\n"
}

// m3CanonRegion is a change of a side computed from which base lines survive
// (all lines are unique, so this is the only minimal diff).
type m3CanonRegion struct {
	bs, be int
	lines  []string
}

func m3Canonical(base, side []string) ([]m3CanonRegion, bool) {
	idx := make(map[string]int, len(base))
	for i, l := range base {
		if _, dup := idx[l]; dup {
			return nil, false
		}
		idx[l] = i
	}
	seen := make(map[string]bool, len(side))
	var out []m3CanonRegion
	prev := -1
	var pending []string
	for _, l := range side {
		if seen[l] {
			return nil, false
		}
		seen[l] = true
		bi, ok := idx[l]
		if !ok {
			pending = append(pending, l)
			continue
		}
		if bi <= prev {
			return nil, false
		}
		if bi > prev+1 || len(pending) > 0 {
			out = append(out, m3CanonRegion{prev + 1, bi, pending})
		}
		prev, pending = bi, nil
	}
	if len(base) > prev+1 || len(pending) > 0 {
		out = append(out, m3CanonRegion{prev + 1, len(base), pending})
	}
	return out, true
}

func m3RegionsCost(rs []m3CanonRegion) int {
	c := 0
	for _, r := range rs {
		c += r.be - r.bs + len(r.lines)
	}
	return c
}

// m3CheckCleanContent: the merge keeps the base lines both sides kept, adds
// every line either side added, drops the rest, and orders them as both
// sides do.
func m3CheckCleanContent(t *testing.T, bl, hl, sl, ml []string, base, head, sess string) {
	t.Helper()
	inB, inH, inS, inM := m3Set(bl), m3Set(hl), m3Set(sl), m3Set(ml)
	want := map[string]bool{}
	for _, l := range bl {
		if inH[l] && inS[l] {
			want[l] = true
		}
	}
	for _, side := range [][]string{hl, sl} {
		for _, l := range side {
			if !inB[l] {
				want[l] = true
			}
		}
	}
	fail := func(what string) {
		t.Fatalf("%s\nbase %q\nhead %q\nsess %q\n got %q", what, base, head, sess, strings.Join(ml, ""))
	}
	if len(inM) != len(ml) {
		fail("merged repeats a line")
	}
	if len(want) != len(inM) {
		fail("merged lines differ from the changes of both sides")
	}
	for l := range want {
		if !inM[l] {
			fail("merged lacks " + l)
		}
	}
	for _, side := range [][]string{hl, sl} {
		in := m3Set(side)
		if !slices.Equal(m3Filter(ml, in), m3Filter(side, inM)) {
			fail("merged orders lines unlike a side")
		}
	}
}

func m3Set(l []string) map[string]bool {
	m := make(map[string]bool, len(l))
	for _, s := range l {
		m[s] = true
	}
	return m
}

func m3Filter(l []string, keep map[string]bool) []string {
	var out []string
	for _, s := range l {
		if keep[s] {
			out = append(out, s)
		}
	}
	return out
}
