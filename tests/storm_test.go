package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// TestStorm runs 8 workers against one sandbox for ESBX_STORM_SECONDS (15 s
// by default; the full run is 60), each alternating a bare
// exec_command (an implicit session: create, run, finalize, publish) with an
// explicit create → exec → publish (or destroy) cycle, all on disjoint
// paths. Expected errors: server_busy only (an admission limit; the worker
// backs off and retries). Anything else is a failure, as is a finalization
// that fails or takes longer than runtime.workspace.finalize_timeout_s
// (30 s). At the end no session, holder, mount or session directory may be
// left, the LayerStack must verify and every acknowledged file be in head.
func TestStorm(t *testing.T) {
	secs := 15
	if v, err := strconv.Atoi(os.Getenv("ESBX_STORM_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	e := newEnv(t)
	e.start()
	sb := e.createSandbox(e.project(map[string]string{"seed.txt": "seed\n"}))
	const workers = 8
	stop := time.Now().Add(time.Duration(secs) * time.Second)

	var mu sync.Mutex
	want := map[string]string{}
	counts := map[string]int{}
	var slowest time.Duration
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			// call retries server_busy with back-off and reports anything else.
			call := func(op string, args map[string]any) (map[string]any, bool) {
				backoff := 20 * time.Millisecond
				for {
					r, err := e.call(op, sb, args)
					if err != nil {
						t.Errorf("worker %d %s: %v", w, op, err)
						return nil, false
					}
					if errKind(r) == "server_busy" && time.Now().Before(stop.Add(30*time.Second)) {
						mu.Lock()
						counts["server_busy retries"]++
						mu.Unlock()
						time.Sleep(backoff)
						backoff = min(2*backoff, time.Second)
						continue
					}
					if errKind(r) != "" {
						t.Errorf("worker %d %s %v: unexpected error %v", w, op, args, r)
						return nil, false
					}
					return r, true
				}
			}
			for n := 0; time.Now().Before(stop); n++ {
				if n%2 == 0 {
					p := fmt.Sprintf("imp/w%d-%d.txt", w, n)
					began := time.Now()
					r, ok := call("exec_command", map[string]any{"cmd": fmt.Sprintf("mkdir -p imp && echo %d-%d > %s", w, n, p), "yield_time_ms": 60000})
					took := time.Since(began)
					if !ok {
						continue
					}
					if r["status"] != "ok" || r["publish"] == nil || r["finalization_failed"] != nil {
						t.Errorf("worker %d implicit command: %v", w, r)
						continue
					}
					if took > 30*time.Second {
						t.Errorf("worker %d: implicit finalization took %s (> finalize_timeout_s 30 s)", w, took)
					}
					mu.Lock()
					want[p] = fmt.Sprintf("%d-%d\n", w, n)
					counts["implicit"]++
					slowest = max(slowest, took)
					mu.Unlock()
					continue
				}
				r, ok := call("create_workspace_session", nil)
				if !ok {
					continue
				}
				ws := r["workspace_session_id"].(string)
				p := fmt.Sprintf("exp/w%d-%d.txt", w, n)
				r, ok = call("exec_command", map[string]any{"workspace_session_id": ws, "cmd": fmt.Sprintf("mkdir -p exp && echo %d-%d > %s", w, n, p), "yield_time_ms": 60000})
				if ok && r["status"] != "ok" {
					t.Errorf("worker %d explicit command: %v", w, r)
				}
				if n%4 == 3 {
					if _, ok := call("destroy_workspace_session", map[string]any{"workspace_session_id": ws}); ok {
						mu.Lock()
						counts["explicit destroyed"]++
						mu.Unlock()
					}
					continue
				}
				began := time.Now()
				if r, ok := call("publish_workspace_session", map[string]any{"workspace_session_id": ws}); ok {
					if r["destroyed"] != true || r["publish"] == nil {
						t.Errorf("worker %d publish: %v", w, r)
					}
					mu.Lock()
					want[p] = fmt.Sprintf("%d-%d\n", w, n)
					counts["explicit published"]++
					slowest = max(slowest, time.Since(began))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d workers for %d s: %v; slowest finalize/publish %s", workers, secs, counts, slowest.Round(time.Millisecond))
	if counts["implicit"] == 0 || counts["explicit published"] == 0 {
		t.Fatalf("the storm did no work: %v", counts)
	}

	// Nothing leaked: sessions, holders, mounts, session directories.
	if got := e.mustCall("list_workspace_sessions", sb, nil)["workspace_sessions"].([]any); len(got) != 0 {
		t.Errorf("sessions left after the storm: %v", got)
	}
	// The sandbox keeps one spare holder for its next implicit session
	// (#18); anything more is a leak. destroy_sandbox below must end it.
	deadline := time.Now().Add(10 * time.Second)
	for len(e.ourProcesses()) > 1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := e.ourProcesses(); len(left) > 1 {
		t.Errorf("processes left after the storm (one spare holder allowed): %v", left)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), e.root) {
		t.Errorf("a mount below %s is left", e.root)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.data(), "sandboxes", sb, "sessions")); len(ents) != 0 {
		t.Errorf("session directories left: %v", ents)
	}
	// Every acknowledged file is in head, and the LayerStack verifies.
	dir := filepath.Join(e.data(), "sandboxes", sb, "layerstack")
	e.checkStack(t, dir, map[string]string{}, nil, func(f string, a ...any) { t.Helper(); t.Fatalf(f, a...) })
	st, err := layers.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	head, _ := st.Head()
	view := st.View(head)
	for p, c := range want {
		if b, err := view.ReadFile(p); err != nil || string(b) != c {
			t.Errorf("%s in head: %q %v, want %q", p, b, err, c)
		}
	}
	if b, err := view.ReadFile("seed.txt"); err != nil || string(b) != "seed\n" {
		t.Errorf("seed.txt: %q %v", b, err)
	}

	// Destroying the sandbox ends its spare holder too: nothing is left.
	e.mustCall("destroy_sandbox", "", map[string]any{"sandbox_id": sb})
	deadline = time.Now().Add(10 * time.Second)
	for len(e.ourProcesses()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := e.ourProcesses(); len(left) > 0 {
		t.Errorf("processes left after destroy_sandbox: %v", left)
	}
}
