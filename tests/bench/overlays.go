package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/fuseoverlay"
	"golang.org/x/sys/unix"
)

// Part 6 compares the overlay drivers on the same trees, side by side in one
// run: a native directory, the kernel overlay (OverlayFS with userxattr), the
// project's FUSE overlay (fuseoverlay.Mount) and Debian's fuse-overlayfs.
// Every overlay column is mounted by a worker (this binary re-executed with
// overlayWorkerArg) in a fresh user+mount namespace, as a session's holder
// mounts it, and the workloads run in that worker, so what is measured is the
// filesystem, not the supervisor's command path. The FUSE overlay is served
// by a process of its own (overlayServerArg), as the holder serves it to the
// session's commands, with the holder's GOMAXPROCS: served by the worker
// itself it would share one Go runtime with the workloads, which no session
// does (and which measures differently: see fuseoverlay.ServerProcs).
//
// Cold cannot mean "caches dropped" rootless (drop_caches needs init-ns
// root), so cold means the first pass over a fresh mount: the overlay's (and
// FUSE's) dentry, inode and attribute caches and the FUSE daemon's state are
// new, while the backing files may still be in the host page cache. For the
// native column, which has no mount to renew, cold is simply the first pass
// of each rep.

const overlayWorkerArg = "__overlay-worker"

// overlayServerArg re-executes this binary as the server of one FUSE
// overlay mount (a worker's child, in the worker's namespaces).
const overlayServerArg = "__overlay-fuse-server"

// fuseProfileEnv names the directory where each fuse server writes its CPU
// profile (-fuse-profile).
const fuseProfileEnv = "ESBX_BENCH_FUSE_PROFILE"

// serverJob is what a worker passes to its FUSE server (as JSON in argv).
type serverJob struct {
	Lower, Upper, Work, Mnt string
	// Count makes the server count requests: it then answers each line
	// "counts" on its stdin with the counts so far (JSON, one line).
	Count bool
}

// overlayTrees are the workload sizes.
type overlayTrees struct {
	SmallFiles int   `json:"small_files"` // read workload: 4 KiB files
	StatFiles  int   `json:"stat_files"`  // stat workload: 100 B files
	RepoFiles  int   `json:"repo_files"`  // git status workload: .go files of 60 lines
	WriteBytes int64 `json:"write_bytes"` // one file, written in 1 MiB chunks
}

// workerJob is what the parent passes to a worker (as JSON in argv).
type workerJob struct {
	Column  string       `json:"column"` // native, kernel, fuse, fuse-overlayfs
	Lower   string       `json:"lower"`
	Scratch string       `json:"scratch"` // upper, work and mount dirs live here
	Reps    int          `json:"reps"`    // measured reps; one more untimed warm-up
	Trees   overlayTrees `json:"trees"`
	Count   bool         `json:"count"` // fuse: count requests per workload
}

// workerResult maps a workload name to its measured durations.
type workerResult struct {
	Unavailable string                     `json:"unavailable,omitempty"`
	Times       map[string][]time.Duration `json:"times,omitempty"`
	// Requests are the fuse column's requests per workload and opcode
	// (the first measured rep), with -fuse-requests.
	Requests map[string]map[string]uint64 `json:"requests,omitempty"`
}

var overlayColumns = []string{"native", "kernel", "fuse", "fuse-overlayfs"}

var overlayWorkloads = []string{"read cold", "read warm", "git status cold", "git status warm", "stat cold", "stat warm", "write"}

func (b *bench) overlays() {
	trees := overlayTrees{SmallFiles: 2000, StatFiles: 20000, RepoFiles: 5000, WriteBytes: 200 << 20}
	if b.cfg.quick {
		trees = overlayTrees{SmallFiles: 2000, StatFiles: 5000, RepoFiles: 1000, WriteBytes: 50 << 20}
	}
	lower := filepath.Join(b.root, "ov-lower")
	check(genFiles(filepath.Join(lower, "small"), trees.SmallFiles, 100, 4096, "small"))
	check(genFiles(filepath.Join(lower, "many"), trees.StatFiles, 100, 100, "stat"))
	check(genRepo(filepath.Join(lower, "repo"), trees.RepoFiles))
	self, err := os.Executable()
	check(err)

	columns := overlayColumns
	results := map[string]workerResult{}
	for _, c := range columns {
		if len(b.cfg.columns) > 0 && !slices.Contains(b.cfg.columns, c) {
			results[c] = workerResult{Unavailable: "not measured (-columns)"}
		}
	}
	if _, err := exec.LookPath("fuse-overlayfs"); err != nil && results["fuse-overlayfs"].Unavailable == "" {
		results["fuse-overlayfs"] = workerResult{Unavailable: "skipped: fuse-overlayfs not installed"}
	}
	// The columns take turns, one measured rep each per round and in a
	// rotating order, so that load from outside (2 shared CPUs) falls on
	// all of them alike and the ratios compare like with like.
	for rep := 0; rep < b.cfg.reps; rep++ {
		for i := range columns {
			col := columns[(i+rep)%len(columns)]
			if results[col].Unavailable != "" {
				continue
			}
			job := workerJob{Column: col, Lower: lower, Scratch: filepath.Join(b.root, fmt.Sprintf("ov-%s-%d", col, rep)), Reps: 1, Trees: trees,
				Count: b.cfg.fuseRequests && col == "fuse"}
			r := runWorker(self, job)
			if r.Unavailable != "" {
				results[col] = r
				continue
			}
			acc := results[col]
			if acc.Times == nil {
				acc.Times = map[string][]time.Duration{}
			}
			for w, ts := range r.Times {
				acc.Times[w] = append(acc.Times[w], ts...)
			}
			if acc.Requests == nil {
				acc.Requests = r.Requests
			}
			results[col] = acc
		}
	}

	b.printf("trees: read %d × 4 KiB files, stat %d files, git status on a %d-file repo, write %d MiB; cold = first pass over a fresh mount (see tests/bench/overlays.go)\n",
		trees.SmallFiles, trees.StatFiles, trees.RepoFiles, trees.WriteBytes>>20)
	tw := b.table(tabwriter.AlignRight)
	fmt.Fprint(tw, "workload\t")
	for _, c := range columns {
		fmt.Fprintf(tw, "%s\t", c)
	}
	fmt.Fprintln(tw, "kernel/native\tfuse/kernel\tfuse/fuse-overlayfs\t")
	med := func(col, w string) time.Duration {
		r := results[col]
		if r.Unavailable != "" {
			return 0
		}
		return median(r.Times[w])
	}
	for _, w := range overlayWorkloads {
		fmt.Fprintf(tw, "%s\t", w)
		for _, c := range columns {
			if results[c].Unavailable != "" {
				fmt.Fprint(tw, "n/a\t")
				continue
			}
			fmt.Fprintf(tw, "%s\t", ms(med(c, w)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", ratioOr(med("kernel", w), med("native", w)), ratioOr(med("fuse", w), med("kernel", w)), ratioOr(med("fuse", w), med("fuse-overlayfs", w)))
	}
	tw.Flush()
	for _, c := range columns {
		if r := results[c]; r.Unavailable != "" {
			b.printf("%s: %s\n", c, r.Unavailable)
		}
	}
	if reqs := results["fuse"].Requests; reqs != nil {
		b.printRequests(reqs)
	}
	b.printf("fuse is served by a process of its own with GOMAXPROCS=%d, as a session's holder serves it (fuseoverlay.ServerProcs)\n", fuseoverlay.ServerProcs)
	b.println("git status runs with GIT_OPTIONAL_LOCKS=0 as in sessions; in every overlay column the index's uid and st_dev differ from what the")
	b.println("namespace sees, so each pass re-reads every file (natively it only stats them)")
	limits := map[string]float64{"read warm": 2, "git status warm": 2, "read cold": 4, "git status cold": 4, "write": 1.5}
	for _, w := range overlayWorkloads {
		lim, ok := limits[w]
		if !ok {
			continue
		}
		f, k := med("fuse", w), med("kernel", w)
		if f <= 0 || k <= 0 {
			b.target("fuse / kernel, "+w, "n/a", math.NaN(), "≤", lim, "×", "not measured")
			continue
		}
		b.target("fuse / kernel, "+w, ratio(f, k), ratioValue(f, k), "≤", lim, "×", "")
	}
	if results["fuse-overlayfs"].Unavailable != "" || results["fuse"].Unavailable != "" {
		b.target("workloads where fuse is not faster than fuse-overlayfs (of 7)", "n/a", math.NaN(), "<", 1, "", "fuse-overlayfs or fuse not measured")
	} else {
		slower := 0
		for _, w := range overlayWorkloads {
			if med("fuse", w) >= med("fuse-overlayfs", w) {
				slower++
			}
		}
		b.target("workloads where fuse is not faster than fuse-overlayfs (of 7)", strconv.Itoa(slower), float64(slower), "<", 1, "", "")
	}
}

// printRequests prints the fuse column's requests per workload: the total
// and the opcodes, most frequent first.
func (b *bench) printRequests(reqs map[string]map[string]uint64) {
	b.println("fuse requests per workload (first measured rep; the counting slowed the fuse column, so its times above are not comparable):")
	tw := b.table(0)
	fmt.Fprintln(tw, "workload\ttotal\trequests by opcode\t")
	for _, w := range overlayWorkloads {
		ops := reqs[w]
		var total uint64
		names := make([]string, 0, len(ops))
		for op, n := range ops {
			total += n
			names = append(names, op)
		}
		slices.SortFunc(names, func(a, b string) int {
			if ops[a] != ops[b] {
				return int(ops[b]) - int(ops[a])
			}
			return strings.Compare(a, b)
		})
		parts := make([]string, len(names))
		for i, op := range names {
			parts[i] = fmt.Sprintf("%s %d", op, ops[op])
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t\n", w, total, strings.Join(parts, ", "))
	}
	tw.Flush()
}

// ratioOr is a/b, or n/a when either side was not measured.
func ratioOr(a, b time.Duration) string {
	if a <= 0 || b <= 0 {
		return "n/a"
	}
	return ratio(a, b)
}

// runWorker runs one column in a worker process; the overlay columns get a
// new user namespace (uid and gid mapped to root) and mount namespace.
func runWorker(self string, job workerJob) workerResult {
	arg, err := json.Marshal(job)
	check(err)
	cmd := exec.CommandContext(ctx, self, overlayWorkerArg, string(arg))
	if job.Column != "native" {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		}
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		fail("%s worker: %v: %s", job.Column, err, oneLine(errb.String()))
	}
	var res workerResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		fail("%s worker output %q: %v", job.Column, oneLine(out.String()), err)
	}
	return res
}

// genFiles writes n files of size bytes, perDir per directory.
func genFiles(dir string, n, perDir, size int, tag string) error {
	content := bytes.Repeat([]byte("x"), size)
	for i := 0; i < n; i++ {
		d := filepath.Join(dir, fmt.Sprintf("d%04d", i/perDir))
		if i%perDir == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		copy(content, fmt.Sprintf("%s %07d ", tag, i))
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%04d", i%perDir)), content, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// genRepo writes a git repository of n Go files of 60 lines, 10 per package, committed.
func genRepo(dir string, n int) error {
	for i := 0; i < n; i++ {
		pkg := fmt.Sprintf("p%04d", i/10)
		d := filepath.Join(dir, pkg)
		if i%10 == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		var src strings.Builder
		fmt.Fprintf(&src, "package %s\n\n", pkg)
		for l := 0; l < 29; l++ {
			fmt.Fprintf(&src, "// F%d_%d returns a constant.\nfunc F%d_%d() int { return %d }\n", i, l, i, l, l)
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d.go", i)), []byte(src.String()), 0o644); err != nil {
			return err
		}
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"add", "-A", "."},
		// No automatic (detached) gc: it would race the explicit one.
		{"-c", "gc.auto=0", "commit", "-q", "--no-gpg-sign", "-m", "bench repo"},
		{"gc", "-q"},
	} {
		if err := runGit(dir, args...); err != nil {
			return err
		}
	}
	return nil
}

// ---------------------------------------------------------------- the worker

// overlayWorker is main() for the worker process: it prints a workerResult.
func overlayWorker(arg string) int {
	var job workerJob
	if err := json.Unmarshal([]byte(arg), &job); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	res, err := job.run(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// mounted is one fresh mount of a column; unmount tears it down.
type mounted struct {
	dir     string
	unmount func() error
	// counts returns the requests served so far by opcode (a counted
	// fuse mount), else nil.
	counts func() (map[string]uint64, error)
}

func (job *workerJob) run(ctx context.Context) (workerResult, error) {
	if job.Column != "native" {
		// Our mounts must not propagate anywhere (the namespace's copy of the
		// host mounts may be shared).
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return workerResult{}, fmt.Errorf("make / private: %w", err)
		}
	}
	res := workerResult{Times: map[string][]time.Duration{}}
	for rep := 0; rep <= job.Reps; rep++ { // rep 0 is the untimed warm-up
		m, err := job.mount(ctx, rep)
		if err != nil {
			if rep == 0 && job.Column != "native" && job.Column != "kernel" {
				return workerResult{Unavailable: "unavailable: " + oneLine(err.Error())}, nil
			}
			return workerResult{}, err
		}
		times, reqs, err := job.workloads(ctx, m)
		uerr := m.unmount()
		if err != nil {
			return workerResult{}, fmt.Errorf("%s rep %d: %w", job.Column, rep, err)
		}
		if uerr != nil {
			return workerResult{}, fmt.Errorf("%s rep %d: unmount: %w", job.Column, rep, uerr)
		}
		if rep > 0 {
			for k, v := range times {
				res.Times[k] = append(res.Times[k], v)
			}
			if res.Requests == nil {
				res.Requests = reqs
			}
		}
	}
	return res, nil
}

// mount makes a fresh mount of the column over the lower tree, with an empty
// upper and work dir.
func (job *workerJob) mount(ctx context.Context, rep int) (*mounted, error) {
	if job.Column == "native" {
		return &mounted{dir: job.Lower, unmount: func() error { return nil }}, nil
	}
	base := filepath.Join(job.Scratch, fmt.Sprint(rep))
	upper, work, mnt := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "mnt")
	for _, d := range []string{upper, work, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	umount := func() error { return unix.Unmount(mnt, 0) }
	var counts func() (map[string]uint64, error)
	switch job.Column {
	case "kernel":
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,userxattr", job.Lower, upper, work)
		if err := unix.Mount("overlay", mnt, "overlay", 0, opts); err != nil {
			return nil, fmt.Errorf("mount overlay: %w", err)
		}
	case "fuse-overlayfs":
		out, err := exec.CommandContext(ctx, "fuse-overlayfs", "-o", fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", job.Lower, upper, work), mnt).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("fuse-overlayfs: %v: %s", err, out)
		}
	case "fuse":
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		arg, err := json.Marshal(serverJob{Lower: job.Lower, Upper: upper, Work: work, Mnt: mnt, Count: job.Count})
		if err != nil {
			return nil, err
		}
		// The server unmounts and exits when its stdin closes.
		cmd := exec.CommandContext(ctx, self, overlayServerArg, string(arg))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start fuse server: %w", err)
		}
		br := bufio.NewReader(stdout)
		if line, err := br.ReadString('\n'); line != "ready\n" {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("fuse server: %q %v", line, err)
		}
		if job.Count {
			counts = func() (map[string]uint64, error) {
				if _, err := io.WriteString(stdin, "counts\n"); err != nil {
					return nil, err
				}
				line, err := br.ReadBytes('\n')
				if err != nil {
					return nil, fmt.Errorf("fuse server counts: %w", err)
				}
				var m map[string]uint64
				return m, json.Unmarshal(line, &m)
			}
		}
		umount = func() error {
			stdin.Close()
			if err := cmd.Wait(); err != nil {
				return fmt.Errorf("fuse server: %w", err)
			}
			return nil
		}
	default:
		return nil, fmt.Errorf("unknown column %q", job.Column)
	}
	return &mounted{dir: mnt, unmount: umount, counts: counts}, nil
}

// overlayServer is main() for the FUSE server process: it mounts the
// overlay the way the holder does (provenance on: every open is attributed
// and the records are passed on, here dropped), says "ready" and serves
// until its stdin closes.
func overlayServer(arg string) int {
	var job serverJob
	if err := json.Unmarshal([]byte(arg), &job); err != nil {
		fmt.Fprintln(os.Stderr, "fuse server:", err)
		return 2
	}
	runtime.GOMAXPROCS(fuseoverlay.ServerProcs)
	if d := os.Getenv(fuseProfileEnv); d != "" {
		pf, err := os.Create(filepath.Join(d, fmt.Sprintf("fuse-%d.pprof", os.Getpid())))
		if err == nil {
			err = pprof.StartCPUProfile(pf)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "fuse server: profile:", err)
			return 1
		}
		defer func() {
			pprof.StopCPUProfile()
			pf.Close()
		}()
	}
	var files []*os.File
	for _, d := range []string{job.Lower, job.Upper, job.Work} {
		f, err := os.Open(d)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fuse server:", err)
			return 1
		}
		files = append(files, f)
	}
	var counter *fuseoverlay.RequestCounter
	if job.Count {
		counter = &fuseoverlay.RequestCounter{}
	}
	srv, err := fuseoverlay.Mount(context.Background(), job.Mnt, fuseoverlay.Options{
		Lowers: files[:1], Upper: files[1], Work: files[2], Name: "bench",
		Owner:    func(uint32) string { return "cmd-bench" },
		Sink:     func([]fuseoverlay.Record) {},
		Requests: counter,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fuse server: fuseoverlay.Mount:", err)
		return 1
	}
	fmt.Println("ready")
	// Serve until stdin closes, answering "counts" lines.
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "counts" && counter != nil {
			line, _ := json.Marshal(counter.Snapshot())
			fmt.Println(string(line))
		}
	}
	uerr := srv.Unmount()
	srv.Wait()
	// files stay referenced until here: the server keeps only their
	// descriptors, which a collected *os.File would close.
	for _, f := range files {
		f.Close()
	}
	if uerr != nil {
		fmt.Fprintln(os.Stderr, "fuse server:", uerr)
		return 1
	}
	return 0
}

// workloads runs every workload once over a fresh mount: the cold passes
// first, then the warm ones, then the write. For a counted mount it also
// returns each workload's requests by opcode.
func (job *workerJob) workloads(ctx context.Context, m *mounted) (map[string]time.Duration, map[string]map[string]uint64, error) {
	dir := m.dir
	t := job.Trees
	small := treePaths(filepath.Join(dir, "small"), t.SmallFiles, 100)
	many := treePaths(filepath.Join(dir, "many"), t.StatFiles, 100)
	out := map[string]time.Duration{}
	steps := []struct {
		name string
		f    func() error
	}{
		{"read cold", func() error { return readAll(small) }},
		{"stat cold", func() error { return statAll(many) }},
		{"git status cold", func() error { return gitStatus(ctx, filepath.Join(dir, "repo")) }},
		{"read warm", func() error { return readAll(small) }},
		{"stat warm", func() error { return statAll(many) }},
		{"git status warm", func() error { return gitStatus(ctx, filepath.Join(dir, "repo")) }},
		{"write", func() error { return writeBig(filepath.Join(dir, "write.bin"), t.WriteBytes) }},
	}
	var reqs map[string]map[string]uint64
	var last map[string]uint64
	if m.counts != nil {
		reqs = map[string]map[string]uint64{}
		var err error
		if last, err = m.counts(); err != nil {
			return nil, nil, err
		}
	}
	for _, s := range steps {
		t0 := time.Now()
		if err := s.f(); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", s.name, err)
		}
		out[s.name] = time.Since(t0)
		if m.counts != nil {
			now, err := m.counts()
			if err != nil {
				return nil, nil, err
			}
			d := map[string]uint64{}
			for op, n := range now {
				if n > last[op] {
					d[op] = n - last[op]
				}
			}
			reqs[s.name], last = d, now
		}
	}
	return out, reqs, os.Remove(filepath.Join(dir, "write.bin"))
}

func treePaths(dir string, n, perDir int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = filepath.Join(dir, fmt.Sprintf("d%04d", i/perDir), fmt.Sprintf("f%04d", i%perDir))
	}
	return out
}

func readAll(paths []string) error {
	buf := make([]byte, 64<<10)
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		for {
			_, err := f.Read(buf)
			if err == io.EOF {
				break
			}
			if err != nil {
				f.Close()
				return err
			}
		}
		f.Close()
	}
	return nil
}

func statAll(paths []string) error {
	var st unix.Stat_t
	for _, p := range paths {
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", p, err)
		}
	}
	return nil
}

// gitStatus runs git status as a session does (GIT_OPTIONAL_LOCKS=0: the
// index is not rewritten, so every pass does the same work).
func gitStatus(ctx context.Context, repo string) error {
	cmd := exec.CommandContext(ctx, "git", "-C", repo, "status", "--porcelain")
	cmd.Env = append(os.Environ(), "GIT_OPTIONAL_LOCKS=0", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("git status: %v: %s", err, oneLine(string(out)))
	}
	if len(bytes.TrimSpace(out)) != 0 {
		return errors.New("git status reports changes: " + oneLine(string(out)))
	}
	return nil
}

func writeBig(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	chunk := bytes.Repeat([]byte("w"), 1<<20)
	for n := int64(0); n < size; n += int64(len(chunk)) {
		if _, err := f.Write(chunk); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
