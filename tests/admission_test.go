package tests

import (
	"bufio"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"
)

// burst sends n copies of one request at once: every connection is dialled
// first, then all of them write their request line together, so the
// supervisor handles them concurrently. It returns the n responses.
func (e *env) burst(n int, op, sandboxID string, args map[string]any) []map[string]any {
	e.t.Helper()
	b, err := json.Marshal(map[string]any{"op": op, "scope": map[string]any{"kind": "sandbox", "sandbox_id": sandboxID}, "args": args})
	if err != nil {
		e.t.Fatal(err)
	}
	conns := make([]net.Conn, n)
	for i := range conns {
		if conns[i], err = net.Dial("unix", e.socket()); err != nil {
			e.t.Fatal(err)
		}
		defer conns[i].Close()
	}
	out := make([]map[string]any, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
			<-start
			if _, errs[i] = c.Write(append(b, '\n')); errs[i] != nil {
				return
			}
			line, err := bufio.NewReader(c).ReadBytes('\n')
			if errs[i] = err; err == nil {
				errs[i] = json.Unmarshal(line, &out[i])
			}
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			e.t.Fatalf("%s request %d: %v", op, i, err)
		}
	}
	return out
}

// admitted counts the successes of a burst and checks that every refusal
// is server_busy naming the cap.
func admitted(t *testing.T, out []map[string]any, detail string, limit int) int {
	t.Helper()
	n := 0
	for _, m := range out {
		switch errKind(m) {
		case "":
			n++
		case "server_busy":
			d, _ := m["error"].(map[string]any)["details"].(map[string]any)
			if v, _ := d[detail].(float64); int(v) != limit || d["limit_scope"] != "sandbox" {
				t.Fatalf("refusal without the cap in its details: %v", m)
			}
		default:
			t.Fatalf("want success or server_busy, got %v", m)
		}
	}
	return n
}

// TestConcurrentAdmission fires more simultaneous requests than a cap
// allows: exactly the cap's worth are admitted, the rest get server_busy
// (issue 13 item 6: admission used to count only commands and sessions that
// had finished starting, so a burst got past the caps).
func TestConcurrentAdmission(t *testing.T) {
	const n, k = 12, 3
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		writeConfig(t, e, "runtime:\n  command:\n    max_active_per_sandbox: 3\n  workspace:\n    max_sessions_per_sandbox: 3\n")
		e.start()
		project := e.project(map[string]string{"a.txt": "a\n"})
		long := map[string]any{"cmd": "sleep 60", "yield_time_ms": 0}

		t.Run("commands in one session", func(t *testing.T) {
			id := e.createSandbox(project)
			ws := e.session(id)
			out := e.burst(n, "exec_command", id, map[string]any{"cmd": "sleep 60", "yield_time_ms": 0, "workspace_session_id": ws})
			if got := admitted(t, out, "max_active_commands", k); got != k {
				t.Fatalf("%d of %d commands admitted under a cap of %d", got, n, k)
			}
		})
		t.Run("commands in implicit sessions", func(t *testing.T) {
			id := e.createSandbox(project)
			out := e.burst(n, "exec_command", id, long)
			if got := admitted(t, out, "max_active_commands", k); got != k {
				t.Fatalf("%d of %d commands admitted under a cap of %d", got, n, k)
			}
		})
		t.Run("sessions", func(t *testing.T) {
			id := e.createSandbox(project)
			out := e.burst(n, "create_workspace_session", id, map[string]any{})
			if got := admitted(t, out, "max_workspace_sessions", k); got != k {
				t.Fatalf("%d of %d sessions admitted under a cap of %d", got, n, k)
			}
			// A refused or failed start gives its slot back: after one
			// destroy exactly one more session fits.
			var ws string
			for _, m := range out {
				if errKind(m) == "" {
					ws, _ = m["workspace_session_id"].(string)
				}
			}
			e.rt(id, "destroy_workspace_session", "--workspace-session-id", ws)
			out = e.burst(n, "create_workspace_session", id, map[string]any{})
			if got := admitted(t, out, "max_workspace_sessions", k); got != 1 {
				t.Fatalf("%d sessions admitted into one free slot", got)
			}
		})
	})
}
