package tests

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// walCommits reads the state database's write-ahead log and returns the
// number of commits it holds since its last reset, and the reset's salt
// (a checkpoint that restarts the log changes it). A commit frame is one
// whose "database size after commit" field is not zero; frames past the
// first with another salt are leftovers of an earlier log.
func walCommits(t *testing.T, path string) (commits int, salt uint64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read WAL: %v", err)
	}
	if len(b) < 32 {
		return 0, 0
	}
	be := binary.BigEndian
	page := int(be.Uint32(b[8:12]))
	salt = be.Uint64(b[16:24])
	for off := 32; off+24+page <= len(b); off += 24 + page {
		if be.Uint64(b[off+8:off+16]) != salt {
			break
		}
		if be.Uint32(b[off+4:off+8]) != 0 {
			commits++
		}
	}
	return commits, salt
}

// TestCommandCommits: a command's records cost two commits of the state
// database (each one WAL fsync under synchronous=FULL): its running record
// with the sandbox's activity revision, and its terminal record with the
// next revision. Both survive a crash: after kill -9 the command is
// terminal with its exit code and the revision is the one last reported.
func TestCommandCommits(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWithProject(t)
		ws := e.session(id)
		wal := filepath.Join(e.data(), "state.db-wal")
		e.exec(id, "--workspace-session-id", ws, "true") // warm-up: the first command may start more than itself
		var n int
		var cmd string
		for try := 0; ; try++ {
			before, salt := walCommits(t, wal)
			out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "10000", "exit 7")
			if out["status"] != "error" || num(t, out["exit_code"]) != 7 {
				t.Fatalf("exec: %v", out)
			}
			cmd = out["command_session_id"].(string)
			// What the end of the command writes after its reply is counted too.
			time.Sleep(300 * time.Millisecond)
			after, salt2 := walCommits(t, wal)
			if salt2 == salt {
				n = after - before
				break
			}
			if try == 3 {
				t.Fatalf("the WAL was reset during each of %d commands", try+1)
			}
		}
		if n != 2 {
			t.Errorf("one command made %d commits of the state database, want 2", n)
		}
		rev := num(t, e.mgr("inspect_sandbox", "--sandbox-id", id)["activity_revision"])
		e.kill9()
		e.start()
		if got := num(t, e.mgr("inspect_sandbox", "--sandbox-id", id)["activity_revision"]); got != rev {
			t.Errorf("activity_revision after kill -9: %d, want %d", got, rev)
		}
		out := e.rt(id, "read_command_lines", "--command-session-id", cmd)
		if out["status"] != "error" || num(t, out["exit_code"]) != 7 || out["interrupted"] == true {
			t.Errorf("command after kill -9: %v", out)
		}
	})
}
