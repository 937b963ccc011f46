package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// checkOrigins verifies that origins describe a common subsequence.
func checkOrigins(t *testing.T, prev, next string, got []int) {
	t.Helper()
	a, b := textLines([]byte(prev)), textLines([]byte(next))
	if len(got) != len(b) {
		t.Fatalf("len(origins) = %d, want %d", len(got), len(b))
	}
	last := -1
	for j, i := range got {
		if i < 0 {
			continue
		}
		if i <= last || i >= len(a) || a[i] != b[j] {
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
		{"crlf to lf keeps lines", "a\r\nb\r\n", "a\nb\n", []int{0, 1}},
		{"lone cr", "a\rb\r", "a\rc\rb\r", []int{0, -1, 1}},
		{"bom dropped", "\xef\xbb\xbfa\nb\n", "a\nb\n", []int{0, 1}},
		{"no final newline, append", "a\nb", "a\nb\nc", []int{0, 1, -1}},
		{"no final newline added", "a\nb\n", "a\nb", []int{0, 1}},
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
	if len(prev) > attrTextMax {
		prev = prev[:strings.LastIndexByte(prev[:attrTextMax], '\n')+1]
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
	ownA = lineOwner{Owner: "operation:a", LayerID: "L000002-aaaaaaaa", TS: "2024-01-01T00:00:00.000Z"}
	ownB = lineOwner{Owner: "workspace_session:ws-1", CommandSessionID: "cmd-1", Agent: "alice", LayerID: "L000003-bbbbbbbb", TS: "2024-01-02T00:00:00.000Z"}
	ownC = lineOwner{Owner: ownerOriginal}
)

func TestBlameRecordOwners(t *testing.T) {
	owners := []lineOwner{ownA, ownA, ownB, ownA, ownC, ownC}
	rec := auditRecord{V: 1, Path: "f"}
	rec.setOwners(owners, ownB)
	if rec.DefaultOwner != "operation:a" || deref(rec.DefaultMeta.LayerID) != ownA.LayerID || rec.DefaultMeta.CommandSessionID != nil {
		t.Fatalf("default: %+v", rec)
	}
	want := []ownerRange{{StartLine: 3, LineCount: 1, lineOwner: ownB}, {StartLine: 5, LineCount: 2, lineOwner: ownC}}
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
	var back auditRecord
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.lineOwners(); !reflect.DeepEqual(got, owners) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, owners)
	}

	// Ties go to the first seen; approximate owners never become the default.
	approx := ownB
	approx.Approximate = true
	tie := auditRecord{}
	tie.setOwners([]lineOwner{ownB, ownA, approx, approx, approx, ownA, ownB}, ownC)
	if tie.DefaultOwner != ownB.Owner || len(tie.OwnerRanges) != 3 || tie.OwnerRanges[1].LineCount != 3 {
		t.Fatalf("tie/approximate: default %s ranges %+v", tie.DefaultOwner, tie.OwnerRanges)
	}
	allApprox := auditRecord{}
	allApprox.setOwners([]lineOwner{approx, approx}, ownA)
	if allApprox.DefaultOwner != ownA.Owner || len(allApprox.OwnerRanges) != 1 || !allApprox.lineOwners()[1].Approximate {
		t.Fatalf("all approximate: %+v", allApprox)
	}
	empty := auditRecord{}
	empty.setOwners(nil, ownA)
	if empty.DefaultOwner != ownA.Owner || empty.LineCount != 0 || empty.OwnerRanges == nil || len(empty.OwnerRanges) != 0 {
		t.Fatalf("empty: %+v", empty)
	}
	whole := auditRecord{Wholesale: true}
	whole.setOwners(repeatOwner(ownA, 3), ownA)
	if len(whole.OwnerRanges) != 1 || whole.OwnerRanges[0].LineCount != 3 || whole.DefaultOwner != ownA.Owner {
		t.Fatalf("wholesale: %+v", whole)
	}
}

func TestBlameTileRanges(t *testing.T) {
	later := ownB
	later.TS = "2024-02-01T00:00:00.000Z"
	later.Approximate = true
	owners := []lineOwner{ownC, ownC, ownB, later, ownA, ownB}
	got := tileRanges(owners, false)
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
	if w, _ := json.Marshal(tileRanges([]lineOwner{ownA}, true)); !strings.Contains(string(w), `"wholesale":true`) {
		t.Fatalf("wholesale json: %s", w)
	}
	if r := tileRanges(nil, false); r == nil || len(r) != 0 {
		t.Fatalf("empty tiling: %#v", r)
	}
}

// testSandbox is a supervisor with a state database and one sandbox with a
// real LayerStack (no namespaces needed).
func testSandbox(t *testing.T, files map[string]string) (*Supervisor, *sandbox) {
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
	st, err := openStore(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.close() })
	if err := st.initAudit(ctx); err != nil {
		t.Fatal(err)
	}
	sbDir := filepath.Join(root, "sandboxes", "sbx-test")
	stack, _, err := layers.Create(ctx, filepath.Join(sbDir, "layerstack"), ws, layers.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := &Supervisor{store: st, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	sb := newSandbox(sandboxRecord{ID: "sbx-test"}, sbDir)
	sb.Stack = stack
	return s, sb
}

// write publishes one sessionless write and records it as file_write does.
func write(t *testing.T, s *Supervisor, sb *sandbox, p, content, requestID string) layers.PublishResult {
	t.Helper()
	var prev layers.Manifest
	res, err := sb.Stack.Update(context.Background(), func(v *layers.View) ([]layers.Change, error) {
		prev = v.Manifest()
		return []layers.Change{{Kind: layers.ChangeWrite, Path: p, Mode: 0o644, Data: []byte(content)}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if requestID != "" {
		if requestID == "zero-prev" {
			prev = layers.Manifest{}
		}
		s.auditSessionless(context.Background(), sb, prev, res, p, requestID)
	}
	return res
}

func blame(t *testing.T, s *Supervisor, sb *sandbox, p string) (map[string]any, error) {
	t.Helper()
	out, err := s.fileBlame(&call{ctx: context.Background(), args: catalog.Args{"path": p}, sb: sb})
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(out)
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

func wantErrKind(t *testing.T, err error, kind string) *catalog.Error {
	t.Helper()
	var ce *catalog.Error
	if !errors.As(err, &ce) || ce.Kind != kind {
		t.Fatalf("want %s, got %v", kind, err)
	}
	return ce
}

func TestBlameHeadFromAudit(t *testing.T) {
	s, sb := testSandbox(t, map[string]string{"base.txt": "one\ntwo\n", "dir/x": "x\n", "empty": ""})
	m, err := blame(t, s, sb, "/workspace/base.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got := owners(t, m); got != "original×2" || m["view"] != "head" || m["workspace_session_id"] != nil || m["path"] != "base.txt" {
		t.Fatalf("base file: %v", m)
	}
	if rev := m["revision"].(map[string]any); rev["manifest_version"] != 1.0 {
		t.Fatalf("revision %v", rev)
	}

	// Edit the base file: kept lines stay original.
	write(t, s, sb, "base.txt", "zero\none\nTWO\n", "r1")
	m, _ = blame(t, s, sb, "base.txt")
	if got := owners(t, m); got != "operation:r1×1 original×1 operation:r1×1" {
		t.Fatalf("after edit: %s", got)
	}
	r0 := m["ranges"].([]any)[0].(map[string]any)
	if _, ok := r0["command_session_id"]; !ok || r0["command_session_id"] != nil || !strings.HasPrefix(r0["layer_id"].(string), "L000002-") || r0["ts"] == nil {
		t.Fatalf("operation range metadata: %v", r0)
	}
	res := write(t, s, sb, "base.txt", "zero\none\nTWO\nthree\n", "zero-prev")
	m, _ = blame(t, s, sb, "base.txt")
	if got := owners(t, m); got != "operation:r1×1 original×1 operation:r1×1 operation:zero-prev×1" {
		t.Fatalf("after second edit: %s", got)
	}

	// A write without its record: the digest no longer matches.
	write(t, s, sb, "base.txt", "lost\n", "")
	m, _ = blame(t, s, sb, "base.txt")
	if got := owners(t, m); got != "unknown×1" {
		t.Fatalf("lost record: %s", got)
	}
	write(t, s, sb, "base.txt", "lost\nfound\n", "r4")
	m, _ = blame(t, s, sb, "base.txt")
	if got := owners(t, m); got != "unknown×1 operation:r4×1" {
		t.Fatalf("after lost record: %s", got)
	}

	// Empty, binary and big files.
	m, _ = blame(t, s, sb, "empty")
	if m["line_count"] != 0.0 || len(m["ranges"].([]any)) != 0 {
		t.Fatalf("empty: %v", m)
	}
	write(t, s, sb, "bin", "a\x00b\nc\n", "rb")
	m, _ = blame(t, s, sb, "bin")
	if got := owners(t, m); got != "operation:rb×1(w)" {
		t.Fatalf("binary: %s", got)
	}
	write(t, s, sb, "empty2", "", "re")
	m, _ = blame(t, s, sb, "empty2")
	if m["line_count"] != 0.0 || len(m["ranges"].([]any)) != 0 {
		t.Fatalf("written empty: %v", m)
	}

	// Errors: directory, absent, deleted with a record.
	_, err = blame(t, s, sb, "dir")
	wantErrKind(t, err, catalog.InvalidRequest)
	_, err = blame(t, s, sb, "nope.txt")
	if ce := wantErrKind(t, err, catalog.NotFound); ce.Message != "file not found: nope.txt" || ce.Details["last_record_layer_id"] != nil {
		t.Fatalf("absent: %v", ce)
	}
	_, err = blame(t, s, sb, "../x")
	wantErrKind(t, err, catalog.InvalidRequest)
	if _, err := sb.Stack.Publish(context.Background(), []layers.Change{{Kind: layers.ChangeDelete, Path: "base.txt"}}); err != nil {
		t.Fatal(err)
	}
	_, err = blame(t, s, sb, "base.txt")
	if ce := wantErrKind(t, err, catalog.NotFound); !strings.HasPrefix(fmt.Sprint(ce.Details["last_record_layer_id"]), "L") {
		t.Fatalf("deleted: %v", ce.Details)
	}
	_ = res
}

func TestBlamePublishWithSession(t *testing.T) {
	s, sb := testSandbox(t, map[string]string{"f.txt": "a\nb\nc\n", "ign/log": "x\n"})
	ctx := context.Background()
	pub := sessionOwner("ws-1", ptr("alice"))
	sessionContent := "a\nS1\nb\nc\nS2\n"
	sess := []lineOwner{pub, {Owner: pub.Owner, Agent: "alice", CommandSessionID: "cmd-1"}, pub, pub, {Owner: pub.Owner, Agent: "alice", CommandSessionID: "cmd-2", Approximate: true}}
	var prev layers.Manifest
	// The committed content merges a head-side change (H) with the session's.
	committed := "H\na\nS1\nb\nc\nS2\n"
	res, err := sb.Stack.Update(ctx, func(v *layers.View) ([]layers.Change, error) {
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
	err = s.recordPublishAudit(ctx, sb, prev, res, []auditFile{
		{Path: "f.txt", Owner: pub, Session: sess, SessionContent: []byte(sessionContent)},
		{Path: "ign/log", Owner: pub, Wholesale: true},
		{Path: "new.bin", Owner: pub},
		{Path: "gone", Owner: pub},
	})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := blame(t, s, sb, "f.txt")
	want := "workspace_session:ws-1×1 original×1 workspace_session:ws-1:cmd-1×1 original×2 workspace_session:ws-1:cmd-2×1"
	if got := owners(t, m); got != want {
		t.Fatalf("merged publish:\n got %s\nwant %s", got, want)
	}
	last := m["ranges"].([]any)[4].(map[string]any)
	if last["approximate"] != true || last["agent"] != "alice" || last["layer_id"] != res.LayerID {
		t.Fatalf("session range: %v", last)
	}
	m, _ = blame(t, s, sb, "ign/log")
	if got := owners(t, m); got != "workspace_session:ws-1×2(w)" {
		t.Fatalf("ignored route: %s", got)
	}
	rec, err := s.store.latestAudit(ctx, sb.Rec.ID, "new.bin", -1)
	if err != nil || rec == nil || !rec.Wholesale || rec.LineCount != 1 || rec.ManifestVersion != 2 || rec.LayerID != res.LayerID {
		t.Fatalf("binary record: %+v %v", rec, err)
	}
	if rec, _ := s.store.latestAudit(ctx, sb.Rec.ID, "gone", -1); rec != nil {
		t.Fatalf("record for an unwritten path")
	}
	if err := s.store.deleteSandboxAudit(ctx, sb.Rec.ID); err != nil {
		t.Fatal(err)
	}
	if rec, _ := s.store.latestAudit(ctx, sb.Rec.ID, "f.txt", -1); rec != nil {
		t.Fatalf("audit survives sandbox deletion")
	}
}

// testSession is a session over the sandbox's head with a plain upper dir
// (no holder: checkpoints only read the upper dir).
func testSession(t *testing.T, sb *sandbox) *session {
	t.Helper()
	head, err := sb.Stack.Head()
	if err != nil {
		t.Fatal(err)
	}
	ss := &session{dir: filepath.Join(sb.Dir, "sessions", "ws-t"), rec: sessionRecord{WorkspaceSessionID: "ws-t", Agent: ptr("bob"),
		BaseRevision: head.Revision(), Lease: leaseRecord{Layers: head.Layers}}}
	for _, d := range []string{"upper", "attribution"} {
		if err := os.MkdirAll(filepath.Join(ss.dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return ss
}

func upperWrite(t *testing.T, ss *session, p, content string) {
	t.Helper()
	full := filepath.Join(ss.upper(), p)
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

func cmdsOf(owners []lineOwner) string {
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
	s, sb := testSandbox(t, map[string]string{"f.txt": "a\nb\nc\n", "same.txt": "s\n"})
	write(t, s, sb, "f.txt", "a\nb\nc\nd\n", "r1") // line d is operation:r1 in the base
	ctx := context.Background()
	ss := testSession(t, sb)

	upperWrite(t, ss, "f.txt", "a\nX\nb\nc\nd\n")
	upperWrite(t, ss, "same.txt", "s\n") // copied up, unchanged
	s.checkpointSession(ctx, sb, ss, "cmd-1", false)
	upperWrite(t, ss, "f.txt", "a\nX\nb\nY\nc\nd\n")
	upperWrite(t, ss, "n/new.txt", "n1\nn2\n")
	s.checkpointSession(ctx, sb, ss, "cmd-2", true)
	upperWrite(t, ss, "f.txt", "a\nX\nb\nY\nc\nd\nZ\n")
	s.checkpointSession(ctx, sb, ss, "", false, "f.txt") // a file operation
	s.checkpointSession(ctx, sb, ss, "cmd-3", false)     // nothing changed since

	content := []byte("a\nX\nb\nY\nc\nd\nZ\n")
	if got := cmdsOf(s.sessionLineOwners(ss, "f.txt", content)); got != "-,cmd-1,-,cmd-2~,-,-,-" {
		t.Fatalf("sessionLineOwners: %s", got)
	}
	if got := cmdsOf(s.sessionLineOwners(ss, "n/new.txt", []byte("n1\nn2\n"))); got != "cmd-2~,cmd-2~" {
		t.Fatalf("new file: %s", got)
	}
	// Content changed after the last checkpoint: new lines have no writer.
	if got := cmdsOf(s.sessionLineOwners(ss, "n/new.txt", []byte("n1\nlate\nn2\n"))); got != "cmd-2~,-,cmd-2~" {
		t.Fatalf("uncheckpointed change: %s", got)
	}
	if got := cmdsOf(s.sessionLineOwners(ss, "nothing.txt", []byte("q\n"))); got != "-" {
		t.Fatalf("no checkpoint: %s", got)
	}

	// Session view: base lines keep the base's owners.
	base, _ := sessionBase(ss)
	read := func(b []byte) func() ([]byte, error) { return func() ([]byte, error) { return b, nil } }
	got, wholesale, err := s.sessionBlameOwners(ctx, sb, ss, base, "f.txt", int64(len(content)), read(content))
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
	if got, _, _ := s.sessionBlameOwners(ctx, sb, ss, base, "same.txt", 2, read([]byte("s\n"))); cmdsOf(got) != "original" {
		t.Fatalf("unchanged copy-up: %s", cmdsOf(got))
	}

	// The index survives, and is rebuilt when lost.
	if err := os.Remove(filepath.Join(attrDir(ss), attrIndexName)); err != nil {
		t.Fatal(err)
	}
	if got := cmdsOf(s.sessionLineOwners(ss, "f.txt", content)); got != "-,cmd-1,-,cmd-2~,-,-,-" {
		t.Fatalf("after losing the index: %s", got)
	}
	s.checkpointSession(ctx, sb, ss, "cmd-4", false)
	if got := cmdsOf(s.sessionLineOwners(ss, "f.txt", content)); got != "-,cmd-1,-,cmd-2~,-,-,-" {
		t.Fatalf("rebuilt index re-attributed: %s", got)
	}

	// A removed file loses its checkpoint.
	if err := os.Remove(filepath.Join(ss.upper(), "n", "new.txt")); err != nil {
		t.Fatal(err)
	}
	s.checkpointSession(ctx, sb, ss, "cmd-5", false)
	if _, err := os.Stat(filepath.Join(attrDir(ss), ckKey("n/new.txt")+".json")); !os.IsNotExist(err) {
		t.Fatalf("stale checkpoint kept: %v", err)
	}

	// Publishing carries the session's writers into the audit record.
	var prev layers.Manifest
	res, err := sb.Stack.Update(ctx, func(v *layers.View) ([]layers.Change, error) {
		prev = v.Manifest()
		return []layers.Change{{Kind: layers.ChangeWrite, Path: "f.txt", Mode: 0o644, Data: content}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.recordPublishAudit(ctx, sb, prev, res, []auditFile{{Path: "f.txt", Owner: sessionOwner("ws-t", ptr("bob")),
		Session: s.sessionLineOwners(ss, "f.txt", content), SessionContent: content}}); err != nil {
		t.Fatal(err)
	}
	m, _ := blame(t, s, sb, "f.txt")
	want := "original×1 workspace_session:ws-t:cmd-1×1 original×1 workspace_session:ws-t:cmd-2×1 original×1 operation:r1×1 workspace_session:ws-t×1"
	if got := owners(t, m); got != want {
		t.Fatalf("published:\n got %s\nwant %s", got, want)
	}
}

func TestBlameCheckpointLimits(t *testing.T) {
	s, sb := testSandbox(t, map[string]string{})
	ss := testSession(t, sb)
	ctx := context.Background()
	// Fill the byte budget with a fake stored entry, then a new file has no room.
	idx := &ckIndex{V: 1, Files: map[string]*ckEntry{"big": {State: ckStored, Key: "k", Bytes: attrMaxBytes}}}
	b, _ := json.Marshal(idx)
	if err := os.WriteFile(filepath.Join(attrDir(ss), attrIndexName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	upperWrite(t, ss, "big", "x\n")
	upperWrite(t, ss, "f.txt", "1\n")
	s.checkpointSession(ctx, sb, ss, "cmd-1", false, "f.txt")
	if got := cmdsOf(s.sessionLineOwners(ss, "f.txt", []byte("1\n"))); got != "-" {
		t.Fatalf("over the limit: %s", got)
	}
	b, _ = os.ReadFile(filepath.Join(attrDir(ss), attrIndexName))
	if !strings.Contains(string(b), `"state":"over_limit"`) {
		t.Fatalf("index: %s", b)
	}
	// Non-text files are not attributed line by line.
	upperWrite(t, ss, "bin", "a\x00")
	upperWrite(t, ss, "f.txt", "1\n2\n")
	s.checkpointSession(ctx, sb, ss, "cmd-2", false)
	if _, err := os.Stat(filepath.Join(attrDir(ss), ckKey("bin")+".txt")); !os.IsNotExist(err) {
		t.Fatalf("binary checkpointed: %v", err)
	}
	// "big" was re-read (its stored copy is gone) and shrank: room for f.txt once it changes.
	if got := cmdsOf(s.sessionLineOwners(ss, "f.txt", []byte("1\n2\n"))); got != "cmd-2,cmd-2" {
		t.Fatalf("after room was freed: %s", got)
	}
}
