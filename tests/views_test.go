package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// obs sends one observability request on the raw socket; id "" is system scope.
func (e *env) obs(op, id string, args map[string]any) map[string]any {
	e.t.Helper()
	scope := map[string]any{"kind": "system"}
	if id != "" {
		scope = map[string]any{"kind": "sandbox", "sandbox_id": id}
	}
	all := map[string]any{}
	for k, v := range args {
		all[k] = v
	}
	if id != "" {
		all["sandbox_id"] = id // required by the sandbox-only views
	}
	args = all
	return e.rawObj(map[string]any{"op": op, "scope": scope, "args": args})
}

func (e *env) obsOK(op, id string, args map[string]any) map[string]any {
	e.t.Helper()
	m := e.obs(op, id, args)
	if _, bad := m["error"]; bad {
		e.t.Fatalf("%s %v: %v", op, args, m)
	}
	return m
}

func objs(v any) []map[string]any {
	arr, _ := v.([]any)
	out := make([]map[string]any, 0, len(arr))
	for _, x := range arr {
		m, _ := x.(map[string]any)
		out = append(out, m)
	}
	return out
}

func strs(v any) []string {
	out := []string{}
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

func byKey(list []map[string]any, key, val string) map[string]any {
	for _, m := range list {
		if m[key] == val {
			return m
		}
	}
	return nil
}

// topoProcs returns the process rows of one workspace of a topology answer.
func topoWorkspace(t *testing.T, topo map[string]any, ws string) map[string]any {
	t.Helper()
	inner := topo["topology"].(map[string]any)
	w := byKey(objs(inner["workspaces"]), "workspace_id", ws)
	if w == nil {
		t.Fatalf("workspace %s not in topology: %v", ws, topo)
	}
	return w
}

func hasProcess(w map[string]any, name string) bool {
	for _, p := range objs(w["processes"]) {
		if p["name"] == name {
			return true
		}
	}
	return false
}

func TestViewsSessionsCommandsAndHolders(t *testing.T) {
	e, id := sandboxWithProject(t)
	a := e.session(id, "--agent", "alice")
	b := e.session(id)
	run := e.exec(id, "--workspace-session-id", a, "--yield-time-ms", "0", "sleep 5")
	cmd, _ := run["command_session_id"].(string)
	if run["status"] != "running" || cmd == "" {
		t.Fatalf("exec: %v", run)
	}

	// snapshot (sandbox scope): both sessions, the running command.
	snap := e.obsOK("snapshot", id, nil)
	if snap["sandbox_id"] != id || snap["lifecycle_state"] != "ready" {
		t.Fatalf("snapshot header: %v", snap)
	}
	if d := snap["daemon"].(map[string]any); d["runtime_dir"] != filepath.Join(e.data(), "sandboxes", id) || d["daemon_pid"] == nil ||
		d["event_store"].(map[string]any)["dropped_storage"] == nil {
		t.Fatalf("snapshot daemon: %v", d)
	}
	// Resources come from recorded samples only: none yet means partial
	// with an error, else available with the latest sample.
	switch r := snap["resources"].(map[string]any); snap["availability"] {
	case "partial":
		if r["latest"] != nil || len(r["history"].([]any)) != 0 || len(snap["errors"].([]any)) == 0 {
			t.Fatalf("partial snapshot: %v", snap)
		}
	case "available":
		if r["latest"] == nil || len(r["history"].([]any)) == 0 {
			t.Fatalf("available snapshot without samples: %v", snap)
		}
	default:
		t.Fatalf("snapshot availability: %v", snap)
	}
	wss := objs(snap["workspaces"])
	if len(wss) != 2 || wss[0]["workspace_id"] != a || wss[1]["workspace_id"] != b {
		t.Fatalf("snapshot workspaces: %v", wss)
	}
	wa, wb := wss[0], wss[1]
	if wa["agent"] != "alice" || wa["lifecycle_state"] != "active" || wa["finalization_state"] != "active" || wa["holder_pid"] == nil ||
		wa["finalize_policy"] != "no_op" || wa["network_profile"] != "shared" {
		t.Fatalf("workspace a: %v", wa)
	}
	if l := wa["layers"].(map[string]any); l["layer_count"] != float64(1) || len(l["base_root_hash"].(string)) != 64 {
		t.Fatalf("workspace a layers: %v", l)
	}
	execs := objs(wa["active_namespace_executions"])
	if len(execs) != 1 || execs[0]["namespace_execution_id"] != cmd || execs[0]["command"] != "sleep 5" ||
		execs[0]["operation"] != "exec_command" || execs[0]["lifecycle_state"] != "running" {
		t.Fatalf("executions of a: %v", execs)
	}
	if len(objs(wb["active_namespace_executions"])) != 0 {
		t.Fatalf("executions of b: %v", wb)
	}
	if st := snap["stack"].(map[string]any); st["layer_count"] != float64(1) || st["active_leases"] != float64(2) {
		t.Fatalf("snapshot stack: %v", st)
	}
	sys := e.obsOK("snapshot", "", nil)
	if nodes := objs(sys["sandboxes"]); len(nodes) != 1 || nodes[0]["sandbox_id"] != id || len(objs(nodes[0]["workspaces"])) != 2 {
		t.Fatalf("system snapshot: %v", sys)
	}

	// topology: the sleep runs in a's namespaces; b only has its holder.
	// Poll: right after a yield-0 exec the command may still be in its exec shim.
	var topo map[string]any
	for deadline := time.Now().Add(4 * time.Second); ; {
		topo = e.obsOK("topology", id, nil)
		if hasProcess(topoWorkspace(t, topo, a), "sleep") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	inner := topo["topology"].(map[string]any)
	if topo["view"] != "topology" || topo["scope"] != "sandbox" || inner["available"] != true || inner["source"] != "proc_namespaces" ||
		inner["error"] != nil || inner["schema_version"] != float64(2) {
		t.Fatalf("topology header: %v", topo)
	}
	ta := topoWorkspace(t, topo, a)
	if ta["state"] != "active" || !hasProcess(ta, "sleep") {
		t.Fatalf("topology of a: %v", ta)
	}
	init := objs(ta["processes"])
	var initRow map[string]any
	for _, p := range init {
		if p["kind"] == "namespace_init" {
			initRow = p
		}
	}
	if initRow == nil || initRow["pid"] != wa["holder_pid"] || initRow["namespace_pid"] != float64(1) {
		t.Fatalf("namespace_init row of a: %v (holder %v)", init, wa["holder_pid"])
	}
	if tb := topoWorkspace(t, topo, b); tb["state"] != "idle" || len(objs(tb["processes"])) != 1 {
		t.Fatalf("topology of b: %v", tb)
	}

	// daemon: both holders, with pids.
	for _, scope := range []string{"", id} {
		d := e.obsOK("daemon", scope, nil)
		dd := d["daemon"].(map[string]any)
		want := "supervisor"
		if scope != "" {
			want = "sandbox"
		}
		if d["scope"] != want || dd["available"] != true || dd["pid"] == nil || dd["goroutines"].(float64) <= 0 ||
			dd["resident_bytes"].(float64) <= 0 || dd["file_descriptor_count"].(float64) <= 0 {
			t.Fatalf("daemon %q: %v", scope, d)
		}
		holders := objs(dd["holders"])
		ha, hb := byKey(holders, "workspace_session_id", a), byKey(holders, "workspace_session_id", b)
		if len(holders) != 2 || ha == nil || hb == nil || ha["pid"] != wa["holder_pid"] || hb["pid"] != wb["holder_pid"] ||
			ha["sandbox_id"] != id || ha["resident_bytes"] == nil {
			t.Fatalf("daemon holders %q: %v", scope, holders)
		}
		if ru := dd["runtime_usage"].(map[string]any); ru["active_commands"] != float64(1) || ru["live_sessions"] != float64(2) ||
			ru["active_requests"].(float64) < 1 {
			t.Fatalf("runtime_usage: %v", ru)
		}
	}

	// After the command exits its processes are gone from the topology.
	e.waitDone(id, cmd)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ta = topoWorkspace(t, e.obsOK("topology", id, nil), a)
		if !hasProcess(ta, "sleep") && ta["state"] == "idle" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleep still listed after exit: %v", ta)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := len(objs(e.obsOK("snapshot", id, nil)["workspaces"].([]any)[0].(map[string]any)["active_namespace_executions"])); n != 0 {
		t.Fatalf("finished command still active in snapshot")
	}

	// Topology needs a sandbox.
	if m := e.obs("topology", "", nil); errKind(m) != "invalid_request" {
		t.Fatalf("system-scoped topology: %v", m)
	}
}

func TestViewsLayerstack(t *testing.T) {
	e, id := sandboxWithProject(t)
	a := e.session(id)
	b := e.session(id)
	l2 := e.rt(id, "file_write", "--path", "first.txt", "--content", "one\n")["layer_id"].(string)
	l3 := e.rt(id, "file_write", "--path", "dir/second.txt", "--content", "two\n")["layer_id"].(string)
	c := e.session(id) // leases all three layers

	ls := e.obsOK("layerstack", id, nil)
	if ls["view"] != "layerstack" || ls["manifest_version"] != float64(3) || len(ls["root_hash"].(string)) != 64 || ls["active_lease_count"] != float64(3) {
		t.Fatalf("layerstack header: %v", ls)
	}
	layers := objs(ls["layers"])
	var ids []string
	for _, l := range layers {
		ids = append(ids, l["layer_id"].(string))
	}
	if want := []string{l3, l2, "B000001-base"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("layers %v, want %v", ids, want)
	}
	if got := strs(layers[2]["leased_by_workspaces"]); !reflect.DeepEqual(got, []string{a, b}) {
		t.Fatalf("base leased_by_workspaces %v", got)
	}
	if got := strs(layers[0]["leased_by_workspaces"]); !reflect.DeepEqual(got, []string{c}) {
		t.Fatalf("head leased_by_workspaces %v", got)
	}
	if got := strs(layers[1]["leased_by_workspaces"]); len(got) != 0 {
		t.Fatalf("middle leased_by_workspaces %v", got)
	}
	if got := strs(layers[1]["booked_by"]); !reflect.DeepEqual(got, []string{l3}) {
		t.Fatalf("middle booked_by %v", got)
	}
	if got := strs(layers[2]["booked_by"]); !reflect.DeepEqual(got, []string{l3}) {
		t.Fatalf("base booked_by %v", got)
	}
	if got := strs(layers[0]["booked_by"]); len(got) != 0 {
		t.Fatalf("head booked_by %v", got)
	}
	if layers[1]["bytes"] != float64(4) || ls["total_bytes"].(float64) < 4 || ls["storage_allocated_bytes"].(float64) <= 0 ||
		ls["staging_entry_count"] != float64(0) {
		t.Fatalf("sizes: %v", ls)
	}

	// One layer's entries.
	one := e.obsOK("layerstack", id, map[string]any{"layer_id": l2})
	if one["layer_id"] != l2 || one["truncated"] != false {
		t.Fatalf("layer view: %v", one)
	}
	if en := byKey(objs(one["entries"]), "path", "first.txt"); en == nil || en["kind"] != "write" {
		t.Fatalf("layer entries: %v", one["entries"])
	}
	two := e.obsOK("layerstack", id, map[string]any{"layer_id": l3, "limit": 1})
	if en := objs(two["entries"]); len(en) != 1 || two["truncated"] != true {
		t.Fatalf("limited layer view: %v", two)
	}

	// One session's mounts.
	ws := e.obsOK("layerstack", id, map[string]any{"workspace_id": c})
	mounts := objs(ws["mounts"])
	if ws["workspace"] != c || len(mounts) != 3 || mounts[0]["layer_id"] != l3 || mounts[2]["layer_id"] != "B000001-base" {
		t.Fatalf("workspace view: %v", ws)
	}
	if got := strs(mounts[2]["shared_with"]); !reflect.DeepEqual(got, []string{a, b}) {
		t.Fatalf("base shared_with %v", got)
	}
	if got := strs(mounts[0]["shared_with"]); len(got) != 0 {
		t.Fatalf("head shared_with %v", got)
	}
	e.rt(id, "file_write", "--workspace-session-id", c, "--path", "mine.txt", "--content", "12345678\n")
	if ws = e.obsOK("layerstack", id, map[string]any{"workspace_id": c}); ws["upper_bytes"].(float64) < 9 {
		t.Fatalf("upper_bytes: %v", ws)
	}

	// Bad arguments.
	bad := []struct {
		args map[string]any
		kind string
		msg  string
	}{
		{map[string]any{"workspace_id": a, "layer_id": l2}, "invalid_request", ""},
		{map[string]any{"window_ms": 600001}, "invalid_request", "window_ms exceeds max (600000)"},
		{map[string]any{"limit": 5001}, "invalid_request", ""},
		{map[string]any{"layer_id": "L999999-00000000"}, "not_found", ""},
		{map[string]any{"layer_id": ".."}, "not_found", ""},
		{map[string]any{"workspace_id": "ws-nope"}, "not_found", ""},
	}
	for _, tc := range bad {
		m := e.obs("layerstack", id, tc.args)
		if errKind(m) != tc.kind || (tc.msg != "" && errMsg(m) != tc.msg) {
			t.Errorf("layerstack %v: %v", tc.args, m)
		}
	}
	if m := e.obsOK("layerstack", id, map[string]any{"window_ms": 600000}); m["trend"] == nil {
		t.Fatalf("no trend with window_ms: %v", m)
	}
	if m := e.obsOK("layerstack", id, nil); m["trend"] != nil {
		t.Fatalf("trend without window_ms: %v", m)
	}
}

// vmRSS reads VmRSS (bytes) of a process.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n * 1024
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

func TestViewsQueriesDoNotGrowMemory(t *testing.T) {
	e := newEnv(t)
	e.startWithConfig("observability:\n  resource_stats:\n    sample_interval_ms: 250\n")
	id := e.createSandbox(e.project(map[string]string{"shared.txt": "base\n"}))
	ws := e.session(id)
	e.waitSample(id, ws, 0) // the resource views have samples to read
	e.rt(id, "file_write", "--path", "x.txt", "--content", "x\n")
	raw, err := os.ReadFile(filepath.Join(e.home, "run", "supervisor.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	queries := []struct {
		op, id string
		args   map[string]any
	}{
		{"snapshot", id, nil}, {"snapshot", "", nil}, {"daemon", "", nil}, {"daemon", id, nil},
		{"topology", id, nil}, {"layerstack", id, nil}, {"layerstack", id, map[string]any{"workspace_id": ws}},
		{"layerstack", id, map[string]any{"layer_id": "B000001-base"}},
		{"events", id, nil}, {"events", "", nil}, {"trace", id, nil}, {"trace", "", nil},
		{"resources", id, map[string]any{"window_ms": 600000}}, {"resources", "", nil},
		{"cgroup", id, nil}, {"cgroup", id, map[string]any{"scope": ws}}, {"health", "", nil},
		{"layerstack", id, map[string]any{"window_ms": 600000}},
	}
	query := func(i int) {
		q := queries[i%len(queries)]
		if m := e.obs(q.op, q.id, q.args); errKind(m) != "" {
			t.Fatalf("%s: %v", q.op, m)
		}
	}
	for i := range 100 { // warm up: pools and heap reach their steady size
		query(i)
	}
	before := vmRSS(t, pid)
	for i := range 2000 {
		query(i)
	}
	after := vmRSS(t, pid)
	t.Logf("supervisor VmRSS %d KiB → %d KiB", before>>10, after>>10)
	if after-before > 4<<20 { // "a few MiB" (§10.1: reads keep no history in memory)
		t.Fatalf("2000 observability queries grew VmRSS by %d KiB", (after-before)>>10)
	}
}
