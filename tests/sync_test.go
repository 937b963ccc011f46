package tests

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Live sessions that keep up with the head (issue #19): sync_workspace_session
// and publish_workspace_session keep:true, on both drivers.

func (e *env) sync(id, ws string, args ...string) map[string]any {
	e.t.Helper()
	return e.rt(id, append([]string{"sync_workspace_session", "--workspace-session-id", ws}, args...)...)
}

func (e *env) syncFail(id, ws, kind string, args ...string) map[string]any {
	e.t.Helper()
	return e.rtFail(id, 1, kind, append([]string{"sync_workspace_session", "--workspace-session-id", ws}, args...)...)
}

// sessionRead is a file as session ws sees it ("" when absent).
func (e *env) sessionRead(id, ws, p string) string {
	e.t.Helper()
	r := e.rt(id, "exec_command", "--workspace-session-id", ws, "cat "+p+" 2>/dev/null || true")
	return r["output"].(string)
}

// sessionBaseVersion is the manifest version of ws's base.
func (e *env) sessionBaseVersion(id, ws string) int64 {
	e.t.Helper()
	for _, s := range e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any) {
		m := s.(map[string]any)
		if m["workspace_session_id"] == ws {
			return num(e.t, m["base_revision"].(map[string]any)["manifest_version"])
		}
	}
	e.t.Fatalf("session %s not listed", ws)
	return 0
}

// upperEntries lists the session's upper dir (relative paths).
func (e *env) upperEntries(id, ws string) []string {
	e.t.Helper()
	upper := filepath.Join(e.data(), "sandboxes", id, "sessions", ws, "upper")
	var out []string
	err := filepath.Walk(upper, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(upper, p); rel != "." && !strings.HasPrefix(fi.Name(), ".esbx") {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("walk upper: %v", err)
	}
	return out
}

// waiter is a command that runs until path appears in the session, then
// prints it. On the kernel driver it must not keep /workspace as its
// working directory (a swap of the kernel overlay refuses that); the FUSE
// driver swaps under a cwd inside /workspace.
func waiter(t *testing.T, path string) string {
	dir := "/workspace"
	if driverOf(t) == "kernel" {
		dir = "/"
	}
	return "cd " + dir + " && while [ ! -e /workspace/" + path + " ]; do sleep 0.1; done; cat /workspace/" + path
}

func TestSyncBringsHeadIntoLiveSession(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"shared.txt": lines(10, "base"), "stale.txt": "stale\n"})
		a := e.session(id, "--agent", "alice")
		b := e.session(id, "--agent", "bob")
		e.exec(id, "--workspace-session-id", b, "sed -i 's/line 9 base/line 9 bob/' shared.txt && echo mine > own.txt && cat stale.txt >/dev/null")
		// bob's copy-up of an unchanged file must not hide alice's edit of it.
		e.exec(id, "--workspace-session-id", b, "cp stale.txt /tmp/x && cp /tmp/x stale.txt")
		run := e.exec(id, "--workspace-session-id", b, "--yield-time-ms", "100", waiter(t, "fromA.txt"))
		if run["status"] != "running" {
			t.Fatalf("waiter: %v", run)
		}
		cmd := run["command_session_id"].(string)

		e.exec(id, "--workspace-session-id", a, "sed -i 's/line 2 base/line 2 alice/' shared.txt && echo 'from A' > fromA.txt && echo fresh > stale.txt")
		e.publish(id, a)
		before := e.sessionBaseVersion(id, b)

		dry := e.sync(id, b, "--dry-run")
		ds := dry["sync"].(map[string]any)
		if dry["dry_run"] != true || ds["result"] != "would_sync" || num(t, ds["merged_paths"]) != 2 || dry["plan"] == nil { // shared.txt, and stale.txt: a copy-up merges to the head's version
			t.Fatalf("dry run: %v", dry)
		}
		if got := e.sessionRead(id, b, "fromA.txt"); got != "" || e.sessionBaseVersion(id, b) != before {
			t.Fatalf("a dry run changed the session: fromA.txt=%q", got)
		}

		pre, _ := e.activity(id, map[string]any{"workspace_session_id": b})
		res := e.sync(id, b)
		s := res["sync"].(map[string]any)
		if res["dry_run"] != false || s["result"] != "synced" || s["no_op"] != false || num(t, s["merged_paths"]) != 2 {
			t.Fatalf("sync: %v", res)
		}
		after := e.sessionBaseVersion(id, b)
		if after <= before || num(t, s["base_revision"].(map[string]any)["manifest_version"]) != after ||
			num(t, s["previous_base_revision"].(map[string]any)["manifest_version"]) != before {
			t.Fatalf("base %d → %d; sync %v", before, after, s)
		}
		// The command that was waiting (started before the sync, so it
		// survived it) sees alice's file through the new view.
		if out := e.waitDone(id, cmd); out["status"] != "ok" || out["output"] != "from A" {
			t.Fatalf("running command after sync: %v", out)
		}
		want := map[string]string{
			"fromA.txt": "from A", "own.txt": "mine", "stale.txt": "fresh",
		}
		for p, w := range want {
			if got := e.sessionRead(id, b, p); got != w {
				t.Errorf("%s in bob's session: %q, want %q", p, got, w)
			}
		}
		shared := e.sessionRead(id, b, "shared.txt")
		if !strings.Contains(shared, "line 2 alice") || !strings.Contains(shared, "line 9 bob") {
			t.Fatalf("merged shared.txt: %q", shared)
		}
		// Blame of the session view: head-only lines are alice's, bob's line
		// keeps bob and the command that wrote it.
		bl := e.rt(id, "file_blame", "--workspace-session-id", b, "--path", "shared.txt")
		for _, r := range bl["ranges"].([]any) {
			m := r.(map[string]any)
			start, n := num(t, m["start_line"]), num(t, m["line_count"])
			for l := start; l < start+n; l++ {
				switch l {
				case 2:
					if m["owner"] != "workspace_session:"+a {
						t.Errorf("line 2 (alice's, from the head): %v", m)
					}
				case 9:
					if c, _ := m["command_session_id"].(string); m["owner"] != "workspace_session:"+b || !strings.HasPrefix(c, "cmd-") {
						t.Errorf("line 9 (bob's): %v", m)
					}
				}
			}
		}
		if r := e.rt(id, "file_blame", "--workspace-session-id", b, "--path", "fromA.txt")["ranges"].([]any); r[0].(map[string]any)["owner"] != "workspace_session:"+a {
			t.Errorf("fromA.txt blame in bob's session: %v", r)
		}
		// File activity keeps its owners: the commands that end after the
		// sync (the waiter, a no-op) changed nothing and are credited with
		// nothing (the rebuilt upper and the head's merge are no one's
		// activity); bob's earlier edits keep their commands.
		e.exec(id, "--workspace-session-id", b, "true")
		edited := false
		recs, _ := e.activity(id, map[string]any{"workspace_session_id": b})
		if len(recs) != len(pre) {
			t.Errorf("commands after the sync are credited with what the sync did: %v", recs[len(pre):])
		}
		for _, m := range recs {
			if (m["path"] == "shared.txt" || m["new_path"] == "shared.txt") && m["command_session_id"] != nil { // sed -i renames on FUSE
				edited = true
			}
		}
		if !edited {
			t.Errorf("bob's edit of shared.txt lost its activity record")
		}
		// The restarted supervisor brings the session back on its new base.
		e.stop()
		e.start()
		if got := e.sessionBaseVersion(id, b); got != after {
			t.Fatalf("after restart the base is %d, want %d", got, after)
		}
		if got := e.sessionRead(id, b, "fromA.txt") + e.sessionRead(id, b, "own.txt"); got != "from Amine" {
			t.Fatalf("after restart: %q", got)
		}
		// Publishing the synced session merges nothing more: it is on the head.
		p := e.publish(id, b)
		if num(t, p["publish"].(map[string]any)["outcome_summary"].(map[string]any)["merged"]) != 0 {
			t.Fatalf("publish after sync: %v", p)
		}
		head := e.rt(id, "file_read", "--path", "shared.txt")["content"].(string)
		if !strings.Contains(head, "line 2 alice") || !strings.Contains(head, "line 9 bob") {
			t.Fatalf("head after bob's publish: %q", head)
		}
	})
}

func TestSyncConflictRejectedAndNothingChanges(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"x.txt": lines(3, "base"), "y.txt": lines(3, "base")})
		a := e.session(id)
		b := e.session(id)
		e.exec(id, "--workspace-session-id", b, "sed -i 's/line 2 base/line 2 bob/' x.txt y.txt && echo b > b.txt")
		e.exec(id, "--workspace-session-id", a, "sed -i 's/line 2 base/line 2 alice/' x.txt y.txt && echo a > a.txt")
		e.publish(id, a)
		upper := e.upperEntries(id, b)
		before := e.sessionBaseVersion(id, b)

		dry := e.sync(id, b, "--dry-run")
		if dry["sync"].(map[string]any)["result"] != "would_reject" || dry["would_commit"] != false {
			t.Fatalf("dry run of a conflict: %v", dry)
		}
		body := e.syncFail(id, b, "operation_failed")
		d := body["details"].(map[string]any)
		rej := d["publish_rejection"].(map[string]any)
		var paths []string
		for _, c := range rej["conflicts"].([]any) {
			paths = append(paths, c.(map[string]any)["path"].(string))
		}
		slices.Sort(paths)
		if d["session_retained"] != true || d["workspace_session_id"] != b || strings.Join(paths, ",") != "x.txt,y.txt" {
			t.Fatalf("rejection must list every conflicting path: %v", body)
		}
		if got := e.upperEntries(id, b); strings.Join(got, ",") != strings.Join(upper, ",") {
			t.Fatalf("upper changed: %v → %v", upper, got)
		}
		if e.sessionBaseVersion(id, b) != before || e.sessionRead(id, b, "a.txt") != "" ||
			!strings.Contains(e.sessionRead(id, b, "x.txt"), "line 2 bob") {
			t.Fatal("a rejected sync changed the session")
		}
		// Resolved: theirs for x.txt, ours for y.txt.
		res := e.sync(id, b, "--resolutions", `[{"path":"x.txt","strategy":"theirs"},{"path":"y.txt","strategy":"ours"}]`)
		if s := res["sync"].(map[string]any); num(t, s["kept_head_paths"]) != 1 {
			t.Fatalf("resolved sync: %v", res)
		}
		if x, y := e.sessionRead(id, b, "x.txt"), e.sessionRead(id, b, "y.txt"); !strings.Contains(x, "line 2 alice") || !strings.Contains(y, "line 2 bob") {
			t.Fatalf("resolved: x=%q y=%q", x, y)
		}
		if e.sessionRead(id, b, "a.txt") != "a" || e.sessionRead(id, b, "b.txt") != "b" {
			t.Fatal("resolved sync lost a file")
		}
	})
}

func TestSyncBadArguments(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"f.txt": "f\n"})
		ws := e.session(id)
		e.syncFail(id, "ws-01JUNKJUNKJUNKJUNKJUNKJUNK", "not_found")
		e.rtFail(id, 2, "invalid_request", "sync_workspace_session", "--workspace-session-id", ws, "--default-strategy", "mine")
		e.rtFail(id, 2, "invalid_request", "sync_workspace_session", "--workspace-session-id", ws, "--resolutions", `[{"path":"f.txt","strategy":"mine"}]`)
		e.rtFail(id, 1, "invalid_request", "sync_workspace_session", "--workspace-session-id", ws, "--resolutions", `[{"path":"nope.txt","strategy":"ours"}]`)
		implicit := e.exec(id, "--yield-time-ms", "100", "sleep 30")
		e.syncFail(id, implicit["workspace_session_id"].(string), "not_found")
		e.rt(id, "write_command_stdin", "--command-session-id", implicit["command_session_id"].(string), "\x03")
		// Already on the head: a no-op that moves nothing.
		if s := e.sync(id, ws)["sync"].(map[string]any); s["no_op"] != true || s["result"] != "no_op" {
			t.Fatalf("sync on the head: %v", s)
		}
	})
}

// TestSyncKernelPinnedCommandRefuses: on the kernel driver a running
// command whose working directory is in /workspace keeps the old overlay;
// the sync refuses naming it and changes nothing.
func TestSyncKernelPinnedCommandRefuses(t *testing.T) {
	t.Setenv("ESBX_OVERLAY", "kernel")
	e, id := sandboxWith(t, map[string]string{"f.txt": "f\n"})
	if driverOf(t) != "kernel" {
		t.Skip("kernel driver only")
	}
	a, b := e.session(id), e.session(id)
	run := e.exec(id, "--workspace-session-id", b, "--yield-time-ms", "100", "sleep 60")
	cmd := run["command_session_id"].(string)
	e.exec(id, "--workspace-session-id", a, "echo a > a.txt")
	e.publish(id, a)
	before := e.sessionBaseVersion(id, b)
	body := e.syncFail(id, b, "operation_failed")
	d := body["details"].(map[string]any)
	if msg, _ := body["message"].(string); !strings.Contains(msg, cmd) || !slices.Contains(d["pinned_command_session_ids"].([]any), any(cmd)) ||
		d["reason"] != "pinned:cwd_pinned_workspace" {
		t.Fatalf("pinned refusal must name %s: %v", cmd, body)
	}
	if e.sessionBaseVersion(id, b) != before || e.sessionRead(id, b, "a.txt") != "" {
		t.Fatal("a refused sync changed the session")
	}
	if out := e.rt(id, "read_command_lines", "--command-session-id", cmd); out["status"] != "running" {
		t.Fatalf("the pinned command must keep running: %v", out)
	}
	// publish keep:true commits, then cannot move the pinned session: the
	// error says the publish completed and how to move it later.
	e.exec(id, "--workspace-session-id", b, "echo b > b.txt")
	body = e.rtFail(id, 1, "operation_failed", "publish_workspace_session", "--workspace-session-id", b, "--keep")
	d = body["details"].(map[string]any)
	if d["publish_completed"] != true || d["recovery_operation"] != "sync_workspace_session" || d["destroyed"] != false ||
		d["reason"] != "pinned:cwd_pinned_workspace" {
		t.Fatalf("keep of a pinned session: %v", body)
	}
	if got := e.rt(id, "file_read", "--path", "b.txt")["content"]; got != "b" {
		t.Fatalf("the publish did not commit: %v", got)
	}
	if e.sessionBaseVersion(id, b) != before || e.sessionRead(id, b, "b.txt") != "b" {
		t.Fatal("the session must stay as it was")
	}
}

func TestPublishKeepTwiceCreditsBothCommits(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"f.txt": lines(4, "base")})
		ws := e.session(id, "--agent", "carol")
		run := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "100", waiter(t, "done.txt"))
		cmd := run["command_session_id"].(string)
		e.exec(id, "--workspace-session-id", ws, "sed -i 's/line 1 base/line 1 first/' f.txt")
		p1 := e.publish(id, ws, "--keep")
		if p1["destroyed"] != false || p1["kept"] != true || p1["publish"].(map[string]any)["no_op"] != false {
			t.Fatalf("first keep: %v", p1)
		}
		l1 := p1["publish"].(map[string]any)["layer_id"].(string)
		if up := e.upperEntries(id, ws); len(up) != 0 {
			t.Fatalf("upper after keep must be empty: %v", up)
		}
		if v := e.sessionBaseVersion(id, ws); v != num(t, p1["base_revision"].(map[string]any)["manifest_version"]) {
			t.Fatalf("base after keep: %d, %v", v, p1)
		}
		e.exec(id, "--workspace-session-id", ws, "sed -i 's/line 4 base/line 4 second/' f.txt")
		p2 := e.publish(id, ws, "--keep")
		l2 := p2["publish"].(map[string]any)["layer_id"].(string)
		if p2["kept"] != true || l2 == l1 || p2["publish"].(map[string]any)["outcome_summary"].(map[string]any)["merged"] != nil &&
			num(t, p2["publish"].(map[string]any)["outcome_summary"].(map[string]any)["merged"]) != 0 {
			t.Fatalf("second keep: %v", p2)
		}
		if d := e.rt(id, "diff_workspace_session", "--workspace-session-id", ws)["files"].([]any); len(d) != 0 {
			t.Fatalf("a kept session has nothing left to publish: %v", d)
		}
		layersSeen := map[string]int{}
		for _, r := range e.rt(id, "file_blame", "--path", "f.txt")["ranges"].([]any) {
			m := r.(map[string]any)
			if m["owner"] == "workspace_session:"+ws {
				lid, _ := m["layer_id"].(string)
				layersSeen[lid] += int(num(t, m["line_count"]))
			}
		}
		if layersSeen[l1] != 1 || layersSeen[l2] != 1 {
			t.Fatalf("blame must credit both commits (%s, %s) to %s: %v", l1, l2, ws, layersSeen)
		}
		// Same session, same running command: it sees what the session writes now.
		e.exec(id, "--workspace-session-id", ws, "echo finished > done.txt")
		if out := e.waitDone(id, cmd); out["output"] != "finished" {
			t.Fatalf("command across two keeps: %v", out)
		}
	})
}

// TestPublishKeepDropsWhatThePublishDropped: a publish that kept the head's
// version of a path (theirs) leaves the kept session on the head with an
// empty upper too — the session's discarded version does not come back as
// a conflict.
func TestPublishKeepDropsWhatThePublishDropped(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"f.txt": lines(3, "base")})
		a, b := e.session(id), e.session(id)
		e.exec(id, "--workspace-session-id", a, "sed -i 's/line 2 base/line 2 alice/' f.txt")
		e.publish(id, a)
		e.exec(id, "--workspace-session-id", b, "sed -i 's/line 2 base/line 2 bob/' f.txt && echo new > new.txt")
		p := e.publish(id, b, "--keep", "--resolutions", `[{"path":"f.txt","strategy":"theirs"}]`)
		if p["kept"] != true {
			t.Fatalf("keep: %v", p)
		}
		if up := e.upperEntries(id, b); len(up) != 0 {
			t.Fatalf("upper after keep must be empty: %v", up)
		}
		if got := e.sessionRead(id, b, "f.txt"); !strings.Contains(got, "line 2 alice") {
			t.Fatalf("the kept session shows %q", got)
		}
	})
}

// TestPublishKeepThenWriteAgain (issue #27 item 6): after publish keep:true
// the session goes on writing to the files it published — an append to a
// published file must work (it failed with EXDEV on the FUSE driver), the
// second publish must carry it. The first publish's outcome_summary counts
// both paths as unchanged_head — the contract's name for "head had not
// changed the path, the session's change applies as is" — and its summary
// counts them as published.
func TestPublishKeepThenWriteAgain(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"a.txt": "a\n", "d/m.txt": "m1\n"})
		ws := e.session(id, "--agent", "kim")
		e.exec(id, "--workspace-session-id", ws, "echo k1 > k.txt && echo m2 >> d/m.txt")
		p1 := e.publish(id, ws, "--keep")
		pub := p1["publish"].(map[string]any)
		sum := pub["outcome_summary"].(map[string]any)
		if p1["kept"] != true || pub["no_op"] != false || num(t, sum["unchanged_head"]) != 2 || num(t, sum["applied"]) != 0 ||
			num(t, pub["summary"].(map[string]any)["published_paths"]) != 2 {
			t.Fatalf("first keep: %v", p1)
		}
		out := e.exec(id, "--workspace-session-id", ws, "echo k2 >> k.txt && echo m3 >> d/m.txt && echo a2 >> a.txt && cat k.txt d/m.txt a.txt")
		if num(t, out["exit_code"]) != 0 || out["output"] != "k1\nk2\nm1\nm2\nm3\na\na2" {
			t.Fatalf("writes after keep: %v", out)
		}
		p2 := e.publish(id, ws, "--keep")
		if p2["publish"].(map[string]any)["no_op"] != false {
			t.Fatalf("second keep: %v", p2)
		}
		for p, want := range map[string]string{"k.txt": "k1\nk2", "d/m.txt": "m1\nm2\nm3", "a.txt": "a\na2"} {
			if got := e.rt(id, "file_read", "--path", p)["content"]; got != want {
				t.Fatalf("head %s = %q, want %q", p, got, want)
			}
		}
		// A sync replaces the upper the same way: a file it brought in
		// from the head takes writes too.
		o := e.session(id)
		e.exec(id, "--workspace-session-id", o, "echo o1 > o.txt")
		e.publish(id, o)
		e.exec(id, "--workspace-session-id", ws, "echo mine > mine.txt")
		if s := e.sync(id, ws)["sync"].(map[string]any); s["result"] != "synced" {
			t.Fatalf("sync: %v", s)
		}
		if out := e.exec(id, "--workspace-session-id", ws, "echo o2 >> o.txt && echo k3 >> k.txt && cat o.txt k.txt"); num(t, out["exit_code"]) != 0 || out["output"] != "o1\no2\nk1\nk2\nk3" {
			t.Fatalf("writes after sync: %v", out)
		}
	})
}
