package tests

import (
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Chaos beyond the supervisor (issue 36 item 3): what a session's holder,
// the disk, a stopped supervisor, a fork bomb and descriptor exhaustion do
// to the promises that work is never lost and nothing is half-published.

// holderPidOf is the holder pid of session ws (0 when it has none).
func (e *env) holderPidOf(id, ws string) int {
	e.t.Helper()
	for _, s := range e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any) {
		m := s.(map[string]any)
		if m["workspace_session_id"] == ws && m["holder_pid"] != nil {
			return int(num(e.t, m["holder_pid"]))
		}
	}
	return 0
}

// waitSize waits until the file p on the host is at least n bytes long.
func waitSize(t *testing.T, p string, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if st, err := os.Stat(p); err == nil && st.Size() >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not reach %d bytes", p, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkLines: s is lines "l<i> <pad>" for i = 0, 1, …, the last one
// possibly cut short (a write the kill interrupted), nothing else.
func checkLines(t *testing.T, what, s, pad string) int {
	t.Helper()
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		want := fmt.Sprintf("l%d %s", i, pad)
		if l == want || (i == len(lines)-1 && strings.HasPrefix(want, l)) {
			continue
		}
		t.Fatalf("%s: line %d is %.40q…, want %.40q…", what, i, l, want)
	}
	return len(lines)
}

// TestChaosHolderKilledMidWrite: kill -9 of a session's holder while a
// command writes into /workspace — through the kernel overlay, or through
// the FUSE overlay the holder itself serves — interrupts the command
// (holder_exited), brings the explicit session back with a new holder and
// every byte that reached its upper dir (whole lines, the last one perhaps
// cut), publishes nothing by itself, and a publish afterwards carries
// exactly what the session shows. An implicit session killed the same way
// publishes nothing at all; its work is a recovery artifact.
func TestChaosHolderKilledMidWrite(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWithProject(t)
		ws := e.session(id)
		e.rt(id, "file_write", "--workspace-session-id", ws, "--path", "kept.txt", "--content", "kept\n")
		pad := strings.Repeat("x", 4000) // one write(2) of ~4 KiB per line
		loop := fmt.Sprintf(`i=0; while :; do echo "l$i %s" >> log.txt; i=$((i+1)); done`, pad)
		old := e.holderPidOf(id, ws)
		if old == 0 {
			t.Fatal("no holder pid")
		}
		w := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "0", loop)
		// Killed as soon as 100 KB are written: the FUSE holder's queued
		// write notices are applied before its death is noticed (see the
		// issue 36 report), so more writes only make that wait longer.
		waitSize(t, filepath.Join(e.data(), "sandboxes", id, "sessions", ws, "upper", "log.txt"), 100_000)
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		r := e.waitDone(id, w["command_session_id"].(string))
		t.Logf("the command was terminal %s after the kill", time.Since(killed).Round(time.Millisecond))
		if r["status"] != "error" || r["interrupted"] != true || r["interrupt_reason"] != "holder_exited" {
			t.Fatalf("the writing command after its holder's kill: %v", r)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			if p := e.holderPidOf(id, ws); p != 0 && p != old {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the session did not come back: %v", e.rt(id, "list_workspace_sessions"))
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("a new holder %s after the kill", time.Since(killed).Round(time.Millisecond))
		// The upper dir holds what reached it (both drivers write it in
		// one format); the session shows exactly that.
		b, err := os.ReadFile(filepath.Join(e.data(), "sandboxes", id, "sessions", ws, "upper", "log.txt"))
		if err != nil {
			t.Fatal(err)
		}
		n := checkLines(t, "log.txt after the kill", strings.TrimSuffix(string(b), "\n"), pad)
		sum := e.rt(id, "exec_command", "--workspace-session-id", ws, "sha256sum log.txt; cat kept.txt")["output"].(string)
		if want := fmt.Sprintf("%x  log.txt\nkept", sha256.Sum256(b)); sum != want {
			t.Fatalf("the session after the kill shows %q, want %q (%d lines in its upper dir)", sum, want, n)
		}
		e.rtFail(id, 1, "not_found", "file_read", "--path", "log.txt")
		e.rt(id, "publish_workspace_session", "--workspace-session-id", ws)
		if head := e.rt(id, "exec_command", "sha256sum log.txt; cat kept.txt")["output"].(string); head != sum {
			t.Fatalf("published log.txt: %q, the session showed %q", head, sum)
		}

		imp := e.exec(id, "--yield-time-ms", "0", strings.ReplaceAll(loop, "log.txt", "implicit.txt"))
		ipid := e.holderPidOf(id, imp["workspace_session_id"].(string))
		waitSize(t, filepath.Join(e.data(), "sandboxes", id, "sessions", imp["workspace_session_id"].(string), "upper", "implicit.txt"), 100_000)
		if err := syscall.Kill(ipid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if r := e.waitDone(id, imp["command_session_id"].(string)); r["interrupt_reason"] != "holder_exited" || r["publish"] != nil {
			t.Fatalf("implicit command after its holder's kill: %v", r)
		}
		e.rtFail(id, 1, "not_found", "file_read", "--path", "implicit.txt")
	})
}

// supPath is a path of the supervisor's data directory as the supervisor
// sees it (startOnSmallDisk mounts it in the supervisor's own namespace).
func (e *env) supPath(rel ...string) string {
	return filepath.Join(append([]string{fmt.Sprintf("/proc/%d/root", e.sup.Process.Pid), e.data()}, rel...)...)
}

// TestChaosDiskFull: the disk fills up in the middle of a publish (the
// layer's staging copy) and of a sync (the new upper dir). Each fails with
// operation_failed naming the full disk and changes nothing: head stays,
// staging is empty, the session keeps its base, its files and no sync
// leftovers. With space again, both go through and carry everything.
func TestChaosDiskFull(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.startOnSmallDisk("64m")
		id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n", "shared.txt": "1\n2\n3\n"}))
		ballast := e.session(id)
		e.exec(id, "--workspace-session-id", ballast, "--yield-time-ms", "60000", "head -c 22M /dev/zero > ballast")
		ws := e.session(id)
		// 22 MiB more in the session: ~18 MiB stay free, less than a copy of it.
		e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "60000", "head -c 22M /dev/zero | tr '\\0' b > big && sed -i s/^1$/one/ shared.txt")
		stack := func() (int64, int64) {
			r := e.obsOK("layerstack", id, nil)
			return int64(r["manifest_version"].(float64)), int64(r["staging_entry_count"].(float64))
		}
		v0, _ := stack()
		unchanged := func(what string, base int64) {
			t.Helper()
			if v, staged := stack(); v != base || staged != 0 {
				t.Fatalf("after %s: head version %d (was %d), %d staging entries", what, v, base, staged)
			}
			if out := e.exec(id, "--workspace-session-id", ws, "wc -c < big; head -1 shared.txt")["output"]; out != "23068672\none" {
				t.Fatalf("the session after %s: %q", what, out)
			}
			if ents, _ := os.ReadDir(e.supPath("sandboxes", id, "sessions", ws)); len(ents) == 0 {
				t.Fatalf("cannot read the session's directory through %s", e.supPath())
			} else {
				for _, d := range ents {
					if strings.Contains(d.Name(), "sync") {
						t.Fatalf("after %s: leftover %s in the session's directory", what, d.Name())
					}
				}
			}
		}
		full := func(what string, body map[string]any) {
			t.Helper()
			if msg, _ := body["message"].(string); !strings.Contains(msg, "no space left on device") {
				t.Fatalf("%s on a full disk: %v, want the full disk named", what, body)
			}
		}
		full("publish", e.publishFail(id, ws))
		unchanged("a publish on a full disk", v0)
		e.rtFail(id, 1, "not_found", "file_read", "--path", "big")

		// Someone else publishes line 3: the sync must merge, on a full disk.
		e.rt(id, "file_write", "--path", "shared.txt", "--content", "1\n2\nthree\n")
		v1, _ := stack()
		full("sync", e.syncFail(id, ws, "operation_failed"))
		unchanged("a sync on a full disk", v1)
		if e.sessionBaseVersion(id, ws) != v0 {
			t.Fatal("a failed sync moved the session")
		}

		// Space again: both go through.
		e.rt(id, "destroy_workspace_session", "--workspace-session-id", ballast)
		e.rt(id, "sync_workspace_session", "--workspace-session-id", ws)
		if got := e.sessionRead(id, ws, "shared.txt"); got != "one\n2\nthree" || e.sessionBaseVersion(id, ws) != v1 {
			t.Fatalf("synced with space again: %q on base %d", got, e.sessionBaseVersion(id, ws))
		}
		e.rt(id, "publish_workspace_session", "--workspace-session-id", ws)
		if out := e.exec(id, "wc -c < big; tr -d b < big | wc -c; cat shared.txt")["output"]; out != "23068672\n0\none\n2\nthree" {
			t.Fatalf("published with space again: %q", out)
		}
	})
}

// TestChaosDescriptorExhaustion: a supervisor at its RLIMIT_NOFILE (256
// here, lowered for the test) still answers: health is served, new work
// (a session, a command) is refused with server_busy naming
// max_open_files, and once descriptors are released work goes on. Idle
// clients take the descriptors. Before, accept(2) failed with EMFILE and
// every client, health included, waited with no answer.
func TestChaosDescriptorExhaustion(t *testing.T) {
	e := newEnv(t)
	writeConfig(t, e, "supervisor:\n  max_concurrent_connections: 4096\n  request_read_timeout_s: 600\n")
	e.supPrefix = []string{"sh", "-c", `ulimit -n 256 && exec "$@"`, "sh"}
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	ws := e.session(id)
	fds := func() int {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", e.sup.Process.Pid))
		return len(ents)
	}
	var idle []net.Conn
	closeIdle := func() {
		for _, c := range idle {
			c.Close()
		}
		idle = nil
	}
	defer closeIdle()
	// Idle clients, one at a time, until one is no longer accepted (the
	// supervisor's descriptor count stops growing).
	for len(idle) < 400 {
		before := fds()
		c, err := net.Dial("unix", e.socket())
		if err != nil {
			t.Fatalf("dial with %d idle clients: %v", len(idle), err)
		}
		idle = append(idle, c)
		grew := false
		for deadline := time.Now().Add(time.Second); !grew && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			grew = fds() > before
		}
		if !grew {
			break
		}
	}
	t.Logf("%d idle clients, %d descriptors open in the supervisor", len(idle), fds())
	if len(idle) >= 400 {
		t.Fatalf("400 idle clients did not exhaust 256 descriptors")
	}
	r, err := e.callWithin(30*time.Second, "health", "", nil)
	if err != nil || errKind(r) != "" || r["status"] == nil {
		t.Fatalf("health at the descriptor limit: %v %v", r, err)
	}
	for _, req := range []struct {
		op   string
		args map[string]any
	}{{"create_workspace_session", nil}, {"exec_command", map[string]any{"workspace_session_id": ws, "cmd": "true"}}} {
		r, err := e.callWithin(30*time.Second, req.op, id, req.args)
		details, _ := r["error"].(map[string]any)["details"].(map[string]any)
		if err != nil || errKind(r) != "server_busy" || details["max_open_files"] != float64(256) || !strings.Contains(errMsg(r), "file descriptors") {
			t.Fatalf("%s at the descriptor limit: %v %v, want server_busy naming max_open_files 256", req.op, r, err)
		}
	}
	closeIdle()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := e.callWithin(30*time.Second, "exec_command", id, map[string]any{"workspace_session_id": ws, "cmd": "echo back"})
		if err == nil && errKind(r) == "" && r["output"] == "back" {
			break
		}
		if time.Now().After(deadline) || (errKind(r) != "" && errKind(r) != "server_busy") {
			t.Fatalf("exec_command once the idle clients are gone: %v %v", r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestChaosSupervisorStopped: while the supervisor is stopped (SIGSTOP;
// 30 s in the issue, shortened here with SANDBOX_CLIENT_PROBE_S=1)
// waiting clients give up with connection_error naming the stopped pid and
// the unknown outcome, instead of waiting forever; once it runs again
// requests are answered and a command that ran across the stop finishes.
func TestChaosSupervisorStopped(t *testing.T) {
	e := newEnv(t)
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	ws := e.session(id)
	run := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "0", "sleep 2; echo done > done.txt; echo finished")
	pid := e.sup.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	probe := []string{"SANDBOX_CLIENT_PROBE_S=1"}
	clients := [][]string{
		{"sandbox-manager-cli", "list_sandboxes"},
		{"sandbox-runtime-cli", "--sandbox-id", id, "file_read", "--path", "a.txt"},
		{"sandbox-runtime-cli", "--sandbox-id", id, "exec_command", "--workspace-session-id", ws, "echo hi"},
	}
	results := make([]result, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() { results[i] = e.runEnv(probe, c[0], c[1:]...) })
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 1 || r.stdout != "" {
			t.Fatalf("%v against a stopped supervisor: exit %d stdout %q stderr %q", clients[i], r.code, r.stdout, r.stderr)
		}
		body, _ := r.obj(t)["error"].(map[string]any)
		details, _ := body["details"].(map[string]any)
		msg, _ := body["message"].(string)
		if body["kind"] != "connection_error" || !strings.Contains(msg, fmt.Sprintf("supervisor pid %d is stopped", pid)) ||
			!strings.Contains(msg, "outcome is unknown") || details["supervisor_state"] != "stopped" || details["outcome"] != "unknown" {
			t.Fatalf("%v against a stopped supervisor: %s", clients[i], r.stderr)
		}
	}
	resume()
	e.mgr("list_sandboxes")
	if r := e.waitDone(id, run["command_session_id"].(string)); r["status"] != "ok" || !strings.Contains(fmt.Sprint(r["output"]), "finished") {
		t.Fatalf("the command across the stop: %v", r)
	}
	if got := e.sessionRead(id, ws, "done.txt"); got != "done" {
		t.Fatalf("done.txt after the stop: %q", got)
	}
}

// TestChaosForkBomb: a command that forks until it cannot gets EAGAIN at
// the session's pids limit (resource profile "standard", pids_max 256),
// even where no pids cgroup is delegated (the shim's RLIMIT_NPROC, counted
// per session user namespace), instead of taking the user's whole process
// limit; the session and the supervisor go on. The bomb is bounded at 600
// processes so that, without the limit, it ends rather than hurting the
// host.
func TestChaosForkBomb(t *testing.T) {
	e := newEnv(t)
	writeConfig(t, e, "sandbox:\n  resource_profile: standard\n")
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	ws := e.session(id)
	other := e.session(id)
	if out := e.exec(id, "--workspace-session-id", ws, "ulimit -u")["output"]; out != "256" {
		t.Fatalf("a command's process limit: %q, want 256", out)
	}
	bomb := `perl -e 'my @k; for (1..600) { my $p = fork(); if (!defined $p) { print "EAGAIN after ", scalar(@k), " ($!)\n"; last } ` +
		`if ($p == 0) { sleep 120; exit 0 } push @k, $p } print "forked ", scalar(@k), "\n"; ` +
		`open(my $f, ">", "bomb-held") or die; close $f; sleep 1 while ! -e "release"; kill 9, @k; 1 while wait() != -1'`
	run := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "0", "--timeout-ms", "120000", bomb)
	waitSize(t, filepath.Join(e.data(), "sandboxes", id, "sessions", ws, "upper", "bomb-held"), 0)
	// At its limit the session holds its processes; another session forks
	// freely, and the supervisor answers.
	if out := e.exec(id, "--workspace-session-id", other, "echo fine | cat")["output"]; out != "fine" {
		t.Fatalf("another session during the bomb: %q", out)
	}
	e.obsOK("health", "", nil)
	e.rt(id, "file_write", "--workspace-session-id", ws, "--path", "release", "--content", "")
	r := e.waitDone(id, run["command_session_id"].(string))
	out := fmt.Sprint(r["output"])
	n := -1
	if _, after, ok := strings.Cut(out, "EAGAIN after "); ok {
		_, _ = fmt.Sscanf(after, "%d", &n)
	}
	if n >= 256 || n < 100 {
		t.Fatalf("the fork bomb: %v, want EAGAIN after 100-255 forks", r)
	}
	if out := e.exec(id, "--workspace-session-id", ws, "echo back | cat")["output"]; out != "back" {
		t.Fatalf("the session after the bomb: %q", out)
	}
}
