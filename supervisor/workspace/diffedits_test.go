package workspace

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/aymanbagabas/go-udiff"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// TestDiffRenderingUsesTheLineDiff: workspace_diff prints the hunks of the
// layers line diff, so its -/+ lines are the lines the publish merge and
// blame see changed (line endings and a missing final newline included).
func TestDiffRenderingUsesTheLineDiff(t *testing.T) {
	cases := []struct{ name, old, new string }{
		{"crlf to lf of one line", "a\r\nb\r\nc\r\n", "a\r\nb\nc\r\n"},
		{"final newline added", "a\nb\nc", "a\nb\nc\n"},
		{"append after missing newline", "a\nb", "a\nb\nc\n"},
		{"duplicates", "x\nx\ny\nx\nx\n", "x\ny\nx\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			text, err := udiff.ToUnified("a/f", "b/f", c.old, wsDiffEdits(c.old, c.new), wsDiffContext)
			if err != nil {
				t.Fatal(err)
			}
			// Old and new line numbers (1-based) the printed diff removes and adds.
			var removed, added []int
			o, n := 0, 0
			for _, l := range strings.Split(text, "\n") {
				switch {
				case strings.HasPrefix(l, "@@"):
					if _, err := fmt.Sscanf(l, "@@ -%d", &o); err != nil {
						t.Fatalf("header %q: %v", l, err)
					}
					var rest string
					_, _ = fmt.Sscanf(l[strings.Index(l, "+"):], "+%s", &rest)
					n, _ = strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
				case strings.HasPrefix(l, "+++"), strings.HasPrefix(l, "---"), strings.HasPrefix(l, "\\"):
				case strings.HasPrefix(l, "+"):
					added = append(added, n)
					n++
				case strings.HasPrefix(l, "-"):
					removed = append(removed, o)
					o++
				case strings.HasPrefix(l, " "):
					o, n = o+1, n+1
				}
			}
			var wantRemoved, wantAdded []int
			for _, h := range layers.DiffLines([]byte(c.old), []byte(c.new)) {
				for k := h.OldStart; k < h.OldEnd; k++ {
					wantRemoved = append(wantRemoved, k+1)
				}
				for k := h.NewStart; k < h.NewEnd; k++ {
					wantAdded = append(wantAdded, k+1)
				}
			}
			if fmt.Sprint(removed, added) != fmt.Sprint(wantRemoved, wantAdded) {
				t.Fatalf("printed -%v +%v, the line diff -%v +%v:\n%s", removed, added, wantRemoved, wantAdded, text)
			}
		})
	}
}
