package tests

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sendAndHangUp writes one request and closes the connection at once, as
// a client that gives up (or is killed) while the operation runs.
func (e *env) sendAndHangUp(req map[string]any) {
	e.t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := net.Dial("unix", e.socket())
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := c.Write(append(b, '\n')); err != nil {
		e.t.Fatal(err)
	}
	c.Close()
}

// dispatchSpan waits for the supervisor.dispatch span of a request (it is
// written when the request ends) and returns it.
func (e *env) dispatchSpan(requestID string, obsArgs ...string) map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		// Until the request ends its trace may not exist yet (not_found).
		if r := e.run("sandbox-observability-cli", append([]string{"trace", "--trace-id", requestID}, obsArgs...)...); r.code == 0 {
			if n := findSpan(r.obj(e.t)["spans"], "supervisor.dispatch"); n != nil {
				return n["span"].(map[string]any)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("request %s never ended", requestID)
	return nil
}

// TestDisconnectCancelsLongReads: when the client of a long read (a diff,
// a directory listing, an export) closes its connection, the supervisor stops the walk — the
// request's span ends "cancelled" and a cancelled archive export leaves no
// file — while a client that only half-closes still gets its answer
// (issue 13 item 7: every request ran on context.Background(), so
// abandoned walks and exports ran to the end).
func TestDisconnectCancelsLongReads(t *testing.T) {
	e := newEnv(t)
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	ws := e.session(id)
	// 8,000 new files: a diff and an export of them take far longer than
	// the moment the client needs to hang up.
	if out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "300000",
		"mkdir d && cd d && seq 1 8000 | xargs -n 500 touch && for f in 1 2 3; do echo x > $f; done"); out["status"] != "ok" {
		t.Fatalf("make files: %v", out)
	}
	sandboxScope := map[string]any{"kind": "sandbox", "sandbox_id": id}

	{
		e.sendAndHangUp(map[string]any{"op": "diff_workspace_session", "request_id": "req-cancel-diff", "scope": sandboxScope,
			"args": map[string]any{"workspace_session_id": ws}})
		if sp := e.dispatchSpan("req-cancel-diff", "--sandbox-id", id); sp["status"] != "cancelled" {
			t.Fatalf("diff whose client hung up: %v", sp)
		}
		// A half-closed client is still there: it gets the whole diff.
		b, _ := json.Marshal(map[string]any{"op": "diff_workspace_session", "request_id": "req-half-close", "scope": sandboxScope,
			"args": map[string]any{"workspace_session_id": ws, "paths": []string{"d/1"}}})
		lines := e.raw(append(b, '\n'))
		var m map[string]any
		if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &m) != nil || errKind(m) != "" {
			t.Fatalf("half-closed diff: %q", lines)
		}
		if sp := e.dispatchSpan("req-half-close", "--sandbox-id", id); sp["status"] != "completed" {
			t.Fatalf("half-closed diff span: %v", sp)
		}
	}
	{
		// A listing of the 8,000-entry directory stops too (issue 14: the
		// request context comes from the connection and file_list is
		// declared cancellable), while a write in the same session, which
		// is not, completes although its client is gone (§2.4).
		e.sendAndHangUp(map[string]any{"op": "file_list", "request_id": "req-cancel-list", "scope": sandboxScope,
			"args": map[string]any{"workspace_session_id": ws, "path": "d"}})
		if sp := e.dispatchSpan("req-cancel-list", "--sandbox-id", id); sp["status"] != "cancelled" {
			t.Fatalf("file_list whose client hung up: %v", sp)
		}
		e.sendAndHangUp(map[string]any{"op": "file_write", "request_id": "req-hangup-write", "scope": sandboxScope,
			"args": map[string]any{"workspace_session_id": ws, "path": "written.txt", "content": "kept\n"}})
		if sp := e.dispatchSpan("req-hangup-write", "--sandbox-id", id); sp["status"] != "completed" {
			t.Fatalf("file_write whose client hung up: %v", sp)
		}
	}

	e.publish(id, ws)
	{
		dest := filepath.Join(e.root, "project", "out.tar") // below the workspace root: an allowed destination
		e.sendAndHangUp(map[string]any{"op": "export_changes", "request_id": "req-cancel-export", "scope": map[string]any{"kind": "system"},
			"args": map[string]any{"sandbox_id": id, "dest": dest, "format": "tar"}})
		if sp := e.dispatchSpan("req-cancel-export"); sp["status"] != "cancelled" {
			t.Fatalf("export whose client hung up: %v", sp)
		}
		if _, err := os.Lstat(dest); !os.IsNotExist(err) {
			t.Fatalf("a cancelled export left %s: %v", dest, err)
		}
		ents, _ := os.ReadDir(e.root)
		for _, en := range ents {
			if strings.HasPrefix(en.Name(), ".esbx-export") {
				t.Fatalf("a cancelled export left %s", en.Name())
			}
		}
	}
}
