package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

func TestResolve(t *testing.T) {
	reg := NewRegistry[struct{}]()
	for id, state := range map[string]string{
		"sbx-ready": StateReady, "sbx-creating": StateCreating, "sbx-stopping": StateStopping, "sbx-failed": StateFailed,
	} {
		reg.Put(New(Record{ID: id, State: state, Error: "boom"}, "", struct{}{}))
	}
	tests := []struct {
		id       string
		readOnly bool
		kind     string // "" for success
	}{
		{"sbx-ready", false, ""},
		{"sbx-failed", true, ""},
		{"sbx-failed", false, catalog.OperationFailed},
		{"sbx-creating", true, catalog.OperationConflict},
		{"sbx-stopping", false, catalog.OperationConflict},
		{"sbx-absent", true, catalog.NotFound},
		{"bad id/", true, catalog.InvalidRequest},
	}
	for _, tt := range tests {
		sb, e := reg.Resolve(tt.id, tt.readOnly)
		switch {
		case tt.kind == "" && (e != nil || sb == nil || sb.Rec.ID != tt.id):
			t.Errorf("Resolve(%q, %v) = %v, %v; want the entry", tt.id, tt.readOnly, sb, e)
		case tt.kind != "" && (e == nil || e.Kind != tt.kind):
			t.Errorf("Resolve(%q, %v) error %v; want kind %s", tt.id, tt.readOnly, e, tt.kind)
		}
	}
}

func TestCheckWorkspaceRoot(t *testing.T) {
	base := t.TempDir()
	own := filepath.Join(base, "data")
	ws := filepath.Join(base, "ws")
	for _, d := range []string{own, ws, filepath.Join(base, "other")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(ws, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		p     string
		roots []string
		want  string // "" when refused
	}{
		{"directory", ws, nil, ws},
		{"symlink resolved", link, nil, ws},
		{"relative", "ws", nil, ""},
		{"missing", filepath.Join(base, "nope"), nil, ""},
		{"file", file, nil, ""},
		{"root", "/", nil, ""},
		{"the supervisor's directory", own, nil, ""},
		{"contains the supervisor's directory", base, nil, ""},
		{"under a configured root", ws, []string{ws}, ws},
		{"outside the configured roots", ws, []string{filepath.Join(base, "other")}, ""},
	}
	for _, tt := range tests {
		got, err := CheckWorkspaceRoot(tt.p, []string{own}, tt.roots)
		if tt.want == "" {
			var ce *catalog.Error
			if !errors.As(err, &ce) || ce.Kind != catalog.InvalidRequest {
				t.Errorf("%s: got %q, %v; want invalid_request", tt.name, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: got %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

// fakeStore records what the manager persists; the state database itself
// is tested with the root package.
type fakeStore struct {
	mu      sync.Mutex
	put     map[string]Record
	deleted []string
}

func (f *fakeStore) PutSandbox(_ context.Context, rec *Record) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.put[rec.ID] = *rec
	return nil
}

func (f *fakeStore) DeleteSandboxRows(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, id)
	return nil
}

type stopRecorder struct{ stopped, forgotten []string }

func (o *stopRecorder) Stop(_ context.Context, sb *Sandbox[int], _ func(string)) {
	o.stopped = append(o.stopped, sb.Rec.ID)
}
func (o *stopRecorder) Forget(sb *Sandbox[int]) { o.forgotten = append(o.forgotten, sb.Rec.ID) }

func TestDestroyRemovesEverything(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sbx-1")
	if err := os.MkdirAll(filepath.Join(dir, "layerstack"), 0o755); err != nil {
		t.Fatal(err)
	}
	st := &fakeStore{put: map[string]Record{}}
	occ := &stopRecorder{}
	var released []string
	m := &Manager[int]{Reg: NewRegistry[int](), Store: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Occupants: occ, ReleaseImage: func(r string) { released = append(released, r) }}
	m.Reg.Put(New(Record{ID: "sbx-1", State: StateReady, Rootfs: "img-1"}, dir, 0))
	bg := make(chan struct{})
	sb := m.Reg.Get("sbx-1")
	sb.GoBackground(func() { close(bg) })

	rec, err := m.Destroy(context.Background(), "sbx-1", func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	<-bg // Destroy waited for it
	if rec.State != StateStopped {
		t.Errorf("state %q", rec.State)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory left: %v", err)
	}
	if m.Reg.Get("sbx-1") != nil {
		t.Error("still registered")
	}
	if len(occ.stopped) != 1 || len(occ.forgotten) != 1 || len(st.deleted) != 1 || len(released) != 1 {
		t.Errorf("stopped %v forgotten %v deleted %v released %v", occ.stopped, occ.forgotten, st.deleted, released)
	}
	if st.put["sbx-1"].State != StateStopping {
		t.Errorf("persisted state %q, want stopping before removal", st.put["sbx-1"].State)
	}
	if sb.GoBackground(func() {}) {
		t.Error("background work accepted after removal")
	}
	if _, err := m.Destroy(context.Background(), "sbx-1", func(string) {}); err == nil {
		t.Error("second destroy succeeded")
	}
}
