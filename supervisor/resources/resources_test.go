package resources

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
)

// testView is a resource view over a fresh data directory with the
// configuration's defaults.
func testView(t testing.TB, mutate func(*obs.Options)) (View, string) {
	t.Helper()
	opt := obs.Options{Enabled: true, MaxDiskBytes: 4 << 20, MaxLineBytes: 16384, ResourcesEnabled: true, ResourcesMaxDiskBytes: 1 << 20}
	if mutate != nil {
		mutate(&opt)
	}
	data := t.TempDir()
	return View{Reg: obs.New(opt, data), SampleIntervalMs: 2000}, data
}

// testSandbox is the scope of a sandbox whose directory exists.
func testSandbox(t testing.TB, data, id string) obs.Scope {
	t.Helper()
	dir := filepath.Join(data, "sandboxes", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return obs.Scope{ID: id, Dir: dir}
}

// sandboxSeries is the sandbox series of the last windowMs as the wire
// carries it.
func sandboxSeries(t *testing.T, v View, sb obs.Scope, windowMs int64) []any {
	t.Helper()
	pts, err := v.Series(context.Background(), sb, ScopeSandbox, time.Now().UnixMilli()-windowMs, obs.MaxRecords, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(pts)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > obs.MaxBytes {
		t.Fatalf("series of %d bytes", len(b))
	}
	var out []any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// segSizes are the sizes of a store's current and rotated segment.
func segSizes(t *testing.T, dir, name string) (cur, rot int64) {
	t.Helper()
	if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
		cur = fi.Size()
	}
	if fi, err := os.Stat(filepath.Join(dir, name+".1")); err == nil {
		rot = fi.Size()
	}
	return cur, rot
}

func resSegSizes(t *testing.T, dir string) (cur, rot int64) { return segSizes(t, dir, obs.ResLogName) }

func TestResourceStoreCapsUnder10000Samples(t *testing.T) {
	v, data := testView(t, func(o *obs.Options) { o.ResourcesMaxDiskBytes = 128 << 10 })
	sb := testSandbox(t, data, "sbx-res")
	dir := filepath.Join(sb.Dir, obs.DirName)
	limit := int64(128 << 10)
	st := v.Reg.Resources(sb)
	now := time.Now().UnixMilli() - 10000
	for i := range 10000 {
		m := Metrics{MetricsSource: "proc", CgroupError: "not delegated", CPUUsec: uint64(i) * 1000, MemCur: 1 << 20,
			MemMaxUnlimited: true, IORBytes: uint64(i), PidsCur: 2}
		AppendSample(st, now+int64(i), ScopeSandbox, &m, nil)
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
	huge := Metrics{MetricsSource: "proc", CgroupError: strings.Repeat("e", 20000)}
	AppendSample(st, now+10000, ScopeSandbox, &huge, nil)
	if got := st.Stats(); got != (obs.SinkStats{DroppedOversized: 1}) {
		t.Fatalf("resource store counters: %+v", got)
	}
	for _, name := range []string{obs.ResLogName, obs.ResLogName + ".1"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("_truncated")) || bytes.Contains(b, []byte("eeee")) {
			t.Fatalf("%s holds a truncated or oversized sample", name)
		}
	}
	// The event log of the same directory is untouched by samples.
	if cur, rot := segSizes(t, dir, obs.LogName); cur != 0 || rot != 0 {
		t.Fatalf("samples went to the event log: %d %d", cur, rot)
	}
	// The view returns at most 500 points within 256 KiB, newest last,
	// with the counter deltas of consecutive samples.
	series := sandboxSeries(t, v, sb, 600000)
	if len(series) == 0 || len(series) > obs.MaxRecords {
		t.Fatalf("resources: %d points", len(series))
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
	v, data := testView(t, nil)
	sb := testSandbox(t, data, "sbx-delta")
	st := v.Reg.Resources(sb)
	now := time.Now().UnixMilli()
	// An old sample outside the window, then a drop (a process exited).
	for i, c := range []struct {
		ts  int64
		cpu uint64
	}{{now - 120000, 1}, {now - 3000, 5000}, {now - 2000, 9000}, {now - 1000, 4000}} {
		m := Metrics{MetricsSource: "proc", CPUUsec: c.cpu, PidsCur: i}
		AppendSample(st, c.ts, ScopeSandbox, &m, nil)
		AppendSample(st, c.ts, "ws-a", &m, nil)
	}
	series := sandboxSeries(t, v, sb, 60000)
	var deltas []float64
	for _, p := range series {
		deltas = append(deltas, p.(map[string]any)["deltas"].(map[string]any)["cpu_usec"].(float64))
	}
	if len(deltas) != 3 || deltas[0] != 4999 || deltas[1] != 4000 || deltas[2] != 0 {
		t.Fatalf("deltas %v (series %v)", deltas, series)
	}
	// A window with no samples: no points, never a new sample.
	before, _ := resSegSizes(t, filepath.Join(sb.Dir, obs.DirName))
	if series := sandboxSeries(t, v, sb, 1); len(series) != 0 {
		t.Fatalf("empty window: %v", series)
	}
	if cur, err := v.Current(context.Background(), sb, time.Now().UnixMilli()-1); err != nil || cur != nil {
		t.Fatalf("current of an empty window: %v %v", cur, err)
	}
	if after, _ := resSegSizes(t, filepath.Join(sb.Dir, obs.DirName)); after != before {
		t.Fatalf("a read wrote %d bytes", after-before)
	}
}

func TestReadCgroupMetrics(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  Metrics
		err   bool
	}{
		{"limited", map[string]string{
			"cpu.stat":       "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n",
			"memory.current": "4096\n", "memory.max": "536870912\n",
			"io.stat":      "8:0 rbytes=100 wbytes=200 rios=1 wios=2\n8:16 rbytes=1 wbytes=2\n",
			"pids.current": "3\n"},
			Metrics{CPUUsec: 123456, MemCur: 4096, MemMax: ptr[int64](536870912), IORBytes: 101, IOWBytes: 202, PidsCur: 3}, false},
		{"unlimited, no io", map[string]string{"cpu.stat": "usage_usec 7\n", "memory.current": "1\n", "memory.max": "max\n"},
			Metrics{CPUUsec: 7, MemCur: 1, MemMaxUnlimited: true}, false},
		{"no cpu.stat", map[string]string{"memory.current": "1\n"}, Metrics{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, c := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ReadCgroupMetrics(dir)
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
	cg := SetupCgroups(t.TempDir(), "/proc/self/cgroup")
	if cg.Delegated || !strings.Contains(cg.Reason, "not a cgroup v2 mount") || cg.SandboxPath("sbx-x") != "" || cg.SessionPath("ws-x") != "" {
		t.Fatalf("%+v", cg)
	}
	if err := cg.Attach("sbx-x", "ws-x", os.Getpid()); err != nil {
		t.Fatalf("attach without delegation: %v", err)
	}
}

// BenchmarkResourcesQuery is one resources query over a full 1 MiB store.
func BenchmarkResourcesQuery(b *testing.B) {
	v, data := testView(b, nil)
	sb := testSandbox(b, data, "sbx-bench")
	st := v.Reg.Resources(sb)
	now := time.Now().UnixMilli() - 5000
	for i := range 5000 {
		m := Metrics{MetricsSource: "proc", CPUUsec: uint64(i), MemCur: 1 << 20, PidsCur: 2}
		AppendSample(st, now+int64(i), ScopeSandbox, &m, nil)
	}
	for b.Loop() {
		if _, err := v.Series(context.Background(), sb, ScopeSandbox, time.Now().UnixMilli()-600000, obs.MaxRecords, 1); err != nil {
			b.Fatal(err)
		}
	}
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
	// What AppendSample writes takes the fast path with the same result.
	rec := sampleRecord{Kind: "sample", TS: 42, Scope: "sandbox", Metrics: &Metrics{MetricsSource: "proc"}, Counters: counterKeys}
	line, err := obs.EncodeLine(&rec)
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
