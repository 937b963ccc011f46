package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// obsCLI runs sandbox-observability-cli and returns its result object.
func (e *env) obsCLI(args ...string) map[string]any {
	e.t.Helper()
	return e.ok("sandbox-observability-cli", args...)
}

func eventRecords(t *testing.T, m map[string]any) []map[string]any {
	t.Helper()
	if m["view"] != "events" {
		t.Fatalf("not an events view: %v", m)
	}
	raw, ok := m["events"].([]any)
	if !ok {
		t.Fatalf("events is not an array: %v", m)
	}
	out := make([]map[string]any, 0, len(raw))
	for _, r := range raw {
		rec := r.(map[string]any)
		if rec["kind"] != "event" {
			t.Fatalf("not an event record: %v", rec)
		}
		out = append(out, rec)
	}
	return out
}

func TestEventsAndTraceOfASession(t *testing.T) {
	e, id := sandboxWithProject(t)
	r := e.ok("sandbox-runtime-cli", "--sandbox-id", id, "--request-id", "req-ev-session", "create_workspace_session")
	ws, _ := r["workspace_session_id"].(string)
	if ws == "" {
		t.Fatalf("create_workspace_session: %v", r)
	}
	out := e.ok("sandbox-runtime-cli", "--sandbox-id", id, "--request-id", "req-ev-exec", "exec_command", "--workspace-session-id", ws, "echo hi")
	if out["status"] != "ok" {
		t.Fatalf("exec: %v", out)
	}
	e.rt(id, "destroy_workspace_session", "--workspace-session-id", ws)

	evs := eventRecords(t, e.obsCLI("events", "--sandbox-id", id))
	var acquired, released map[string]any
	var lastTS int64
	for _, ev := range evs {
		if ts := num(t, ev["ts"]); ts < lastTS {
			t.Fatalf("events not chronological: %v", evs)
		} else {
			lastTS = ts
		}
		attrs, _ := ev["attrs"].(map[string]any)
		if attrs["workspace_session_id"] != ws {
			continue
		}
		switch ev["name"] {
		case "lease.acquired":
			acquired = ev
		case "lease.released":
			released = ev
		}
	}
	if acquired == nil || released == nil {
		t.Fatalf("lease events missing: %v", evs)
	}
	if acquired["trace"] != "req-ev-session" || acquired["parent"] == nil {
		t.Fatalf("lease.acquired not in its request's trace: %v", acquired)
	}
	if _, ok := acquired["attrs"].(map[string]any)["revision"]; !ok {
		t.Fatalf("lease.acquired without revision: %v", acquired)
	}
	if num(t, released["ts"]) < num(t, acquired["ts"]) {
		t.Fatalf("released before acquired: %v %v", acquired, released)
	}

	// Filters: exact name, last_n.
	only := eventRecords(t, e.obsCLI("events", "--sandbox-id", id, "--name", "lease.released"))
	if len(only) == 0 {
		t.Fatal("name filter lost lease.released")
	}
	for _, ev := range only {
		if ev["name"] != "lease.released" {
			t.Fatalf("name filter: %v", ev)
		}
	}
	if n := len(eventRecords(t, e.obsCLI("events", "--sandbox-id", id, "--last-n", "1"))); n != 1 {
		t.Fatalf("last_n 1 gave %d", n)
	}
	// Upstream's tools ask for the newest 10000 (issue #27 item 10): a
	// selection that fits is one page; after_seq pages on from a seq.
	big := e.obsCLI("events", "--sandbox-id", id, "--last-n", "10000")
	bigEvs := eventRecords(t, big)
	if len(bigEvs) < 2 || big["truncated"] != false || big["next_after_seq"] != nil {
		t.Fatalf("last_n 10000: truncated=%v next=%v, %d events", big["truncated"], big["next_after_seq"], len(bigEvs))
	}
	after := e.obsCLI("events", "--sandbox-id", id, "--after-seq", fmt.Sprint(bigEvs[0]["seq"]))
	if a := eventRecords(t, after); len(a) < len(bigEvs)-1 || a[0]["seq"].(json.Number) != bigEvs[1]["seq"].(json.Number) {
		t.Fatalf("after_seq %v: %d events, want from %v", bigEvs[0]["seq"], len(a), bigEvs[1]["seq"])
	}
	if n := len(eventRecords(t, e.obsCLI("events", "--sandbox-id", id, "--since-ms", "99999999999999"))); n != 0 {
		t.Fatalf("since_ms in the future gave %d", n)
	}

	// The exec request's trace: root supervisor.dispatch with attr op.
	tr := e.obsCLI("trace", "--sandbox-id", id, "--trace-id", "req-ev-exec")
	if tr["view"] != "trace" || tr["trace"] != "req-ev-exec" {
		t.Fatalf("trace: %v", tr)
	}
	roots, _ := tr["spans"].([]any)
	if len(roots) != 1 {
		t.Fatalf("roots: %v", tr)
	}
	root := roots[0].(map[string]any)
	sp := root["span"].(map[string]any)
	if sp["name"] != "supervisor.dispatch" || sp["kind"] != "span" || sp["status"] != "completed" || sp["trace"] != "req-ev-exec" {
		t.Fatalf("root span: %v", sp)
	}
	if sp["attrs"].(map[string]any)["op"] != "exec_command" {
		t.Fatalf("root op: %v", sp)
	}
	if num(t, root["offset_ms"]) != 0 {
		t.Fatalf("root offset: %v", root)
	}
	if _, ok := root["children"].([]any); !ok {
		t.Fatalf("children not an array: %v", root)
	}
	if _, ok := root["events"].([]any); !ok {
		t.Fatalf("events not an array: %v", root)
	}
	// The session request's trace carries lease.acquired under its
	// workspace_session.create span.
	str := e.obsCLI("trace", "--sandbox-id", id, "--trace-id", "req-ev-session")
	create := findSpan(str["spans"], "workspace_session.create")
	found := false
	for _, x := range create["events"].([]any) {
		if x.(map[string]any)["event"].(map[string]any)["name"] == "lease.acquired" {
			found = true
		}
	}
	if !found {
		t.Fatalf("lease.acquired not under workspace_session.create: %v", str)
	}
	// "last" (the default) is the newest traced request: observability
	// queries are not traced.
	last := e.obsCLI("trace", "--sandbox-id", id)
	lroot := last["spans"].([]any)[0].(map[string]any)["span"].(map[string]any)
	if lroot["attrs"].(map[string]any)["op"] != "destroy_workspace_session" {
		t.Fatalf("last trace: %v", last)
	}

	// Errors.
	e.fail(1, "not_found", "sandbox-observability-cli", "trace", "--sandbox-id", id, "--trace-id", "req-does-not-exist")
	e.fail(2, "invalid_request", "sandbox-observability-cli", "events", "--sandbox-id", id, "--last-n", "0")
	e.fail(2, "invalid_request", "sandbox-observability-cli", "events", "--sandbox-id", id, "--last-n", "1000001")
	for _, args := range []map[string]any{
		{"last_n": 0}, {"last_n": 1000001}, {"since_ms": -5}, {"since_ms": "soon"}, {"name": 3}, {"unknown": true},
	} {
		m := e.rawObj(map[string]any{"op": "events", "scope": map[string]any{"kind": "sandbox", "sandbox_id": id}, "args": args})
		if errKind(m) != "invalid_request" {
			t.Fatalf("events %v: %v", args, m)
		}
	}
	if m := e.rawObj(map[string]any{"op": "trace", "scope": map[string]any{"kind": "system"}, "args": map[string]any{"trace_id": " "}}); errKind(m) != "invalid_request" {
		t.Fatalf("blank trace_id: %v", m)
	}

	// The store lives in the sandbox directory; the system store holds the
	// system-scoped requests (create_sandbox) and is queried without
	// --sandbox-id.
	if _, err := os.Stat(filepath.Join(e.data(), "sandboxes", id, "observability", "observability.ndjson")); err != nil {
		t.Fatalf("sandbox store: %v", err)
	}
	sys := e.obsCLI("trace")
	if sr := sys["spans"].([]any); len(sr) == 0 || sr[0].(map[string]any)["span"].(map[string]any)["attrs"].(map[string]any)["op"] != "create_sandbox" {
		t.Fatalf("system trace: %v", sys)
	}
	eventRecords(t, e.obsCLI("events"))
	h := e.obsCLI("health")
	es, _ := h["event_store"].(map[string]any)
	for _, k := range []string{"dropped_storage", "dropped_oversized", "truncated_records"} {
		if _, ok := es[k]; !ok {
			t.Fatalf("health event_store: %v", h["event_store"])
		}
	}
}

func TestEventsDisabledObservability(t *testing.T) {
	e := newEnv(t)
	cfgDir := filepath.Join(e.home, "config")
	if err := os.MkdirAll(cfgDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yml"), []byte("observability:\n  enabled: false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	ws := e.session(id)
	e.rt(id, "destroy_workspace_session", "--workspace-session-id", ws)
	if n := len(eventRecords(t, e.obsCLI("events", "--sandbox-id", id))); n != 0 {
		t.Fatalf("disabled store lists %d events", n)
	}
	if tr := e.obsCLI("trace", "--sandbox-id", id); tr["trace"] != nil || len(tr["spans"].([]any)) != 0 {
		t.Fatalf("disabled trace: %v", tr)
	}
	for _, p := range []string{filepath.Join(e.data(), "sandboxes", id, "observability"), filepath.Join(e.data(), "supervisor", "observability")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s exists with observability disabled: %v", p, err)
		}
	}
}
