// Command bench measures workspace sessions against the alternatives an agent
// would otherwise use, in the same run on the same machine: session creation
// against `git worktree add` and `cp -a` for growing project sizes, a no-op
// command round trip against `bash -c true` and `bwrap … true` (and in a
// session carrying 10,000 changed files), the memory
// that 32 live sessions cost, and publication (publish latency against
// `git commit` and `cp -a`, parallel publishes, a 3-way merging publish
// against `git merge-file`) and sandbox creation from a Docker image, first and
// cached, against `docker run --rm IMAGE true`; the overlay drivers side by side (native directory,
// kernel overlay, the FUSE overlay, fuse-overlayfs) on read, write, git status and stat workloads;
// a Go module build inside a kernel and a FUSE session; 8 sessions running
// no-op commands at once; and the browser console's fleet page with 20
// sandboxes and 100 live sessions in headless Chromium, with the event
// stream's lag; a live session's sync onto a head 100 layers newer
// against a new session; and the fork of a session with 1,000 changed files
// against a new session and `cp -a` of its upper dir; git status and git
// diff --stat inside kernel and FUSE sessions against the host. It prints medians and ratios; targets are printed
// next to the measured values and never asserted. It exits non-zero only when
// something breaks (an operation fails, a tool that must exist is missing).
//
//	go run ./tests/bench [-bin DIR] [-reps N] [-quick] [-only 2,4,6] [-json FILE] [-profile FILE]
//	                     [-columns kernel,fuse,...] [-fuse-requests] [-fuse-profile DIR]
//
// It starts its own supervisor (SANDBOX_NO_AUTOSTART=1) on a temporary
// EPHEMERAL_SANDBOX_HOME and removes every temporary file at the end.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// opTimeout bounds one supervisor request (a 50k-file snapshot included).
const opTimeout = 10 * time.Minute

// ctx is cancelled by SIGINT/SIGTERM: requests and child processes abort, the
// current section fails, the rest is skipped and the temp dir is removed.
var ctx context.Context

func main() {
	// Part 6 re-executes this binary inside a user+mount namespace.
	if len(os.Args) == 3 && os.Args[1] == overlayWorkerArg {
		os.Exit(overlayWorker(os.Args[2]))
	}
	if len(os.Args) == 3 && os.Args[1] == overlayServerArg {
		os.Exit(overlayServer(os.Args[2]))
	}
	binFlag := flag.String("bin", "./bin", "directory holding the sandbox binaries")
	reps := flag.Int("reps", 5, "measured repetitions per case (the exec round trip uses 6× as many)")
	quick := flag.Bool("quick", false, "fast smoke run: small trees, 2 reps, 8 live sessions")
	only := flag.String("only", "", "comma-separated section numbers to run (1-12); default all")
	jsonOut := flag.String("json", "", "also write every figure, with alternatives, ratios and targets, as one JSON document to this file (- = standard output; the text then goes to standard error)")
	columns := flag.String("columns", "", "part 6: comma-separated overlay columns to measure (native, kernel, fuse, fuse-overlayfs); default all")
	fuseRequests := flag.Bool("fuse-requests", false, "part 6: count the FUSE requests of each workload in the fuse column (the counting slows that column: its times are not comparable)")
	fuseProfile := flag.String("fuse-profile", "", "part 6: write a CPU profile of each fuse column server into this directory (fuse-PID.pprof)")
	profile := flag.String("profile", "", "write a CPU profile of the supervisor to this file (go tool pprof bin/sandbox-supervisor FILE)")
	flag.Parse()
	if *reps < 1 {
		fmt.Fprintln(os.Stderr, "bench: -reps must be ≥ 1")
		os.Exit(2)
	}
	sections := map[int]bool{}
	for _, f := range strings.FieldsFunc(*only, func(r rune) bool { return r == ',' || r == ' ' }) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 12 {
			fmt.Fprintf(os.Stderr, "bench: -only: bad section %q (want numbers 1-12)\n", f)
			os.Exit(2)
		}
		sections[n] = true
	}
	cfg := config{reps: *reps, sizes: []int{1000, 10000, 50000}, liveSessions: 32}
	if *quick {
		cfg = config{reps: 2, sizes: []int{100, 1000, 2000}, liveSessions: 8, quick: true}
	}
	cfg.only = sections
	cfg.fuseRequests = *fuseRequests
	if *fuseProfile != "" {
		d, err := filepath.Abs(*fuseProfile)
		if err == nil {
			err = os.MkdirAll(d, 0o755)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: -fuse-profile:", err)
			os.Exit(2)
		}
		// The fuse servers are the workers' children: they inherit it.
		os.Setenv(fuseProfileEnv, d)
	}
	for _, c := range strings.FieldsFunc(*columns, func(r rune) bool { return r == ',' || r == ' ' }) {
		if !slices.Contains(overlayColumns, c) {
			fmt.Fprintf(os.Stderr, "bench: -columns: unknown column %q (want %s)\n", c, strings.Join(overlayColumns, ", "))
			os.Exit(2)
		}
		cfg.columns = append(cfg.columns, c)
	}
	cfg.json = *jsonOut
	if *profile != "" {
		p, err := filepath.Abs(*profile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: -profile:", err)
			os.Exit(2)
		}
		cfg.profile = p
	}
	bin, err := filepath.Abs(*binFlag)
	if err == nil {
		_, err = os.Stat(filepath.Join(bin, "sandbox-supervisor"))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: binaries not found (run make build):", err)
		os.Exit(2)
	}
	cfg.bin = bin
	var stop context.CancelFunc
	ctx, stop = signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(cfg)
	stop()
	os.Exit(code)
}

type config struct {
	bin          string
	reps         int
	sizes        []int // generated tree sizes in files
	liveSessions int
	quick        bool
	only         map[int]bool // sections to run; empty means all
	columns      []string     // part 6 columns to measure; empty means all
	fuseRequests bool         // part 6: count the fuse column's requests
	profile      string       // supervisor CPU profile path, or ""
	json         string       // JSON report path, "-" or ""
}

// bench is one run: a temporary root, a supervisor and a client.
type bench struct {
	cfg    config
	root   string // everything temporary lives below it
	home   string // EPHEMERAL_SANDBOX_HOME
	sock   string
	sup    *exec.Cmd
	supLog string
	done   chan error
	client *catalog.Client
	failed bool
	out    io.Writer      // the printed report
	rep    *report        // the JSON report
	cur    *reportSection // the section running, nil outside
}

func run(cfg config) int {
	root, err := os.MkdirTemp("", "esbx-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	b := &bench{cfg: cfg, root: root, home: filepath.Join(root, "h"), supLog: filepath.Join(root, "supervisor.log"),
		out: os.Stdout, rep: &report{Started: time.Now().UTC().Format(time.RFC3339), Sections: []*reportSection{}, Targets: []reportTarget{}}}
	if cfg.json == "-" {
		b.out = os.Stderr // standard output carries the JSON document
	}
	b.sock = filepath.Join(b.home, "run", "supervisor.sock")
	defer b.cleanup()

	if err := b.start(); err != nil {
		fmt.Fprintln(os.Stderr, "bench: start supervisor:", err)
		return 1
	}
	b.header()
	b.section(1, "1. workspace session creation vs project size", b.sessionCreation)
	b.section(2, "2. no-op command round trip", b.execRoundTrip)
	b.section(3, fmt.Sprintf("3. memory of %d live sessions", cfg.liveSessions), b.liveMemory)
	b.section(4, "4. publication", b.publication)
	b.section(5, "5. sandbox creation from a Docker image", b.imageCreation)
	b.section(6, "6. overlay drivers: native, kernel, fuse, fuse-overlayfs", b.overlays)
	b.section(7, "7. go build of a module inside a session: kernel vs fuse", b.goBuild)
	b.section(8, "8. concurrency: 8 sessions at once; 4 KiB file operations", b.concurrency)
	b.section(9, "9. browser console: the fleet page with 20 sandboxes and 100 live sessions; event stream lag", b.console)
	b.section(10, "10. live sessions: sync onto a head 100 layers newer vs a new session", b.liveSync)
	b.section(11, fmt.Sprintf("11. fork of a session with %s changed files vs a new session and cp -a", count(forkChanged)), b.fork)
	b.section(12, "12. git in sessions: status and diff --stat against the host", b.gitSpeed)
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "bench: interrupted")
		return 130
	}
	if err := b.stop(); err != nil {
		fmt.Fprintln(os.Stderr, "bench: supervisor shutdown:", err)
		b.failed = true
	}
	b.rep.Failed = b.failed
	if cfg.json != "" {
		if err := b.writeReport(cfg.json); err != nil {
			fmt.Fprintln(os.Stderr, "bench: -json:", err)
			return 1
		}
	}
	if b.failed {
		fmt.Fprintln(os.Stderr, "bench: FAILED (see above); supervisor log tail:")
		fmt.Fprintln(os.Stderr, tail(b.supLog, 20))
		return 1
	}
	return 0
}

// failure aborts the current section.
type failure struct{ err error }

func check(err error) {
	if ctx.Err() != nil {
		panic(failure{errors.New("interrupted")})
	}
	if err != nil {
		panic(failure{err})
	}
}

func fail(format string, a ...any) { panic(failure{fmt.Errorf(format, a...)}) }

// section runs part n unless -only excludes it; a failure is reported and
// the next part still runs.
func (b *bench) section(n int, title string, f func()) {
	if ctx.Err() != nil || (len(b.cfg.only) > 0 && !b.cfg.only[n]) {
		return
	}
	b.printf("\n== %s ==\n", title)
	b.cur = &reportSection{Number: n, Title: title, Tables: []reportTable{}, Notes: []string{}, Targets: []reportTarget{}}
	b.rep.Sections = append(b.rep.Sections, b.cur)
	defer func() { b.cur = nil }()
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(failure)
			if !ok {
				panic(r)
			}
			b.failed = true
			b.cur.Failed = f.err.Error()
			b.printf("FAILED: %v\n", f.err)
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", title, f.err)
		}
	}()
	f()
}

// ---------------------------------------------------------------- supervisor

func (b *bench) start() error {
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "EPHEMERAL_SANDBOX_HOME" || strings.HasPrefix(k, "SANDBOX_") {
			os.Unsetenv(k)
		}
	}
	os.Setenv("EPHEMERAL_SANDBOX_HOME", b.home)
	os.Setenv("SANDBOX_NO_AUTOSTART", "1")
	logf, err := os.Create(b.supLog)
	if err != nil {
		return err
	}
	defer logf.Close()
	// The HTTP listener serves part 9 (the browser console).
	args := []string{"serve", "--http", "tcp://127.0.0.1:0"}
	if b.cfg.profile != "" {
		args = append(args, "-cpuprofile", b.cfg.profile)
	}
	cmd := exec.Command(filepath.Join(b.cfg.bin, "sandbox-supervisor"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a terminal ^C reaches us, and we stop it with SIGTERM.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	b.sup, b.done = cmd, make(chan error, 1)
	go func() { b.done <- cmd.Wait() }()
	b.client = &catalog.Client{Endpoint: catalog.Endpoint{Network: "unix", Address: b.sock}}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("unix", b.sock); err == nil {
			c.Close()
			return nil
		}
		select {
		case err := <-b.done:
			b.sup = nil
			return fmt.Errorf("supervisor exited early: %v\n%s", err, tail(b.supLog, 20))
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("supervisor did not listen on %s\n%s", b.sock, tail(b.supLog, 20))
}

// stop sends SIGTERM and waits for the supervisor to exit.
func (b *bench) stop() error {
	if b.sup == nil {
		return nil
	}
	defer func() { b.sup = nil }()
	_ = b.sup.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-b.done:
		return err
	case <-time.After(30 * time.Second):
		_ = b.sup.Process.Kill()
		<-b.done
		return errors.New("supervisor ignored SIGTERM for 30 s; killed")
	}
}

func (b *bench) cleanup() {
	if err := b.stop(); err != nil {
		fmt.Fprintln(os.Stderr, "bench: supervisor shutdown:", err)
	}
	if b.cfg.profile != "" { // keep the supervisor's log beside its profile
		if data, err := os.ReadFile(b.supLog); err == nil {
			_ = os.WriteFile(b.cfg.profile+".log", data, 0o644)
		}
	}
	// Overlay work dirs are mode 000: make everything removable first.
	_ = filepath.WalkDir(b.root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
	if err := os.RemoveAll(b.root); err != nil {
		fmt.Fprintln(os.Stderr, "bench: remove temp dir:", err)
	}
}

// call sends one request (one connection) and returns the success result.
func (b *bench) call(op, sandboxID string, args map[string]any) map[string]any {
	res, _, err := b.timedCall(op, sandboxID, args)
	check(err)
	return res
}

// timedCall measures request → response on a fresh connection.
func (b *bench) timedCall(op, sandboxID string, args map[string]any) (map[string]any, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	req := &catalog.Request{Op: op, Scope: catalog.RequestScope{Kind: "system"}, Args: args}
	if sandboxID != "" {
		req.Scope = catalog.RequestScope{Kind: "sandbox", SandboxID: sandboxID}
	}
	t0 := time.Now()
	res, cerr := b.client.Call(ctx, req)
	d := time.Since(t0)
	if cerr != nil {
		return nil, d, fmt.Errorf("%s: %v", op, cerr)
	}
	if e := catalog.ErrorFromResponse(res); e != nil {
		return nil, d, fmt.Errorf("%s: %s: %s %v", op, e.Kind, e.Message, e.Details)
	}
	return res, d, nil
}

func (b *bench) createSandbox(tree string) (string, time.Duration) {
	res, d, err := b.timedCall("create_sandbox", "", map[string]any{"workspace_root": tree})
	check(err)
	id, _ := res["id"].(string)
	if id == "" {
		fail("create_sandbox: no id in %v", res)
	}
	return id, d
}

func (b *bench) destroySandbox(id string) {
	b.call("destroy_sandbox", "", map[string]any{"sandbox_id": id})
}

// createSession returns the session id, its overlay driver and the latency.
func (b *bench) createSession(sbx string) (string, string, time.Duration) {
	res, d, err := b.timedCall("create_workspace_session", sbx, nil)
	check(err)
	ws, _ := res["workspace_session_id"].(string)
	if ws == "" {
		fail("create_workspace_session: no workspace_session_id in %v", res)
	}
	driver, _ := res["overlay_driver"].(string)
	return ws, driver, d
}

func (b *bench) destroySession(sbx, ws string) time.Duration {
	_, d, err := b.timedCall("destroy_workspace_session", sbx, map[string]any{"workspace_session_id": ws})
	check(err)
	return d
}

// execOK checks that a command output object is a successful exit 0.
func execOK(res map[string]any) error {
	if res["status"] != "ok" || fmt.Sprint(res["exit_code"]) != "0" {
		return fmt.Errorf("exec_command true: status %v exit_code %v output %q", res["status"], res["exit_code"], res["output"])
	}
	return nil
}

func (b *bench) header() {
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	b.rep.Go, b.rep.Kernel, b.rep.CPUs, b.rep.UID = runtime.Version(), strings.TrimSpace(string(kernel)), runtime.NumCPU(), os.Getuid()
	b.rep.Reps, b.rep.Quick = b.cfg.reps, b.cfg.quick
	b.printf("sandbox bench: %s, Linux %s, %d CPUs, uid %d, reps %d", runtime.Version(),
		strings.TrimSpace(string(kernel)), runtime.NumCPU(), os.Getuid(), b.cfg.reps)
	if b.cfg.quick {
		b.print(" (quick)")
	}
	b.println()
	b.println("all times are medians of the measured reps, each case after one untimed warm-up; ratios are alternative/session")
}

// ---------------------------------------------------------------- part 1

type tree struct {
	name  string
	path  string
	files int
}

func (b *bench) sessionCreation() {
	var trees []tree
	for _, n := range b.cfg.sizes {
		p := filepath.Join(b.root, fmt.Sprintf("gen%d", n))
		check(generateTree(p, n))
		trees = append(trees, tree{name: "generated " + count(n), path: p, files: n})
	}
	goroot := "/usr/local/go" // fallback when go env fails
	if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
		goroot = string(bytes.TrimSpace(out))
	}
	realSrc := filepath.Join(goroot, "src")
	if b.cfg.quick {
		realSrc = filepath.Join(realSrc, "net")
	}
	p := filepath.Join(b.root, "gosrc")
	check(runCmd("", "cp", "-a", realSrc, p))
	n, err := countFiles(p)
	check(err)
	trees = append(trees, tree{name: "real: " + strings.TrimPrefix(realSrc, goroot+"/"), path: p, files: n})

	type row struct {
		t                              tree
		snapshot                       time.Duration
		session, destroy, worktree, cp time.Duration
		driver                         string
	}
	var rows []row
	for _, t := range trees {
		repo := filepath.Join(b.root, "git-"+filepath.Base(t.path))
		check(gitRepo(t.path, repo))
		sbx, snap := b.createSandbox(t.path)
		var sess, dest, wt, cp []time.Duration
		var driver string
		for i := 0; i <= b.cfg.reps; i++ { // i == 0 is the warm-up
			ws, drv, d := b.createSession(sbx)
			dd := b.destroySession(sbx, ws)
			driver = drv
			dst := filepath.Join(b.root, "wt")
			dw, err := timed(func() error { return runGit(repo, "worktree", "add", "-q", "--detach", dst, "HEAD") })
			check(err)
			check(runGit(repo, "worktree", "remove", "--force", dst))
			dst = filepath.Join(b.root, "cp")
			dc, err := timed(func() error { return runCmd("", "cp", "-a", t.path, dst) })
			check(err)
			check(removeAll(dst))
			if i > 0 {
				sess, dest, wt, cp = append(sess, d), append(dest, dd), append(wt, dw), append(cp, dc)
			}
		}
		b.destroySandbox(sbx)
		check(removeAll(repo))
		rows = append(rows, row{t: t, snapshot: snap, session: median(sess), destroy: median(dest), worktree: median(wt), cp: median(cp), driver: driver})
	}

	tw := b.table(tabwriter.AlignRight)
	fmt.Fprintln(tw, "tree\tfiles\tcreate_sandbox (once)\tsession create\tsession destroy\tgit worktree add\tcp -a\tworktree/session\tcp/session\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.t.name, r.t.files, ms(r.snapshot), ms(r.session), ms(r.destroy),
			ms(r.worktree), ms(r.cp), ratio(r.worktree, r.session), ratio(r.cp, r.session))
	}
	tw.Flush()
	b.printf("overlay driver: %s; session create/destroy measured through the socket (Go client, one request per connection)\n", rows[0].driver)
	first, last, mid := rows[0], rows[len(b.cfg.sizes)-1], rows[1]
	b.target(fmt.Sprintf("session create %s files / %s files (flat)", count(last.t.files), count(first.t.files)),
		ratio(last.session, first.session), ratioValue(last.session, first.session), "≤", 1.5, "×", "")
	b.target(fmt.Sprintf("session create / git worktree add at %s files (session ≥ 50× faster)", count(mid.t.files)),
		ratio(mid.session, mid.worktree), ratioValue(mid.session, mid.worktree), "≤", 0.02, "×", "")
}

// generateTree writes n files of 100 bytes, 100 per directory.
func generateTree(dir string, n int) error {
	line := bytes.Repeat([]byte("x"), 100)
	for i := 0; i < n; i++ {
		d := filepath.Join(dir, fmt.Sprintf("d%04d", i/100))
		if i%100 == 0 {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		content := slices.Clone(line)
		copy(content, fmt.Sprintf("file %07d ", i)) // distinct contents, as in a real tree
		content[99] = '\n'
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%02d.txt", i%100)), content, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func countFiles(dir string) (int, error) {
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	})
	return n, err
}

// gitRepo copies src to repo and commits it once (everything, ignored files included).
func gitRepo(src, repo string) error {
	if err := runCmd("", "cp", "-a", src, repo); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"add", "-A", "-f", "."},
		{"commit", "-q", "--no-gpg-sign", "-m", "bench tree"},
	} {
		if err := runGit(repo, args...); err != nil {
			return err
		}
	}
	return nil
}

func runGit(repo string, args ...string) error {
	full := append([]string{"-C", repo, "-c", "user.name=bench", "-c", "user.email=bench@localhost"}, args...)
	return runCmd("", "git", full...)
}

// ---------------------------------------------------------------- part 2

// settleAfterCase is the pause after each timed case of the round-trip
// section, longer than the background work an implicit session leaves.
const settleAfterCase = 40 * time.Millisecond

// manyChanged is how many files the session of execManyChanged changed.
const manyChanged = 10000

// execManyChanged times no-op commands in a new explicit session of sbx
// after one command wrote manyChanged files (100 directories of 100): what
// every later command of such a session pays for the changes it carries.
func (b *bench) execManyChanged(sbx string) []time.Duration {
	ws, _, _ := b.createSession(sbx)
	b.execIn(sbx, ws, fmt.Sprintf("for d in $(seq 100); do mkdir -p m/$d; for i in $(seq %d); do echo $i > m/$d/f$i.txt; done; done", manyChanged/100))
	args := map[string]any{"cmd": "true", "workspace_session_id": ws}
	var ds []time.Duration
	for i := 0; i <= b.cfg.reps*6; i++ { // i == 0 is the warm-up
		res, d, err := b.timedCall("exec_command", sbx, args)
		if err == nil {
			err = execOK(res)
		}
		check(err)
		if i > 0 {
			ds = append(ds, d)
		}
		time.Sleep(settleAfterCase)
	}
	b.destroySession(sbx, ws)
	return ds
}

func (b *bench) execRoundTrip() {
	n := b.cfg.reps * 6
	proj := filepath.Join(b.root, "small")
	check(generateTree(proj, 100))
	sbx, _ := b.createSandbox(proj)
	ws, _, _ := b.createSession(sbx)
	rt := filepath.Join(b.cfg.bin, "sandbox-runtime-cli")
	execArgs := map[string]any{"cmd": "true", "workspace_session_id": ws}

	type method struct {
		name string
		run  func() (time.Duration, error)
		na   string
		ds   []time.Duration
	}
	methods := []*method{
		{name: "exec_command true, explicit session, socket (Go client)", run: func() (time.Duration, error) {
			res, d, err := b.timedCall("exec_command", sbx, execArgs)
			if err == nil {
				err = execOK(res)
			}
			return d, err
		}},
		{name: "exec_command true, explicit session, sandbox-runtime-cli", run: func() (time.Duration, error) {
			return timed(func() error {
				out, err := runOut(rt, "--sandbox-id", sbx, "exec_command", "--workspace-session-id", ws, "true")
				if err != nil {
					return err
				}
				var res map[string]any
				if err := json.Unmarshal(out, &res); err != nil {
					return fmt.Errorf("sandbox-runtime-cli output %q: %v", out, err)
				}
				return execOK(res)
			})
		}},
		{name: "exec_command true, implicit session (create+run+finalize), socket", run: func() (time.Duration, error) {
			res, d, err := b.timedCall("exec_command", sbx, map[string]any{"cmd": "true"})
			if err == nil {
				err = execOK(res)
			}
			return d, err
		}},
		{name: "bash -c true", run: func() (time.Duration, error) {
			return timed(func() error { return runCmd("", "bash", "-c", "true") })
		}},
	}
	bwrap := &method{name: "bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all true", run: func() (time.Duration, error) {
		return timed(func() error {
			return runCmd("", "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "true")
		})
	}}
	if _, err := exec.LookPath("bwrap"); err != nil {
		bwrap.na = "bwrap not installed"
	} else if _, err := bwrap.run(); err != nil {
		bwrap.na = "bwrap fails unprivileged: " + oneLine(err.Error())
	}
	methods = append(methods, bwrap)

	for i := 0; i <= n; i++ { // interleaved; i == 0 is the warm-up
		for _, m := range methods {
			if m.na != "" {
				continue
			}
			d, err := m.run()
			check(err)
			if i > 0 {
				m.ds = append(m.ds, d)
			}
			// Each case is timed on an idle machine: an implicit session
			// ends its holder and removes its directory after the reply
			// (about 4 ms of CPU), which would otherwise land on the next
			// case (bash, bwrap) and flatter the ratios against them. That
			// work is a throughput cost; section 8 measures throughput.
			time.Sleep(settleAfterCase)
		}
	}
	b.destroySession(sbx, ws)
	big := b.execManyChanged(sbx)
	b.destroySandbox(sbx)

	socket := median(methods[0].ds)
	tw := b.table(0)
	fmt.Fprintf(tw, "method (median of %d)\tmedian\tmin\tmax\tvs socket\n", n)
	for _, m := range methods {
		if m.na != "" {
			fmt.Fprintf(tw, "%s\tn/a (%s)\t\t\t\n", m.name, m.na)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.name, ms(median(m.ds)), ms(slices.Min(m.ds)), ms(slices.Max(m.ds)), ratio(median(m.ds), socket))
	}
	fmt.Fprintf(tw, "exec_command true, explicit session with %s changed files, socket\t%s\t%s\t%s\t%s\n", count(manyChanged),
		ms(median(big)), ms(slices.Min(big)), ms(slices.Max(big)), ratio(median(big), socket))
	tw.Flush()
	b.println("(with changed files, a kernel session's command end walks the upper dir for attribution and file activity)")
	b.target("exec_command true through the socket", ms(socket), float64(socket)/1e6, "<", 5, " ms", "")
	if bw := methods[len(methods)-1]; bw.na == "" {
		b.target("exec_command socket / bwrap … true (faster than bwrap)", ratio(socket, median(bw.ds)), ratioValue(socket, median(bw.ds)), "<", 1, "×", "")
	} else {
		b.target("exec_command socket / bwrap … true (faster than bwrap)", "n/a", math.NaN(), "<", 1, "×", bw.na)
	}
	cli, implicit := median(methods[1].ds), median(methods[2].ds)
	b.target("exec_command sandbox-runtime-cli / socket", ratio(cli, socket), ratioValue(cli, socket), "≤", 1.3, "×", "")
	b.target("exec_command implicit session / explicit session", ratio(implicit, socket), ratioValue(implicit, socket), "<", 2, "×", "")
}

// ---------------------------------------------------------------- part 3

func (b *bench) liveMemory() {
	proj := filepath.Join(b.root, "mem")
	check(generateTree(proj, 1000))
	sbx, _ := b.createSandbox(proj)
	// Warm the supervisor's paths once so the baseline is not its first session.
	ws, _, _ := b.createSession(sbx)
	b.destroySession(sbx, ws)
	before, err := readMem(b.sup.Process.Pid)
	check(err)

	var ids []string
	for range b.cfg.liveSessions {
		ws, _, _ := b.createSession(sbx)
		ids = append(ids, ws)
	}
	idle := b.sessionMemory(sbx, ids, before)
	for _, ws := range ids {
		res, _, err := b.timedCall("exec_command", sbx, map[string]any{"cmd": "true", "workspace_session_id": ws})
		check(err)
		check(execOK(res))
	}
	used := b.sessionMemory(sbx, ids, before)
	for _, ws := range ids {
		b.destroySession(sbx, ws)
	}
	b.destroySandbox(sbx)

	tw := b.table(tabwriter.AlignRight)
	fmt.Fprintln(tw, "state\tholder procs\tΣ holder VmRSS\tΣ holder RssAnon\tsupervisor VmRSS growth\ttotal extra (VmRSS)\tper session\tper session (PSS)\t")
	for _, r := range []struct {
		name string
		m    sessionMem
	}{{"idle after create", idle}, {"after one exec_command each", used}} {
		total := r.m.holders.rss + r.m.supGrowth
		pss := "n/a"
		if r.m.holders.pss >= 0 && r.m.supPssGrowth != -1 {
			pss = mib((r.m.holders.pss + r.m.supPssGrowth) / int64(len(ids)))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.name, r.m.procs, mib(r.m.holders.rss), mib(r.m.holders.anon),
			mib(r.m.supGrowth), mib(total), mib(total/int64(len(ids))), pss)
	}
	tw.Flush()
	b.printf("%d sessions; supervisor VmRSS before: %s. VmRSS counts pages shared with the supervisor binary once per holder,\n", len(ids), mib(before.rss))
	b.println("so the VmRSS sum overstates; PSS (smaps_rollup, holders + supervisor PSS growth) divides shared pages among their users")
}

// memInfo is one process's memory in bytes; pss is -1 when smaps_rollup is unreadable.
type memInfo struct{ rss, anon, pss int64 }

type sessionMem struct {
	holders      memInfo
	procs        int
	supGrowth    int64 // VmRSS
	supPssGrowth int64 // -1 when unknown
}

// sessionMemory sums VmRSS over every holder (found by holder_pid) and its descendants.
func (b *bench) sessionMemory(sbx string, ids []string, before memInfo) sessionMem {
	res := b.call("list_workspace_sessions", sbx, nil)
	list, _ := res["workspace_sessions"].([]any)
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	children := childMap()
	var m sessionMem
	found := 0
	for _, it := range list {
		s, _ := it.(map[string]any)
		id, _ := s["workspace_session_id"].(string)
		if !want[id] {
			continue
		}
		pid, err := strconv.Atoi(fmt.Sprint(s["holder_pid"]))
		if err != nil || pid <= 0 {
			fail("session %s: holder_pid %v", id, s["holder_pid"])
		}
		found++
		for _, p := range descendants(pid, children) {
			mi, err := readMem(p)
			if err != nil {
				if p == pid {
					fail("holder %d of %s: %v", pid, id, err)
				}
				continue // a child that just exited
			}
			m.holders.rss += mi.rss
			m.holders.anon += mi.anon
			if mi.pss < 0 || m.holders.pss < 0 {
				m.holders.pss = -1
			} else {
				m.holders.pss += mi.pss
			}
			m.procs++
		}
	}
	if found != len(ids) {
		fail("list_workspace_sessions lists %d of the %d live sessions", found, len(ids))
	}
	now, err := readMem(b.sup.Process.Pid)
	check(err)
	m.supGrowth = now.rss - before.rss
	m.supPssGrowth = -1
	if now.pss >= 0 && before.pss >= 0 {
		m.supPssGrowth = now.pss - before.pss
	}
	return m
}

func readMem(pid int) (memInfo, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memInfo{}, err
	}
	defer f.Close()
	var mi memInfo
	seen := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "RssAnon") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return memInfo{}, fmt.Errorf("/proc/%d/status %s: %q", pid, k, v)
		}
		if k == "VmRSS" {
			mi.rss, seen = kb<<10, true
		} else {
			mi.anon = kb << 10
		}
	}
	if !seen {
		return memInfo{}, fmt.Errorf("/proc/%d/status has no VmRSS", pid)
	}
	mi.pss = readPss(pid)
	return mi, sc.Err()
}

// readPss returns the proportional set size (shared pages divided among
// their users), or -1 when /proc/<pid>/smaps_rollup cannot be read.
func readPss(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "Pss:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return -1
			}
			return kb << 10
		}
	}
	return -1
}

// childMap maps each pid to its children, from /proc/*/stat.
func childMap() map[int][]int {
	m := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may contain spaces and parentheses.
		i := bytes.LastIndexByte(st, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(st[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			m[ppid] = append(m[ppid], pid)
		}
	}
	return m
}

func descendants(pid int, children map[int][]int) []int {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// ---------------------------------------------------------------- helpers

func timed(f func() error) (time.Duration, error) {
	t0 := time.Now()
	err := f()
	return time.Since(t0), err
}

func runCmd(dir, name string, args ...string) error {
	_, err := runOutDir(dir, name, args...)
	return err
}

func runOut(name string, args ...string) ([]byte, error) { return runOutDir("", name, args...) }

func runOutDir(dir, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, oneLine(errb.String()))
	}
	return out.Bytes(), nil
}

func removeAll(p string) error {
	_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(q, 0o755)
		}
		return nil
	})
	return os.RemoveAll(p)
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "n/a"
	}
	r := float64(a) / float64(b)
	switch {
	case math.Abs(r) >= 100:
		return fmt.Sprintf("%.0f×", r)
	case math.Abs(r) >= 10:
		return fmt.Sprintf("%.1f×", r)
	default:
		return fmt.Sprintf("%.2f×", r)
	}
}

func mib(bytes int64) string { return fmt.Sprintf("%.1f MiB", float64(bytes)/(1<<20)) }

func count(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
