// Command soak is `make soak` (issue 36 item 2): SOAK_AGENTS agents work
// against one sandbox per overlay driver for SOAK_SECONDS — explicit
// sessions (commands with output and stdin, file writes, sync, fork,
// publish with and without keep, edits of one shared file that the
// publishes merge), implicit commands, sessionless writes and squashes —
// while the supervisor is killed with SIGKILL every -kill-every. Every 10 s
// it samples the supervisor: RSS and PSS, open descriptors, goroutines,
// holder processes, the SQLite WAL, the data directory's size and the
// layers of each sandbox. At the end every acknowledged write must be in
// the head. It writes soak.json and soak.png (the curves, drawn with
// gonum.org/v1/plot) into -out and exits 1 on a fault or a lost write.
//
// It is its own module so that the plotting library is a dependency of
// this tool only, never of the supervisor or its clients.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var errLost = errors.New("connection lost")

type soak struct {
	bin, home string
	mu        sync.Mutex
	sup       *exec.Cmd
	down      atomic.Bool // the supervisor is being killed or restarted

	ackMu sync.Mutex
	acked map[string]map[string]string // sandbox → path → content
	ops   map[string]int
	fault map[string][]string
}

func (s *soak) socket() string { return filepath.Join(s.home, "run", "supervisor.sock") }
func (s *soak) data() string   { return filepath.Join(s.home, "data") }

func (s *soak) environ() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EPHEMERAL_SANDBOX_HOME=") && !strings.HasPrefix(kv, "SANDBOX_") {
			out = append(out, kv)
		}
	}
	return append(out, "EPHEMERAL_SANDBOX_HOME="+s.home, "SANDBOX_NO_AUTOSTART=1")
}

func (s *soak) start() error {
	cmd := exec.Command(filepath.Join(s.bin, "sandbox-supervisor"), "serve")
	cmd.Env = s.environ()
	logf, err := os.OpenFile(filepath.Join(s.home, "supervisor.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("unix", s.socket()); err == nil {
			c.Close()
			s.mu.Lock()
			s.sup = cmd
			s.mu.Unlock()
			return nil
		}
	}
	return fmt.Errorf("the supervisor did not listen within 60 s (log: %s)", filepath.Join(s.home, "supervisor.log"))
}

func (s *soak) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sup == nil {
		return 0
	}
	return s.sup.Process.Pid
}

// call sends one request; an error envelope is returned as the response,
// a lost connection as errLost.
func (s *soak) call(op, sb string, args map[string]any) (map[string]any, error) {
	c, err := net.Dial("unix", s.socket())
	if err != nil {
		return nil, errLost
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
	scope := map[string]any{"kind": "system"}
	if sb != "" {
		scope = map[string]any{"kind": "sandbox", "sandbox_id": sb}
	}
	if args == nil {
		args = map[string]any{}
	}
	b, _ := json.Marshal(map[string]any{"op": op, "scope": scope, "args": args})
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, errLost
	}
	line, err := bufio.NewReaderSize(c, 1<<20).ReadBytes('\n')
	if err != nil {
		return nil, errLost
	}
	var m map[string]any
	if err := json.Unmarshal(line, &m); err != nil {
		return nil, fmt.Errorf("%s: bad response %q", op, line)
	}
	return m, nil
}

func errKind(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	k, _ := e["kind"].(string)
	return k
}

// expected are the refusals an agent meets by design: a squash already
// running, a publish or sync whose merge conflicts (the agent retries
// with a strategy), a limit while many agents work at once.
var expected = map[string]bool{"operation_conflict": true, "conflict": true, "server_busy": true}

// do runs op for an agent: a lost connection waits for the supervisor and
// reports false (the outcome is unknown); an unexpected error is a fault.
func (s *soak) do(op, sb string, args map[string]any) (map[string]any, bool) {
	r, err := s.call(op, sb, args)
	s.ackMu.Lock()
	s.ops[op]++
	s.ackMu.Unlock()
	if errors.Is(err, errLost) || (err == nil && s.down.Load() && errKind(r) != "") {
		for s.down.Load() {
			time.Sleep(100 * time.Millisecond)
		}
		return nil, false
	}
	if err != nil {
		s.addFault(op, err.Error())
		return nil, false
	}
	if k := errKind(r); k != "" {
		if !expected[k] && !(k == "operation_failed" && strings.Contains(fmt.Sprint(r), "publish_rejection")) {
			b, _ := json.Marshal(r)
			s.addFault(op, string(b))
		}
		return r, false
	}
	return r, true
}

func (s *soak) addFault(op, what string) {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	if len(s.fault[op]) < 20 {
		s.fault[op] = append(s.fault[op], what)
	} else {
		s.fault[op+" (more)"] = append(s.fault[op+" (more)"][:0], strconv.Itoa(len(s.fault[op+" (more)"])+1))
	}
}

func (s *soak) ack(sb, path, content string) {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	if s.acked[sb] == nil {
		s.acked[sb] = map[string]string{}
	}
	s.acked[sb][path] = content
}

// agent works in sandbox sb until deadline.
func (s *soak) agent(n int, sb string, deadline time.Time) {
	rng := rand.New(rand.NewPCG(uint64(n), uint64(time.Now().UnixNano())))
	for k := 0; time.Now().Before(deadline); k++ {
		tag := fmt.Sprintf("a%d-%d", n, k)
		switch p := rng.IntN(10); {
		case p < 4: // an explicit session's whole life
			s.sessionWork(sb, tag, rng)
		case p < 7: // an implicit command
			path := "imp/" + tag + ".txt"
			r, ok := s.do("exec_command", sb, map[string]any{"cmd": "mkdir -p imp && echo " + tag + " > " + path + " && seq 1 50", "yield_time_ms": 30000})
			if ok && r["status"] == "ok" && r["publish"] != nil {
				s.ack(sb, path, tag+"\n")
			}
		case p < 9: // a sessionless write
			path := "w/" + tag + ".txt"
			if _, ok := s.do("file_write", sb, map[string]any{"path": path, "content": tag + "\n"}); ok {
				s.ack(sb, path, tag+"\n")
			}
		default: // reads, as a console would
			s.do("layerstack", sb, map[string]any{"sandbox_id": sb})
			s.do("events", "", map[string]any{"last_n": 50})
			s.do("list_workspace_sessions", sb, nil)
		}
	}
}

func (s *soak) sessionWork(sb, tag string, rng *rand.Rand) {
	r, ok := s.do("create_workspace_session", sb, nil)
	if !ok {
		return
	}
	ws := r["workspace_session_id"].(string)
	open := true // a publish without keep ends the session
	defer func() {
		if open {
			s.do("destroy_workspace_session", sb, map[string]any{"workspace_session_id": ws})
		}
	}()
	files := map[string]string{}
	for i := range 3 {
		files[fmt.Sprintf("s/%s/%d.txt", tag, i)] = fmt.Sprintf("%s %d\n", tag, i)
	}
	var sh strings.Builder
	fmt.Fprintf(&sh, "mkdir -p s/%s", tag)
	for p, c := range files {
		fmt.Fprintf(&sh, " && echo '%s' > %s", strings.TrimSuffix(c, "\n"), p)
	}
	// One line of the shared file: other agents edit others (merged) or
	// the same one (a conflict, resolved below).
	fmt.Fprintf(&sh, " && sed -i '%ds/.*/%s/' shared.txt && seq 1 200", 1+rng.IntN(40), tag)
	if _, ok := s.do("exec_command", sb, map[string]any{"workspace_session_id": ws, "cmd": sh.String(), "yield_time_ms": 30000}); !ok {
		return
	}
	// A command fed on stdin.
	if r, ok := s.do("exec_command", sb, map[string]any{"workspace_session_id": ws, "cmd": "read x; echo got $x", "yield_time_ms": 0}); ok {
		s.do("write_command_stdin", sb, map[string]any{"command_session_id": r["command_session_id"], "stdin": tag + "\n", "yield_time_ms": 5000})
	}
	if rng.IntN(3) == 0 {
		s.do("sync_workspace_session", sb, map[string]any{"workspace_session_id": ws, "default_strategy": "ours"})
	}
	if rng.IntN(4) == 0 {
		if r, ok := s.do("fork_workspace_session", sb, map[string]any{"workspace_session_id": ws}); ok {
			s.do("destroy_workspace_session", sb, map[string]any{"workspace_session_id": r["workspace_session_id"]})
		}
	}
	args := map[string]any{"workspace_session_id": ws, "keep": rng.IntN(3) == 0}
	r, ok = s.do("publish_workspace_session", sb, args)
	if !ok && r != nil && strings.Contains(fmt.Sprint(r), "publish_rejection") {
		args["default_strategy"] = "theirs"
		r, ok = s.do("publish_workspace_session", sb, args)
	}
	if ok {
		open = r["destroyed"] != true
		for p, c := range files {
			s.ack(sb, p, c)
		}
	}
}

// sample is one 10 s reading of the supervisor.
type sample struct {
	T          float64        `json:"t_s"`
	RSS        int64          `json:"rss_bytes"`
	PSS        int64          `json:"pss_bytes"`
	FDs        int64          `json:"fds"`
	Goroutines int64          `json:"goroutines"`
	Holders    int64          `json:"holders"`
	WAL        int64          `json:"wal_bytes"`
	DataDir    int64          `json:"data_dir_bytes"`
	Layers     map[string]int `json:"layers"`
	Restarts   int            `json:"restarts"`
}

func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

func (s *soak) sample(t0 time.Time, sbs []string, restarts int) (sample, bool) {
	r, err := s.call("daemon", "", nil)
	if err != nil || errKind(r) != "" {
		return sample{}, false
	}
	d, _ := r["daemon"].(map[string]any)
	hs, _ := d["holders"].([]any)
	out := sample{T: time.Since(t0).Seconds(), RSS: num(d["resident_bytes"]), FDs: num(d["file_descriptor_count"]),
		Goroutines: num(d["goroutines"]), Holders: int64(len(hs)), Layers: map[string]int{}, Restarts: restarts}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", num(d["pid"]))); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				out.PSS = kb << 10
			}
		}
	}
	if st, err := os.Stat(filepath.Join(s.data(), "state.db-wal")); err == nil {
		out.WAL = st.Size()
	}
	_ = filepath.WalkDir(s.data(), func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			if info, err := e.Info(); err == nil {
				if st, ok := info.Sys().(*syscall.Stat_t); ok {
					out.DataDir += st.Blocks * 512
				}
			}
		}
		return nil
	})
	for _, sb := range sbs {
		if r, err := s.call("layerstack", sb, map[string]any{"sandbox_id": sb}); err == nil && errKind(r) == "" {
			ls, _ := r["layers"].([]any)
			out.Layers[sb] = len(ls)
		}
	}
	return out, true
}

func main() {
	bin := flag.String("bin", "bin", "directory of the built binaries")
	agents := flag.Int("agents", envInt("SOAK_AGENTS", 32), "agents (SOAK_AGENTS)")
	seconds := flag.Int("seconds", envInt("SOAK_SECONDS", 600), "duration in seconds (SOAK_SECONDS)")
	outDir := flag.String("out", "soak", "directory for soak.json and soak.png")
	killEvery := flag.Duration("kill-every", 3*time.Minute, "SIGKILL the supervisor this often (0: never)")
	every := flag.Duration("sample", 10*time.Second, "sampling interval")
	flag.Parse()
	if err := run(*bin, *agents, *seconds, *outDir, *killEvery, *every); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

func run(bin string, agents, seconds int, outDir string, killEvery, every time.Duration) error {
	bin, _ = filepath.Abs(bin)
	root, err := os.MkdirTemp("", "esbx-soak-")
	if err != nil {
		return err
	}
	s := &soak{bin: bin, home: filepath.Join(root, "home"), acked: map[string]map[string]string{}, ops: map[string]int{}, fault: map[string][]string{}}
	if err := os.MkdirAll(s.home, 0o700); err != nil {
		return err
	}
	if err := s.start(); err != nil {
		return err
	}
	defer func() {
		if p := s.pid(); p != 0 {
			_ = syscall.Kill(p, syscall.SIGTERM)
			time.Sleep(2 * time.Second)
		}
		_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
		_ = os.RemoveAll(root)
	}()
	project := filepath.Join(root, "project")
	var shared strings.Builder
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&shared, "line %d\n", i)
	}
	if err := os.MkdirAll(project, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(project, "shared.txt"), []byte(shared.String()), 0o644); err != nil {
		return err
	}
	var sbs []string
	drivers := map[string]string{}
	for _, d := range []string{"kernel", "fuse"} {
		r, err := s.call("create_sandbox", "", map[string]any{"workspace_root": project, "overlay": d})
		if err != nil || errKind(r) != "" {
			fmt.Fprintf(os.Stderr, "soak: no %s sandbox: %v %v\n", d, r, err)
			continue
		}
		sbs = append(sbs, r["id"].(string))
		drivers[r["id"].(string)] = d
	}
	if len(sbs) == 0 {
		return errors.New("no sandbox could be created")
	}
	t0 := time.Now()
	deadline := t0.Add(time.Duration(seconds) * time.Second)
	var wg sync.WaitGroup
	for i := range agents {
		wg.Go(func() { s.agent(i, sbs[i%len(sbs)], deadline) })
	}
	wg.Go(func() { // a squash now and then, besides autosquash
		for time.Now().Before(deadline) {
			time.Sleep(45 * time.Second)
			for _, sb := range sbs {
				s.do("squash_layerstacks", "", map[string]any{"sandbox_id": sb})
			}
		}
	})
	var samples []sample
	restarts := 0
	nextKill := t0.Add(killEvery)
	tick := time.NewTicker(every)
	for now := time.Now(); now.Before(deadline); now = <-tick.C {
		if smp, ok := s.sample(t0, sbs, restarts); ok {
			samples = append(samples, smp)
			fmt.Printf("%5.0fs rss %6.1f MiB pss %6.1f MiB fds %4d goroutines %5d holders %3d wal %6.1f MiB data %7.1f MiB layers %v\n",
				smp.T, mib(smp.RSS), mib(smp.PSS), smp.FDs, smp.Goroutines, smp.Holders, mib(smp.WAL), mib(smp.DataDir), smp.Layers)
		}
		if killEvery > 0 && now.After(nextKill) && now.Before(deadline.Add(-every)) {
			s.down.Store(true)
			_ = syscall.Kill(s.pid(), syscall.SIGKILL)
			time.Sleep(500 * time.Millisecond)
			if err := s.start(); err != nil {
				return err
			}
			s.down.Store(false)
			restarts++
			nextKill = time.Now().Add(killEvery)
		}
	}
	tick.Stop()
	wg.Wait()
	if smp, ok := s.sample(t0, sbs, restarts); ok {
		samples = append(samples, smp)
	}

	// Every acknowledged write is in the head.
	lost := []string{}
	checked := 0
	for sb, files := range s.acked {
		for p, c := range files {
			r, err := s.call("file_read", sb, map[string]any{"path": p})
			checked++
			if err != nil || errKind(r) != "" || strings.TrimSuffix(fmt.Sprint(r["content"]), "\n") != strings.TrimSuffix(c, "\n") {
				lost = append(lost, fmt.Sprintf("%s %s (%s): %v %v", sb, p, drivers[sb], r, err))
			}
		}
	}
	sort.Strings(lost)
	rep := report(samples, every)
	doc := map[string]any{"agents": agents, "seconds": seconds, "kill_every_s": killEvery.Seconds(), "sample_every_s": every.Seconds(),
		"sandboxes": drivers, "restarts": restarts, "operations": s.ops, "faults": s.fault, "acknowledged_writes_checked": checked,
		"lost_writes": lost, "samples": samples, "summary": rep}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(doc, "", "  ")
	if err := os.WriteFile(filepath.Join(outDir, "soak.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := plotSamples(samples, drivers, filepath.Join(outDir, "soak.png")); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	rb, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Printf("summary: %s\n%d operations, %d restarts, %d acknowledged writes checked, %d lost, faults: %d kinds\nwrote %s and %s\n",
		rb, total(s.ops), restarts, checked, len(lost), len(s.fault), filepath.Join(outDir, "soak.json"), filepath.Join(outDir, "soak.png"))
	if len(lost) > 0 || len(s.fault) > 0 {
		return fmt.Errorf("%d lost writes, faults %v", len(lost), s.fault)
	}
	return nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// report compares each curve's last value with its value after warm-up
// (the first sample past a tenth of the run, at least one interval in):
// memory and descriptors should end within 10 % of it.
func report(samples []sample, every time.Duration) map[string]any {
	if len(samples) < 2 {
		return map[string]any{"note": "too few samples"}
	}
	warm := samples[0]
	end := samples[len(samples)-1]
	for _, s := range samples {
		if s.T >= max(end.T/10, every.Seconds()) {
			warm = s
			break
		}
	}
	growth := func(a, b int64) float64 {
		if a == 0 {
			return 0
		}
		return float64(b-a) / float64(a)
	}
	return map[string]any{
		"warm_up_at_s": warm.T,
		"rss_growth":   growth(warm.RSS, end.RSS), "pss_growth": growth(warm.PSS, end.PSS),
		"fds_growth": growth(warm.FDs, end.FDs), "goroutines_growth": growth(warm.Goroutines, end.Goroutines),
		"data_dir_growth": growth(warm.DataDir, end.DataDir), "wal_end_bytes": end.WAL,
		"flat_memory_and_fds": growth(warm.RSS, end.RSS) <= 0.10 && growth(warm.FDs, end.FDs) <= 0.10,
	}
}
