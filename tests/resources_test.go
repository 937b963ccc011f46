package tests

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// startWithConfig writes config.yml and starts the supervisor.
func (e *env) startWithConfig(cfg string) {
	e.t.Helper()
	dir := filepath.Join(e.home, "config")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(cfg), 0o600); err != nil {
		e.t.Fatal(err)
	}
	e.start()
}

// latestSample returns the metrics of the newest sample of a cgroup view
// (scope a session or "sandbox"), or nil.
func (e *env) latestSample(id, scope string) map[string]any {
	e.t.Helper()
	m := e.obsOK("cgroup", id, map[string]any{"scope": scope})
	series := objs(m["series"])
	if len(series) == 0 {
		return nil
	}
	last := series[len(series)-1]
	met := last["metrics"].(map[string]any)
	met["_ts"] = last["ts"]
	return met
}

func metric(t *testing.T, m map[string]any, k string) float64 {
	t.Helper()
	v, ok := m[k].(float64)
	if !ok {
		t.Fatalf("metric %s missing: %v", k, m)
	}
	return v
}

// waitSample polls until the scope has a sample newer than after (Unix ms).
func (e *env) waitSample(id, scope string, after float64) map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := e.latestSample(id, scope); m != nil && m["_ts"].(float64) > after {
			return m
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no new sample of %s", scope)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestResourcesBusySessionRisesIdleDoesNot(t *testing.T) {
	e := newEnv(t)
	e.startWithConfig("observability:\n  resource_stats:\n    sample_interval_ms: 250\n")
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	idle := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"})) // no session: never sampled

	// No session yet: no samples, and reading never samples on demand.
	r := e.obsOK("resources", id, nil)
	if r["view"] != "resources" || r["scope"] != "sandbox" || r["sandbox_id"] != id || r["source"] != "supervisor_disk" ||
		r["availability"] != "partial" || len(objs(r["series"])) != 0 || len(r["errors"].([]any)) == 0 {
		t.Fatalf("resources without samples: %v", r)
	}

	busy := e.session(id, "--agent", "busy")
	calm := e.session(id, "--agent", "calm")
	b0 := e.waitSample(id, busy, 0)
	c0 := e.waitSample(id, calm, 0)
	health := e.obsOK("health", "", nil)
	wantSource := "proc"
	if health["cgroup"].(map[string]any)["delegated"] == true {
		wantSource = "cgroup"
	}
	for _, m := range []map[string]any{b0, c0} {
		if m["metrics_source"] != wantSource || metric(t, m, "pids_cur") < 1 || metric(t, m, "mem_cur") <= 0 {
			t.Fatalf("first sample: %v (want source %s, the holder counted)", m, wantSource)
		}
		if wantSource == "proc" && (m["cgroup_available"] != false || m["cgroup_error"] == nil || m["mem_max_unlimited"] != true) {
			t.Fatalf("proc sample without the cgroup reason: %v", m)
		}
	}

	// The busy session holds ~40 MB in a shell variable and spins; the calm
	// one sleeps.
	run := e.exec(id, "--workspace-session-id", busy, "--yield-time-ms", "0", "--timeout-ms", "120000",
		`x=$(head -c 40000000 /dev/zero | tr '\0' a); while :; do :; done`)
	sleep := e.exec(id, "--workspace-session-id", calm, "--yield-time-ms", "0", "--timeout-ms", "120000", "sleep 600")
	if run["status"] != "running" || sleep["status"] != "running" {
		t.Fatalf("exec: %v %v", run, sleep)
	}
	var b1, c1 map[string]any
	deadline := time.Now().Add(90 * time.Second)
	for {
		b1 = e.latestSample(id, busy)
		if metric(t, b1, "cpu_usec")-metric(t, b0, "cpu_usec") >= 1e6 && metric(t, b1, "mem_cur")-metric(t, b0, "mem_cur") >= 30e6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("busy session did not rise: first %v, now %v", b0, b1)
		}
		time.Sleep(200 * time.Millisecond)
	}
	c1 = e.waitSample(id, calm, b1["_ts"].(float64)-1)
	cpuBusy := metric(t, b1, "cpu_usec") - metric(t, b0, "cpu_usec")
	cpuCalm := metric(t, c1, "cpu_usec") - metric(t, c0, "cpu_usec")
	memCalm := metric(t, c1, "mem_cur") - metric(t, c0, "mem_cur")
	t.Logf("busy: +%.0f µs CPU, +%.0f B; calm: +%.0f µs CPU, %+.0f B", cpuBusy, metric(t, b1, "mem_cur")-metric(t, b0, "mem_cur"), cpuCalm, memCalm)
	if cpuCalm*10 > cpuBusy || memCalm > 10e6 {
		t.Fatalf("the calm session rose too: +%.0f µs CPU, %+.0f B (busy +%.0f µs)", cpuCalm, memCalm, cpuBusy)
	}
	if metric(t, c1, "pids_cur") < 2 || metric(t, b1, "pids_cur") < 2 {
		t.Fatalf("command processes not counted: busy %v calm %v", b1, c1)
	}
	if counts := e.obsOK("health", "", nil)["counts"].(map[string]any); counts["sandboxes"] != float64(2) ||
		counts["workspace_sessions"] != float64(2) || counts["running_commands"] != float64(2) {
		t.Fatalf("health counts: %v", counts)
	}

	// The sandbox series: deltas of the counters, never negative; with
	// /proc the sandbox sample is the sum of its sessions.
	r = e.obsOK("resources", id, map[string]any{"window_ms": 600000})
	series := objs(r["series"])
	if r["availability"] != "available" || len(series) < 2 || len(r["errors"].([]any)) != 0 {
		t.Fatalf("sandbox resources: %v", r)
	}
	var cpuDeltas float64
	for i, p := range series {
		d := p["deltas"].(map[string]any)
		if i > 0 && (p["sample_delta_ms"] == nil || p["sample_delta_ms"].(float64) <= 0) {
			t.Fatalf("sample_delta_ms: %v", p)
		}
		for _, k := range []string{"cpu_usec", "io_rbytes", "io_wbytes"} {
			if v, ok := d[k]; i > 0 && (!ok || v.(float64) < 0) {
				t.Fatalf("delta %s: %v", k, p)
			}
		}
		if i > 0 {
			cpuDeltas += d["cpu_usec"].(float64)
		}
	}
	if cpuDeltas < cpuBusy/2 {
		t.Fatalf("sandbox cpu deltas %.0f µs, busy session alone +%.0f µs", cpuDeltas, cpuBusy)
	}
	if wantSource == "proc" {
		sbx := e.latestSample(id, "sandbox")
		b, c := e.latestSample(id, busy), e.latestSample(id, calm)
		if sbx["_ts"] == b["_ts"] && b["_ts"] == c["_ts"] &&
			metric(t, sbx, "cpu_usec") != metric(t, b, "cpu_usec")+metric(t, c, "cpu_usec") {
			t.Fatalf("sandbox sample %v is not the sum of %v and %v", sbx, b, c)
		}
	}

	// Fleet: the latest sandbox sample per sandbox; a sandbox without
	// sessions is partial with an error.
	fleet := e.obsOK("resources", "", nil)
	sbs := fleet["sandboxes"].(map[string]any)
	if fleet["scope"] != "fleet" || fleet["availability"] != "partial" || sbs[id].(map[string]any)["current"] == nil ||
		sbs[id].(map[string]any)["availability"] != "available" || sbs[idle].(map[string]any)["current"] != nil ||
		sbs[idle].(map[string]any)["availability"] != "partial" {
		t.Fatalf("fleet: %v", fleet)
	}

	// cgroup view of a session: its samples and its processes.
	cg := e.obsOK("cgroup", id, map[string]any{"scope": busy})
	if cg["view"] != "cgroup" || cg["scope"] != busy || cg["availability"] != "available" || len(objs(cg["series"])) == 0 {
		t.Fatalf("cgroup view: %v", cg)
	}
	topo := cg["topology"].(map[string]any)
	if w := objs(topo["workspaces"]); len(w) != 1 || w[0]["workspace_id"] != busy || !hasProcess(w[0], "bash") {
		t.Fatalf("cgroup topology: %v", topo)
	}

	// snapshot carries the latest samples; a stack sample arrives every
	// 10th interval and makes the layerstack trend.
	snap := e.obsOK("snapshot", id, nil)
	if snap["availability"] != "available" || snap["resources"].(map[string]any)["latest"] == nil {
		t.Fatalf("snapshot: %v", snap)
	}
	for _, w := range objs(snap["workspaces"]) {
		if w["resources"].(map[string]any)["latest"] == nil {
			t.Fatalf("snapshot workspace without samples: %v", w)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		ls := e.obsOK("layerstack", id, map[string]any{"window_ms": 600000})
		if tr := objs(ls["trend"]); len(tr) > 0 {
			if m := tr[0]["metrics"].(map[string]any); m["layer_count"] != float64(1) || m["active_leases"] != float64(2) {
				t.Fatalf("stack sample: %v", m)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no stack sample")
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Reads never write: the idle sandbox has no resource store at all.
	if _, err := os.Stat(filepath.Join(e.data(), "sandboxes", idle, "observability", "resources.ndjson")); !os.IsNotExist(err) {
		t.Fatalf("a sandbox without sessions has a resource store: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.data(), "sandboxes", id, "observability", "resources.ndjson")); err != nil {
		t.Fatal(err)
	}

	// Bad input changes nothing and gets the contract's errors.
	bad := []struct {
		op, id string
		args   map[string]any
		kind   string
		msg    string
	}{
		{"resources", id, map[string]any{"window_ms": 600001}, "invalid_request", "window_ms exceeds max (600000)"},
		{"resources", "", map[string]any{"window_ms": 600001}, "invalid_request", "window_ms exceeds max (600000)"},
		{"resources", id, map[string]any{"window_ms": 0}, "invalid_request", ""},
		{"resources", id, map[string]any{"window_ms": -1}, "invalid_request", ""},
		{"resources", id, map[string]any{"window_ms": "soon"}, "invalid_request", ""},
		{"resources", id, map[string]any{"window_ms": 1.5}, "invalid_request", ""},
		{"resources", "sbx-nope", nil, "not_found", ""},
		{"cgroup", id, map[string]any{"window_ms": 600001}, "invalid_request", "window_ms exceeds max (600000)"},
		{"cgroup", id, map[string]any{"scope": "ws-nope"}, "not_found", ""},
		{"cgroup", id, map[string]any{"scope": " "}, "invalid_request", ""},
		{"cgroup", id, map[string]any{"scope": 7}, "invalid_request", ""},
		{"cgroup", id, map[string]any{"unknown": 1}, "invalid_request", ""},
		{"cgroup", "", nil, "invalid_request", ""},
		{"cgroup", "sbx-nope", nil, "not_found", ""},
	}
	for _, tc := range bad {
		m := e.obs(tc.op, tc.id, tc.args)
		if errKind(m) != tc.kind || (tc.msg != "" && errMsg(m) != tc.msg) {
			t.Errorf("%s %s %v: %v", tc.op, tc.id, tc.args, m)
		}
	}
	e.fail(2, "invalid_request", "sandbox-observability-cli", "resources", "--sandbox-id", id, "--window-ms", "-5")
	e.fail(1, "invalid_request", "sandbox-observability-cli", "cgroup", "--sandbox-id", id, "--window-ms", "700000")
	// The CLI reaches both operations.
	if out := e.obsCLI("cgroup", "--sandbox-id", id, "--scope", calm, "--window-ms", "5000"); out["scope"] != calm {
		t.Fatalf("cgroup CLI: %v", out)
	}
}
