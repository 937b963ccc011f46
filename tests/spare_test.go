package tests

import (
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// alive reports whether process pid exists (a zombie counts).
func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// holderPids lists the supervisor's holder processes (sessions' and spare).
func holderPids(supervisor int) []int {
	return childPids(supervisor, func(argv []string) bool {
		return len(argv) >= 3 && argv[len(argv)-2] == "nsholder" && argv[len(argv)-1] == "serve"
	})
}

// waitHolders polls until the supervisor has n holder processes and
// returns them (sorted), or fails after 15 s.
func waitHolders(t *testing.T, e *env, n int, why string) []int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		pids := holderPids(e.sup.Process.Pid)
		if len(pids) == n {
			slices.Sort(pids)
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d holder processes %v, want %d", why, len(pids), pids, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSpareHolder (#18): after an implicit command a sandbox keeps one
// spare holder, which the next implicit session takes (every implicit
// session still runs in its own namespaces, also when two start at once);
// destroy_sandbox kills the spare, and so does a supervisor crash.
func TestSpareHolder(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		proj := e.project(map[string]string{"a.txt": "a\n"})
		id := e.createSandbox(proj)
		pidNS := func(out map[string]any) string {
			t.Helper()
			if out["status"] != "ok" {
				t.Fatalf("implicit command: %v", out)
			}
			ns := strings.TrimSpace(out["output"].(string))
			if !strings.HasPrefix(ns, "pid:[") {
				t.Fatalf("readlink /proc/self/ns/pid: %q", ns)
			}
			return ns
		}
		const nsCmd = "readlink /proc/self/ns/pid"
		pidNS(e.rt(id, "exec_command", nsCmd))
		spare := waitHolders(t, e, 1, "after one implicit command (its session gone, the spare started)")
		pidNS(e.rt(id, "exec_command", nsCmd))
		// The spare served that session (and died with it); a new one waits.
		next := waitHolders(t, e, 1, "after the second implicit command")
		if next[0] == spare[0] {
			t.Fatalf("spare holder %d was not taken by the implicit session", spare[0])
		}

		// Two implicit sessions at once: one takes the spare, the other
		// starts its own holder; never the same one. (Namespace inode
		// numbers are reused once freed: only live ones are compared.)
		var wg sync.WaitGroup
		outs := make([]result, 2)
		for i := range outs {
			wg.Go(func() {
				outs[i] = e.run("sandbox-runtime-cli", "--sandbox-id", id, "exec_command", "sleep 0.5; "+nsCmd)
			})
		}
		wg.Wait()
		var ns []string
		for _, r := range outs {
			if r.code != 0 {
				t.Fatalf("concurrent implicit command: exit %d: %s %s", r.code, r.stdout, r.stderr)
			}
			ns = append(ns, pidNS(r.obj(t)))
		}
		if ns[0] == ns[1] {
			t.Fatalf("two live implicit sessions share pid namespace %s", ns[0])
		}
		waitHolders(t, e, 1, "after the concurrent implicit commands")

		// destroy_sandbox leaves no holder behind, the spare included.
		e.mgr("destroy_sandbox", "--sandbox-id", id)
		if left := holderPids(e.sup.Process.Pid); len(left) > 0 {
			t.Fatalf("holder processes %v left after destroy_sandbox", left)
		}

		// A supervisor crash takes the spare with it.
		id = e.createSandbox(proj)
		pidNS(e.rt(id, "exec_command", nsCmd))
		spare = waitHolders(t, e, 1, "before the crash")
		e.kill9()
		deadline := time.Now().Add(10 * time.Second)
		for alive(spare[0]) {
			if time.Now().After(deadline) {
				t.Fatalf("spare holder %d still running 10 s after the supervisor was killed", spare[0])
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
