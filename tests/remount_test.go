package tests

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// sessionView lists what a session sees below /workspace (files with their
// content, the stop marker of waitStop loops left out), through a command
// in the session.
func (e *env) sessionView(id, ws string) string {
	e.t.Helper()
	out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "20000",
		`find . -type f ! -name stop | sort | while read -r f; do printf '%s=%s\n' "$f" "$(cat "$f")"; done`)
	if out["status"] != "ok" {
		e.t.Fatalf("view of %s: %v", ws, out)
	}
	return out["output"].(string)
}

// waitStop starts a command in ws that runs until the session's
// /workspace/stop exists, with its cwd at dir; it returns the command ID.
func (e *env) waitStop(id, ws, dir string) string {
	e.t.Helper()
	out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "200",
		fmt.Sprintf("cd %s && while [ ! -e /workspace/stop ]; do sleep 0.05; done; echo stopped", dir))
	if out["status"] != "running" {
		e.t.Fatalf("waitStop: %v", out)
	}
	return out["command_session_id"].(string)
}

// stopWait ends a waitStop command: the session writes the marker (through
// the holder, into the current overlay) and the command must see it.
func (e *env) stopWait(id, ws, cmd string) {
	e.t.Helper()
	e.rt(id, "file_write", "--workspace-session-id", ws, "--path", "stop", "--content", "")
	if out := e.waitDone(id, cmd); out["status"] != "ok" || !strings.Contains(out["output"].(string), "stopped") {
		e.t.Fatalf("waitStop command after the remount: %v", out)
	}
}

// sessionLayers is the layer count of each live session's base.
func (e *env) sessionLayers(id string) map[string]int64 {
	e.t.Helper()
	out := map[string]int64{}
	for _, s := range e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any) {
		m := s.(map[string]any)
		out[m["workspace_session_id"].(string)] = num(e.t, m["base_revision"].(map[string]any)["layer_count"])
	}
	return out
}

func (e *env) swept(res map[string]any) map[string]map[string]any {
	e.t.Helper()
	out := map[string]map[string]any{}
	for _, s := range res["swept_sessions"].([]any) {
		m := s.(map[string]any)
		out[m["session_id"].(string)] = m
	}
	return out
}

// TestSquashRemountsLiveSessions (issue 19 item 5): a squash with three
// live sessions on different bases, each with its own uncommitted edits and
// one with a running command (FUSE: cwd in /workspace; kernel: cwd
// outside), moves all three onto the squashed chain ("remounted"), the
// replaced layer directories are gone when the result returns, every
// session sees what it saw before, and keeps working: the running command
// sees a file written after the swap, new writes, exec, blame, a supervisor
// restart (restored on the squashed chain) and publish. On the kernel
// driver a session whose command's cwd is inside /workspace is left
// "leased" with pinned:cwd_pinned_workspace and keeps its layers until it
// ends.
func TestSquashRemountsLiveSessions(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		id := e.createSandbox(e.project(map[string]string{"a.txt": "l1\n-\n-\n-\nl2\n-\n-\n-\nl3\n", "src/m.go": "package m\n"}))
		kernel := e.mgr("inspect_sandbox", "--sandbox-id", id)["overlay_driver"] == "kernel"

		head := 0
		publish := func() {
			head++
			e.rt(id, "file_write", "--path", fmt.Sprintf("h%d.txt", head), "--content", fmt.Sprintf("head %d\n", head))
		}
		var sessions []string
		for i := 1; i <= 3; i++ {
			publish()
			publish()
			ws := e.session(id, "--agent", fmt.Sprintf("agent%d", i))
			sessions = append(sessions, ws)
			e.rt(id, "file_write", "--workspace-session-id", ws, "--path", fmt.Sprintf("e%d.txt", i), "--content", fmt.Sprintf("edit %d\n", i))
			// Each changes its own line of a.txt, so all three publish.
			e.exec(id, "--workspace-session-id", ws, fmt.Sprintf("sed -i '%ds/.*/line by %d/' a.txt", 4*i-3, i))
		}
		publish()
		publish()
		// Running command in the middle session.
		dir := "/workspace/src"
		if kernel {
			dir = "/" // a kernel swap needs no process in the old overlay
		}
		running := e.waitStop(id, sessions[1], dir)

		views := map[string]string{}
		blame := map[string]string{}
		for _, ws := range sessions {
			views[ws] = e.sessionView(id, ws)
			b, _ := json.Marshal(e.rt(id, "file_blame", "--workspace-session-id", ws, "--path", "a.txt")["ranges"])
			blame[ws] = string(b)
		}
		before := e.layerDirs(id)
		if len(before) != 9 { // B + 8 published layers
			t.Fatalf("layer dirs before: %v", before)
		}

		res := e.mgr("squash_layerstacks", "--sandbox-id", id)
		swept := e.swept(res)
		for _, ws := range sessions {
			if s := swept[ws]; s == nil || s["disposition"] != "remounted" {
				t.Fatalf("session %s not remounted: %v", ws, res)
			}
		}
		for _, b := range res["squashed_blocks"].([]any) {
			if m := b.(map[string]any); m["replaced_layers"] != "reclaimed" {
				t.Fatalf("block not reclaimed: %v", res)
			}
		}
		if _, ok := res["faulty_sessions"]; ok {
			t.Fatalf("faulty sessions: %v", res)
		}
		headLayers := e.manifestLayers(id)
		after := e.layerDirs(id)
		slices.Sort(headLayers)
		if len(after) != 5 || !slices.Equal(after, headLayers) {
			t.Fatalf("layer dirs after the squash: %v (head %v, before %v)", after, headLayers, before)
		}
		wantLayers := map[string]int64{sessions[0]: 2, sessions[1]: 3, sessions[2]: 4}
		if got := e.sessionLayers(id); fmt.Sprint(got) != fmt.Sprint(wantLayers) {
			t.Fatalf("session chains %v, want %v", got, wantLayers)
		}

		// Same views, same blame; the running command sees the new overlay.
		for _, ws := range sessions {
			if got := e.sessionView(id, ws); got != views[ws] {
				t.Fatalf("view of %s changed by the remount:\n%s\nwas\n%s", ws, got, views[ws])
			}
			b, _ := json.Marshal(e.rt(id, "file_blame", "--workspace-session-id", ws, "--path", "a.txt")["ranges"])
			if string(b) != blame[ws] {
				t.Fatalf("blame of %s changed by the remount:\n%s\nwas\n%s", ws, b, blame[ws])
			}
		}
		e.stopWait(id, sessions[1], running)

		// They keep working.
		for i, ws := range sessions {
			e.rt(id, "file_write", "--workspace-session-id", ws, "--path", fmt.Sprintf("w%d.txt", i+1), "--content", "after\n")
			if out := e.exec(id, "--workspace-session-id", ws, fmt.Sprintf("echo x%d > x%d.txt && cat e%d.txt", i+1, i+1, i+1)); out["status"] != "ok" || out["output"] != fmt.Sprintf("edit %d", i+1) {
				t.Fatalf("exec in %s after the remount: %v", ws, out)
			}
			views[ws] = e.sessionView(id, ws)
		}

		// A restart restores them on the squashed chain.
		e.stop()
		e.start()
		if got := e.sessionLayers(id); fmt.Sprint(got) != fmt.Sprint(wantLayers) {
			t.Fatalf("session chains after restart %v, want %v", got, wantLayers)
		}
		for _, ws := range sessions {
			if got := e.sessionView(id, ws); got != views[ws] {
				t.Fatalf("view of %s after restart:\n%s\nwas\n%s", ws, got, views[ws])
			}
		}

		if kernel {
			// A command whose cwd is inside /workspace pins the old overlay.
			publish()
			publish()
			pinned := e.session(id)
			cmd := e.waitStop(id, pinned, "/workspace")
			publish()
			res := e.mgr("squash_layerstacks", "--sandbox-id", id)
			s := e.swept(res)[pinned]
			if s == nil || s["disposition"] != "leased" || s["reason"] != "pinned:cwd_pinned_workspace" || !strings.Contains(fmt.Sprint(s["class_detail"]), cmd) {
				t.Fatalf("pinned session: %v", res)
			}
			leased := false
			for _, b := range res["squashed_blocks"].([]any) {
				m := b.(map[string]any)
				leased = leased || (m["replaced_layers"] == "leased" && strings.Contains(fmt.Sprint(m["blocked_reasons"]), pinned))
			}
			if !leased {
				t.Fatalf("the pinned session's layers are not leased: %v", res)
			}
			e.stopWait(id, pinned, cmd)
			e.rt(id, "destroy_workspace_session", "--workspace-session-id", pinned)
		}

		// Every session publishes; the head has all their work.
		for i, ws := range sessions {
			e.rt(id, "publish_workspace_session", "--workspace-session-id", ws)
			for _, p := range []string{"e%d.txt", "w%d.txt", "x%d.txt"} {
				e.rt(id, "file_read", "--path", fmt.Sprintf(p, i+1)) // fails the test when absent
			}
		}
		if got := e.rt(id, "file_read", "--path", "a.txt")["content"]; got != "line by 1\n-\n-\n-\nline by 2\n-\n-\n-\nline by 3\n" && got != "line by 1\n-\n-\n-\nline by 2\n-\n-\n-\nline by 3" {
			t.Fatalf("a.txt after the three publishes: %q", got)
		}
		headLayers = e.manifestLayers(id)
		slices.Sort(headLayers)
		if got := e.layerDirs(id); !slices.Equal(got, headLayers) {
			t.Fatalf("layer dirs %v, head %v", got, headLayers)
		}
	})
}

// TestAutosquashRemountsLiveSessions: autosquash runs the same sweep: two
// live sessions on the squashed block are moved and its layers reclaimed
// at once.
func TestAutosquashRemountsLiveSessions(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		writeConfig(t, e, "runtime:\n  layerstack:\n    autosquash:\n      squash_at_n_layers: 5\n")
		e.start()
		id := e.createSandbox(e.project(map[string]string{"a.txt": "0\n"}))
		e.rt(id, "file_write", "--path", "h1.txt", "--content", "1\n")
		e.rt(id, "file_write", "--path", "h2.txt", "--content", "2\n")
		ws1 := e.session(id)
		e.rt(id, "file_write", "--workspace-session-id", ws1, "--path", "e1.txt", "--content", "edit 1\n")
		e.rt(id, "file_write", "--path", "h3.txt", "--content", "3\n")
		ws2 := e.session(id)
		e.rt(id, "file_write", "--workspace-session-id", ws2, "--path", "e2.txt", "--content", "edit 2\n")
		v1, v2 := e.sessionView(id, ws1), e.sessionView(id, ws2)
		e.rt(id, "file_write", "--path", "h4.txt", "--content", "4\n") // 5 layers: autosquash folds h2+h1

		var completed map[string]any
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) && completed == nil {
			for _, ev := range eventRecords(t, e.obsCLI("events", "--sandbox-id", id, "--name", "layerstack.autosquash.completed")) {
				completed = ev
			}
			time.Sleep(50 * time.Millisecond)
		}
		attrs, _ := completed["attrs"].(map[string]any)
		if attrs == nil || num(t, attrs["remounted_sessions"]) != 2 || num(t, attrs["after_layers"]) != 4 {
			t.Fatalf("completed event: %v", completed)
		}
		head := e.manifestLayers(id)
		slices.Sort(head)
		if got := e.layerDirs(id); !slices.Equal(got, head) {
			t.Fatalf("layer dirs %v, head %v", got, head)
		}
		if got := e.sessionLayers(id); got[ws1] != 2 || got[ws2] != 3 {
			t.Fatalf("session chains %v", got)
		}
		if e.sessionView(id, ws1) != v1 || e.sessionView(id, ws2) != v2 {
			t.Fatal("a session's view changed")
		}
		e.rt(id, "publish_workspace_session", "--workspace-session-id", ws1)
		e.rt(id, "publish_workspace_session", "--workspace-session-id", ws2)
		for _, p := range []string{"e1.txt", "e2.txt", "h4.txt"} {
			e.rt(id, "file_read", "--path", p)
		}
	})
}
