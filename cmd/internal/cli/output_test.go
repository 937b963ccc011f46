package cli

import (
	"strings"
	"testing"
)

// TestBoundOutputMarkerReads: every marker names reads that lead on — a
// row shown in part is read whole (max_output_tokens=0), whole rows from
// their first — and names truncated_before (issue #27 item 8).
func TestBoundOutputMarkerReads(t *testing.T) {
	long := strings.Repeat("y", 500)
	for _, tc := range []struct {
		name   string
		obj    map[string]any
		want   []string
		unwant []string
	}{
		{"one long row", map[string]any{"start_offset": 7, "output": long},
			[]string{"row 7 is shown only in part: read it whole with read_command_lines start_offset=7 limit=1 max_output_tokens=0"},
			[]string{"read rows"}},
		{"long rows at both ends", map[string]any{"start_offset": 0, "output": long + "\nmid\n" + long},
			[]string{"start_offset=0 limit=1 max_output_tokens=0", "; read row 1 with read_command_lines start_offset=1 limit=1; ", "start_offset=2 limit=1 max_output_tokens=0"}, nil},
		{"short rows, some gone", map[string]any{"start_offset": 40, "truncated_before": 40, "output": strings.Repeat("row\n", 200) + "end"},
			[]string{"with read_command_lines start_offset=", "40 earlier rows fell out of the transcript window (truncated_before) and can no longer be read"},
			[]string{"max_output_tokens=0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			BoundOutput(tc.obj, 50)
			out := tc.obj["output"].(string)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("marker lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.unwant {
				if strings.Contains(out, w) {
					t.Errorf("marker has %q:\n%s", w, out)
				}
			}
		})
	}
}
