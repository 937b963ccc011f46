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
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// file_blame through its handler: the contract's errors and the head view
// from audit records (the owners themselves are tested in
// supervisor/attribution).

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
	t.Cleanup(func() { st.Close() })
	if err := st.initAudit(ctx); err != nil {
		t.Fatal(err)
	}
	sbDir := filepath.Join(root, "sandboxes", "sbx-test")
	stack, _, err := layers.Create(ctx, filepath.Join(sbDir, "layerstack"), ws, layers.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := &Supervisor{store: st, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s.glue = &attrGlue{store: st, log: s.log, recordLayerOrigin: s.recordLayerOrigin}
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
		s.glue.auditSessionless(context.Background(), sb, prev, res, p, requestID)
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
