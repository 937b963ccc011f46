package tests

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// startOnSmallDisk starts the supervisor with its data directory on a
// tmpfs of the given size (e.g. "64m"), without root: the supervisor runs
// in a new user and mount namespace (unshare -Urm) where it may mount one.
// Only the supervisor (and the holders it starts) see that filesystem.
func (e *env) startOnSmallDisk(size string) {
	e.t.Helper()
	if out, err := exec.Command("unshare", "-Urm", "true").CombinedOutput(); err != nil {
		skipOrFail(e.t, "unprivileged user and mount namespaces (unshare -Urm): %v %s", err, out)
	}
	if err := os.MkdirAll(e.data(), 0o700); err != nil {
		e.t.Fatal(err)
	}
	e.supPrefix = []string{"unshare", "-Urm", "sh", "-c",
		`mount -t tmpfs -o size="$0",mode=0700 tmpfs "$1" && shift && exec "$@"`, size, e.data()}
	e.start()
}

// TestDiskFullKeepsCommandOutput: with the data directory full, a command
// still returns its output, marked as not stored (issue 13 item 3: it came
// back as output "" and total_lines 0, with no sign of the loss), while
// publish and session creation fail cleanly.
func TestDiskFullKeepsCommandOutput(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.startOnSmallDisk("64m")
		id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
		ws := e.session(id)
		// An agent fills the disk: the session's upper directory is on the
		// data directory's filesystem.
		e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "300000", "head -c 100M /dev/zero > fill; true")

		want := func(what string, out map[string]any) {
			t.Helper()
			msg, _ := out["transcript_error"].(string)
			if out["output"] != "hello\nworld" || num(t, out["total_lines"]) != 2 || out["transcript_lost"] != true ||
				!strings.Contains(msg, "no space left on device") {
				t.Fatalf("%s on a full disk: %v", what, out)
			}
		}
		out := e.exec(id, "--workspace-session-id", ws, "echo hello; echo world; exit 3")
		if out["status"] != "error" || num(t, out["exit_code"]) != 3 {
			t.Fatalf("exec_command on a full disk: %v", out)
		}
		want("exec_command", out)
		want("read_command_lines", e.rt(id, "read_command_lines", "--command-session-id", out["command_session_id"].(string)))

		e.rtFail(id, 1, "operation_failed", "create_workspace_session")
		e.publishFail(id, ws)

		// With space again, transcripts are stored as before.
		e.exec(id, "--workspace-session-id", ws, "rm fill")
		out = e.exec(id, "--workspace-session-id", ws, "echo fine")
		if out["output"] != "fine" || out["transcript_lost"] != nil {
			t.Fatalf("exec_command with space again: %v", out)
		}
	})
}
