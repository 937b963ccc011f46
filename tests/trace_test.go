package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// findSpan returns the first node (depth first) of a trace's span forest
// whose span has that name, or nil.
func findSpan(nodes any, name string) map[string]any {
	for _, n := range objs(nodes) {
		if sp, _ := n["span"].(map[string]any); sp["name"] == name {
			return n
		}
		if hit := findSpan(n["children"], name); hit != nil {
			return hit
		}
	}
	return nil
}

// childNames lists the span names of a node's children.
func childNames(n map[string]any) []string {
	out := []string{}
	for _, c := range objs(n["children"]) {
		out = append(out, c["span"].(map[string]any)["name"].(string))
	}
	return out
}

func spanAttrs(n map[string]any) map[string]any {
	return n["span"].(map[string]any)["attrs"].(map[string]any)
}

// wantChain asserts that the trace holds parent → child for every pair.
func wantChain(t *testing.T, tr map[string]any, pairs ...[2]string) {
	t.Helper()
	for _, p := range pairs {
		parent := findSpan(tr["spans"], p[0])
		if parent == nil {
			t.Fatalf("trace %v has no %s span: %v", tr["trace"], p[0], tr)
		}
		if findSpan(parent["children"], p[1]) == nil {
			t.Fatalf("trace %v: %s has no %s below it (children %v)", tr["trace"], p[0], p[1], childNames(parent))
		}
	}
}

// hasEvent reports whether a span node carries an event of that name.
func hasEvent(n map[string]any, name string) bool {
	for _, x := range objs(n["events"]) {
		if x["event"].(map[string]any)["name"] == name {
			return true
		}
	}
	return false
}

// storeSpans reads the span records of an event store from disk (§10.1's
// documented format), both segments.
func storeSpans(t *testing.T, dir string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, name := range []string{"observability.ndjson.1", "observability.ndjson"} {
		f, err := os.Open(filepath.Join(dir, name))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["kind"] == "span" {
				out = append(out, m)
			}
		}
		f.Close()
	}
	return out
}

func TestTraceChildSpans(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"a.txt": "alpha\n"})
	mk := e.ok("sandbox-manager-cli", "--request-id", "req-tr-create", "create_sandbox", "--workspace-bind-root", root)
	id := mk["id"].(string)
	rt := func(req string, args ...string) map[string]any {
		t.Helper()
		return e.ok("sandbox-runtime-cli", append([]string{"--sandbox-id", id, "--request-id", req}, args...)...)
	}

	// The boot is recorded in the system store under a synthetic trace.
	var boot map[string]any
	for _, ev := range eventRecords(t, e.obsCLI("events", "--name", "supervisor.boot")) {
		boot = ev
	}
	if boot == nil || !strings.HasPrefix(boot["trace"].(string), "boot-") || boot["attrs"].(map[string]any)["probes"] == nil {
		t.Fatalf("supervisor.boot: %v", boot)
	}

	// create_sandbox is system-scoped: its trace is in the system store.
	wantChain(t, e.obsCLI("trace", "--trace-id", "req-tr-create"),
		[2]string{"supervisor.dispatch", "sandbox.create"}, [2]string{"sandbox.create", "workspace.snapshot"})

	ws := rt("req-tr-session", "create_workspace_session")["workspace_session_id"].(string)
	tr := e.obsCLI("trace", "--sandbox-id", id, "--trace-id", "req-tr-session")
	wantChain(t, tr, [2]string{"supervisor.dispatch", "workspace_session.create"},
		[2]string{"workspace_session.create", "holder.spawn"}, [2]string{"holder.spawn", "holder.mount_overlay"})
	if a := spanAttrs(findSpan(tr["spans"], "holder.spawn")); a["workspace_session_id"] != ws || a["pid"] == nil {
		t.Fatalf("holder.spawn attrs: %v", a)
	}

	out := rt("req-tr-exec", "exec_command", "--workspace-session-id", ws, "echo hi > b.txt")
	if out["status"] != "ok" {
		t.Fatalf("exec: %v", out)
	}
	tr = e.obsCLI("trace", "--sandbox-id", id, "--trace-id", "req-tr-exec")
	wantChain(t, tr, [2]string{"supervisor.dispatch", "command.exec"}, [2]string{"command.exec", "holder.exec"})
	ce := findSpan(tr["spans"], "command.exec")
	if a := spanAttrs(ce); a["session_created"] != false || a["finalize_policy"] != "no_op" || ce["span"].(map[string]any)["status"] != "completed" {
		t.Fatalf("command.exec: %v", ce)
	}
	if findSpan(tr["spans"], "workspace_session.create") != nil {
		t.Fatalf("exec in an explicit session created one: %v", tr)
	}

	rt("req-tr-write", "file_write", "--workspace-session-id", ws, "--path", "c.txt", "--content", "c\n")
	wantChain(t, e.obsCLI("trace", "--sandbox-id", id, "--trace-id", "req-tr-write"), [2]string{"supervisor.dispatch", "holder.file_op"})

	rt("req-tr-publish", "publish_workspace_session", "--workspace-session-id", ws)
	tr = e.obsCLI("trace", "--sandbox-id", id, "--trace-id", "req-tr-publish")
	wantChain(t, tr, [2]string{"supervisor.dispatch", "workspace_session.publish"},
		[2]string{"workspace_session.publish", "workspace_session.capture_changes"},
		[2]string{"workspace_session.publish", "layerstack.publish"},
		[2]string{"workspace_session.publish", "workspace_session.destroy"})
	pa := spanAttrs(findSpan(tr["spans"], "workspace_session.publish"))
	if pa["committed"] != true || pa["no_op"] != false || pa["destroyed"] != true || pa["dry_run"] != false || num(t, pa["source_count"]) != 2 {
		t.Fatalf("workspace_session.publish attrs: %v", pa)
	}
	if la := spanAttrs(findSpan(tr["spans"], "layerstack.publish")); num(t, la["layers_added"]) != 1 || num(t, la["bytes"]) < 5 || la["base"] == nil {
		t.Fatalf("layerstack.publish attrs: %v", la)
	}

	// An implicit session is finalized in the background: its spans form a
	// synthetic finalize-<ulid> trace, not dropped and not in the request's.
	out = rt("req-tr-implicit", "exec_command", "echo x > d.txt")
	if out["status"] != "ok" {
		t.Fatalf("implicit exec: %v", out)
	}
	tr = e.obsCLI("trace", "--sandbox-id", id, "--trace-id", "req-tr-implicit")
	wantChain(t, tr, [2]string{"supervisor.dispatch", "command.exec"}, [2]string{"command.exec", "workspace_session.create"},
		[2]string{"command.exec", "holder.exec"})
	if a := spanAttrs(findSpan(tr["spans"], "command.exec")); a["session_created"] != true || a["finalize_policy"] != "publish_then_destroy" {
		t.Fatalf("implicit command.exec attrs: %v", a)
	}
	if !hasEvent(findSpan(tr["spans"], "workspace_session.create"), "lease.acquired") {
		t.Fatalf("the implicit session's lease.acquired is not in the exec trace: %v", tr)
	}
	var finTrace string
	for _, sp := range storeSpans(t, filepath.Join(e.data(), "sandboxes", id, "observability")) {
		if sp["name"] == "workspace_session.finalize" {
			finTrace, _ = sp["trace"].(string)
		}
	}
	if !strings.HasPrefix(finTrace, "finalize-") || len(finTrace) <= len("finalize-") {
		t.Fatalf("finalize span trace %q", finTrace)
	}
	tr = e.obsCLI("trace", "--sandbox-id", id, "--trace-id", finTrace)
	if roots := objs(tr["spans"]); len(roots) != 1 || roots[0]["span"].(map[string]any)["name"] != "workspace_session.finalize" {
		t.Fatalf("finalize trace roots: %v", tr)
	}
	wantChain(t, tr, [2]string{"workspace_session.finalize", "workspace_session.publish"},
		[2]string{"workspace_session.publish", "layerstack.publish"}, [2]string{"workspace_session.finalize", "workspace_session.destroy"})
	if !hasEvent(findSpan(tr["spans"], "workspace_session.destroy"), "lease.released") {
		t.Fatalf("lease.released is not in the finalize trace: %v", tr)
	}
	// The same events are listed by events, chronologically, with the
	// finalize trace id.
	var released bool
	for _, ev := range eventRecords(t, e.obsCLI("events", "--sandbox-id", id, "--name", "lease.released")) {
		released = released || ev["trace"] == finTrace
	}
	if !released {
		t.Fatalf("events lacks the finalize trace's lease.released")
	}

	e.ok("sandbox-manager-cli", "--request-id", "req-tr-export", "export_changes", "--sandbox-id", id, "--dest", filepath.Join(root, "export"))
	tr = e.obsCLI("trace", "--trace-id", "req-tr-export")
	wantChain(t, tr, [2]string{"supervisor.dispatch", "layerstack.export"})
	if a := spanAttrs(findSpan(tr["spans"], "layerstack.export")); a["sandbox_id"] != id || a["format"] != "dir" {
		t.Fatalf("layerstack.export attrs: %v", a)
	}

	mgr := e.ok("sandbox-manager-cli", "--request-id", "req-tr-destroy", "destroy_sandbox", "--sandbox-id", id)
	if mgr["state"] != "stopped" {
		t.Fatalf("destroy: %v", mgr)
	}
	wantChain(t, e.obsCLI("trace", "--trace-id", "req-tr-destroy"), [2]string{"supervisor.dispatch", "sandbox.destroy"})
}

// TestTraceOfAHolderDeath: a holder that dies outside any request gets one
// synthetic holder-<ulid> trace holding holder.exited and the restore.
func TestTraceOfAHolderDeath(t *testing.T) {
	e, id := sandboxWithProject(t)
	ws := e.session(id)
	var pid int64
	for _, s := range e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any) {
		if m := s.(map[string]any); m["workspace_session_id"] == ws {
			pid = num(t, m["holder_pid"])
		}
	}
	if pid == 0 {
		t.Fatal("no holder pid")
	}
	if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var restored map[string]any
	for deadline := time.Now().Add(30 * time.Second); restored == nil; {
		for _, ev := range eventRecords(t, e.obsCLI("events", "--sandbox-id", id, "--name", "workspace_session.restored")) {
			if ev["attrs"].(map[string]any)["workspace_session_id"] == ws {
				restored = ev
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no workspace_session.restored event")
		}
		time.Sleep(50 * time.Millisecond)
	}
	trace, _ := restored["trace"].(string)
	if !strings.HasPrefix(trace, "holder-") {
		t.Fatalf("restored event trace %q", trace)
	}
	tr := e.obsCLI("trace", "--sandbox-id", id, "--trace-id", trace)
	wantChain(t, tr, [2]string{"workspace_session.restore", "holder.spawn"}, [2]string{"holder.spawn", "holder.mount_overlay"})
	var exited bool
	for _, root := range objs(tr["spans"]) {
		for _, x := range objs(root["events"]) {
			ev := x["event"].(map[string]any)
			exited = exited || (ev["name"] == "holder.exited" && ev["attrs"].(map[string]any)["pid"] == json.Number(fmt.Sprint(pid)))
		}
	}
	if !exited {
		t.Fatalf("holder.exited (pid %d) not in the holder trace: %v", pid, tr)
	}
	if a := spanAttrs(findSpan(tr["spans"], "workspace_session.restore")); a["workspace_session_id"] != ws || a["reason"] != "holder_exited" {
		t.Fatalf("restore attrs: %v", a)
	}
}
