package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// forkView is everything a session sees of its workspace, through commands
// and through the file operations, for comparing a fork with its source.
type forkView struct {
	Tree  string // find with kinds and symlink targets, then every file's content
	Root  []any  // file_list of the root
	Sub   []any  // file_list of newdir
	Read  any    // file_read of shared.txt
	Files []diffFileT
}

func (e *env) forkView(id, ws string) forkView {
	e.t.Helper()
	out := e.exec(id, "--workspace-session-id", ws,
		`find . -mindepth 1 -printf '%p %y %l %m\n' | LC_ALL=C sort; find . -type f | LC_ALL=C sort | xargs -r md5sum`)
	if out["status"] != "ok" {
		e.t.Fatalf("view of %s: %v", ws, out)
	}
	return forkView{
		Tree:  out["output"].(string),
		Root:  e.rt(id, "file_list", "--workspace-session-id", ws)["entries"].([]any),
		Sub:   e.rt(id, "file_list", "--workspace-session-id", ws, "--path", "newdir")["entries"].([]any),
		Read:  e.rt(id, "file_read", "--workspace-session-id", ws, "--path", "shared.txt")["content"],
		Files: e.diff(id, ws).Files,
	}
}

// forkProject: shared.txt has five lines so the source and the fork can
// edit different ones and still merge cleanly.
func forkProject(t *testing.T) (*env, string) {
	t.Helper()
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"shared.txt": "one\ntwo\nthree\nfour\nfive\n", "old.txt": "old\n", "keep/k.txt": "k\n"})
	return e, e.createSandbox(root)
}

func (e *env) fork(id, src string, args ...string) map[string]any {
	e.t.Helper()
	return e.rt(id, append([]string{"fork_workspace_session", "--workspace-session-id", src}, args...)...)
}

func sessionDirs(t *testing.T, e *env, id string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.data(), "sandboxes", id, "sessions"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	return names
}

func activeLeases(t *testing.T, e *env, id string) string {
	t.Helper()
	return fmt.Sprint(e.obsOK("snapshot", id, nil)["stack"].(map[string]any)["active_leases"])
}

// TestForkWorkspaceSession: a fork sees exactly its source's view (edits,
// a deleted lower file, a new directory, a symlink), survives a restart,
// then diverges from it; blame in the fork credits the source's command;
// both publish like any two sessions.
func TestForkWorkspaceSession(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := forkProject(t)
		src := e.session(id, "--agent", "alice")
		out := e.exec(id, "--workspace-session-id", src,
			`sed -i 's/^one$/ONE/' shared.txt && rm old.txt && mkdir -p newdir/sub && echo n > newdir/sub/n.txt && `+
				`ln -s shared.txt link && echo made > made.txt && chmod 0751 newdir`)
		if out["status"] != "ok" {
			t.Fatalf("source edits: %v", out)
		}
		srcCmd := out["command_session_id"].(string)
		e.rt(id, "file_write", "--workspace-session-id", src, "--path", "newdir/w.txt", "--content", "written\n")

		f := e.fork(id, src, "--agent", "bob")
		fork, _ := f["workspace_session_id"].(string)
		var srcObj map[string]any
		for _, s := range e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any) {
			if s.(map[string]any)["workspace_session_id"] == src {
				srcObj = s.(map[string]any)
			}
		}
		if !strings.HasPrefix(fork, "ws-") || fork == src || f["forked_from"] != src || f["agent"] != "bob" || f["finalize_policy"] != "no_op" ||
			f["network_profile"] != "shared" || !reflect.DeepEqual(f["base_revision"], srcObj["base_revision"]) || f["overlay_driver"] != driverOf(t) {
			t.Fatalf("fork result: %v (source %v)", f, srcObj)
		}
		want := e.forkView(id, src)
		if got := e.forkView(id, fork); !reflect.DeepEqual(got, want) {
			t.Fatalf("fork's view differs from its source's:\n got %+v\nwant %+v", got, want)
		}
		if !strings.Contains(want.Tree, "./link l shared.txt") || strings.Contains(want.Tree, "old.txt") || !strings.Contains(want.Tree, "./newdir/sub/n.txt f") {
			t.Fatalf("source view: %s", want.Tree)
		}

		// A restart restores the fork with its view.
		e.stop()
		e.start()
		if got := e.forkView(id, fork); !reflect.DeepEqual(got, want) {
			t.Fatalf("fork's view after a restart:\n got %+v\nwant %+v", got, want)
		}

		// Blame in the fork credits the source's command for its line.
		blame := func(ws string) string {
			return blameRanges(t, e.rt(id, "file_blame", "--path", "shared.txt", "--workspace-session-id", ws))
		}
		srcOwner, forkOwner := "workspace_session:"+src, "workspace_session:"+fork
		if got, w := blame(fork), fmt.Sprintf("%s:%s×1 original×4", srcOwner, srcCmd); got != w {
			t.Fatalf("fork's blame:\n got %s\nwant %s", got, w)
		}
		if r := rangeAt(e.rt(id, "file_blame", "--path", "shared.txt", "--workspace-session-id", fork), 0); r["agent"] != "alice" {
			t.Fatalf("source's range in the fork: %v", r)
		}

		// They diverge.
		out = e.exec(id, "--workspace-session-id", fork, "sed -i 's/^five$/FIVE/' shared.txt && echo f > fork-only.txt && rm made.txt")
		if out["status"] != "ok" {
			t.Fatalf("fork edits: %v", out)
		}
		forkCmd := out["command_session_id"].(string)
		e.rt(id, "file_write", "--workspace-session-id", src, "--path", "src-only.txt", "--content", "s\n")
		if got := e.exec(id, "--workspace-session-id", src, "cat shared.txt made.txt; ls -1")["output"]; got != "ONE\ntwo\nthree\nfour\nfive\nmade\nkeep\nlink\nmade.txt\nnewdir\nshared.txt\nsrc-only.txt" {
			t.Fatalf("source after the fork's edits: %q", got)
		}
		if got := e.exec(id, "--workspace-session-id", fork, "cat shared.txt; ls -1")["output"]; got != "ONE\ntwo\nthree\nfour\nFIVE\nfork-only.txt\nkeep\nlink\nnewdir\nshared.txt" {
			t.Fatalf("fork after the source's edits: %q", got)
		}
		if got, w := blame(fork), fmt.Sprintf("%s:%s×1 original×3 %s:%s×1", srcOwner, srcCmd, forkOwner, forkCmd); got != w {
			t.Fatalf("fork's blame after its edit:\n got %s\nwant %s", got, w)
		}
		if got, w := blame(src), fmt.Sprintf("%s:%s×1 original×4", srcOwner, srcCmd); got != w {
			t.Fatalf("source's blame after the fork's edit:\n got %s\nwant %s", got, w)
		}

		// The fork publishes first; the source then merges onto it.
		if p := e.rt(id, "publish_workspace_session", "--workspace-session-id", fork); p["destroyed"] != true {
			t.Fatalf("fork's publish: %v", p)
		}
		if got, w := blameRanges(t, e.rt(id, "file_blame", "--path", "shared.txt")), fmt.Sprintf("%s:%s×1 original×3 %s:%s×1", srcOwner, srcCmd, forkOwner, forkCmd); got != w {
			t.Fatalf("head's blame after the fork's publish:\n got %s\nwant %s", got, w)
		}
		p := e.rt(id, "publish_workspace_session", "--workspace-session-id", src)
		if p["destroyed"] != true {
			t.Fatalf("source's publish: %v", p)
		}
		got := e.exec(id, "cat shared.txt; ls -1; readlink link; cat newdir/w.txt")["output"]
		if w := "ONE\ntwo\nthree\nfour\nFIVE\nfork-only.txt\nkeep\nlink\nmade.txt\nnewdir\nshared.txt\nsrc-only.txt\nshared.txt\nwritten"; got != w {
			t.Fatalf("head after both publishes:\n got %q\nwant %q", got, w)
		}
	})
}

// TestForkOptionsAndRefusals: the fork's network profile defaults to the
// source's and can be chosen; bad requests and unforkable sources get the
// contract's envelope and leave nothing behind (no session directory, no
// lease), also when the copy fails half-way.
func TestForkOptionsAndRefusals(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := forkProject(t)
		src := e.session(id, "--network-profile", "offline", "--agent", "alice")
		ifaces := func(ws string) string {
			return e.exec(id, "--workspace-session-id", ws, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\n' ' '`)["output"].(string)
		}
		if got := ifaces(src); got != "lo " {
			t.Fatalf("offline source's interfaces: %q", got)
		}
		same := e.fork(id, src)
		if same["network_profile"] != "offline" || same["agent"] != nil {
			t.Fatalf("default fork: %v", same)
		}
		if got := ifaces(same["workspace_session_id"].(string)); got != "lo " {
			t.Fatalf("fork of an offline session has %q", got)
		}
		shared := e.fork(id, src, "--network-profile", "shared", "--agent", "carol")
		if shared["network_profile"] != "shared" || shared["agent"] != "carol" {
			t.Fatalf("shared fork: %v", shared)
		}
		if got := ifaces(shared["workspace_session_id"].(string)); got == "lo " {
			t.Fatalf("shared fork has only loopback")
		}

		dirs, leases := sessionDirs(t, e, id), activeLeases(t, e, id)
		nothingLeft := func(what string) {
			t.Helper()
			if got := sessionDirs(t, e, id); !reflect.DeepEqual(got, dirs) {
				t.Fatalf("%s left session directories: %v (before %v)", what, got, dirs)
			}
			if got := activeLeases(t, e, id); got != leases {
				t.Fatalf("%s left leases: %s (before %s)", what, got, leases)
			}
			if n := len(e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any)); n != len(dirs) {
				t.Fatalf("%s: %d sessions listed for %d directories", what, n, len(dirs))
			}
		}
		e.rtFail(id, 1, "not_found", "fork_workspace_session", "--workspace-session-id", "ws-nope")
		for _, bad := range []map[string]any{
			{"workspace_session_id": src, "network_profile": "lan"},
			{"workspace_session_id": src, "agent": "bad\x01agent"},
			{"workspace_session_id": src, "agent": strings.Repeat("a", 129)},
			{"network_profile": "shared"},
		} {
			m := e.rawObj(map[string]any{"op": "fork_workspace_session", "scope": map[string]any{"kind": "sandbox", "sandbox_id": id}, "args": bad})
			if errKind(m) != "invalid_request" {
				t.Fatalf("fork %v: %v", bad, m)
			}
		}
		nothingLeft("bad requests")

		// A source with a running command is refused, naming it.
		run := e.exec(id, "--workspace-session-id", src, "--yield-time-ms", "0", "sleep 30")
		body := e.rtFail(id, 1, "operation_failed", "fork_workspace_session", "--workspace-session-id", src)
		if d := body["details"].(map[string]any); fmt.Sprint(d["active_command_session_ids"]) != fmt.Sprint([]any{run["command_session_id"]}) {
			t.Fatalf("running-command refusal: %v", body)
		}
		nothingLeft("a busy source")
		e.rt(id, "write_command_stdin", "--command-session-id", run["command_session_id"].(string), "\u0003")
		e.waitDone(id, run["command_session_id"].(string))

		// An implicit session is nobody's to fork.
		imp := e.exec(id, "--yield-time-ms", "0", "sleep 30")
		e.rtFail(id, 1, "not_found", "fork_workspace_session", "--workspace-session-id", imp["workspace_session_id"].(string))
		e.rt(id, "write_command_stdin", "--command-session-id", imp["command_session_id"].(string), "\u0003")
		e.waitDone(id, imp["command_session_id"].(string))
		for n := 0; len(sessionDirs(t, e, id)) != len(dirs) && n < 100; n++ {
			time.Sleep(50 * time.Millisecond) // the implicit session's finalization
		}

		// A copy that fails half-way (a file the session made unreadable
		// to its owner) rolls everything back.
		if out := e.exec(id, "--workspace-session-id", src, "mkdir -p a/b && echo x > a/b/x && echo s > a/secret && chmod 000 a/secret"); out["status"] != "ok" {
			t.Fatalf("unreadable file: %v", out)
		}
		body = e.rtFail(id, 1, "operation_failed", "fork_workspace_session", "--workspace-session-id", src)
		if d := body["details"].(map[string]any); d["stage"] != "copy" || d["workspace_session_id"] != src {
			t.Fatalf("failed copy: %v", body)
		}
		nothingLeft("a failed copy")
	})
}
