package tests

// Overlay driver selection, file activity and live line attribution
// (issue 5): the FUSE overlay as the fallback driver, its provenance, and
// the kernel driver's capture records in the same format.

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestOverlayDriverSelection: the probe knobs make a driver unavailable;
// health says which and why, overlay auto picks kernel, else fuse, else
// fails, and an explicit driver whose probe failed fails with its reason.
func TestOverlayDriverSelection(t *testing.T) {
	tests := []struct {
		name         string
		knobs        []string
		kernel, fuse bool // available after the knobs (fuse: when the host has it)
		auto         string
		status       string
	}{
		{"both", nil, true, true, "kernel", "ok"},
		{"kernel probe failed", []string{"SANDBOX_PROBE_FAIL_KERNEL_OVERLAY=1"}, false, true, "fuse", "ok"},
		{"fuse probe failed", []string{"SANDBOX_PROBE_FAIL_FUSE_OVERLAY=1"}, true, false, "kernel", "ok"},
		{"neither", []string{"SANDBOX_PROBE_FAIL_KERNEL_OVERLAY=1", "SANDBOX_PROBE_FAIL_FUSE_OVERLAY=1"}, false, false, "", "unavailable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.supEnv = tc.knobs
			e.start()
			h := e.obsOK("health", "", nil)
			drivers := h["overlay_drivers"].(map[string]any)
			k, f := drivers["kernel"].(map[string]any), drivers["fuse"].(map[string]any)
			if tc.fuse && f["available"] != true {
				skipOrFail(t, "the FUSE overlay does not work here: %v", f["reason"])
			}
			if k["available"] != tc.kernel || f["available"] != tc.fuse || h["status"] != tc.status {
				t.Fatalf("health: status %v, overlay_drivers %v", h["status"], drivers)
			}
			for _, d := range []map[string]any{k, f} {
				if (d["available"] == true) != (d["reason"] == nil) {
					t.Errorf("reason must be null exactly when available: %v", d)
				}
			}
			root := e.project(map[string]string{"a.txt": "a\n"})
			args := []string{"create_sandbox", "--workspace-bind-root", root, "--overlay"}
			if tc.auto == "" {
				body := e.fail(1, "operation_failed", "sandbox-manager-cli", append(args, "auto")...)
				if !strings.Contains(body["message"].(string), "overlay driver auto is unavailable") {
					t.Fatalf("auto without drivers: %v", body)
				}
			} else {
				rec := e.mgr(append(args, "auto")...)
				if rec["overlay_driver"] != tc.auto {
					t.Fatalf("auto picked %v, want %s", rec["overlay_driver"], tc.auto)
				}
				id := rec["id"].(string)
				if out := e.exec(id, "echo hi > b.txt && cat a.txt b.txt"); out["status"] != "ok" || out["output"] != "a\nhi" {
					t.Fatalf("exec with %s: %v", tc.auto, out)
				}
			}
			for _, d := range []struct {
				name string
				ok   bool
				info map[string]any
			}{{"kernel", tc.kernel, k}, {"fuse", tc.fuse, f}} {
				if d.ok {
					continue
				}
				body := e.fail(1, "operation_failed", "sandbox-manager-cli", append(args, d.name)...)
				if msg := body["message"].(string); !strings.Contains(msg, "overlay driver "+d.name+" is unavailable: "+d.info["reason"].(string)) {
					t.Fatalf("explicit %s: %v", d.name, body)
				}
			}
		})
	}
}

// activity queries file_activity and returns its records.
func (e *env) activity(id string, args map[string]any) ([]map[string]any, map[string]any) {
	e.t.Helper()
	m := e.obsOK("file_activity", id, args)
	if m["view"] != "file_activity" || m["sandbox_id"] != id {
		e.t.Fatalf("file_activity: %v", m)
	}
	return objs(m["records"]), m
}

func hasActivity(recs []map[string]any, op, path string) map[string]any {
	for _, r := range recs {
		if r["op"] == op && r["path"] == path {
			return r
		}
	}
	return nil
}

func activityString(recs []map[string]any) string {
	var b strings.Builder
	for _, r := range recs {
		fmt.Fprintf(&b, "  %v %v %v cmd=%v src=%v req=%v\n", r["op"], r["path"], r["new_path"], r["command_session_id"], r["source"], r["request_id"])
	}
	return b.String()
}

// TestFileActivity: what a command and a file operation change in a session
// is recorded with the command (or the request) and the driver's source;
// the filters and the limit work.
func TestFileActivity(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		id := e.createSandbox(e.project(map[string]string{"keep.txt": "k\n", "del.txt": "d\n", "mode.sh": "#!/bin/sh\n", "dir/x": "x\n", "old.txt": "o\n"}))
		source := map[string]string{"kernel": "capture", "fuse": "fuse"}[e.overlay]
		ws := e.session(id)
		before := time.Now().Add(-time.Second).UnixMilli()
		out := e.exec(id, "--workspace-session-id", ws,
			"umask 022 && echo new > new.txt && echo more >> keep.txt && rm del.txt && mkdir -p made/sub && ln -s keep.txt link && chmod +x mode.sh && mv old.txt moved.txt && echo done")
		if out["status"] != "ok" || out["output"] != "done" {
			t.Fatalf("exec: %v", out)
		}
		cmd := out["command_session_id"].(string)
		e.rt(id, "--request-id", "req-fa1", "file_write", "--workspace-session-id", ws, "--path", "note.txt", "--content", "n\n")

		recs, _ := e.activity(id, nil)
		for _, want := range []struct{ op, path string }{
			{"create", "new.txt"}, {"write", "keep.txt"}, {"unlink", "del.txt"}, {"mkdir", "made"}, {"mkdir", "made/sub"},
			{"symlink", "link"}, {"chmod", "mode.sh"},
		} {
			r := hasActivity(recs, want.op, want.path)
			if r == nil {
				t.Errorf("no %s %s record in\n%s", want.op, want.path, activityString(recs))
				continue
			}
			if r["command_session_id"] != cmd || r["workspace_session_id"] != ws || r["source"] != source || r["request_id"] != nil {
				t.Errorf("%s %s: %v", want.op, want.path, r)
			}
			if _, ok := r["ts"].(string); !ok {
				t.Errorf("%s %s: no ts: %v", want.op, want.path, r)
			}
		}
		// A rename: one record under fuse; unlink + create from capture.
		if e.overlay == "fuse" {
			if r := hasActivity(recs, "rename", "old.txt"); r == nil || r["new_path"] != "moved.txt" || r["command_session_id"] != cmd {
				t.Errorf("rename record: %v in\n%s", r, activityString(recs))
			}
		} else if hasActivity(recs, "unlink", "old.txt") == nil || hasActivity(recs, "create", "moved.txt") == nil {
			t.Errorf("rename as unlink + create missing in\n%s", activityString(recs))
		}
		note := hasActivity(recs, "create", "note.txt")
		if note == nil || note["request_id"] != "req-fa1" || note["command_session_id"] != nil || note["source"] != source {
			t.Errorf("file_write record: %v in\n%s", note, activityString(recs))
		}
		for _, r := range recs {
			if r["path"] == "dir" || r["path"] == "." || strings.Contains(fmt.Sprint(r["path"]), ".wh.") {
				t.Errorf("record of an untouched or internal path: %v", r)
			}
		}

		// Filters: path prefix (by component), session, since, limit.
		made, _ := e.activity(id, map[string]any{"path": "/workspace/made"})
		if len(made) != 2 || made[0]["path"] != "made" || made[1]["path"] != "made/sub" {
			t.Errorf("path filter made:\n%s", activityString(made))
		}
		if none, _ := e.activity(id, map[string]any{"path": "mad"}); len(none) != 0 {
			t.Errorf("path prefix matched a partial component:\n%s", activityString(none))
		}
		other := e.session(id)
		if none, _ := e.activity(id, map[string]any{"workspace_session_id": other}); len(none) != 0 {
			t.Errorf("other session has records:\n%s", activityString(none))
		}
		if all, _ := e.activity(id, map[string]any{"workspace_session_id": ws, "since_ms": before}); len(all) != len(recs) {
			t.Errorf("since_ms before the session: %d of %d records", len(all), len(recs))
		}
		if none, _ := e.activity(id, map[string]any{"since_ms": time.Now().Add(time.Hour).UnixMilli()}); len(none) != 0 {
			t.Errorf("since_ms in the future:\n%s", activityString(none))
		}
		last, m := e.activity(id, map[string]any{"limit": 1})
		if len(last) != 1 || m["truncated"] != true || last[0]["path"] != "note.txt" {
			t.Errorf("limit 1 must keep the newest: %v", m)
		}
		if bad := e.obs("file_activity", id, map[string]any{"limit": 1001}); errKind(bad) != "invalid_request" {
			t.Errorf("limit 1001: %v", bad)
		}
		// Reads never record.
		e.rt(id, "file_read", "--workspace-session-id", ws, "--path", "keep.txt")
		if again, _ := e.activity(id, nil); len(again) != len(recs) {
			t.Errorf("a read added records:\n%s", activityString(again[len(recs):]))
		}
	})
}

// TestFileActivityDisabled: observability.enabled false or
// observability.file_activity.enabled false stores nothing and the view
// answers empty.
func TestFileActivityDisabled(t *testing.T) {
	for _, tc := range []struct{ name, cfg string }{
		{"file_activity off", "observability:\n  file_activity:\n    enabled: false\n"},
		{"observability off", "observability:\n  enabled: false\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.startWithConfig(tc.cfg)
			id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
			ws := e.session(id)
			if out := e.exec(id, "--workspace-session-id", ws, "echo b > b.txt && echo ok"); out["status"] != "ok" {
				t.Fatalf("exec: %v", out)
			}
			e.rt(id, "file_write", "--workspace-session-id", ws, "--path", "c.txt", "--content", "c\n")
			if recs, m := e.activity(id, nil); len(recs) != 0 || m["truncated"] != false {
				t.Fatalf("disabled file activity answered %v", m)
			}
		})
	}
}

// fuseSandbox starts a supervisor and a sandbox on the FUSE driver.
func fuseSandbox(t *testing.T, files map[string]string) (*env, string) {
	t.Helper()
	return fuseSandboxArgs(t, files)
}

func fuseSandboxArgs(t *testing.T, files map[string]string, args ...string) (*env, string) {
	t.Helper()
	e := newEnv(t)
	e.overlay = "fuse"
	e.start()
	return e, e.createSandbox(e.project(files), args...)
}

// TestProvenanceConcurrentWriters: two commands of one FUSE session append
// to one file through handles held open at the same time; every line is
// owned by the command that wrote it, in the session's blame and after
// publishing in the head's.
func TestProvenanceConcurrentWriters(t *testing.T) {
	e, id := fuseSandbox(t, map[string]string{"base.txt": "b\n"})
	ws := e.session(id, "--agent", "alice")
	writer := func(tag string, delay string) string {
		out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "0",
			fmt.Sprintf("sleep %s; exec 3>>log.txt; for i in 1 2 3 4; do echo %s$i >&3; sleep 0.4; done", delay, tag))
		return out["command_session_id"].(string)
	}
	a := writer("A", "0")
	b := writer("B", "0.2")
	for _, c := range []string{a, b} {
		if out := e.waitDone(id, c); out["status"] != "ok" {
			t.Fatalf("writer %s: %v", c, out)
		}
	}
	content := e.rt(id, "file_read", "--workspace-session-id", ws, "--path", "log.txt")
	owner := "workspace_session:" + ws
	checkOwners := func(bl map[string]any, text string) {
		t.Helper()
		lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
		if len(lines) != 8 {
			t.Fatalf("log.txt: %q", text)
		}
		var want []string
		for _, l := range lines {
			c := a
			if strings.HasPrefix(l, "B") {
				c = b
			}
			want = append(want, owner+":"+c)
		}
		var got []string
		for _, r := range objs(bl["ranges"]) {
			for range num(t, r["line_count"]) {
				got = append(got, fmt.Sprintf("%v:%v", r["owner"], r["command_session_id"]))
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("line owners of %q:\n got %v\nwant %v", text, got, want)
		}
	}
	text := fileText(t, content)
	checkOwners(e.rt(id, "file_blame", "--workspace-session-id", ws, "--path", "log.txt"), text)
	e.rt(id, "publish_workspace_session", "--workspace-session-id", ws)
	checkOwners(e.rt(id, "file_blame", "--path", "log.txt"), text)
}

// TestProvenanceInterleavedRanges: two commands of one FUSE session,
// running at the same time, overwrite interleaved line ranges of one file
// in place (each its own descriptor, pwrite at its offsets), and a third
// writes one range through a shared mapping; every line is owned by the
// command that wrote it. The driver opens files without OPEN, so a write
// is credited to the process that makes it, and a mapped write (which the
// kernel sends without a process) to the process whose msync follows it.
func TestProvenanceInterleavedRanges(t *testing.T) {
	e, id := fuseSandbox(t, map[string]string{"base.txt": "b\n"})
	ws := e.session(id, "--agent", "alice")
	run := func(script string) string {
		t.Helper()
		out := e.exec(id, "--workspace-session-id", ws, script)
		if out["status"] != "ok" {
			t.Fatalf("%s: %v", script, out)
		}
		return out["command_session_id"].(string)
	}
	// Eight lines of eight bytes.
	c0 := run(`for i in 0 1 2 3 4 5 6 7; do echo "line-0$i"; done > r.txt`)
	writer := func(tag string, lines string, delay string) string {
		out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "0", fmt.Sprintf(`python3 -c '
import os, time
time.sleep(%s)
fd = os.open("r.txt", os.O_WRONLY)
for i in (%s):
    os.pwrite(fd, b"%s-%%02d\n" %% i, i * 8)
    time.sleep(0.3)
os.close(fd)
'`, delay, lines, tag))
		return out["command_session_id"].(string)
	}
	a := writer("AAAA", "0, 2, 4", "0")
	b := writer("BBBB", "1, 3, 5", "0.15")
	for _, c := range []string{a, b} {
		if out := e.waitDone(id, c); out["status"] != "ok" {
			t.Fatalf("writer %s: %v", c, out)
		}
	}
	m := run(`python3 -c '
import mmap
with open("r.txt", "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
    m[48:56] = b"MMMM-06\n"
    m.flush()
    m.close()
'`)
	text := fileText(t, e.rt(id, "file_read", "--workspace-session-id", ws, "--path", "r.txt"))
	if want := "AAAA-00\nBBBB-01\nAAAA-02\nBBBB-03\nAAAA-04\nBBBB-05\nMMMM-06\nline-07"; strings.TrimSuffix(text, "\n") != want {
		t.Fatalf("r.txt: %q, want %q", text, want)
	}
	owner := "workspace_session:" + ws
	var want []string
	for _, c := range []string{a, b, a, b, a, b, m, c0} {
		want = append(want, owner+":"+c)
	}
	var got []string
	for _, r := range objs(e.rt(id, "file_blame", "--workspace-session-id", ws, "--path", "r.txt")["ranges"]) {
		for range num(t, r["line_count"]) {
			got = append(got, fmt.Sprintf("%v:%v", r["owner"], r["command_session_id"]))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("line owners:\n got %v\nwant %v", got, want)
	}
}

// fileText is file_read's content.
func fileText(t *testing.T, m map[string]any) string {
	t.Helper()
	c, ok := m["content"].(string)
	if !ok {
		t.Fatalf("file_read: %v", m)
	}
	return c
}

// TestProvenanceRewrites: an mmap write and a rename-over save (sed -i, an
// editor-style temp file + rename) attribute only the lines they changed,
// to the command that made them, under both drivers.
func TestProvenanceRewrites(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		id := e.createSandbox(e.project(map[string]string{"base.txt": "b\n"}))
		ws := e.session(id)
		run := func(script string) string {
			out := e.exec(id, "--workspace-session-id", ws, script)
			if out["status"] != "ok" {
				t.Fatalf("%s: %v", script, out)
			}
			return out["command_session_id"].(string)
		}
		owner := "workspace_session:" + ws
		c1 := run("printf 'one\\ntwo\\nthree\\nfour\\nfive\\n' > f.txt && printf 'aaaa\\nbbbb\\ncccc\\n' > m.txt")
		c2 := run(`python3 -c '
import mmap
with open("m.txt", "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
    m[5:9] = b"BBBB"
    m.flush()
    m.close()
'`)
		if got, want := blameRanges(t, e.rt(id, "file_blame", "--workspace-session-id", ws, "--path", "m.txt")),
			fmt.Sprintf("%s:%s×1 %s:%s×1 %s:%s×1", owner, c1, owner, c2, owner, c1); got != want {
			t.Errorf("mmap write:\n got %s\nwant %s", got, want)
		}
		c3 := run(`sed -i 's/^three$/THREE/' f.txt`)
		if got, want := blameRanges(t, e.rt(id, "file_blame", "--workspace-session-id", ws, "--path", "f.txt")),
			fmt.Sprintf("%s:%s×2 %s:%s×1 %s:%s×2", owner, c1, owner, c3, owner, c1); got != want {
			t.Errorf("sed -i:\n got %s\nwant %s", got, want)
		}
		c4 := run(`python3 -c '
import os
data = open("f.txt").read().replace("five", "FIVE")
with open(".f.txt.swp", "w") as t:
    t.write(data)
    t.flush()
    os.fsync(t.fileno())
os.replace(".f.txt.swp", "f.txt")
'`)
		if got, want := blameRanges(t, e.rt(id, "file_blame", "--workspace-session-id", ws, "--path", "f.txt")),
			fmt.Sprintf("%s:%s×2 %s:%s×1 %s:%s×1 %s:%s×1", owner, c1, owner, c3, owner, c1, owner, c4); got != want {
			t.Errorf("editor save:\n got %s\nwant %s", got, want)
		}
	})
}

// TestToolsInFuseSession: git, a Go build and an editor-style save work
// inside a FUSE session.
func TestToolsInFuseSession(t *testing.T) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	goroot := strings.TrimSpace(string(out))
	if err != nil || goroot == "" {
		skipOrFail(t, "no Go toolchain on PATH: %v", err)
	}
	if resolved, err := filepath.EvalSymlinks(goroot); err == nil {
		goroot = resolved
	}
	// The toolchain reaches the session as a host path (a default one such
	// as /usr covers /usr/local/go; anything else is added).
	e := newEnv(t)
	e.overlay = "fuse"
	e.startWithConfig("sandbox:\n  host_paths: [/usr, /bin, /sbin, /lib, /lib32, /lib64, /libx32, /etc, /opt, /nix, " + goroot + "]\n")
	id := e.createSandbox(e.project(map[string]string{
		"go.mod":  "module example.com/tiny\n\ngo 1.21\n",
		"main.go": "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"tiny ok\") }\n",
		"README":  "one\ntwo\n",
	}))
	ws := e.session(id)
	steps := []struct{ name, script, want string }{
		{"git", "git init -q . && git add -A && git -c user.email=t@e -c user.name=t commit -qm init && echo change >> README && git status --porcelain",
			" M README"},
		{"go build", "export PATH=" + goroot + "/bin:$PATH GOCACHE=/tmp/gocache GOPATH=/tmp/gopath GOFLAGS=-mod=mod GOTOOLCHAIN=local && " +
			"go build -o /tmp/tiny . && /tmp/tiny", "tiny ok"},
		{"editor save", `python3 -c '
import os
with open("README.tmp~", "w") as t:
    t.write("ONE\ntwo\nchange\n")
os.rename("README.tmp~", "README")
' && cat README && git diff --stat | tail -1`, "ONE\ntwo\nchange\n 1 file changed, 2 insertions(+), 1 deletion(-)"},
	}
	for _, st := range steps {
		out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "120000", st.script)
		if out["status"] != "ok" || out["output"] != st.want {
			t.Fatalf("%s: %v", st.name, out)
		}
	}
}

// TestDockerImageFuseWorkspace: an image sandbox on the FUSE driver keeps
// the kernel overlay for its root and serves /workspace through FUSE; the
// session's workspace changes publish as usual.
func TestDockerImageFuseWorkspace(t *testing.T) {
	requireDocker(t)
	e, id := fuseSandboxArgs(t, map[string]string{"README.md": "project\n"}, "--image", busyboxImage)
	out := e.shell(id, `grep -E " / | /workspace " /proc/mounts | cut -d" " -f2,3 | sort && cat /workspace/README.md && echo x > /workspace/made.txt`)
	if want := "/ overlay\n/workspace fuse.esbx"; !strings.Contains(out, want) || !strings.Contains(out, "project") {
		t.Fatalf("mounts and content:\n%s", out)
	}
	if got := e.rt(id, "file_read", "--path", "made.txt")["content"]; got != "x" {
		t.Fatalf("published made.txt: %v", got)
	}
}
