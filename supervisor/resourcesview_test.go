package supervisor

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	sbx "github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/resources"
)

// Handler-level tests of the resources, cgroup and snapshot views and the
// sampler's wiring; the store, series and cgroup code is tested in
// package resources, the event and trace stores in package obs.

func obsSupervisor(t *testing.T, mutate func(*config.Config)) *Supervisor {
	t.Helper()
	cfg := config.Default()
	if mutate != nil {
		mutate(cfg)
	}
	data := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ids := statedb.NewIDs()
	return &Supervisor{cfg: cfg, dirs: catalog.Dirs{Data: data}, ids: ids, log: log, obs: newObsRegistry(cfg, data, log, ids),
		sandboxes: sbx.NewRegistry[*occupants]()}
}

func obsSandbox(t *testing.T, s *Supervisor, id string) *sandbox {
	t.Helper()
	dir := filepath.Join(s.dirs.Data, "sandboxes", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return newSandbox(sandboxRecord{ID: id}, dir)
}

// query runs a handler the way dispatch does (validated args).
func query(t *testing.T, s *Supervisor, sb *sandbox, opID string, raw map[string]any) (map[string]any, error) {
	t.Helper()
	op, ok := catalog.Lookup(opID)
	if !ok {
		t.Fatalf("no op %s", opID)
	}
	args, verr := op.Validate(raw)
	if verr != nil {
		return nil, verr
	}
	c := &call{ctx: context.Background(), req: &catalog.Request{Op: opID, RequestID: "req-q"}, op: op, args: args, sb: sb}
	res, err := handlers[opID](s, c)
	if err != nil {
		return nil, err
	}
	// Round-trip through JSON as the wire does.
	var m map[string]any
	if err := json.Unmarshal(catalog.CompactJSON(res), &m); err != nil {
		t.Fatal(err)
	}
	return m, nil
}

func mustQuery(t *testing.T, s *Supervisor, sb *sandbox, opID string, raw map[string]any) map[string]any {
	t.Helper()
	m, err := query(t, s, sb, opID, raw)
	if err != nil {
		t.Fatalf("%s %v: %v", opID, raw, err)
	}
	return m
}

// TestResourcesWindow: an empty window answers partial with an error and
// writes nothing; window_ms above observability.views.resource_window_ms
// is refused.
func TestResourcesWindow(t *testing.T) {
	s := obsSupervisor(t, nil)
	sb := obsSandbox(t, s, "sbx-win")
	m := resources.Metrics{MetricsSource: "proc", CPUUsec: 1}
	resources.AppendSample(s.obs.Resources(scopeOf(sb)), time.Now().UnixMilli()-120000, resources.ScopeSandbox, &m, nil)
	got := mustQuery(t, s, sb, "resources", map[string]any{"window_ms": 1})
	if got["availability"] != "partial" || len(got["series"].([]any)) != 0 || len(got["errors"].([]any)) != 1 {
		t.Fatalf("empty window: %v", got)
	}
	s.sandboxes.Put(sb)
	fleet := mustQuery(t, s, nil, "resources", map[string]any{"window_ms": 1})
	if node := fleet["sandboxes"].(map[string]any)["sbx-win"].(map[string]any); node["availability"] != "partial" || node["current"] != nil {
		t.Fatalf("fleet node of an empty window: %v", node)
	}
	s.cfg.Observability.Views.ResourceWindowMs = 5000
	if _, err := query(t, s, sb, "resources", map[string]any{"window_ms": 5001}); err == nil || !strings.Contains(err.Error(), "window_ms exceeds max (5000)") {
		t.Fatalf("window over max: %v", err)
	}
}

func TestResourcesObservabilityDisabled(t *testing.T) {
	s := obsSupervisor(t, func(c *config.Config) { c.Observability.Enabled = false })
	sb := obsSandbox(t, s, "sbx-off")
	s.sampleOnce(true) // nothing to sample, and nothing may be created
	for _, op := range []string{"resources", "cgroup"} {
		m := mustQuery(t, s, sb, op, map[string]any{"sandbox_id": "sbx-off"})
		if len(m["series"].([]any)) != 0 || !strings.Contains(m["errors"].([]any)[0].(string), "observability.enabled: false") {
			t.Fatalf("%s: %v", op, m)
		}
	}
	if _, err := os.Stat(filepath.Join(sb.Dir, obs.DirName)); !os.IsNotExist(err) {
		t.Fatalf("store directory with observability disabled: %v", err)
	}
}

func TestResourcesDisabled(t *testing.T) {
	s := obsSupervisor(t, func(c *config.Config) { c.Observability.ResourceStats.Enabled = false })
	sb := obsSandbox(t, s, "sbx-off")
	if st := s.obs.Resources(scopeOf(sb)); st != nil {
		t.Fatal("a resource store with resource_stats disabled")
	}
	m := mustQuery(t, s, sb, "resources", nil)
	if m["availability"] != "partial" || len(m["series"].([]any)) != 0 || !strings.Contains(m["errors"].([]any)[0].(string), "disabled") {
		t.Fatalf("disabled: %v", m)
	}
}

// TestResourcesResponseBound: long samples still give a resources answer
// within 256 KiB (the oldest points are dropped).
func TestResourcesResponseBound(t *testing.T) {
	s := obsSupervisor(t, func(c *config.Config) { c.Observability.ResourceStats.MaxDiskBytes = 4 << 20 })
	sb := obsSandbox(t, s, "sbx-big")
	st := s.obs.Resources(scopeOf(sb))
	now := time.Now().UnixMilli() - 1000
	for i := range 300 {
		m := resources.Metrics{MetricsSource: "proc", CgroupError: strings.Repeat("e", 10000), CPUUsec: uint64(i)}
		resources.AppendSample(st, now+int64(i), resources.ScopeSandbox, &m, nil)
		resources.AppendSample(st, now+int64(i), "ws-a", &m, nil)
	}
	for _, tc := range []struct {
		op   string
		args map[string]any
		key  string
	}{
		{"resources", map[string]any{"window_ms": 600000}, "series"},
		{"cgroup", map[string]any{"sandbox_id": "sbx-big", "scope": "sandbox"}, "series"},
		{"snapshot", nil, "resources"},
	} {
		m, err := query(t, s, sb, tc.op, tc.args)
		if err != nil {
			t.Fatal(err)
		}
		b := catalog.CompactJSON(m)
		if len(b) > obs.MaxBytes {
			t.Fatalf("%s: %d bytes", tc.op, len(b))
		}
		if ser, ok := m[tc.key].([]any); ok && len(ser) == 0 {
			t.Fatalf("%s: no points", tc.op)
		}
	}
}
