package layers

import (
	"bytes"
	"fmt"
	"math/rand"
	"strings"
	"testing"
)

func TestSplitLines(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"a", []string{"a"}},
		{"a\n", []string{"a\n"}},
		{"a\nb", []string{"a\n", "b"}},
		{"a\r\nb\r\n", []string{"a\r\n", "b\r\n"}},
		{"a\rb\r", []string{"a\r", "b\r"}},
		{"a\r\r\nb", []string{"a\r", "\r\n", "b"}},
		{"\n\n", []string{"\n", "\n"}},
		{"\ufeffa\n", []string{"\ufeffa\n"}},
	}
	for _, c := range cases {
		var got []string
		for _, l := range SplitLines([]byte(c.in)) {
			got = append(got, string(l))
		}
		if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", c.want) {
			t.Errorf("SplitLines(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestTextEditsRebuild: the edits turn old into new, and LineOrigins keeps
// exactly the lines no hunk touches, for texts mixing LF, CRLF, lone CR and
// a missing final newline.
func TestTextEditsRebuild(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	ends := []string{"\n", "\r\n", "\r"}
	gen := func(n int) string {
		var sb strings.Builder
		for range n {
			fmt.Fprintf(&sb, "l%d%s", r.Intn(6), ends[r.Intn(len(ends))])
		}
		if r.Intn(2) == 0 {
			sb.WriteString("tail")
		}
		return sb.String()
	}
	for i := range 300 {
		old, new := gen(r.Intn(30)), gen(r.Intn(30))
		var out []byte
		pos := 0
		for _, e := range TextEdits([]byte(old), []byte(new)) {
			out = append(append(out, old[pos:e.Start]...), e.New...)
			pos = e.End
		}
		out = append(out, old[pos:]...)
		if !bytes.Equal(out, []byte(new)) {
			t.Fatalf("case %d: edits of %q give %q, want %q", i, old, out, new)
		}
		a, b := SplitLines([]byte(old)), SplitLines([]byte(new))
		origins := LineOrigins([]byte(old), []byte(new))
		kept := 0
		for j, o := range origins {
			if o >= 0 {
				kept++
				if !bytes.Equal(a[o], b[j]) {
					t.Fatalf("case %d: line %d kept from a different line", i, j)
				}
			}
		}
		changed := 0
		for _, h := range DiffLines([]byte(old), []byte(new)) {
			changed += h.NewEnd - h.NewStart
		}
		if kept+changed != len(b) {
			t.Fatalf("case %d: %d kept + %d changed lines != %d", i, kept, changed, len(b))
		}
	}
}
