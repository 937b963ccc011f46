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

// TestCommandCommits: the state database commits (each one WAL fsync
// under synchronous=FULL) of one command. In an explicit session, two: the
// running record with the sandbox's activity revision, the terminal record
// with the next revision and the records of the command it evicts (§6.7).
// In an implicit session also two: the session record with the running
// record and the revision, then the terminal record with the outcome of
// the finalization, the session record's removal, the revision and the
// evictions. Everything survives a crash:
// after kill -9 each command is terminal with its exit code, the evicted
// ones are reported evicted, and the revision is the one last reported.
func TestCommandCommits(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		// Three retained: the two warm-up commands are evicted by the last two cases.
		writeConfig(t, e, "runtime:\n  command:\n    max_terminal_entries: 3\n")
		e.start()
		id := e.createSandbox(e.project(map[string]string{"a": "a"}))
		ws := e.session(id)
		wal := filepath.Join(e.data(), "state.db-wal")
		// Warm-up: the first commands may start more than themselves.
		warm := []string{e.exec(id, "--workspace-session-id", ws, "true")["command_session_id"].(string),
			e.exec(id, "true")["command_session_id"].(string)}
		cases := []struct {
			name    string
			args    []string
			commits int
		}{
			{"explicit", []string{"--workspace-session-id", ws}, 2},
			{"implicit, evicting one", nil, 2},
			{"explicit, evicting one", []string{"--workspace-session-id", ws}, 2},
		}
		cmds := map[string]string{}
		for _, tc := range cases {
			var n int
			for try := 0; ; try++ {
				before, salt := walCommits(t, wal)
				out := e.exec(id, append(tc.args, "--yield-time-ms", "10000", "exit 7")...)
				if out["status"] != "error" || num(t, out["exit_code"]) != 7 {
					t.Fatalf("%s exec: %v", tc.name, out)
				}
				cmds[tc.name] = out["command_session_id"].(string)
				// What the end of the command writes after its reply is counted too.
				time.Sleep(500 * time.Millisecond)
				after, salt2 := walCommits(t, wal)
				if salt2 == salt {
					n = after - before
					break
				}
				if try == 3 {
					t.Fatalf("the WAL was reset during each of %d commands", try+1)
				}
			}
			if n != tc.commits {
				t.Errorf("%s: one command made %d commits of the state database, want %d", tc.name, n, tc.commits)
			}
		}
		rev := num(t, e.mgr("inspect_sandbox", "--sandbox-id", id)["activity_revision"])
		e.kill9()
		e.start()
		if got := num(t, e.mgr("inspect_sandbox", "--sandbox-id", id)["activity_revision"]); got != rev {
			t.Errorf("activity_revision after kill -9: %d, want %d", got, rev)
		}
		for name, cmd := range cmds {
			out := e.rt(id, "read_command_lines", "--command-session-id", cmd)
			if out["status"] != "error" || num(t, out["exit_code"]) != 7 || out["interrupted"] == true {
				t.Errorf("%s command after kill -9: %v", name, out)
			}
		}
		for _, cmd := range warm {
			body := e.rtFail(id, 1, "not_found", "read_command_lines", "--command-session-id", cmd)
			if body["details"].(map[string]any)["reason"] != "evicted" {
				t.Errorf("evicted %s after kill -9: %v", cmd, body)
			}
			if _, err := os.Stat(filepath.Join(e.data(), "commands", cmd)); !os.IsNotExist(err) {
				t.Errorf("evicted transcript %s kept: %v", cmd, err)
			}
		}
	})
}
