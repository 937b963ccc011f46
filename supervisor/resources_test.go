package supervisor

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	sbx "github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
)

func resSegSizes(t *testing.T, dir string) (cur, rot int64) {
	t.Helper()
	if fi, err := os.Stat(filepath.Join(dir, resLogName)); err == nil {
		cur = fi.Size()
	}
	if fi, err := os.Stat(filepath.Join(dir, resLogName+".1")); err == nil {
		rot = fi.Size()
	}
	return cur, rot
}

func TestResourceStoreCapsUnder10000Samples(t *testing.T) {
	s := obsSupervisor(t, func(c *Config) { c.Observability.ResourceStats.MaxDiskBytes = 128 << 10 })
	sb := obsSandbox(t, s, "sbx-res")
	dir := filepath.Join(sb.Dir, obsDirName)
	limit := int64(128 << 10)
	st := s.obs.resources(sb)
	now := time.Now().UnixMilli() - 10000
	for i := range 10000 {
		m := resMetrics{MetricsSource: "proc", CgroupError: "not delegated", CPUUsec: uint64(i) * 1000, MemCur: 1 << 20,
			MemMaxUnlimited: true, IORBytes: uint64(i), PidsCur: 2}
		appendSample(st, now+int64(i), scopeSandbox, &m, nil)
		if i%500 == 0 || i == 9999 {
			cur, rot := resSegSizes(t, dir)
			if cur > limit/2 || rot > limit/2 || cur+rot > limit {
				t.Fatalf("after %d samples: segments %d + %d exceed %d", i+1, cur, rot, limit)
			}
		}
	}
	if _, rot := resSegSizes(t, dir); rot == 0 {
		t.Fatal("no rotation after 10,000 samples")
	}
	// Strict appends: an oversized sample is dropped, never truncated.
	huge := resMetrics{MetricsSource: "proc", CgroupError: strings.Repeat("e", 20000)}
	appendSample(st, now+10000, scopeSandbox, &huge, nil)
	if got := st.stats(); got != (SinkStats{DroppedOversized: 1}) {
		t.Fatalf("resource store counters: %+v", got)
	}
	for _, name := range []string{resLogName, resLogName + ".1"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("_truncated")) || bytes.Contains(b, []byte("eeee")) {
			t.Fatalf("%s holds a truncated or oversized sample", name)
		}
	}
	// The event log of the same directory is untouched by samples.
	if cur, rot := segSizes(t, dir); cur != 0 || rot != 0 {
		t.Fatalf("samples went to the event log: %d %d", cur, rot)
	}
	// The view returns at most 500 points within 256 KiB, newest last,
	// with the counter deltas of consecutive samples.
	m := mustQuery(t, s, sb, "resources", map[string]any{"window_ms": 600000})
	series := m["series"].([]any)
	if m["availability"] != "available" || len(series) == 0 || len(series) > obsMaxRecords {
		t.Fatalf("resources: %d points, %v", len(series), m["availability"])
	}
	last := series[len(series)-1].(map[string]any)
	if last["metrics"].(map[string]any)["cpu_usec"] != float64(9999000) || last["deltas"].(map[string]any)["cpu_usec"] != float64(1000) ||
		last["sample_delta_ms"] != float64(1) {
		t.Fatalf("last point: %v", last)
	}
	for _, p := range series[1:] {
		if p := p.(map[string]any); p["sample_delta_ms"] != float64(1) || p["deltas"].(map[string]any)["io_rbytes"] != float64(1) {
			t.Fatalf("point: %v", p)
		}
	}
}

func TestResourceDeltasClampAndWindow(t *testing.T) {
	s := obsSupervisor(t, nil)
	sb := obsSandbox(t, s, "sbx-delta")
	st := s.obs.resources(sb)
	now := time.Now().UnixMilli()
	// An old sample outside the window, then a drop (a process exited).
	for i, c := range []struct {
		ts  int64
		cpu uint64
	}{{now - 120000, 1}, {now - 3000, 5000}, {now - 2000, 9000}, {now - 1000, 4000}} {
		m := resMetrics{MetricsSource: "proc", CPUUsec: c.cpu, PidsCur: i}
		appendSample(st, c.ts, scopeSandbox, &m, nil)
		appendSample(st, c.ts, "ws-a", &m, nil)
	}
	m := mustQuery(t, s, sb, "resources", map[string]any{"window_ms": 60000})
	series := m["series"].([]any)
	var deltas []float64
	for _, p := range series {
		deltas = append(deltas, p.(map[string]any)["deltas"].(map[string]any)["cpu_usec"].(float64))
	}
	if len(deltas) != 3 || deltas[0] != 4999 || deltas[1] != 4000 || deltas[2] != 0 {
		t.Fatalf("deltas %v (series %v)", deltas, series)
	}
	// A window with no samples: partial with an error, never a new sample.
	before, _ := resSegSizes(t, filepath.Join(sb.Dir, obsDirName))
	m = mustQuery(t, s, sb, "resources", map[string]any{"window_ms": 1})
	if m["availability"] != "partial" || len(m["series"].([]any)) != 0 || len(m["errors"].([]any)) != 1 {
		t.Fatalf("empty window: %v", m)
	}
	if after, _ := resSegSizes(t, filepath.Join(sb.Dir, obsDirName)); after != before {
		t.Fatalf("a read wrote %d bytes", after-before)
	}
	// window_ms above observability.views.resource_window_ms.
	s.cfg.Observability.Views.ResourceWindowMs = 5000
	if _, err := query(t, s, sb, "resources", map[string]any{"window_ms": 5001}); err == nil || !strings.Contains(err.Error(), "window_ms exceeds max (5000)") {
		t.Fatalf("window over max: %v", err)
	}
}

func TestResourcesObservabilityDisabled(t *testing.T) {
	s := obsSupervisor(t, func(c *Config) { c.Observability.Enabled = false })
	sb := obsSandbox(t, s, "sbx-off")
	s.sampleOnce(true) // nothing to sample, and nothing may be created
	for _, op := range []string{"resources", "cgroup"} {
		m := mustQuery(t, s, sb, op, map[string]any{"sandbox_id": "sbx-off"})
		if len(m["series"].([]any)) != 0 || !strings.Contains(m["errors"].([]any)[0].(string), "observability.enabled: false") {
			t.Fatalf("%s: %v", op, m)
		}
	}
	if _, err := os.Stat(filepath.Join(sb.Dir, obsDirName)); !os.IsNotExist(err) {
		t.Fatalf("store directory with observability disabled: %v", err)
	}
}

func TestResourcesDisabled(t *testing.T) {
	s := obsSupervisor(t, func(c *Config) { c.Observability.ResourceStats.Enabled = false })
	sb := obsSandbox(t, s, "sbx-off")
	if st := s.obs.resources(sb); st != nil {
		t.Fatal("a resource store with resource_stats disabled")
	}
	m := mustQuery(t, s, sb, "resources", nil)
	if m["availability"] != "partial" || len(m["series"].([]any)) != 0 || !strings.Contains(m["errors"].([]any)[0].(string), "disabled") {
		t.Fatalf("disabled: %v", m)
	}
}

func TestReadCgroupMetrics(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  resMetrics
		err   bool
	}{
		{"limited", map[string]string{
			"cpu.stat":       "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n",
			"memory.current": "4096\n", "memory.max": "536870912\n",
			"io.stat":      "8:0 rbytes=100 wbytes=200 rios=1 wios=2\n8:16 rbytes=1 wbytes=2\n",
			"pids.current": "3\n"},
			resMetrics{CPUUsec: 123456, MemCur: 4096, MemMax: ptr[int64](536870912), IORBytes: 101, IOWBytes: 202, PidsCur: 3}, false},
		{"unlimited, no io", map[string]string{"cpu.stat": "usage_usec 7\n", "memory.current": "1\n", "memory.max": "max\n"},
			resMetrics{CPUUsec: 7, MemCur: 1, MemMaxUnlimited: true}, false},
		{"no cpu.stat", map[string]string{"memory.current": "1\n"}, resMetrics{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, c := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := readCgroupMetrics(dir)
			if (err != nil) != tc.err {
				t.Fatalf("err %v", err)
			}
			if tc.err {
				return
			}
			if got.MetricsSource != "cgroup" || !got.CgroupAvailable || got.CgroupPath == nil || *got.CgroupPath != dir {
				t.Fatalf("header: %+v", got)
			}
			got.MetricsSource, got.CgroupAvailable, got.CgroupPath = "", false, nil
			if (got.MemMax == nil) != (tc.want.MemMax == nil) || (got.MemMax != nil && *got.MemMax != *tc.want.MemMax) {
				t.Fatalf("mem_max %v want %v", got.MemMax, tc.want.MemMax)
			}
			got.MemMax, tc.want.MemMax = nil, nil
			if got != tc.want {
				t.Fatalf("got %+v want %+v", got, tc.want)
			}
		})
	}
}

func TestSetupCgroupsWithoutV2(t *testing.T) {
	// A directory that is not a cgroup2 mount: no delegation, with the reason.
	cg := setupCgroups(t.TempDir(), "/proc/self/cgroup")
	if cg.delegated || !strings.Contains(cg.reason, "not a cgroup v2 mount") || cg.sandboxPath("sbx-x") != "" || cg.sessionPath("ws-x") != "" {
		t.Fatalf("%+v", cg)
	}
	if err := cg.attach("sbx-x", "ws-x", os.Getpid()); err != nil {
		t.Fatalf("attach without delegation: %v", err)
	}
}

// BenchmarkSpan is the cost of one span record (start + end) in a sandbox
// store: what tracing adds per span to a request.
func BenchmarkSpan(b *testing.B) {
	s := obsSupervisorB(b)
	sb := newSandbox(sandboxRecord{ID: "sbx-bench"}, filepath.Join(s.dirs.Data, "sbx-bench"))
	if err := os.MkdirAll(sb.Dir, 0o700); err != nil {
		b.Fatal(err)
	}
	root := s.startSpan(sb, "req-bench", "", "supervisor.dispatch", map[string]any{"op": "exec_command"})
	for b.Loop() {
		sp := root.child("holder.exec", map[string]any{"workspace_session_id": "ws-x", "command_session_id": "cmd-y"})
		sp.done(nil, nil)
	}
}

// BenchmarkResourcesQuery is one resources query over a full 1 MiB store.
func BenchmarkResourcesQuery(b *testing.B) {
	s := obsSupervisorB(b)
	sb := newSandbox(sandboxRecord{ID: "sbx-bench"}, filepath.Join(s.dirs.Data, "sbx-bench"))
	if err := os.MkdirAll(sb.Dir, 0o700); err != nil {
		b.Fatal(err)
	}
	st := s.obs.resources(sb)
	now := time.Now().UnixMilli() - 5000
	for i := range 5000 {
		m := resMetrics{MetricsSource: "proc", CPUUsec: uint64(i), MemCur: 1 << 20, PidsCur: 2}
		appendSample(st, now+int64(i), scopeSandbox, &m, nil)
	}
	c := &call{sb: sb}
	op, _ := catalog.Lookup("resources")
	c.op = op
	c.args, _ = op.Validate(map[string]any{"window_ms": 600000})
	for b.Loop() {
		if _, err := s.resources(c); err != nil {
			b.Fatal(err)
		}
	}
}

func obsSupervisorB(b *testing.B) *Supervisor {
	cfg := DefaultConfig()
	data := b.TempDir()
	return &Supervisor{cfg: cfg, dirs: catalog.Dirs{Data: data}, ids: newIDSource(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), obs: newObsRegistry(cfg, data), sandboxes: sbx.NewRegistry[*occupants]()}
}

func TestSampleHead(t *testing.T) {
	tests := []struct {
		line string
		want sampleHeader
		ok   bool
	}{
		{`{"kind":"sample","ts":123,"scope":"ws-a","cpu_usec":1}`, sampleHeader{"sample", 123, "ws-a"}, true},
		{`{"kind":"sample","ts":5,"scope":"a\"b","x":1}`, sampleHeader{"sample", 5, `a"b`}, true},
		{`{"scope":"stack","ts":7,"kind":"sample"}`, sampleHeader{"sample", 7, "stack"}, true},
		{`{"kind":"event","ts":7,"name":"x"}`, sampleHeader{}, false},
		{`{"kind":"sample","ts":`, sampleHeader{}, false},
		{`not json`, sampleHeader{}, false},
	}
	for _, tc := range tests {
		got, ok := sampleHead([]byte(tc.line))
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("%s: got %+v %v, want %+v %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
	// What appendSample writes takes the fast path with the same result.
	rec := sampleRecord{Kind: "sample", TS: 42, Scope: "sandbox", resMetrics: &resMetrics{MetricsSource: "proc"}, Counters: counterKeys}
	line, err := encodeLine(&rec)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(line, samplePrefix) {
		t.Fatalf("sample line %s does not start with %s", line, samplePrefix)
	}
	if h, ok := sampleHead(bytes.TrimSpace(line)); !ok || h != (sampleHeader{"sample", 42, "sandbox"}) {
		t.Fatalf("%+v %v", h, ok)
	}
}

// TestResourcesResponseBound: long samples still give a resources answer
// within 256 KiB (the oldest points are dropped).
func TestResourcesResponseBound(t *testing.T) {
	s := obsSupervisor(t, func(c *Config) { c.Observability.ResourceStats.MaxDiskBytes = 4 << 20 })
	sb := obsSandbox(t, s, "sbx-big")
	st := s.obs.resources(sb)
	now := time.Now().UnixMilli() - 1000
	for i := range 300 {
		m := resMetrics{MetricsSource: "proc", CgroupError: strings.Repeat("e", 10000), CPUUsec: uint64(i)}
		appendSample(st, now+int64(i), scopeSandbox, &m, nil)
		appendSample(st, now+int64(i), "ws-a", &m, nil)
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
		if len(b) > obsMaxBytes {
			t.Fatalf("%s: %d bytes", tc.op, len(b))
		}
		if ser, ok := m[tc.key].([]any); ok && len(ser) == 0 {
			t.Fatalf("%s: no points", tc.op)
		}
	}
}

func TestObservabilityConfigRanges(t *testing.T) {
	tests := []struct {
		yaml, err string
	}{
		{"observability:\n  resource_stats:\n    max_disk_bytes: 131073\n", "not even"},
		{"observability:\n  resource_stats:\n    max_disk_bytes: 131070\n", "out of range"},
		{"observability:\n  resource_stats:\n    max_disk_bytes: 131072\n    sample_interval_ms: 250\n", ""},
		{"observability:\n  resource_stats:\n    sample_interval_ms: 249\n", "out of range"},
		{"observability:\n  max_disk_bytes: 1000\n", "out of range"},
		{"observability:\n  max_disk_bytes: 1048576\n", ""},
	}
	for _, tc := range tests {
		p := filepath.Join(t.TempDir(), "config.yml")
		if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(p)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.err)
		}
	}
}
