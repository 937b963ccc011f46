package layers

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// m3Hunk is the expected shape of a conflicting hunk in the table below.
type m3Hunk struct {
	start, count           int
	baseT, headT, sessionT string
}

func TestMerge3Table(t *testing.T) {
	const five = "a\nb\nc\nd\ne\n"
	tests := []struct {
		name                string
		base, head, session string
		opt                 MergeOptions
		want                string   // merged bytes when clean
		reason              string   // "" means clean
		hunks               []m3Hunk // checked when reason is text_overlap
	}{
		{name: "disjoint edits", base: five, head: "a\nB\nc\nd\ne\n", session: "a\nb\nc\nD\ne\n",
			want: "a\nB\nc\nD\ne\n"},
		{name: "disjoint insert, delete and edit", base: five, head: "x\na\nb\nd\ne\n", session: "a\nb\nc\nd\nE\ny\n",
			want: "x\na\nb\nd\nE\ny\n"},
		{name: "overlapping different edits", base: five, head: "a\nX\nd\ne\n", session: "a\nb\nY\nd\ne\n",
			reason: "text_overlap", hunks: []m3Hunk{{2, 2, "b\nc\n", "X\n", "b\nY\n"}}},
		{name: "same line edited differently", base: five, head: "a\nb\nC1\nd\ne\n", session: "a\nb\nC2\nd\ne\n",
			reason: "text_overlap", hunks: []m3Hunk{{3, 1, "c\n", "C1\n", "C2\n"}}},
		{name: "two conflicts and a clean change", base: five, head: "A1\nb\nc\nd\nE1\n", session: "A2\nb\nC\nd\nE2\n",
			reason: "text_overlap", hunks: []m3Hunk{{1, 1, "a\n", "A1\n", "A2\n"}, {5, 1, "e\n", "E1\n", "E2\n"}}},
		{name: "identical edits", base: five, head: "a\nB\nc\nD\ne\n", session: "a\nB\nc\nD\ne\nf\n",
			want: "a\nB\nc\nD\ne\nf\n"},
		{name: "identical deletions", base: five, head: "a\nc\nd\ne\n", session: "a\nc\nd\n",
			want: "a\nc\nd\n"},
		{name: "insert at same point conflicts", base: five, head: "a\nx\nb\nc\nd\ne\n", session: "a\ny\nb\nc\nd\ne\n",
			reason: "text_overlap", hunks: []m3Hunk{{2, 0, "", "x\n", "y\n"}}},
		{name: "append at end conflicts", base: five, head: five + "x\n", session: five + "y\n",
			reason: "text_overlap", hunks: []m3Hunk{{6, 0, "", "x\n", "y\n"}}},
		{name: "same insertion at same point", base: five, head: "a\nx\nb\nc\nd\ne\n", session: "a\nx\nb\nc\nd\nE\n",
			want: "a\nx\nb\nc\nd\nE\n"},
		{name: "insertions at neighbouring points", base: five, head: "a\nx\nb\nc\nd\ne\n", session: "a\nb\ny\nc\nd\ne\n",
			want: "a\nx\nb\ny\nc\nd\ne\n"},
		{name: "adjacent replacements", base: five, head: "a\nB\nc\nd\ne\n", session: "a\nb\nC\nd\ne\n",
			want: "a\nB\nC\nd\ne\n"},
		{name: "adjacent block replacements", base: five, head: "a\nB\nC\nd\ne\n", session: "a\nb\nc\nD\nE\n",
			want: "a\nB\nC\nD\nE\n"},
		{name: "adjacent deletions", base: five, head: "a\nc\nd\ne\n", session: "a\nb\nd\ne\n",
			want: "a\nd\ne\n"},
		{name: "insertion right after a replaced line conflicts", base: five, head: "a\nB\nc\nd\ne\n", session: "a\nb\ny\nc\nd\ne\n",
			reason: "text_overlap", hunks: []m3Hunk{{2, 1, "b\n", "B\n", "b\ny\n"}}},
		{name: "insertion right after a deleted block conflicts", base: five, head: "a\nd\ne\n", session: "a\nb\nc\nx\nd\ne\n",
			reason: "text_overlap", hunks: []m3Hunk{{2, 2, "b\nc\n", "", "b\nc\nx\n"}}},
		{name: "insertion one line after a replaced line", base: five, head: "a\nB\nc\nd\ne\n", session: "a\nb\nc\ny\nd\ne\n",
			want: "a\nB\nc\ny\nd\ne\n"},
		{name: "insertion inside a replaced block conflicts", base: five, head: "a\nX\nd\ne\n", session: "a\nb\ny\nc\nd\ne\n",
			reason: "text_overlap", hunks: []m3Hunk{{2, 2, "b\nc\n", "X\n", "b\ny\nc\n"}}},
		{name: "insertion before an edited line conflicts", base: five, head: "a\nx\nb\nc\nd\ne\n", session: "a\nB\nc\nd\ne\n",
			reason: "text_overlap", hunks: []m3Hunk{{2, 1, "b\n", "x\nb\n", "B\n"}}},
		{name: "deletion vs edit of the same line", base: five, head: "a\nb\nd\ne\n", session: "a\nb\nC\nd\ne\n",
			reason: "text_overlap", hunks: []m3Hunk{{3, 1, "c\n", "", "C\n"}}},
		{name: "chained overlap forms one hunk", base: five, head: "a\nX\nY\nd\ne\n", session: "a\nb\nZ\nW\ne\n",
			reason: "text_overlap", hunks: []m3Hunk{{2, 3, "b\nc\nd\n", "X\nY\nd\n", "b\nZ\nW\n"}}},
		{name: "CRLF byte exact", base: "a\r\nb\r\nc\r\nd\r\n", head: "A\r\nb\r\nc\r\nd\r\n", session: "a\r\nb\r\nc\r\nD\r\n",
			want: "A\r\nb\r\nc\r\nD\r\n"},
		{name: "CRLF line ending change is a change", base: "a\r\nb\r\nc\r\nd\r\n", head: "a\r\nb\nc\r\nd\r\n", session: "a\r\nb\r\nc\r\nd\r\ne\n",
			want: "a\r\nb\nc\r\nd\r\ne\n"},
		{name: "CRLF conflicting ending change", base: "a\r\nb\r\n", head: "a\r\nb\n", session: "a\r\nB\r\n",
			reason: "text_overlap", hunks: []m3Hunk{{2, 1, "b\r\n", "b\n", "B\r\n"}}},
		{name: "lone CR stays inside the line", base: "a\rb\nc\n", head: "a\rB\nc\n", session: "a\rb\nC\n",
			want: "a\rB\nC\n"},
		{name: "missing final newline kept", base: "a\nb\nc", head: "A\nb\nc", session: "a\nb\nC",
			want: "A\nb\nC"},
		{name: "head drops final newline", base: "a\nb\nc\n", head: "a\nb\nc", session: "A\nb\nc\n",
			want: "A\nb\nc"},
		{name: "session adds final newline", base: "a\nb\nc", head: "A\nb\nc", session: "a\nb\nc\n",
			want: "A\nb\nc\n"},
		{name: "both append after missing newline", base: "a\nb", head: "a\nb\nx", session: "a\nb\ny\n",
			reason: "text_overlap", hunks: []m3Hunk{{2, 1, "b", "b\nx", "b\ny\n"}}},
		{name: "final newline toggled vs edited", base: "a\nb\nc", head: "a\nb\nc\n", session: "a\nb\nC",
			reason: "text_overlap", hunks: []m3Hunk{{3, 1, "c", "c\n", "C"}}},
		{name: "empty base, different content", base: "", head: "x\n", session: "y\n",
			reason: "text_overlap", hunks: []m3Hunk{{1, 0, "", "x\n", "y\n"}}},
		{name: "empty base, same content", base: "", head: "x\ny", session: "x\ny", want: "x\ny"},
		{name: "empty base, common first line", base: "", head: "x\nh\n", session: "x\ns\n",
			reason: "text_overlap", hunks: []m3Hunk{{1, 0, "", "x\nh\n", "x\ns\n"}}},
		{name: "everything deleted vs edit", base: five, head: "", session: "a\nb\nC\nd\ne\n",
			reason: "text_overlap", hunks: []m3Hunk{{1, 5, five, "", "a\nb\nC\nd\ne\n"}}},
		{name: "head equals base", base: five, head: five, session: "z\n", want: "z\n"},
		{name: "session equals base", base: five, head: "", session: five, want: ""},
		{name: "head equals session", base: five, head: "q\n", session: "q\n", want: "q\n"},
		{name: "binary but trivial", base: "\x00\xff", head: "\x00\xff", session: "\x01\xfe", want: "\x01\xfe"},
		{name: "NUL in head", base: five, head: "a\x00\n", session: "b\n", reason: "not_text"},
		{name: "NUL in base", base: "a\x00\n", head: "a\n", session: "b\n", reason: "not_text"},
		{name: "invalid UTF-8 in session", base: five, head: "a\n", session: "\xc3\x28\n", reason: "not_text"},
		{name: "truncated rune in base", base: "a\n\xe2\x82", head: "a\n", session: "b\n", reason: "not_text"},
		{name: "valid UTF-8 merges", base: "é\nü\n", head: "É\nü\n", session: "é\nÜ\n", want: "É\nÜ\n"},
		{name: "too large", base: five, head: "a\n", session: "b\n", opt: MergeOptions{MaxFileBytes: 9}, reason: "too_large"},
		{name: "too large wins over not_text", base: "\x00" + five, head: "a\n", session: "b\n",
			opt: MergeOptions{MaxFileBytes: 9}, reason: "too_large"},
		{name: "at the size limit", base: five, head: "a\nB\nc\nd\ne\n", session: "a\nb\nc\nd\nE\n",
			opt: MergeOptions{MaxFileBytes: 10}, want: "a\nB\nc\nd\nE\n"},
		{name: "edit distance at the cap stays fine", base: five, head: "a\nB\nc\nd\ne\n", session: "a\nb\nc\nD\ne\n",
			opt: MergeOptions{MaxEditDistance: 2}, want: "a\nB\nc\nD\ne\n"},
		{name: "edit distance beyond the cap degrades", base: five, head: "a\nB\nc\nD\ne\n", session: "a\nb\nC\nd\ne\n",
			opt:    MergeOptions{MaxEditDistance: 3},
			reason: "text_overlap", hunks: []m3Hunk{{2, 3, "b\nc\nd\n", "B\nc\nD\n", "b\nC\nd\n"}}},
		{name: "degraded side still merges away from its span", base: five + "f\n", head: "a\nB\nc\nD\ne\nf\n", session: "a\nb\nc\nd\ne\nF\n",
			opt: MergeOptions{MaxEditDistance: 3}, want: "a\nB\nc\nD\ne\nF\n"},
		{name: "degraded side conflicts with a touching change", base: five, head: "a\nB\nc\nD\ne\n", session: "a\nb\nc\nd\nE\n",
			opt:    MergeOptions{MaxEditDistance: 3},
			reason: "text_overlap", hunks: []m3Hunk{{2, 4, "b\nc\nd\ne\n", "B\nc\nD\ne\n", "b\nc\nd\nE\n"}}},
		{name: "same touching change is clean without the cap", base: five, head: "a\nB\nc\nD\ne\n", session: "a\nb\nc\nd\nE\n",
			want: "a\nB\nc\nD\nE\n"},
		{name: "without the cap the same merge is clean", base: five, head: "a\nB\nc\nD\ne\n", session: "a\nb\nC\nd\ne\n",
			want: "a\nB\nC\nD\ne\n"},
		{name: "repeated lines", base: "x\nx\nx\n", head: "x\nx\n", session: "z\nx\nx\nx\n",
			want: "z\nx\nx\n"},
		{name: "repeated lines, deletion vs append", base: "x\nx\nx\n", head: "x\nx\n", session: "x\nx\nx\ny\n",
			reason: "text_overlap", hunks: []m3Hunk{{3, 1, "x\n", "", "x\ny\n"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Merge3([]byte(tc.base), []byte(tc.head), []byte(tc.session), tc.opt)
			m3CheckShape(t, []byte(tc.base), r)
			if tc.reason == "" {
				if !r.Clean || string(r.Merged) != tc.want {
					t.Fatalf("got %+v, want clean %q", r, tc.want)
				}
			} else {
				if r.Clean || r.Reason != tc.reason {
					t.Fatalf("got %+v, want reason %s", r, tc.reason)
				}
				if tc.reason == "text_overlap" {
					var got []m3Hunk
					for _, h := range r.Hunks {
						got = append(got, m3Hunk{h.BaseStartLine, h.BaseLineCount, h.BaseText, h.HeadText, h.SessionText})
					}
					if fmt.Sprint(got) != fmt.Sprint(tc.hunks) {
						t.Fatalf("hunks\n got %+v\nwant %+v", got, tc.hunks)
					}
				} else if len(r.Hunks) != 0 {
					t.Fatalf("hunks with reason %s: %+v", r.Reason, r.Hunks)
				}
			}
			// Swapping the sides swaps the hunk texts and nothing else.
			sw := Merge3([]byte(tc.base), []byte(tc.session), []byte(tc.head), tc.opt)
			m3CheckSwapped(t, r, sw)
		})
	}
}

func TestMerge3MergedDoesNotAlias(t *testing.T) {
	head := []byte("x\n")
	r := Merge3([]byte("a\n"), head, head, MergeOptions{})
	r.Merged[0] = 'y'
	if string(head) != "x\n" {
		t.Fatal("Merged aliases head")
	}
	if r := Merge3(nil, nil, nil, MergeOptions{}); !r.Clean || r.Merged == nil {
		t.Fatalf("empty merge: %+v", r)
	}
}

func TestMerge3HunkLimits(t *testing.T) {
	// 60 conflicting lines separated by unchanged ones: at most 50 hunks.
	var base, head, sess strings.Builder
	for i := range 60 {
		fmt.Fprintf(&base, "keep %d\nline %d\n", i, i)
		fmt.Fprintf(&head, "keep %d\nhead %d\n", i, i)
		fmt.Fprintf(&sess, "keep %d\nsession %d\n", i, i)
	}
	r := Merge3([]byte(base.String()), []byte(head.String()), []byte(sess.String()), MergeOptions{})
	m3CheckShape(t, []byte(base.String()), r)
	if r.Clean || r.Reason != "text_overlap" || len(r.Hunks) != 50 {
		t.Fatalf("clean=%v reason=%q hunks=%d", r.Clean, r.Reason, len(r.Hunks))
	}
	if h := r.Hunks[49]; h.BaseStartLine != 100 || h.HeadText != "head 49\n" || h.TextTruncated {
		t.Fatalf("hunk 50: %+v", h)
	}

	// Long conflicting texts with multi-byte runes are cut at a rune boundary.
	long := strings.Repeat("€uro ", 1000) + "\n" // 8001 bytes
	r = Merge3([]byte("a\n"+long+"z\n"), []byte("a\nh"+long+"z\n"), []byte("a\n"+"s\n"+"z\n"), MergeOptions{})
	m3CheckShape(t, []byte("a\n"+long+"z\n"), r)
	if r.Clean || len(r.Hunks) != 1 {
		t.Fatalf("%+v", r)
	}
	h := r.Hunks[0]
	if !h.TextTruncated || len(h.BaseText) > 4096 || len(h.BaseText) < 4090 || len(h.HeadText) > 4096 ||
		!utf8.ValidString(h.BaseText) || !utf8.ValidString(h.HeadText) || h.SessionText != "s\n" ||
		!strings.HasPrefix(long, h.BaseText) || !strings.HasPrefix("h"+long, h.HeadText) {
		t.Fatalf("truncation: trunc=%v base %d head %d session %q", h.TextTruncated, len(h.BaseText), len(h.HeadText), h.SessionText)
	}
}

// A 10,000-line file with scattered edits on both sides, and a full rewrite
// on one side (beyond the default cap after the lower bound).
func TestMerge3LargeFile(t *testing.T) {
	const n = 10000
	base := make([]string, n)
	for i := range base {
		base[i] = fmt.Sprintf("line %d of the big file\n", i%997) // repeated lines
	}
	head := append([]string(nil), base...)
	sess := append([]string(nil), base...)
	want := append([]string(nil), base...)
	for i := 5; i < n; i += 50 {
		head[i] = fmt.Sprintf("head %d\n", i)
		want[i] = head[i]
		sess[i+20] = fmt.Sprintf("session %d\n", i+20)
		want[i+20] = sess[i+20]
	}
	join := func(l []string) []byte { return []byte(strings.Join(l, "")) }
	r := Merge3(join(base), join(head), join(sess), MergeOptions{})
	if !r.Clean || !bytes.Equal(r.Merged, join(want)) {
		t.Fatalf("large merge: clean=%v reason=%s hunks=%d", r.Clean, r.Reason, len(r.Hunks))
	}

	// Every line of head is new and the session also edits: one big conflict.
	rewrite := make([]string, n)
	for i := range rewrite {
		rewrite[i] = fmt.Sprintf("rewritten %d\n", i)
	}
	r = Merge3(join(base), join(rewrite), join(sess), MergeOptions{MaxEditDistance: 1000})
	if r.Clean || len(r.Hunks) != 1 || r.Hunks[0].BaseLineCount != n || !r.Hunks[0].TextTruncated {
		t.Fatalf("rewrite: clean=%v hunks=%d", r.Clean, len(r.Hunks))
	}
	// A shuffled file passes the lower bound and needs the search to hit the cap.
	shuffled := append([]string(nil), base...)
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	r = Merge3(join(base), join(shuffled), join(sess), MergeOptions{MaxEditDistance: 2000})
	if r.Clean || len(r.Hunks) != 1 {
		t.Fatalf("shuffled: clean=%v hunks=%d", r.Clean, len(r.Hunks))
	}
	r = Merge3(join(base), join(shuffled), join(sess), MergeOptions{})
	m3CheckShape(t, join(base), r)
}

// Beyond the work budget a side degrades like beyond the cap: coarser, still
// correct.
func TestMerge3WorkBudget(t *testing.T) {
	var base, head, sess, far, want []string
	for i := range 200 {
		base = append(base, fmt.Sprintf("line %d\n", i))
	}
	head = append(head, base[:50]...)
	for i := 149; i >= 50; i-- { // lines 50..149 reversed: distance 198
		head = append(head, base[i])
	}
	head = append(head, base[150:]...)
	sess = append(append(append(sess, base[:100]...), "S\n"), base[101:]...)
	far = append(append(append(far, base[:190]...), "F\n"), base[191:]...)
	want = append(append(append(want, head[:190]...), "F\n"), head[191:]...)
	join := func(l []string) []byte { return []byte(strings.Join(l, "")) }

	saved := m3DiffBudget
	defer func() { m3DiffBudget = saved }()
	for _, budget := range []int{saved, 500} {
		m3DiffBudget = budget
		lt := m3Lines{ids: make(map[string]int32)}
		b, h := lt.split(join(base)), lt.split(join(head))
		regs := m3Diff(b, h, m3DefaultMaxEditDistance, len(lt.texts))
		m3CheckRegions(t, b, h, regs)
		if coarse := len(regs) == 1 && regs[0].coarse; coarse != (budget == 500) || m3RegionCost(regs) < 198 {
			t.Fatalf("budget %d: %v", budget, regs)
		}
		if r := Merge3(join(base), join(head), join(far), MergeOptions{}); !r.Clean || !bytes.Equal(r.Merged, join(want)) {
			t.Fatalf("budget %d: far edit: %+v", budget, r)
		}
		if r := Merge3(join(base), join(head), join(sess), MergeOptions{}); r.Clean {
			t.Fatalf("budget %d: overlapping edit merged", budget)
		}
	}
}

// The diff is a valid and minimal edit script (checked against an LCS table),
// and degrades to one region beyond the cap.
func TestMerge3DiffMinimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for iter := range 3000 {
		a := m3RandIDs(rng, rng.IntN(30), 1+rng.IntN(6))
		b := m3RandIDs(rng, rng.IntN(30), 1+rng.IntN(6))
		if iter%3 == 0 { // b as a mutation of a
			b = m3Mutate(rng, a, 1+rng.IntN(6))
		}
		regs := m3Diff(a, b, m3DefaultMaxEditDistance, 8)
		m3CheckRegions(t, a, b, regs)
		if got, want := m3RegionCost(regs), len(a)+len(b)-2*m3LCS(a, b); got != want {
			t.Fatalf("a=%v b=%v: cost %d, want %d (%v)", a, b, got, want, regs)
		}
		limit := rng.IntN(8)
		capped := m3Diff(a, b, limit, 8)
		m3CheckRegions(t, a, b, capped)
		if d := len(a) + len(b) - 2*m3LCS(a, b); d <= limit {
			if m3RegionCost(capped) != d {
				t.Fatalf("a=%v b=%v limit %d: cost %d, want %d", a, b, limit, m3RegionCost(capped), d)
			}
		} else if len(capped) != 1 {
			t.Fatalf("a=%v b=%v limit %d > distance %d: %v", a, b, limit, d, capped)
		}
	}
}

func m3RandIDs(rng *rand.Rand, n, alphabet int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(rng.IntN(alphabet))
	}
	return out
}

func m3Mutate(rng *rand.Rand, a []int32, alphabet int) []int32 {
	var out []int32
	for _, v := range a {
		switch rng.IntN(6) {
		case 0:
		case 1:
			out = append(out, int32(rng.IntN(alphabet)))
		case 2:
			out = append(out, int32(rng.IntN(alphabet)), v)
		default:
			out = append(out, v)
		}
	}
	return out
}

func m3LCS(a, b []int32) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for i := range a {
		for j := range b {
			if a[i] == b[j] {
				cur[j+1] = prev[j] + 1
			} else {
				cur[j+1] = max(prev[j+1], cur[j])
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func m3RegionCost(regs []m3Region) int {
	c := 0
	for _, r := range regs {
		c += r.be - r.bs + r.ne - r.ns
	}
	return c
}

// m3CheckRegions: sorted, separated by an unchanged line, and applying them
// to a gives b.
func m3CheckRegions(t *testing.T, a, b []int32, regs []m3Region) {
	t.Helper()
	var out []int32
	pa, pb := 0, 0
	for k, r := range regs {
		if r.bs < pa || r.be < r.bs || r.ne < r.ns || (k > 0 && r.bs == pa) || r.be > len(a) || r.ne > len(b) ||
			(r.bs == r.be && r.ns == r.ne) || r.ns-pb != r.bs-pa {
			t.Fatalf("bad regions %v for a=%v b=%v", regs, a, b)
		}
		out = append(out, a[pa:r.bs]...)
		out = append(out, b[r.ns:r.ne]...)
		pa, pb = r.be, r.ne
	}
	out = append(out, a[pa:]...)
	if !m3EqualIDs(out, b) || len(a)-pa != len(b)-pb {
		t.Fatalf("regions %v turn a=%v into %v, want %v", regs, a, out, b)
	}
}

// m3CheckShape checks what holds for every result.
func m3CheckShape(t *testing.T, base []byte, r MergeResult) {
	t.Helper()
	if r.Clean {
		if r.Merged == nil || r.Reason != "" || r.Hunks != nil {
			t.Fatalf("clean result %+v", r)
		}
		return
	}
	if r.Merged != nil {
		t.Fatalf("merged bytes with reason %q", r.Reason)
	}
	switch r.Reason {
	case "not_text", "too_large":
		if r.Hunks != nil {
			t.Fatalf("hunks with %s", r.Reason)
		}
		return
	case "text_overlap":
	default:
		t.Fatalf("reason %q", r.Reason)
	}
	if len(r.Hunks) == 0 || len(r.Hunks) > 50 {
		t.Fatalf("%d hunks", len(r.Hunks))
	}
	lines := m3SplitLines(string(base))
	next := 1
	for _, h := range r.Hunks {
		if h.BaseStartLine < next || h.BaseLineCount < 0 || h.BaseStartLine+h.BaseLineCount > len(lines)+1 {
			t.Fatalf("hunk lines %d+%d (next %d, %d lines)", h.BaseStartLine, h.BaseLineCount, next, len(lines))
		}
		next = h.BaseStartLine + h.BaseLineCount
		for _, s := range []string{h.BaseText, h.HeadText, h.SessionText} {
			if len(s) > 4096 || !utf8.ValidString(s) {
				t.Fatalf("hunk text of %d bytes, valid=%v", len(s), utf8.ValidString(s))
			}
		}
		if want := strings.Join(lines[h.BaseStartLine-1:next-1], ""); !h.TextTruncated && h.BaseText != want ||
			h.TextTruncated && !strings.HasPrefix(want, h.BaseText) {
			t.Fatalf("base text %q, want %q", h.BaseText, want)
		}
		if !h.TextTruncated && h.HeadText == h.SessionText {
			t.Fatalf("conflict between equal texts %q", h.HeadText)
		}
	}
}

// m3CheckSwapped: Merge3(b, s, h) mirrors Merge3(b, h, s).
func m3CheckSwapped(t *testing.T, r, sw MergeResult) {
	t.Helper()
	if r.Clean != sw.Clean || !bytes.Equal(r.Merged, sw.Merged) || r.Reason != sw.Reason || len(r.Hunks) != len(sw.Hunks) {
		t.Fatalf("not symmetric: %+v vs %+v", r, sw)
	}
	for k, h := range r.Hunks {
		h.HeadText, h.SessionText = h.SessionText, h.HeadText
		if h != sw.Hunks[k] {
			t.Fatalf("hunk %d not symmetric: %+v vs %+v", k, h, sw.Hunks[k])
		}
	}
}

// m3SplitLines splits after each "\n", keeping it.
func m3SplitLines(s string) []string {
	var out []string
	for s != "" {
		n := strings.IndexByte(s, '\n') + 1
		if n == 0 {
			n = len(s)
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}
