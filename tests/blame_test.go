package tests

import (
	"fmt"
	"strings"
	"testing"
)

// blameRanges checks that a file_blame result tiles lines 1..line_count
// exactly once, in order, and renders it as "owner[:cmd]×n" per range.
func blameRanges(t *testing.T, m map[string]any) string {
	t.Helper()
	next := int64(1)
	var parts []string
	for _, r := range m["ranges"].([]any) {
		rg := r.(map[string]any)
		if num(t, rg["start_line"]) != next || num(t, rg["line_count"]) < 1 {
			t.Fatalf("ranges do not tile: %v", m["ranges"])
		}
		next += num(t, rg["line_count"])
		s := fmt.Sprint(rg["owner"])
		if c, _ := rg["command_session_id"].(string); c != "" {
			s += ":" + c
		}
		parts = append(parts, fmt.Sprintf("%s×%d", s, num(t, rg["line_count"])))
	}
	if next-1 != num(t, m["line_count"]) {
		t.Fatalf("ranges cover %d of %d lines: %v", next-1, num(t, m["line_count"]), m)
	}
	return strings.Join(parts, " ")
}

func rangeAt(m map[string]any, i int) map[string]any {
	return m["ranges"].([]any)[i].(map[string]any)
}

func TestBlameSessionless(t *testing.T) {
	e := newEnv(t)
	e.start()
	id := e.createSandbox(e.project(map[string]string{"base.txt": "alpha\nbeta\ngamma\n", "src/a.go": "package a\n"}))

	b := e.rt(id, "file_blame", "--path", "base.txt")
	if got := blameRanges(t, b); got != "original×3" || b["view"] != "head" || b["workspace_session_id"] != nil || b["path"] != "base.txt" {
		t.Fatalf("unedited base file: %v", b)
	}
	if rev := b["revision"].(map[string]any); num(t, rev["manifest_version"]) != 1 || num(t, rev["layer_count"]) != 1 {
		t.Fatalf("revision: %v", rev)
	}
	if r := rangeAt(b, 0); len(r) != 3 {
		t.Fatalf("original range carries metadata: %v", r)
	}

	w := e.rt(id, "--request-id", "req-w1", "file_write", "--path", "notes.txt", "--content", "one\ntwo\nthree\n")
	b = e.rt(id, "file_blame", "--path", "/workspace/notes.txt")
	if got := blameRanges(t, b); got != "operation:req-w1×3" || b["path"] != "notes.txt" {
		t.Fatalf("after write: %s", got)
	}
	r := rangeAt(b, 0)
	if cmd, ok := r["command_session_id"]; !ok || cmd != nil || r["layer_id"] != w["layer_id"] || r["ts"] == nil {
		t.Fatalf("operation range: %v (write %v)", r, w)
	}

	ed := e.rt(id, "--request-id", "req-e1", "file_edit", "--path", "notes.txt", "--edits", `[{"old_string":"two","new_string":"TWO\nextra"}]`)
	b = e.rt(id, "file_blame", "--path", "notes.txt")
	if got := blameRanges(t, b); got != "operation:req-w1×1 operation:req-e1×2 operation:req-w1×1" {
		t.Fatalf("after edit: %s", got)
	}
	if rangeAt(b, 1)["layer_id"] != ed["layer_id"] || rangeAt(b, 0)["layer_id"] != w["layer_id"] {
		t.Fatalf("layer ids: %v", b["ranges"])
	}
	if rev := b["revision"].(map[string]any); num(t, rev["manifest_version"]) != 3 {
		t.Fatalf("blame revision is not head's: %v", rev)
	}

	e.rt(id, "--request-id", "req-e2", "file_edit", "--path", "base.txt", "--edits", `[{"old_string":"gamma","new_string":"GAMMA"}]`)
	if got := blameRanges(t, e.rt(id, "file_blame", "--path", "base.txt")); got != "original×2 operation:req-e2×1" {
		t.Fatalf("edited base file: %s", got)
	}
	// An identical rewrite is a no-op and changes nobody's lines.
	e.rt(id, "--request-id", "req-noop", "file_write", "--path", "notes.txt", "--content", "one\nTWO\nextra\nthree\n")
	if got := blameRanges(t, e.rt(id, "file_blame", "--path", "notes.txt")); got != "operation:req-w1×1 operation:req-e1×2 operation:req-w1×1" {
		t.Fatalf("after no-op: %s", got)
	}
	// A full rewrite keeps the lines it keeps.
	e.rt(id, "--request-id", "req-w2", "file_write", "--path", "notes.txt", "--content", "zero\none\nTWO\nthree\n")
	if got := blameRanges(t, e.rt(id, "file_blame", "--path", "notes.txt")); got != "operation:req-w2×1 operation:req-w1×1 operation:req-e1×1 operation:req-w1×1" {
		t.Fatalf("after rewrite: %s", got)
	}

	e.rt(id, "--request-id", "req-empty", "file_write", "--path", "empty.txt", "--content", "")
	if b := e.rt(id, "file_blame", "--path", "empty.txt"); num(t, b["line_count"]) != 0 || len(b["ranges"].([]any)) != 0 {
		t.Fatalf("empty file: %v", b)
	}

	for _, tc := range []struct{ kind, path, msg string }{
		{"invalid_request", "src", "path is not a regular file (Directory)"},
		{"not_found", "nope.txt", "file not found: nope.txt"},
		{"invalid_request", "../x", "invalid path"},
	} {
		body := e.rtFail(id, 1, tc.kind, "file_blame", "--path", tc.path)
		if !strings.Contains(body["message"].(string), tc.msg) {
			t.Errorf("%s: %v", tc.path, body)
		}
	}
	body := e.rtFail(id, 1, "not_found", "file_blame", "--path", "nope.txt")
	if _, ok := body["details"].(map[string]any)["last_record_layer_id"]; ok {
		t.Fatalf("never written path has a last record: %v", body)
	}
	e.rtFail(id, 1, "not_found", "file_blame", "--path", "base.txt", "--workspace-session-id", "ws-nope")

	// A deleted file reports the layer of its last record.
	out := e.exec(id, "rm notes.txt")
	if out["status"] != "ok" || out["publish"].(map[string]any)["no_op"] != false {
		t.Fatalf("rm: %v", out)
	}
	body = e.rtFail(id, 1, "not_found", "file_blame", "--path", "notes.txt")
	last, _ := body["details"].(map[string]any)["last_record_layer_id"].(string)
	if !strings.HasPrefix(last, "L") {
		t.Fatalf("deleted file: %v", body)
	}
}

// The tests below need the session wiring: checkpointSession at the end of
// every session command and after every session file operation, and
// recordPublishAudit (with sessionLineOwners) when a session publishes.

// TestBlameSessionView expects, in an explicit session of agent alice:
// a file_write line → workspace_session:<ws> with command_session_id null,
// a line appended by a command → command_session_id = that command, base
// lines → original, layer_id null on session lines, revision = base.
func TestBlameSessionView(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWithProject(t) // shared.txt "base\n", src/app.py
		ws := e.session(id, "--agent", "alice")
		e.rt(id, "file_write", "--workspace-session-id", ws, "--path", "shared.txt", "--content", "base\nfrom write\n")
		out := e.exec(id, "--workspace-session-id", ws, "echo from cmd >> shared.txt")
		if out["status"] != "ok" {
			t.Fatalf("exec: %v", out)
		}
		cmd := out["command_session_id"].(string)
		b := e.rt(id, "file_blame", "--path", "shared.txt", "--workspace-session-id", ws)
		owner := "workspace_session:" + ws
		if got, want := blameRanges(t, b), fmt.Sprintf("original×1 %s×1 %s:%s×1", owner, owner, cmd); got != want {
			t.Fatalf("session blame:\n got %s\nwant %s", got, want)
		}
		if b["view"] != "session" || b["workspace_session_id"] != ws || num(t, b["revision"].(map[string]any)["manifest_version"]) != 1 {
			t.Fatalf("session blame: %v", b)
		}
		for _, i := range []int{1, 2} {
			r := rangeAt(b, i)
			if r["agent"] != "alice" || r["layer_id"] != nil || r["ts"] == nil {
				t.Fatalf("session range %d: %v", i, r)
			}
		}
		if got := blameRanges(t, e.rt(id, "file_blame", "--path", "src/app.py", "--workspace-session-id", ws)); got != "original×1" {
			t.Fatalf("untouched file in the session: %s", got)
		}
		if got := blameRanges(t, e.rt(id, "file_blame", "--path", "shared.txt")); got != "original×1" {
			t.Fatalf("head changed by a session: %s", got)
		}
		e.rtFail(id, 1, "not_found", "file_blame", "--path", "nope", "--workspace-session-id", ws)
		e.rtFail(id, 1, "invalid_request", "file_blame", "--path", "src", "--workspace-session-id", ws)
	})
}

// TestBlameSessionImplicitPublish expects an implicit session's publish to
// record its lines as workspace_session:<ws> with the command's
// command_session_id and the published layer_id, base lines kept original.
func TestBlameSessionImplicitPublish(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWithProject(t)
		out := e.exec(id, "printf 'x\\ny\\n' > new.txt && echo more >> shared.txt")
		pub, _ := out["publish"].(map[string]any)
		if out["status"] != "ok" || pub == nil || pub["no_op"] != false {
			t.Fatalf("exec: %v", out)
		}
		owner := fmt.Sprintf("workspace_session:%s:%s", out["workspace_session_id"], out["command_session_id"])
		b := e.rt(id, "file_blame", "--path", "new.txt")
		if got := blameRanges(t, b); got != owner+"×2" {
			t.Fatalf("new file: %s", got)
		}
		if r := rangeAt(b, 0); r["layer_id"] != pub["layer_id"] || r["ts"] == nil {
			t.Fatalf("published range: %v (publish %v)", r, pub)
		}
		if got := blameRanges(t, e.rt(id, "file_blame", "--path", "shared.txt")); got != "original×1 "+owner+"×1" {
			t.Fatalf("appended file: %s", got)
		}
		// A later sessionless edit keeps the session's lines.
		e.rt(id, "--request-id", "req-after", "file_edit", "--path", "new.txt", "--edits", `[{"old_string":"y","new_string":"Y"}]`)
		if got := blameRanges(t, e.rt(id, "file_blame", "--path", "new.txt")); got != owner+"×1 operation:req-after×1" {
			t.Fatalf("after sessionless edit: %s", got)
		}
	})
}
