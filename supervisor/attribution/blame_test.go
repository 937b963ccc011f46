package attribution

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the state database's driver

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// checkOrigins verifies that origins describe a common subsequence.
func checkOrigins(t *testing.T, prev, next string, got []int) {
	t.Helper()
	a, b := layers.SplitLines([]byte(prev)), layers.SplitLines([]byte(next))
	if len(got) != len(b) {
		t.Fatalf("len(origins) = %d, want %d", len(got), len(b))
	}
	last := -1
	for j, i := range got {
		if i < 0 {
			continue
		}
		if i <= last || i >= len(a) || string(a[i]) != string(b[j]) {
			t.Fatalf("origins %v: line %d → %d is not an increasing match", got, j, i)
		}
		last = i
	}
}

func TestBlameLineOrigins(t *testing.T) {
	cases := []struct {
		name, prev, next string
		want             []int
	}{
		{"identical", "a\nb\nc\n", "a\nb\nc\n", []int{0, 1, 2}},
		{"empty prev", "", "a\nb\n", []int{-1, -1}},
		{"empty next", "a\n", "", []int{}},
		{"insert middle", "a\nb\nc\n", "a\nb\nX\nc\n", []int{0, 1, -1, 2}},
		{"insert top", "a\nb\n", "X\na\nb\n", []int{-1, 0, 1}},
		{"append", "a\nb\n", "a\nb\nc\nd\n", []int{0, 1, -1, -1}},
		{"delete", "a\nb\nc\nd\n", "a\nd\n", []int{0, 3}},
		{"delete middle", "a\nb\nc\n", "a\nc\n", []int{0, 2}},
		{"replace", "a\nb\nc\n", "a\nB\nc\n", []int{0, -1, 2}},
		{"replace all", "a\nb\n", "x\ny\nz\n", []int{-1, -1, -1}},
		{"move block", "a\nb\nc\nd\ne\n", "d\ne\na\nb\nc\n", []int{-1, -1, 0, 1, 2}},
		{"swap lines", "x\ny\n", "y\nx\n", nil},
		{"duplicates", "x\nx\nx\n", "x\ny\nx\nx\n", []int{0, -1, 1, 2}},
		{"crlf insert", "a\r\nb\r\n", "a\r\nX\r\nb\r\n", []int{0, -1, 1}},
		// The one line rule (layers/linediff.go): terminators are part of a
		// line, as for the publish merge.
		{"crlf to lf changes lines", "a\r\nb\r\n", "a\nb\n", []int{-1, -1}},
		{"crlf to lf of one line", "a\r\nb\r\nc\r\n", "a\r\nb\nc\r\n", []int{0, -1, 2}},
		{"lone cr", "a\rb\r", "a\rc\rb\r", []int{0, -1, 1}},
		{"bom dropped changes the first line", "\xef\xbb\xbfa\nb\n", "a\nb\n", []int{-1, 1}},
		{"no final newline, append", "a\nb", "a\nb\nc", []int{0, -1, -1}},
		{"final newline removed", "a\nb\n", "a\nb", []int{0, -1}},
		{"blank lines", "\n\n\n", "\n\nx\n\n", []int{0, 1, -1, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := lineOrigins([]byte(tc.prev), []byte(tc.next))
			checkOrigins(t, tc.prev, tc.next, got)
			if tc.want != nil && !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("lineOrigins(%q, %q) = %v, want %v", tc.prev, tc.next, got, tc.want)
			}
			if tc.name == "swap lines" && (got[0] == -1) == (got[1] == -1) {
				t.Fatalf("swap keeps exactly one line: %v", got)
			}
		})
	}
}

func TestBlameLineOriginsBigFiles(t *testing.T) {
	var sb strings.Builder
	const n = 300000 // ~ 8 MiB
	for i := range n {
		fmt.Fprintf(&sb, "line %07d of a rather long file, padded to some width....\n", i)
	}
	prev := sb.String()
	if len(prev) > TextMax {
		prev = prev[:strings.LastIndexByte(prev[:TextMax], '\n')+1]
	}
	lines := strings.SplitAfter(prev, "\n")
	lines = lines[:len(lines)-1]
	// Scattered edits: replace every 1000th line, insert after every 777th, delete every 5000th.
	var nb strings.Builder
	kept := 0
	for i, l := range lines {
		switch {
		case i%5000 == 4999:
			continue
		case i%1000 == 500:
			nb.WriteString("changed\n")
			continue
		}
		nb.WriteString(l)
		kept++
		if i%777 == 0 {
			nb.WriteString("inserted\n")
		}
	}
	next := nb.String()
	start := time.Now()
	got := lineOrigins([]byte(prev), []byte(next))
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("big diff took %v", d)
	}
	checkOrigins(t, prev, next, got)
	matched := 0
	for _, o := range got {
		if o >= 0 {
			matched++
		}
	}
	if matched != kept {
		t.Fatalf("big file: %d lines kept, want %d", matched, kept)
	}

	// Every line equal: prefix and suffix do the work.
	same := strings.Repeat("x\n", 200000)
	got = lineOrigins([]byte(same), []byte(same[:200000]+"y\n"+same[200000:]))
	if got[100000] != -1 || got[99999] != 99999 || got[200000] != 199999 {
		t.Fatalf("repeated lines: %v %v %v", got[99999], got[100000], got[200000])
	}

	// Completely different big files stay cheap.
	var other strings.Builder
	for i := range 200000 {
		fmt.Fprintf(&other, "other %d\n", i)
	}
	start = time.Now()
	got = lineOrigins([]byte(prev), []byte(other.String()))
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("unrelated big diff took %v", d)
	}
	for _, o := range got {
		if o != -1 {
			t.Fatalf("unrelated files share a line")
		}
	}
}

var (
	ownA = LineOwner{Owner: "operation:a", LayerID: "L000002-aaaaaaaa", TS: "2024-01-01T00:00:00.000Z"}
	ownB = LineOwner{Owner: "workspace_session:ws-1", CommandSessionID: "cmd-1", Agent: "alice", LayerID: "L000003-bbbbbbbb", TS: "2024-01-02T00:00:00.000Z"}
	ownC = LineOwner{Owner: OwnerOriginal}
)

func TestBlameRecordOwners(t *testing.T) {
	owners := []LineOwner{ownA, ownA, ownB, ownA, ownC, ownC}
	rec := AuditRecord{V: 1, Path: "f"}
	rec.SetOwners(owners, ownB)
	if rec.DefaultOwner != "operation:a" || Deref(rec.DefaultMeta.LayerID) != ownA.LayerID || rec.DefaultMeta.CommandSessionID != nil {
		t.Fatalf("default: %+v", rec)
	}
	want := []OwnerRange{{StartLine: 3, LineCount: 1, LineOwner: ownB}, {StartLine: 5, LineCount: 2, LineOwner: ownC}}
	if !reflect.DeepEqual(rec.OwnerRanges, want) || rec.LineCount != 6 {
		t.Fatalf("ranges: %+v", rec.OwnerRanges)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	_ = json.Unmarshal(b, &raw)
	for _, k := range []string{"v", "ts", "manifest_version", "layer_id", "path", "line_count", "content_digest", "wholesale", "default_owner", "default_meta", "owner_ranges"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("record lacks %s: %s", k, b)
		}
	}
	meta := raw["default_meta"].(map[string]any)
	if len(meta) != 4 || meta["command_session_id"] != nil || meta["agent"] != nil {
		t.Errorf("default_meta: %v", meta)
	}
	rs := raw["owner_ranges"].([]any)
	if r0 := rs[0].(map[string]any); r0["command_session_id"] != "cmd-1" || r0["agent"] != "alice" || r0["start_line"] != 3.0 {
		t.Errorf("range 0: %v", r0)
	}
	if r1 := rs[1].(map[string]any); len(r1) != 3 || r1["owner"] != "original" {
		t.Errorf("original range carries metadata: %v", r1)
	}
	var back AuditRecord
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.LineOwners(); !reflect.DeepEqual(got, owners) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, owners)
	}

	// Ties go to the first seen; approximate owners never become the default.
	approx := ownB
	approx.Approximate = true
	tie := AuditRecord{}
	tie.SetOwners([]LineOwner{ownB, ownA, approx, approx, approx, ownA, ownB}, ownC)
	if tie.DefaultOwner != ownB.Owner || len(tie.OwnerRanges) != 3 || tie.OwnerRanges[1].LineCount != 3 {
		t.Fatalf("tie/approximate: default %s ranges %+v", tie.DefaultOwner, tie.OwnerRanges)
	}
	allApprox := AuditRecord{}
	allApprox.SetOwners([]LineOwner{approx, approx}, ownA)
	if allApprox.DefaultOwner != ownA.Owner || len(allApprox.OwnerRanges) != 1 || !allApprox.LineOwners()[1].Approximate {
		t.Fatalf("all approximate: %+v", allApprox)
	}
	empty := AuditRecord{}
	empty.SetOwners(nil, ownA)
	if empty.DefaultOwner != ownA.Owner || empty.LineCount != 0 || empty.OwnerRanges == nil || len(empty.OwnerRanges) != 0 {
		t.Fatalf("empty: %+v", empty)
	}
	whole := AuditRecord{Wholesale: true}
	whole.SetOwners(RepeatOwner(ownA, 3), ownA)
	if len(whole.OwnerRanges) != 1 || whole.OwnerRanges[0].LineCount != 3 || whole.DefaultOwner != ownA.Owner {
		t.Fatalf("wholesale: %+v", whole)
	}
}

func TestBlameTileRanges(t *testing.T) {
	later := ownB
	later.TS = "2024-02-01T00:00:00.000Z"
	later.Approximate = true
	owners := []LineOwner{ownC, ownC, ownB, later, ownA, ownB}
	got := TileRanges(owners, false)
	if len(got) != 4 {
		t.Fatalf("ranges: %+v", got)
	}
	if got[1].StartLine != 3 || got[1].LineCount != 2 || got[1].TS != later.TS || !got[1].Approximate {
		t.Fatalf("coalesced range: %+v", got[1])
	}
	next := 1
	for _, r := range got {
		if r.StartLine != next || r.LineCount < 1 {
			t.Fatalf("ranges do not tile: %+v", got)
		}
		next += r.LineCount
	}
	if next != len(owners)+1 {
		t.Fatalf("ranges cover %d lines", next-1)
	}
	b, _ := json.Marshal(got)
	if !strings.Contains(string(b), `{"start_line":1,"line_count":2,"owner":"original"}`) ||
		!strings.Contains(string(b), `"owner":"operation:a","command_session_id":null,"agent":null,"layer_id":"L000002-aaaaaaaa"`) ||
		!strings.Contains(string(b), `"approximate":true`) || strings.Contains(string(b), "wholesale") {
		t.Fatalf("json: %s", b)
	}
	if w, _ := json.Marshal(TileRanges([]LineOwner{ownA}, true)); !strings.Contains(string(w), `"wholesale":true`) {
		t.Fatalf("wholesale json: %s", w)
	}
	if r := TileRanges(nil, false); r == nil || len(r) != 0 {
		t.Fatalf("empty tiling: %#v", r)
	}
}

// testAudit is one sandbox's attribution over a real LayerStack and a
// state database with the audit table (no namespaces needed).
func testAudit(t *testing.T, files map[string]string) *Audit {
	t.Helper()
	root := t.TempDir()
	ws := filepath.Join(root, "ws")
	for p, c := range files {
		full := filepath.Join(ws, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st := testStore(t)
	if err := st.InitAudit(ctx); err != nil {
		t.Fatal(err)
	}
	stack, _, err := layers.Create(ctx, filepath.Join(root, "sandboxes", "sbx-test", "layerstack"), ws, layers.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &Audit{SandboxID: "sbx-test", Stack: stack, Store: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// testStore is a Store on a fresh SQLite database.
func testStore(t *testing.T) Store {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return Store{DB: db}
}

func ptr[T any](v T) *T { return &v }

// write publishes one sessionless write and records it as file_write does.
func write(t *testing.T, a *Audit, p, content, requestID string) layers.PublishResult {
	t.Helper()
	var prev layers.Manifest
	res, err := a.Stack.Update(context.Background(), func(v *layers.View) ([]layers.Change, error) {
		prev = v.Manifest()
		return []layers.Change{{Kind: layers.ChangeWrite, Path: p, Mode: 0o644, Data: []byte(content)}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.RecordPublish(context.Background(), prev, res, []AuditFile{{Path: p, Owner: OperationOwner(requestID)}}); err != nil {
		t.Fatal(err)
	}
	return res
}

// blame is file_blame of head's p as JSON (line_count, ranges).
func blame(t *testing.T, a *Audit, p string) (map[string]any, error) {
	t.Helper()
	head, err := a.Stack.Head()
	if err != nil {
		t.Fatal(err)
	}
	owners, _, _, wholesale, err := a.ViewOwners(context.Background(), a.Stack.View(head), head.Version, p)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(map[string]any{"line_count": len(owners), "ranges": TileRanges(owners, wholesale)})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m, nil
}

// owners renders a blame result as "owner[:cmd]xN" per range.
func owners(t *testing.T, m map[string]any) string {
	t.Helper()
	var parts []string
	next := 1.0
	for _, r := range m["ranges"].([]any) {
		rg := r.(map[string]any)
		if rg["start_line"] != next {
			t.Fatalf("ranges do not tile: %v", m["ranges"])
		}
		next += rg["line_count"].(float64)
		s := fmt.Sprintf("%s×%v", rg["owner"], rg["line_count"])
		if c, _ := rg["command_session_id"].(string); c != "" {
			s = fmt.Sprintf("%s:%s×%v", rg["owner"], c, rg["line_count"])
		}
		if rg["wholesale"] == true {
			s += "(w)"
		}
		parts = append(parts, s)
	}
	if next-1 != m["line_count"].(float64) {
		t.Fatalf("ranges cover %v of %v lines", next-1, m["line_count"])
	}
	return strings.Join(parts, " ")
}

func TestBlamePublishWithSession(t *testing.T) {
	a := testAudit(t, map[string]string{"f.txt": "a\nb\nc\n", "ign/log": "x\n"})
	ctx := context.Background()
	pub := SessionOwner("ws-1", ptr("alice"))
	sessionContent := "a\nS1\nb\nc\nS2\n"
	sess := []LineOwner{pub, {Owner: pub.Owner, Agent: "alice", CommandSessionID: "cmd-1"}, pub, pub, {Owner: pub.Owner, Agent: "alice", CommandSessionID: "cmd-2", Approximate: true}}
	var prev layers.Manifest
	// The committed content merges a head-side change (H) with the session's.
	committed := "H\na\nS1\nb\nc\nS2\n"
	res, err := a.Stack.Update(ctx, func(v *layers.View) ([]layers.Change, error) {
		prev = v.Manifest()
		return []layers.Change{
			{Kind: layers.ChangeWrite, Path: "f.txt", Mode: 0o644, Data: []byte(committed)},
			{Kind: layers.ChangeWrite, Path: "ign/log", Mode: 0o644, Data: []byte("x\ny\n")},
			{Kind: layers.ChangeWrite, Path: "new.bin", Mode: 0o644, Data: []byte{0, 1, 2}},
		}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = a.RecordPublish(ctx, prev, res, []AuditFile{
		{Path: "f.txt", Owner: pub, Session: sess, SessionContent: []byte(sessionContent)},
		{Path: "ign/log", Owner: pub, Wholesale: true},
		{Path: "new.bin", Owner: pub},
		{Path: "gone", Owner: pub},
	})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := blame(t, a, "f.txt")
	want := "workspace_session:ws-1×1 original×1 workspace_session:ws-1:cmd-1×1 original×2 workspace_session:ws-1:cmd-2×1"
	if got := owners(t, m); got != want {
		t.Fatalf("merged publish:\n got %s\nwant %s", got, want)
	}
	last := m["ranges"].([]any)[4].(map[string]any)
	if last["approximate"] != true || last["agent"] != "alice" || last["layer_id"] != res.LayerID {
		t.Fatalf("session range: %v", last)
	}
	m, _ = blame(t, a, "ign/log")
	if got := owners(t, m); got != "workspace_session:ws-1×2(w)" {
		t.Fatalf("ignored route: %s", got)
	}
	rec, err := a.Store.LatestAudit(ctx, a.SandboxID, "new.bin", -1)
	if err != nil || rec == nil || !rec.Wholesale || rec.LineCount != 1 || rec.ManifestVersion != 2 || rec.LayerID != res.LayerID {
		t.Fatalf("binary record: %+v %v", rec, err)
	}
	if rec, _ := a.Store.LatestAudit(ctx, a.SandboxID, "gone", -1); rec != nil {
		t.Fatalf("record for an unwritten path")
	}
	if err := a.Store.DeleteSandboxAudit(ctx, a.SandboxID); err != nil {
		t.Fatal(err)
	}
	if rec, _ := a.Store.LatestAudit(ctx, a.SandboxID, "f.txt", -1); rec != nil {
		t.Fatalf("audit survives sandbox deletion")
	}
}

// testSession is a session over the sandbox's head with a plain upper dir
// (no holder: checkpoints only read the upper dir).
func testSession(t *testing.T, a *Audit) (Workspace, *Tracker) {
	t.Helper()
	head, err := a.Stack.Head()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "sessions", "ws-t")
	w := Workspace{ID: "ws-t", Agent: ptr("bob"), Dir: dir, Upper: filepath.Join(dir, "upper"), Base: a.Stack.View(head), Log: a.Log}
	for _, d := range []string{"upper", "attribution"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return w, &Tracker{}
}

func upperWrite(t *testing.T, w Workspace, p, content string) {
	t.Helper()
	full := filepath.Join(w.Upper, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	// A new inode each time, like the holder's temp file + rename.
	if err := os.WriteFile(full+".tmp", []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(full+".tmp", full); err != nil {
		t.Fatal(err)
	}
}

func cmdsOf(owners []LineOwner) string {
	var parts []string
	for _, o := range owners {
		c := o.CommandSessionID
		if c == "" {
			c = "-"
		}
		if o.Approximate {
			c += "~"
		}
		if o.Owner != "workspace_session:ws-t" {
			c = o.Owner
		}
		parts = append(parts, c)
	}
	return strings.Join(parts, ",")
}

func TestBlameCheckpoints(t *testing.T) {
	a := testAudit(t, map[string]string{"f.txt": "a\nb\nc\n", "same.txt": "s\n"})
	write(t, a, "f.txt", "a\nb\nc\nd\n", "r1") // line d is operation:r1 in the base
	ctx := context.Background()
	w, tr := testSession(t, a)

	upperWrite(t, w, "f.txt", "a\nX\nb\nc\nd\n")
	upperWrite(t, w, "same.txt", "s\n") // copied up, unchanged
	tr.Checkpoint(ctx, w, "cmd-1", false)
	upperWrite(t, w, "f.txt", "a\nX\nb\nY\nc\nd\n")
	upperWrite(t, w, "n/new.txt", "n1\nn2\n")
	tr.Checkpoint(ctx, w, "cmd-2", true)
	upperWrite(t, w, "f.txt", "a\nX\nb\nY\nc\nd\nZ\n")
	tr.Checkpoint(ctx, w, "", false, "f.txt") // a file operation
	tr.Checkpoint(ctx, w, "cmd-3", false)     // nothing changed since

	content := []byte("a\nX\nb\nY\nc\nd\nZ\n")
	if got := cmdsOf(tr.LineOwners(w, "f.txt", content)); got != "-,cmd-1,-,cmd-2~,-,-,-" {
		t.Fatalf("sessionLineOwners: %s", got)
	}
	if got := cmdsOf(tr.LineOwners(w, "n/new.txt", []byte("n1\nn2\n"))); got != "cmd-2~,cmd-2~" {
		t.Fatalf("new file: %s", got)
	}
	// Content changed after the last checkpoint: new lines have no writer.
	if got := cmdsOf(tr.LineOwners(w, "n/new.txt", []byte("n1\nlate\nn2\n"))); got != "cmd-2~,-,cmd-2~" {
		t.Fatalf("uncheckpointed change: %s", got)
	}
	if got := cmdsOf(tr.LineOwners(w, "nothing.txt", []byte("q\n"))); got != "-" {
		t.Fatalf("no checkpoint: %s", got)
	}

	// Session view: base lines keep the base's owners.
	read := func(b []byte) func() ([]byte, error) { return func() ([]byte, error) { return b, nil } }
	got, wholesale, err := a.SessionBlameOwners(ctx, tr, w, "f.txt", int64(len(content)), read(content))
	if err != nil || wholesale {
		t.Fatal(err, wholesale)
	}
	if c := cmdsOf(got); c != "original,cmd-1,original,cmd-2~,original,operation:r1,-" {
		t.Fatalf("session blame: %s", c)
	}
	for _, o := range got {
		if o.Owner == "workspace_session:ws-t" && (o.Agent != "bob" || o.LayerID != "" || o.TS == "") {
			t.Fatalf("session line metadata: %+v", o)
		}
	}
	if got, _, _ := a.SessionBlameOwners(ctx, tr, w, "same.txt", 2, read([]byte("s\n"))); cmdsOf(got) != "original" {
		t.Fatalf("unchanged copy-up: %s", cmdsOf(got))
	}

	// The index survives, and is rebuilt when lost.
	if err := os.Remove(filepath.Join(attrDir(w), attrIndexName)); err != nil {
		t.Fatal(err)
	}
	if got := cmdsOf(tr.LineOwners(w, "f.txt", content)); got != "-,cmd-1,-,cmd-2~,-,-,-" {
		t.Fatalf("after losing the index: %s", got)
	}
	tr.Checkpoint(ctx, w, "cmd-4", false)
	if got := cmdsOf(tr.LineOwners(w, "f.txt", content)); got != "-,cmd-1,-,cmd-2~,-,-,-" {
		t.Fatalf("rebuilt index re-attributed: %s", got)
	}

	// A removed file loses its checkpoint.
	if err := os.Remove(filepath.Join(w.Upper, "n", "new.txt")); err != nil {
		t.Fatal(err)
	}
	tr.Checkpoint(ctx, w, "cmd-5", false)
	if _, err := os.Stat(filepath.Join(attrDir(w), ckKey("n/new.txt")+".json")); !os.IsNotExist(err) {
		t.Fatalf("stale checkpoint kept: %v", err)
	}

	// Publishing carries the session's writers into the audit record.
	var prev layers.Manifest
	res, err := a.Stack.Update(ctx, func(v *layers.View) ([]layers.Change, error) {
		prev = v.Manifest()
		return []layers.Change{{Kind: layers.ChangeWrite, Path: "f.txt", Mode: 0o644, Data: content}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.RecordPublish(ctx, prev, res, []AuditFile{{Path: "f.txt", Owner: SessionOwner("ws-t", ptr("bob")),
		Session: tr.LineOwners(w, "f.txt", content), SessionContent: content}}); err != nil {
		t.Fatal(err)
	}
	m, _ := blame(t, a, "f.txt")
	want := "original×1 workspace_session:ws-t:cmd-1×1 original×1 workspace_session:ws-t:cmd-2×1 original×1 operation:r1×1 workspace_session:ws-t×1"
	if got := owners(t, m); got != want {
		t.Fatalf("published:\n got %s\nwant %s", got, want)
	}
}

func TestBlameCheckpointLimits(t *testing.T) {
	a := testAudit(t, map[string]string{})
	w, tr := testSession(t, a)
	ctx := context.Background()
	// Fill the byte budget with a fake stored entry, then a new file has no room.
	idx := &ckIndex{V: 1, Files: map[string]*ckEntry{"big": {State: ckStored, Key: "k", Bytes: attrMaxBytes}}}
	b, _ := json.Marshal(idx)
	if err := os.WriteFile(filepath.Join(attrDir(w), attrIndexName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	upperWrite(t, w, "big", "x\n")
	upperWrite(t, w, "f.txt", "1\n")
	tr.Checkpoint(ctx, w, "cmd-1", false, "f.txt")
	if got := cmdsOf(tr.LineOwners(w, "f.txt", []byte("1\n"))); got != "-" {
		t.Fatalf("over the limit: %s", got)
	}
	b, _ = os.ReadFile(filepath.Join(attrDir(w), attrIndexName))
	if !strings.Contains(string(b), `"state":"over_limit"`) {
		t.Fatalf("index: %s", b)
	}
	// Non-text files are not attributed line by line.
	upperWrite(t, w, "bin", "a\x00")
	upperWrite(t, w, "f.txt", "1\n2\n")
	tr.Checkpoint(ctx, w, "cmd-2", false)
	if _, err := os.Stat(filepath.Join(attrDir(w), ckKey("bin")+".txt")); !os.IsNotExist(err) {
		t.Fatalf("binary checkpointed: %v", err)
	}
	// "big" was re-read (its stored copy is gone) and shrank: room for f.txt once it changes.
	if got := cmdsOf(tr.LineOwners(w, "f.txt", []byte("1\n2\n"))); got != "cmd-2,cmd-2" {
		t.Fatalf("after room was freed: %s", got)
	}
}

// TestLayerAudit: the records of one layer in write order, none of another
// layer or sandbox.
func TestLayerAudit(t *testing.T) {
	ctx := context.Background()
	st := testStore(t)
	if err := st.InitAudit(ctx); err != nil {
		t.Fatal(err)
	}
	recs := []AuditRecord{{V: 1, LayerID: "L1", Path: "b"}, {V: 1, LayerID: "L2", Path: "x"}, {V: 1, LayerID: "L1", Path: "a"}}
	if err := st.AppendAudit(ctx, "sbx-1", recs); err != nil {
		t.Fatal(err)
	}
	if err := st.AppendAudit(ctx, "sbx-2", []AuditRecord{{V: 1, LayerID: "L1", Path: "other"}}); err != nil {
		t.Fatal(err)
	}
	got, err := st.LayerAudit(ctx, "sbx-1", "L1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Path != "b" || got[1].Path != "a" {
		t.Fatalf("LayerAudit = %+v", got)
	}
	if got, err := st.LayerAudit(ctx, "sbx-1", "L9"); err != nil || len(got) != 0 {
		t.Fatalf("unknown layer: %v %v", got, err)
	}
}

// A publish hands the staged bytes to the audit (AuditFile.Committed) so it
// need not read the layer back; bytes that cannot be the layer's (another
// size) are ignored and the layer is read.
func TestBlameRecordCommittedBytes(t *testing.T) {
	cases := []struct {
		name, content string
		committed     []byte
	}{
		{"staged bytes", "a\nb\n", []byte("a\nb\n")},
		{"none", "c\nd\n", nil},
		{"stale bytes", "x\ny\nz\nw\n", []byte("stale\n")},
	}
	a := testAudit(t, map[string]string{})
	ctx := context.Background()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := strings.ReplaceAll(tc.name, " ", "_") + ".txt"
			var prev layers.Manifest
			res, err := a.Stack.Update(ctx, func(v *layers.View) ([]layers.Change, error) {
				prev = v.Manifest()
				return []layers.Change{{Kind: layers.ChangeWrite, Path: p, Mode: 0o644, Data: []byte(tc.content)}}, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := a.RecordPublish(ctx, prev, res, []AuditFile{{Path: p, Owner: OperationOwner("r-" + p), Committed: tc.committed}}); err != nil {
				t.Fatal(err)
			}
			rec, err := a.Store.LatestAudit(ctx, a.SandboxID, p, -1)
			if err != nil || rec == nil {
				t.Fatalf("record: %+v %v", rec, err)
			}
			if rec.ContentDigest != ContentDigest([]byte(tc.content)) || rec.LineCount != len(TextLines([]byte(tc.content))) {
				t.Errorf("record digest %s lines %d, want the layer's content %q", rec.ContentDigest, rec.LineCount, tc.content)
			}
			m, _ := blame(t, a, p)
			if got, want := owners(t, m), fmt.Sprintf("operation:r-%s×%d", p, rec.LineCount); got != want {
				t.Errorf("blame %s, want %s", got, want)
			}
		})
	}
}

// TestCheckpointCountsUsageOnce: a checkpoint of many new files counts the
// store's usage once, not once per file (that was n² map steps: about a
// second for a command that wrote 10,000 files), and the budget it checks
// stays exact as the checkpoint adds files.
func TestCheckpointCountsUsageOnce(t *testing.T) {
	a := testAudit(t, map[string]string{})
	w, tr := testSession(t, a)
	ctx := context.Background()
	for round, n := range []int{300, 200} {
		for i := range n {
			upperWrite(t, w, fmt.Sprintf("r%d/f%d.txt", round, i), fmt.Sprintf("line %d\n", i))
		}
		tr.Checkpoint(ctx, w, fmt.Sprintf("cmd-%d", round), false)
		if tr.scans != round+1 {
			t.Fatalf("after checkpoint %d of %d new files: %d passes over the index, want %d", round+1, n, tr.scans, round+1)
		}
	}
	idx := tr.cachedIndex(attrDir(w))
	stored := 0
	for _, e := range idx.Files {
		if e.State == ckStored {
			stored++
		}
	}
	if stored != 500 {
		t.Fatalf("%d stored checkpoints, want 500", stored)
	}
	if got := cmdsOf(tr.LineOwners(w, "r1/f7.txt", []byte("line 7\n"))); got != "cmd-1" {
		t.Fatalf("owner of a file of the second checkpoint: %s", got)
	}
}
