package tests

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// upperSwapScript swaps the session's directories d0..d3 (each holding
// file) with their symlinks dlinkN -> HOSTDIR back and forth until it is
// interrupted: renameat2(RENAME_EXCHANGE) where the overlay supports it
// (kernel), else (FUSE: EINVAL) two plain renames each way. Each state is
// held for a few milliseconds, so that a diff's capture mostly sees a
// consistent tree and a swap can fall between the capture and its reads;
// the 300 files of a/ sort before dN, so the diff reads them first, which
// widens that gap. The host directory is not visible in the session; the
// links only matter if the supervisor follows them when it reads the
// session's upper directory from the host.
const upperSwapScript = `cd /workspace && mkdir a && for i in $(seq 300); do echo $i > a/f$i; done && for i in 0 1 2 3; do mkdir d$i && echo inside > d$i/file && ln -s HOSTDIR dlink$i; done && exec python3 - <<'EOF'
import ctypes, os, random, time
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE, N = -100, 2, 4
def exchange(i):
    return libc.renameat2(AT_FDCWD, b"d%d" % i, AT_FDCWD, b"dlink%d" % i, RENAME_EXCHANGE) == 0
mode = "exchange" if exchange(0) and exchange(0) else "rename"
print("swapping by", mode, flush=True)
def to_link(i):
    if mode == "exchange":
        exchange(i)
    else:
        os.rename("d%d" % i, "dreal%d" % i); os.rename("dlink%d" % i, "d%d" % i)
def to_dir(i):
    if mode == "exchange":
        exchange(i)
    else:
        os.rename("d%d" % i, "dlink%d" % i); os.rename("dreal%d" % i, "d%d" % i)
end = time.time() + 300
while time.time() < end:
    for flip in (to_link, to_dir):
        for i in range(N):
            flip(i)
        time.sleep(random.uniform(0.002, 0.03))
EOF`

// upperSwapSettle stops in a known state: dN is the link to the host
// directory, drealN the directory.
const upperSwapSettle = `cd /workspace && for i in 0 1 2 3; do L=; D=; for n in d$i dlink$i dreal$i; do ` +
	`if [ -L $n ]; then L=$n; elif [ -d $n ]; then D=$n; fi; done; ` +
	`mv $D tmp$i && { [ $L = d$i ] || mv $L d$i; } && mv tmp$i dreal$i || exit 1; done; readlink d0`

// grepTree reports the regular files below dir that contain marker,
// never following a symlink (unreadable entries are skipped).
func grepTree(dir string, marker []byte) []string {
	var hits []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, marker) {
			hits = append(hits, p)
		}
		return nil
	})
	return hits
}

// TestSecurityUpperSymlinkSwap: a command swaps directories of its session
// with symlinks to a host directory in a loop while diff_workspace_session
// runs 200 times (with a dry-run publish every 20th); no diff, plan or
// error ever shows the host file's content, nothing under the supervisor's
// home holds it, and the session publishes the link as a link.
func TestSecurityUpperSymlinkSwap(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWithProject(t)
		// A host directory the user (and so the supervisor) can read,
		// outside the supervisor's home.
		var rb [12]byte
		_, _ = rand.Read(rb[:])
		marker := "host-secret-" + hex.EncodeToString(rb[:])
		hostDir := filepath.Join(e.root, "hostsecret")
		if err := os.MkdirAll(hostDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(hostDir, "file"), []byte(marker+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		ws := e.session(id)
		swap := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "1000", strings.ReplaceAll(upperSwapScript, "HOSTDIR", hostDir))
		if swap["status"] != "running" {
			t.Fatalf("swapper: %v", swap)
		}
		cmd := swap["command_session_id"].(string)
		const diffs = 200
		outcomes := map[string]int{}
		for i := range diffs {
			args := []string{"--sandbox-id", id, "diff_workspace_session", "--workspace-session-id", ws}
			if i%20 == 19 {
				args = []string{"--sandbox-id", id, "publish_workspace_session", "--workspace-session-id", ws, "--dry-run"}
			}
			r := e.run("sandbox-runtime-cli", args...)
			out := r.stdout + r.stderr
			outcome := "ok"
			if r.code != 0 {
				outcome = fmt.Sprintf("exit %d", r.code)
				if m, ok := decodeLine(r.stderr); ok {
					outcome = errKind(m)
				}
			}
			outcomes[args[2]+" "+outcome]++
			if strings.Contains(out, marker) {
				t.Fatalf("%s %d showed the host file's content: %s", args[2], i, out)
			}
			if r.code != 0 && r.code != 1 || strings.Contains(out, "internal_error") {
				t.Fatalf("%s %d: exit %d %s", args[2], i, r.code, out)
			}
		}
		t.Logf("outcomes: %v", outcomes)
		if read := e.rt(id, "read_command_lines", "--command-session-id", cmd); !strings.Contains(fmt.Sprint(swap, read), "swapping by") {
			t.Fatalf("the swapper did not run: %v %v", swap, read)
		} else {
			t.Logf("swapper: %v", read)
		}
		e.rt(id, "write_command_stdin", "--command-session-id", cmd, "\u0003")
		if done := e.waitDone(id, cmd); done["status"] == "running" {
			t.Fatalf("swapper still running: %v", done)
		}
		if hits := grepTree(e.home, []byte(marker)); len(hits) > 0 {
			t.Fatalf("the host file's content is in the supervisor's home: %v", hits)
		}
		// Leave every dN a link to the host directory: the publication
		// records the links, never what they point to.
		if out := e.exec(id, "--workspace-session-id", ws, upperSwapSettle); out["output"] != hostDir {
			t.Fatalf("settle: %v", out)
		}
		for _, p := range []string{"d0", "dreal0", "d0/file"} {
			r := e.run("sandbox-runtime-cli", "--sandbox-id", id, "diff_workspace_session", "--workspace-session-id", ws, "--paths", `["`+p+`"]`)
			if strings.Contains(r.stdout+r.stderr, marker) || r.code != 0 {
				t.Fatalf("diff %s: exit %d %s%s", p, r.code, r.stdout, r.stderr)
			}
		}
		pub := e.publish(id, ws)
		if pub["destroyed"] != true || strings.Contains(fmt.Sprint(pub), marker) {
			t.Fatalf("publish: %v", pub)
		}
		if hits := grepTree(e.home, []byte(marker)); len(hits) > 0 {
			t.Fatalf("the host file's content is in the supervisor's home after publish: %v", hits)
		}
		entries := e.rt(id, "file_list")["entries"].([]any)
		kinds := map[string]any{}
		for _, en := range entries {
			m := en.(map[string]any)
			kinds[m["name"].(string)] = m["kind"]
		}
		if kinds["d0"] != "symlink" || kinds["dreal0"] != "directory" {
			t.Fatalf("head has d0 as %v and dreal0 as %v, want the symlink and the directory: %v", kinds["d0"], kinds["dreal0"], entries)
		}
		if m, kind := e.rtTry(id, "file_read", "--path", "d0/file"); kind == "" || strings.Contains(fmt.Sprint(m), marker) {
			t.Fatalf("file_read d0/file from head: %v", m)
		}
	})
}
