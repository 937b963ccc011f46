package attribution

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestActivityStoreBoundAndFilters: appends trim each sandbox to max rows
// (oldest first, other sandboxes untouched); queries filter by session, path
// prefix (by component, rename targets included) and time, keep the newest
// limit records in chronological order and say when they truncated.
func TestActivityStoreBoundAndFilters(t *testing.T) {
	ctx := context.Background()
	st := testStore(t)
	if err := st.InitActivity(ctx); err != nil {
		t.Fatal(err)
	}
	t0 := time.UnixMilli(1_700_000_000_000)
	rec := func(i int, ws, path, newPath string) ActivityRecord {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		return ActivityRecord{TS: at.UTC().Format(time.RFC3339Nano), WorkspaceSessionID: ws, Op: "write", Path: path, NewPath: newPath, Source: "fuse", At: at}
	}
	var batch []ActivityRecord
	for i := range 30 {
		batch = append(batch, rec(i, "ws-a", fmt.Sprintf("dir/f%02d", i), ""))
	}
	if err := st.AppendActivity(ctx, "sbx-1", batch, 25); err != nil {
		t.Fatal(err)
	}
	if err := st.AppendActivity(ctx, "sbx-2", []ActivityRecord{rec(0, "ws-x", "dir/f00", "")}, 25); err != nil {
		t.Fatal(err)
	}
	more := []ActivityRecord{rec(30, "ws-b", "dirx/a", ""), rec(31, "ws-b", "tmp/save", "dir/target"), rec(32, "ws-b", "dir", "")}
	if err := st.AppendActivity(ctx, "sbx-1", more, 25); err != nil {
		t.Fatal(err)
	}
	paths := func(rs []json.RawMessage) []string {
		var out []string
		for _, r := range rs {
			var a ActivityRecord
			if err := json.Unmarshal(r, &a); err != nil {
				t.Fatal(err)
			}
			out = append(out, a.Path)
		}
		return out
	}
	tests := []struct {
		name      string
		sandbox   string
		q         ActivityQuery
		want      string
		truncated bool
	}{
		{"bounded to the newest 25", "sbx-1", ActivityQuery{SinceMs: -1, Limit: 1000}, "[dir/f08 dir/f09 dir/f10 dir/f11 dir/f12 dir/f13 dir/f14 dir/f15 dir/f16 dir/f17 dir/f18 dir/f19 dir/f20 dir/f21 dir/f22 dir/f23 dir/f24 dir/f25 dir/f26 dir/f27 dir/f28 dir/f29 dirx/a tmp/save dir]", false},
		{"other sandbox untouched", "sbx-2", ActivityQuery{SinceMs: -1, Limit: 10}, "[dir/f00]", false},
		{"limit keeps the newest", "sbx-1", ActivityQuery{SinceMs: -1, Limit: 2}, "[tmp/save dir]", true},
		{"session", "sbx-1", ActivityQuery{SessionID: "ws-b", SinceMs: -1, Limit: 10}, "[dirx/a tmp/save dir]", false},
		{"path prefix by component and rename target", "sbx-1", ActivityQuery{SessionID: "ws-b", Path: "dir", SinceMs: -1, Limit: 10}, "[tmp/save dir]", false},
		{"since inclusive", "sbx-1", ActivityQuery{SinceMs: t0.Add(31 * time.Millisecond).UnixMilli(), Limit: 10}, "[tmp/save dir]", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, truncated, err := st.QueryActivity(ctx, tc.sandbox, tc.q)
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(paths(rs)); got != tc.want || truncated != tc.truncated {
				t.Fatalf("got %s truncated=%v, want %s truncated=%v", got, truncated, tc.want, tc.truncated)
			}
		})
	}
	if err := st.DeleteSandboxActivity(ctx, "sbx-1"); err != nil {
		t.Fatal(err)
	}
	if rs, _, _ := st.QueryActivity(ctx, "sbx-1", ActivityQuery{SinceMs: -1, Limit: 10}); len(rs) != 0 {
		t.Fatalf("rows left after delete: %d", len(rs))
	}
}

// TestRangeAttribution: a checkpoint line span is credited to the latest
// overlapping write range; lineSpans follows the one line rule.
func TestRangeAttribution(t *testing.T) {
	content := []byte("A1\nB1\nA2\nno newline")
	spans := lineSpans(content)
	if fmt.Sprint(spans) != "[[0 3] [3 6] [6 9] [9 19]]" {
		t.Fatalf("spans %v", spans)
	}
	rs := []writeRange{{cmd: "a", off: 0, end: 3}, {cmd: "b", off: 3, end: 6}, {cmd: "a", off: 6, end: 9}, {cmd: "c", off: 0, end: 1}}
	for i, want := range []string{"c", "b", "a", ""} {
		got, ok := rangeWriter(rs, spans[i], false)
		if got != want || ok != (want != "") {
			t.Errorf("line %d: %q %v, want %q", i+1, got, ok, want)
		}
	}
	if got := fmt.Sprint(lineSpans([]byte("a\rb\r\nc"))); got != "[[0 2] [2 5] [5 6]]" {
		t.Errorf("lone CR and CRLF: spans %v", got)
	}
}

// TestCommandEndWalksOnce: a kernel session's command end checkpoints and
// captures file activity from one walk of the upper dir, and gets both
// right from it: the new file is credited to the command and reported
// created, the file below the FUSE staging directory is neither. A command
// that changed nothing leaves the capture state file as it was, and a
// capture state rewritten underneath (a sync, a fork) is read again.
func TestCommandEndWalksOnce(t *testing.T) {
	a := testAudit(t, map[string]string{"kept.txt": "k\n"})
	w, tr := testSession(t, a)
	ctx := context.Background()
	upperWrite(t, w, "src/new.txt", "one\ntwo\n")
	upperWrite(t, w, fuseStagingDir+"/tmp1", "staged\n")

	recs := tr.CommandEnd(ctx, w, "cmd-1", false, true)
	if got := tr.walks.Load(); got != 1 {
		t.Fatalf("command end walked the upper dir %d times, want 1", got)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.Op+" "+r.Path)
	}
	if want := []string{"mkdir src", "create src/new.txt"}; !slices.Equal(got, want) {
		t.Fatalf("activity of the command: %q, want %q", got, want)
	}
	if got := cmdsOf(tr.LineOwners(w, "src/new.txt", []byte("one\ntwo\n"))); got != "cmd-1,cmd-1" {
		t.Fatalf("owners of the new file: %s", got)
	}

	// Nothing changed: no record, and the state file is not rewritten.
	state := filepath.Join(w.Dir, activityStateName)
	before, ok := identityOfFile(state)
	if !ok {
		t.Fatal("no capture state after the first command")
	}
	if recs := tr.CommandEnd(ctx, w, "cmd-2", false, true); len(recs) != 0 {
		t.Fatalf("a no-op command has activity: %+v", recs)
	}
	if after, _ := identityOfFile(state); after != before {
		t.Fatalf("a no-op command rewrote the capture state (%+v → %+v)", before, after)
	}
	if got := tr.walks.Load(); got != 2 {
		t.Fatalf("two command ends walked the upper dir %d times, want 2", got)
	}

	// The state is replaced underneath (as a sync does): the cache is not
	// used, so the forgotten file is reported again.
	if err := writeFileAtomic(state, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	recs = tr.CommandEnd(ctx, w, "cmd-3", false, true)
	got = got[:0]
	for _, r := range recs {
		got = append(got, r.Op+" "+r.Path)
	}
	if want := []string{"mkdir src", "create src/new.txt"}; !slices.Equal(got, want) {
		t.Fatalf("activity after the state was replaced: %q, want %q", got, want)
	}
	// Without activity only the checkpoint runs.
	if recs := tr.CommandEnd(ctx, w, "cmd-4", false, false); recs != nil {
		t.Fatalf("command end without activity returned records: %+v", recs)
	}
}
