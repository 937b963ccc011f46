package attribution

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// agreeLines splits text the way the contract numbers lines (file_read):
// each line ends after "\r\n", "\n" or a lone "\r", keeping it.
func agreeLines(s string) []string {
	var out []string
	for len(s) > 0 {
		n := len(s)
		if i := strings.IndexAny(s, "\r\n"); i >= 0 {
			n = i + 1
			if s[i] == '\r' && i+1 < len(s) && s[i+1] == '\n' {
				n++
			}
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

// agreeRegion is a change of the session: base lines [bs, be) became
// session lines [ns, ne).
type agreeRegion struct{ bs, be, ns, ne int }

// regionsOf turns blame's origins (session line → base line or -1) into
// the session's change regions against base.
func regionsOf(origins []int, nBase int) []agreeRegion {
	var out []agreeRegion
	pb, pn := 0, 0
	flush := func(b, n int) {
		if b > pb || n > pn {
			out = append(out, agreeRegion{pb, b, pn, n})
		}
	}
	for j, o := range origins {
		if o < 0 {
			continue
		}
		flush(o, j)
		pb, pn = o+1, j+1
	}
	flush(nBase, len(origins))
	return out
}

// linkedToLine is the contract's grouping rule (§9.7) between head's
// replacement of base line i alone and a session region: overlapping,
// starting at the same base line, or a session insertion at either end.
func linkedToLine(i int, r agreeRegion) bool {
	if r.bs == r.be {
		return i <= r.bs && r.bs <= i+1
	}
	return r.bs == i || (r.bs < i+1 && i < r.be)
}

// TestMergeBlameAgree checks that the 3-way merge and blame see the same
// changed lines. For each base line i, head replaces line i alone. Blame's
// line origins of the session against base predict the merge: a conflict
// exactly when a session change touches line i, else the session's text
// with the session line blame maps to base line i replaced by head's.
func TestMergeBlameAgree(t *testing.T) {
	long := func(seed int64, n int) (string, string) {
		r := rand.New(rand.NewSource(seed))
		var base []string
		for k := range n {
			switch r.Intn(4) {
			case 0:
				base = append(base, "}\n")
			case 1:
				base = append(base, "\n")
			default:
				base = append(base, fmt.Sprintf("line %d %d\n", k, r.Intn(50)))
			}
		}
		sess := append([]string(nil), base...)
		for range n / 40 {
			k := r.Intn(len(sess))
			switch r.Intn(4) {
			case 0:
				sess = append(sess[:k], sess[k+1:]...)
			case 1:
				sess = append(sess[:k], append([]string{"}\n", "new\n"}, sess[k:]...)...)
			case 2:
				sess[k] = strings.TrimSuffix(sess[k], "\n") + "\r\n"
			default:
				sess[k] = "}\n"
			}
		}
		return strings.Join(base, ""), strings.Join(sess, "")
	}
	longBase, longSess := long(1, 4000)
	long2Base, long2Sess := long(2, 2500)
	cases := []struct{ name, base, sess string }{
		{"crlf to lf", "a\r\nb\r\nc\r\nd\r\n", "a\r\nb\nc\r\nd\r\n"},
		{"lf to crlf all", "a\nb\nc\n", "a\r\nb\r\nc\r\n"},
		{"final newline added", "a\nb\nc", "a\nb\nc\n"},
		{"final newline removed", "a\nb\nc\n", "a\nb\nc"},
		{"append after missing newline", "a\nb\nc", "a\nb\nc\nd\n"},
		{"crlf insert", "a\r\nb\r\nc\r\n", "a\r\nX\r\nb\r\nc\r\n"},
		{"duplicates", "x\nx\ny\nx\nx\n", "x\ny\nx\n"},
		{"bom", "\ufeffa\nb\n", "a\nb\n"},
		{"lone cr", "a\rb\rc\r", "a\rX\rc\r"},
		{"long", longBase, longSess},
		{"long crlf", strings.ReplaceAll(long2Base, "\n", "\r\n"), long2Sess},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base, sess := agreeLines(c.base), agreeLines(c.sess)
			origins := lineOrigins([]byte(c.base), []byte(c.sess))
			if len(origins) != len(sess) {
				t.Fatalf("blame sees %d session lines, the contract %d", len(origins), len(sess))
			}
			regions := regionsOf(origins, len(base))
			step := max(1, len(base)/150)
			for i := 0; i < len(base); i += step {
				head := append([]string(nil), base...)
				head[i] = fmt.Sprintf("HEAD %d\n", i)
				res := layers.Merge3([]byte(c.base), []byte(strings.Join(head, "")), []byte(c.sess), layers.MergeOptions{})
				conflict := false
				for _, r := range regions {
					conflict = conflict || linkedToLine(i, r)
				}
				if conflict {
					if res.Clean {
						t.Fatalf("base line %d: blame sees it changed by the session, merge does not", i+1)
					}
					continue
				}
				if !res.Clean {
					t.Fatalf("base line %d: blame sees it kept by the session, merge conflicts (%s)", i+1, res.Reason)
				}
				want := append([]string(nil), sess...)
				for j, o := range origins {
					if o == i {
						want[j] = head[i]
					}
				}
				if got := string(res.Merged); got != strings.Join(want, "") {
					t.Fatalf("base line %d: merge and blame place it differently", i+1)
				}
			}
		})
	}
}
