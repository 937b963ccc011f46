package nsholder

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/nsholder/shim"
	"golang.org/x/sys/unix"
)

// testSelf is the sandbox-supervisor binary the holders are started from;
// testShim is the sandbox-exec-shim binary for Config.Shim (the test binary
// when the C shim could not be built: testShimErr says why).
var (
	testSelf, testShim string
	testShimErr        error
)

var defaultHostPaths = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/nix"}

func TestMain(m *testing.M) {
	// The test binary doubles as the holder when the real binary cannot be
	// built (say the supervisor package is mid-change): the holder and the
	// shim then run this package's code just the same.
	if len(os.Args) > 1 && os.Args[1] == "nsholder" {
		os.Exit(Main(os.Args[2:]))
	}
	if filepath.Base(os.Args[0]) == "sandbox-exec-shim" { // argv[0] the holder gives Config.Shim
		os.Exit(shim.Run(os.Args[1:]))
	}
	dir, err := os.MkdirTemp("", "nsholder-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testSelf = filepath.Join(dir, "sandbox-supervisor")
	build := exec.Command("go", "build", "-o", testSelf, "./cmd/sandbox-supervisor")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "nsholder tests: cannot build sandbox-supervisor (%v), using the test binary as the holder:\n%s", err, out)
		if testSelf, err = os.Executable(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	// The C exec shim, built as the Makefile builds it. Without a C
	// compiler the test binary stands in (TestExecShim then skips, or
	// fails under ESBX_REQUIRE_ALL=1).
	testShim = filepath.Join(dir, "sandbox-exec-shim")
	build = exec.Command("sh", "cmd/sandbox-exec-shim/build.sh", testShim)
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		testShimErr = fmt.Errorf("cannot build sandbox-exec-shim: %v\n%s", err, out)
		fmt.Fprintf(os.Stderr, "nsholder tests: %v; using the test binary as the shim\n", testShimErr)
		if testShim, err = os.Executable(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fixture is the on-disk layout of one session.
type fixture struct {
	dir, lower, lower2, upper, work, scratch string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	d := t.TempDir()
	f := &fixture{dir: d}
	f.lower, f.lower2 = filepath.Join(d, "lower1"), filepath.Join(d, "lower0")
	f.upper, f.work, f.scratch = filepath.Join(d, "upper"), filepath.Join(d, "work"), filepath.Join(d, "scratch")
	for _, p := range []string{f.lower, f.lower2, f.upper, f.work, f.scratch, filepath.Join(f.lower2, "sub")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.WriteFile(filepath.Join(f.lower, "hello.txt"), []byte("hello from lower\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(f.lower2, "hello.txt"), []byte("older layer\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(f.lower2, "sub", "a"), []byte("a\n"), 0o644))
	t.Cleanup(func() { openUp(d) }) // runs before TempDir's removal
	return f
}

// openUp makes every directory below d removable (the kernel leaves
// work/work with mode 000).
func openUp(d string) {
	_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
		if e != nil && e.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) config(id string) Config {
	return Config{
		SessionID: id,
		Lowers:    []string{f.lower, f.lower2},
		Upper:     f.upper,
		Work:      f.work,
		Scratch:   f.scratch,
		HostPaths: defaultHostPaths,
	}
}

// session wraps a holder Client and routes its events to per-command channels.
type session struct {
	t     *testing.T
	h     *Client
	mu    sync.Mutex
	chans map[uint64]chan Event
	early map[uint64][]Event
}

func startSession(t *testing.T, cfg Config) *session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := Start(ctx, testSelf, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	return sessionOf(t, h)
}

// sessionOf wraps a started holder; it is closed at the end of the test.
func sessionOf(t *testing.T, h *Client) *session {
	s := &session{t: t, h: h, chans: map[uint64]chan Event{}, early: map[uint64][]Event{}}
	go func() {
		for e := range h.Events() {
			s.mu.Lock()
			if ch := s.chans[e.ID]; ch != nil {
				ch <- e
			} else {
				s.early[e.ID] = append(s.early[e.ID], e)
			}
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() { h.Close(2 * time.Second) })
	return s
}

// cmdRun is one spawned command and what it produced.
type cmdRun struct {
	p        *Process
	events   chan Event
	out      bytes.Buffer
	outDone  chan struct{}
	exitedAt time.Time
	doneAt   time.Time
	status   syscall.WaitStatus
	exited   bool
}

func (s *session) spawn(cmd string) *cmdRun {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := s.h.Spawn(ctx, SpawnRequest{Cmd: cmd, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TERM=dumb"}, Dir: "/workspace"})
	if err != nil {
		s.t.Fatalf("Spawn %q: %v", cmd, err)
	}
	r := &cmdRun{p: p, events: make(chan Event, 16), outDone: make(chan struct{})}
	s.mu.Lock()
	s.chans[p.ID] = r.events
	for _, e := range s.early[p.ID] {
		r.events <- e
	}
	delete(s.early, p.ID)
	s.mu.Unlock()
	go func() {
		defer close(r.outDone)
		_, _ = io.Copy(&r.out, p.PTY) // ends with EIO once no process holds the slave
	}()
	return r
}

// wait waits for Done and the end of the output.
func (r *cmdRun) wait(t *testing.T, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for r.doneAt.IsZero() {
		select {
		case e := <-r.events:
			if e.Exited {
				if r.exited {
					t.Errorf("command %d: second Exited event", r.p.ID)
				}
				r.exited, r.status, r.exitedAt = true, e.Status, time.Now()
			}
			if e.Done {
				if !r.exited {
					t.Errorf("command %d: Done before Exited", r.p.ID)
				}
				r.doneAt = time.Now()
			}
		case <-deadline:
			t.Fatalf("command %d not done after %v; output so far %q", r.p.ID, timeout, r.out.String())
		}
	}
	select {
	case <-r.outDone:
	case <-deadline:
		t.Fatalf("command %d: PTY output did not end", r.p.ID)
	}
	r.p.PTY.Close()
	return strings.ReplaceAll(r.out.String(), "\r\n", "\n")
}

// run runs cmd to completion and returns its output and exit status.
func (s *session) run(cmd string) (string, int) {
	s.t.Helper()
	r := s.spawn(cmd)
	out := r.wait(s.t, 20*time.Second)
	code := r.status.ExitStatus()
	if r.status.Signaled() {
		code = -int(r.status.Signal())
	}
	return out, code
}

// ok runs cmd, which must succeed, and returns its trimmed output.
func (s *session) ok(cmd string) string {
	s.t.Helper()
	out, code := s.run(cmd)
	if code != 0 {
		s.t.Fatalf("%q: exit %d, output %q", cmd, code, out)
	}
	return strings.TrimSpace(out)
}

// fails runs cmd, which must fail.
func (s *session) fails(cmd string) string {
	s.t.Helper()
	out, code := s.run(cmd)
	if code == 0 {
		s.t.Fatalf("%q succeeded: %q", cmd, out)
	}
	return out
}

func TestSessionRoot(t *testing.T) {
	f := newFixture(t)
	s := startSession(t, f.config("sess-root-1"))

	if got := s.ok("cat /workspace/hello.txt; cat /workspace/sub/a"); got != "hello from lower\na" {
		t.Errorf("workspace content = %q", got)
	}
	s.ok("echo hi > /workspace/x")
	if b, err := os.ReadFile(filepath.Join(f.upper, "x")); err != nil || string(b) != "hi\n" {
		t.Errorf("upper/x = %q, %v", b, err)
	}
	for _, l := range []string{f.lower, f.lower2} {
		if _, err := os.Lstat(filepath.Join(l, "x")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("write reached lower %s: %v", l, err)
		}
	}

	// The host's home directory is not visible (as root, /root exists
	// inside but is the session's scratch: none of the host's entries).
	home, _ := os.UserHomeDir()
	hidden := []string{"/home", f.dir, f.upper, f.scratch, "/run/user", "/mnt"}
	if ents, err := os.ReadDir(home); err == nil && len(ents) > 0 {
		hidden = append(hidden, filepath.Join(home, ents[0].Name()))
	}
	if home != "/root" {
		hidden = append(hidden, home)
	}
	for _, p := range hidden {
		if p == "" {
			continue
		}
		if out, code := s.run("ls -d " + p); code == 0 {
			t.Errorf("%s is visible inside: %q", p, out)
		}
	}

	// /proc shows only the session: the holder (1) and this shell.
	out := s.ok(`for p in /proc/[0-9]*; do echo "${p#/proc/}"; done; echo "self $$"`)
	lines := strings.Fields(out)
	self := lines[len(lines)-1]
	pids := lines[:len(lines)-2]
	if strings.Join(pids, " ") != "1 "+self {
		t.Errorf("/proc lists %v, want only 1 and %s", pids, self)
	}
	if got := s.ok("uname -n; hostname"); got != "sess-root-1\nsess-root-1" {
		t.Errorf("hostname = %q", got)
	}
	// The holder is not dumpable: its descriptors and memory are closed
	// to the session even though both are uid 0.
	s.fails("readlink /proc/1/fd/0")
	s.fails("head -c1 /proc/1/environ")
	s.fails("readlink /proc/1/exe")
	if got := s.ok("id -u; id -g"); got != "0\n0" {
		t.Errorf("id = %q", got)
	}

	// /tmp is writable and backed by the scratch dir, not the host's /tmp.
	name := "nsholder-private-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	s.ok("echo t > /tmp/" + name + " && cat /tmp/" + name + " && touch /var/tmp/v /root/r /run/u")
	if _, err := os.Stat(filepath.Join(f.scratch, "tmp", name)); err != nil {
		t.Errorf("/tmp file not in scratch: %v", err)
	}
	if _, err := os.Stat(filepath.Join(os.TempDir(), name)); err == nil {
		t.Errorf("/tmp file reached the host's /tmp")
	}
	for _, p := range []string{"var-tmp/v", "root/r", "run/u"} {
		if _, err := os.Stat(filepath.Join(f.scratch, p)); err != nil {
			t.Errorf("scratch %s: %v", p, err)
		}
	}

	// Read-only system and root.
	for _, p := range []string{"/usr/nsholder-x", "/etc/nsholder-x", "/nsholder-x", "/sys/nsholder-x"} {
		if out := s.fails("touch " + p + " 2>&1"); !strings.Contains(out, "Read-only file system") {
			t.Errorf("touch %s: %q, want EROFS", p, out)
		}
	}
	if got := s.ok("readlink /bin; readlink /dev/ptmx; readlink /dev/fd"); got != "usr/bin\npts/ptmx\n/proc/self/fd" {
		t.Errorf("links = %q", got)
	}
	s.ok("echo x > /dev/null && head -c 4 /dev/zero | od -An -tx1 && head -c 4 /dev/urandom >/dev/null && test -c /dev/full && test -c /dev/tty")
	s.ok("echo shm > /dev/shm/s && cat /dev/shm/s")
	if got := s.ok("tty"); !strings.HasPrefix(got, "/dev/pts/") {
		t.Errorf("tty = %q", got)
	}
	// The session's devpts is its own: no host terminal is in it.
	if got := s.ok("ls /dev/pts"); strings.Fields(got)[0] != "0" || len(strings.Fields(got)) != 2 {
		t.Errorf("/dev/pts = %q, want 0 and ptmx", got)
	}
	// Holder mounts: no path of the supervisor's filesystem in mountinfo
	// but the overlay's options.
	if got := s.ok("awk '{print $5}' /proc/self/mountinfo | sort"); strings.Contains(got, f.dir) || strings.Contains(got, home+"/") {
		t.Errorf("mount points reveal host paths: %q", got)
	}
}

func TestHiddenPaths(t *testing.T) {
	// A host path outside the session's own mounts (/tmp, /root, ... are
	// scratch inside): the home directory, or /var/lib for root.
	base, err := os.UserHomeDir()
	if err != nil || base == "/root" {
		base = "/var/lib"
	}
	share, err := os.MkdirTemp(base, ".nsholder-test-")
	if err != nil {
		t.Skipf("no writable directory for a host path: %v", err)
	}
	defer os.RemoveAll(share)
	must(t, os.MkdirAll(filepath.Join(share, "secret"), 0o755))
	must(t, os.WriteFile(filepath.Join(share, "secret", "key"), []byte("k"), 0o644))
	must(t, os.WriteFile(filepath.Join(share, "token"), []byte("t"), 0o644))
	must(t, os.WriteFile(filepath.Join(share, "visible"), []byte("v\n"), 0o644))
	f := newFixture(t)
	cfg := f.config("sess-hidden")
	cfg.HostPaths = append(append([]string{}, defaultHostPaths...), share, "/nonexistent-host-path")
	cfg.HiddenPaths = []string{filepath.Join(share, "secret"), filepath.Join(share, "token"), "/nonexistent-hidden"}
	s := startSession(t, cfg)
	if got := s.ok("cat " + share + "/visible"); got != "v" {
		t.Errorf("visible = %q", got)
	}
	s.fails("cat " + share + "/secret/key")
	if got := s.ok("stat -c '%a %s' " + share + "/secret " + share + "/token"); got != "0 40\n0 0" && !strings.HasPrefix(got, "0 ") {
		t.Errorf("covers = %q", got)
	}
	if got := s.ok("ls -A " + share + "/secret 2>/dev/null | wc -l; cat " + share + "/token | wc -c"); got != "0\n0" {
		t.Errorf("covers not empty: %q", got)
	}
	s.fails("touch " + share + "/new")
}

func TestResolvConfCopy(t *testing.T) {
	d := t.TempDir()
	host, root, scratch := filepath.Join(d, "host"), filepath.Join(d, "root"), filepath.Join(d, "scratch")
	for _, p := range []string{host + "/etc", host + "/run/systemd/resolve", root + "/etc", scratch + "/run"} {
		must(t, os.MkdirAll(p, 0o755))
	}
	must(t, os.WriteFile(host+"/run/systemd/resolve/stub-resolv.conf", []byte("nameserver 127.0.0.53\n"), 0o644))
	for _, r := range []string{host, root} {
		must(t, os.Symlink("../run/systemd/resolve/stub-resolv.conf", r+"/etc/resolv.conf"))
	}
	must(t, copyResolvConf(root, host, scratch, []bindTarget{{"/etc", host + "/etc"}}))
	b, err := os.ReadFile(scratch + "/run/systemd/resolve/stub-resolv.conf")
	if err != nil || string(b) != "nameserver 127.0.0.53\n" {
		t.Errorf("copied resolv.conf = %q, %v", b, err)
	}
}

func TestSpawnPTY(t *testing.T) {
	f := newFixture(t)
	s := startSession(t, f.config("sess-pty"))

	if out, code := s.run("echo hello; exit 3"); code != 3 || !strings.Contains(out, "hello\n") {
		t.Errorf("run = %q, %d", out, code)
	}
	if out, code := s.run("kill -KILL $$"); code != -9 {
		t.Errorf("killed: %q, %d", out, code)
	}
	if got := s.ok("stty size; pwd; echo $0"); got != "50 200\n/workspace\n/bin/bash" {
		t.Errorf("terminal/cwd/shell = %q", got)
	}
	// The command's process group and session are its own.
	if got := s.ok(`read -r _ _ _ ppid pgrp sid _ < /proc/self/stat; echo "$ppid $pgrp $sid $$"`); func() bool {
		f := strings.Fields(got)
		return len(f) != 4 || f[1] != f[3] || f[2] != f[3]
	}() {
		t.Errorf("ppid pgrp sid pid = %q", got)
	}
	// Hardened through the shim.
	if got := s.ok("grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status | tr -s ' \t' ' '"); got != "NoNewPrivs: 1\nSeccomp: 2" {
		t.Errorf("hardening = %q", got)
	}

	if _, err := s.h.Spawn(context.Background(), SpawnRequest{Cmd: "true", Dir: "/nonexistent"}); err == nil || !strings.Contains(err.Error(), "/nonexistent") {
		t.Errorf("Spawn in a missing directory: %v", err)
	}

	// stdin through the PTY.
	r := s.spawn(`read -r line; echo "got:$line"`)
	time.Sleep(100 * time.Millisecond)
	if _, err := r.p.PTY.Write([]byte("abc\n")); err != nil {
		t.Fatal(err)
	}
	if out := r.wait(t, 10*time.Second); !strings.Contains(out, "got:abc") {
		t.Errorf("stdin: %q", out)
	}

	// A background child of the group holds the command open. It must
	// ignore SIGHUP: when the shell, the terminal's controlling process,
	// exits, the kernel sends SIGHUP to the terminal's foreground group.
	// (The short sleep lets the child set that up before the shell exits.)
	r = s.spawn("(trap '' HUP; exec sleep 1) >/dev/null 2>&1 </dev/null & sleep 0.2; echo started")
	r.wait(t, 10*time.Second)
	if d := r.doneAt.Sub(r.exitedAt); d < 500*time.Millisecond {
		t.Errorf("Done %v after Exited, want after the background sleep (1s)", d)
	}
	// Without that, it gets the SIGHUP and the command is done at once.
	r = s.spawn("sleep 100 >/dev/null 2>&1 </dev/null & echo started")
	r.wait(t, 10*time.Second)
	// One that leaves with setsid does not hold it (given the time to
	// call setsid before the shell exits and the SIGHUP comes).
	r = s.spawn("setsid sleep 100 >/dev/null 2>&1 </dev/null & sleep 0.2; echo started")
	r.wait(t, 10*time.Second)
	if d := r.doneAt.Sub(r.exitedAt); d > 3*time.Second {
		t.Errorf("setsid child held the command for %v", d)
	}
	if got := s.ok("pgrep -x sleep | wc -l"); got != "1" {
		t.Errorf("setsid sleep not running: %q", got)
	}

	// Orphans are reaped by the holder: no zombie remains.
	s.ok("(sleep 0.1 &) ; (true &) ; bash -c 'sleep 0.1 & exit 0'")
	time.Sleep(400 * time.Millisecond)
	if got := s.ok("grep -l '^State:.*Z' /proc/[0-9]*/status || true"); got != "" {
		t.Errorf("zombies: %q", got)
	}

	// Concurrent commands.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		r := s.spawn(fmt.Sprintf("sleep 0.2; echo n%d", i))
		go func() {
			defer wg.Done()
			if out := r.wait(t, 20*time.Second); !strings.Contains(out, fmt.Sprintf("n%d", i)) {
				t.Errorf("concurrent %d: %q", i, out)
			}
		}()
	}
	wg.Wait()
}

func TestSignal(t *testing.T) {
	f := newFixture(t)
	s := startSession(t, f.config("sess-signal"))
	ctx := context.Background()

	r := s.spawn("sleep 100")
	time.Sleep(200 * time.Millisecond)
	must(t, s.h.Signal(ctx, r.p.ID, syscall.SIGTERM))
	r.wait(t, 10*time.Second)
	if !r.status.Signaled() || r.status.Signal() != syscall.SIGTERM {
		t.Errorf("status = %v", r.status)
	}

	// A job in its own process group (same session) is reached too.
	r = s.spawn("set -m; sleep 100 & sleep 100 & wait")
	time.Sleep(300 * time.Millisecond)
	must(t, s.h.Signal(ctx, r.p.ID, syscall.SIGKILL))
	r.wait(t, 10*time.Second)
	if got := s.ok("pgrep -x sleep | wc -l"); got != "0" {
		t.Errorf("sleeps left after Signal: %s", got)
	}
	// Signalling a finished command is not an error; an unknown one is.
	must(t, s.h.Signal(ctx, r.p.ID, syscall.SIGTERM))
	if err := s.h.Signal(ctx, 9999, syscall.SIGTERM); err == nil {
		t.Error("Signal of an unknown command succeeded")
	}

	// Signals from inside do not reach the holder.
	s.ok("for s in TERM INT HUP QUIT USR1 USR2 SEGV BUS ABRT PIPE ALRM TSTP KILL STOP; do kill -$s 1 || true; done")
	time.Sleep(200 * time.Millisecond)
	if got := s.ok("echo alive"); got != "alive" {
		t.Errorf("after signals: %q", got)
	}
	select {
	case <-s.h.Done():
		t.Fatal("holder died from a signal sent inside")
	default:
	}
}

// TestOfflineNetwork: a holder with its own network namespace and no
// helper (profile offline) has lo only, no route, and its own ports.
func TestOfflineNetwork(t *testing.T) {
	f1, f2 := newFixture(t), newFixture(t)
	c1, c2 := f1.config("sess-net-1"), f2.config("sess-net-2")
	c1.IsolatedNetwork, c2.IsolatedNetwork = true, true
	s1, s2 := startSession(t, c1), startSession(t, c2)
	if got := s1.ok("ls /sys/class/net; cat /sys/class/net/lo/flags"); got != "lo\n0x9" {
		t.Errorf("interfaces = %q, want lo up (0x9)", got)
	}
	if got := s1.ok("cat /proc/net/route | wc -l"); got != "1" {
		t.Errorf("routes: %q lines, want the header only", got)
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no python3 to bind a port")
	}
	const bind = `python3 -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1", 47321)); s.listen(); print("bound", flush=True); time.sleep(2)'`
	r1 := s1.spawn(bind)
	time.Sleep(500 * time.Millisecond)
	r2 := s2.spawn(bind)
	o1, o2 := r1.wait(t, 20*time.Second), r2.wait(t, 20*time.Second)
	if !strings.Contains(o1, "bound") || !strings.Contains(o2, "bound") || r1.status != 0 || r2.status != 0 {
		t.Errorf("both offline holders must bind the port: %q / %q", o1, o2)
	}
}

func TestFileOps(t *testing.T) {
	f := newFixture(t)
	s := startSession(t, f.config("sess-files"))
	ctx := context.Background()

	data, info, err := s.h.ReadFile(ctx, "hello.txt", 1<<20)
	if err != nil || string(data) != "hello from lower\n" || info.Kind != "file" || info.Size != 17 {
		t.Fatalf("ReadFile = %q %+v %v", data, info, err)
	}
	created, err := s.h.WriteFile(ctx, "d/e/new.txt", []byte("new"), nil)
	if err != nil || !created {
		t.Fatalf("WriteFile = %v, %v", created, err)
	}
	if b, _ := os.ReadFile(filepath.Join(f.upper, "d/e/new.txt")); string(b) != "new" {
		t.Errorf("upper has %q", b)
	}
	mode := fs.FileMode(0o600)
	if created, err := s.h.WriteFile(ctx, "d/e/new.txt", []byte("newer\n"), &mode); err != nil || created {
		t.Errorf("overwrite = %v, %v", created, err)
	}
	if got := s.ok("cat /workspace/d/e/new.txt; stat -c %a /workspace/d/e/new.txt"); got != "newer\n600" {
		t.Errorf("seen inside: %q", got)
	}
	if info, err := s.h.Lstat(ctx, "sub"); err != nil || info.Kind != "directory" {
		t.Errorf("Lstat = %+v, %v", info, err)
	}
	infos, err := s.h.ReadDir(ctx, "")
	var names []string
	for _, i := range infos {
		names = append(names, i.Name)
	}
	if err != nil || strings.Join(names, ",") != "d,hello.txt,sub" {
		t.Errorf("ReadDir = %v, %v", names, err)
	}
	s.ok("ln -s /etc/passwd /workspace/link")
	if _, _, err := s.h.ReadFile(ctx, "nope", 10); !errors.Is(err, ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	var ke *KindError
	if _, _, err := s.h.ReadFile(ctx, "sub", 10); !errors.Is(err, ErrNotRegular) || !errors.As(err, &ke) || ke.Kind != "directory" {
		t.Errorf("directory: %v", err)
	}
	if _, _, err := s.h.ReadFile(ctx, "link/x", 10); !errors.Is(err, ErrSymlink) {
		t.Errorf("through symlink: %v", err)
	}
	if _, _, err := s.h.ReadFile(ctx, "hello.txt", 3); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too large: %v", err)
	}
	var pe *fs.PathError
	if _, err := s.h.Lstat(ctx, "hello.txt/x"); !errors.Is(err, ErrNotDir) || !errors.As(err, &pe) {
		t.Errorf("not a dir: %v", err)
	}
	if _, err := s.h.Lstat(ctx, "../x"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("../x: %v", err)
	}

	// A 256 MiB round trip, with small requests running alongside.
	big := make([]byte, 256<<20)
	rand.Read(big[:1<<20])
	for i := 1; i < 256; i++ {
		copy(big[i<<20:], big[:1<<20])
		big[i<<20] = byte(i)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.h.Lstat(ctx, "hello.txt"); err != nil {
					t.Errorf("concurrent Lstat: %v", err)
					return
				}
			}
		}()
	}
	if _, err := s.h.WriteFile(ctx, "big.bin", big, nil); err != nil {
		t.Fatalf("WriteFile 256 MiB: %v", err)
	}
	got, info, err := s.h.ReadFile(ctx, "big.bin", 1<<30)
	close(stop)
	wg.Wait()
	if err != nil || info.Size != int64(len(big)) || !bytes.Equal(got, big) {
		t.Fatalf("ReadFile 256 MiB: %d bytes, %+v, %v", len(got), info, err)
	}

	// A cancelled context returns promptly.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.h.Lstat(cctx, "hello.txt"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

// sessionProcs lists the host PIDs of the processes in holder's PID
// namespace (holder included).
func sessionProcs(t *testing.T, holder int) []int {
	t.Helper()
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", holder))
	if err != nil {
		t.Fatalf("holder pid ns: %v", err)
	}
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && l == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mountedAnywhere reports whether some process's mountinfo mentions s.
func mountedAnywhere(s string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/mountinfo"); err == nil && bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

func alive(pid int) bool { return unix.Kill(pid, 0) == nil }

func TestQuiesceAndClose(t *testing.T) {
	f := newFixture(t)
	s := startSession(t, f.config("sess-quiesce"))
	ctx := context.Background()

	r1 := s.spawn("sleep 1000")
	r2 := s.spawn("setsid sleep 1000 >/dev/null 2>&1 </dev/null & trap '' TERM; sleep 1000")
	time.Sleep(300 * time.Millisecond)
	qctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	must(t, s.h.Quiesce(qctx))
	cancel()
	// Events of the killed commands were delivered (before the reply).
	for _, r := range []*cmdRun{r1, r2} {
		r.wait(t, 5*time.Second)
		if !r.status.Signaled() || r.status.Signal() != syscall.SIGKILL {
			t.Errorf("command %d: status %v", r.p.ID, r.status)
		}
	}
	if out := s.ok(`for p in /proc/[0-9]*; do echo "${p#/proc/}"; done`); len(strings.Fields(out)) != 2 {
		t.Errorf("after Quiesce /proc lists %q, want the holder and this shell", out)
	}

	// Close: every session process and the holder's mounts are gone.
	s.spawn("setsid sleep 1000 >/dev/null 2>&1 </dev/null & sleep 1000")
	s.spawn("trap '' TERM; sleep 1000 & wait")
	time.Sleep(300 * time.Millisecond)
	holder := s.h.Pid()
	procs := sessionProcs(t, holder)
	if len(procs) < 5 {
		t.Errorf("session processes seen from the host: %v", procs)
	}
	if !mountedAnywhere(f.upper) {
		t.Error("overlay not visible in any mountinfo before Close")
	}
	start := time.Now()
	must(t, s.h.Close(500*time.Millisecond))
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Close took %v", d)
	}
	select {
	case <-s.h.Done():
	default:
		t.Error("Done not closed after Close")
	}
	for _, p := range procs {
		if alive(p) {
			t.Errorf("process %d survived Close", p)
		}
	}
	if mountedAnywhere(f.upper) {
		t.Error("overlay still mounted after Close")
	}
	if _, err := s.h.Lstat(ctx, "hello.txt"); !errors.Is(err, ErrExited) {
		t.Errorf("Lstat after Close: %v", err)
	}
	if _, err := s.h.Spawn(ctx, SpawnRequest{Cmd: "true"}); !errors.Is(err, ErrExited) {
		t.Errorf("Spawn after Close: %v", err)
	}
	// Events is closed.
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-s.h.Events():
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("Events not closed after Close")
		}
	}
}

func TestCloseGraceful(t *testing.T) {
	f := newFixture(t)
	s := startSession(t, f.config("sess-graceful"))
	s.spawn("trap 'echo bye > /workspace/bye; exit 0' TERM; while :; do sleep 0.05; done")
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	must(t, s.h.Close(10*time.Second))
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("graceful Close took %v although the command exited on SIGTERM", d)
	}
	if b, err := os.ReadFile(filepath.Join(f.upper, "bye")); err != nil || string(b) != "bye\n" {
		t.Errorf("command did not get SIGTERM: %q, %v", b, err)
	}
}

func TestHolderExitsOnEOF(t *testing.T) {
	f := newFixture(t)
	s := startSession(t, f.config("sess-eof"))
	s.spawn("sleep 1000")
	time.Sleep(200 * time.Millisecond)
	procs := sessionProcs(t, s.h.Pid())
	c := s.h
	must(t, c.conn.uc.CloseWrite()) // the holder reads EOF
	select {
	case <-s.h.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("holder still running after the channel closed")
	}
	if st := c.cmd.ProcessState; st == nil || !st.Exited() || st.ExitCode() != 0 {
		t.Errorf("holder did not exit by itself: %v", st)
	}
	for _, p := range procs {
		if alive(p) {
			t.Errorf("process %d survived the holder", p)
		}
	}
}

// childProcs lists the test process's children.
func childProcs() []string {
	var kids []string
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	for _, p := range tasks {
		b, _ := os.ReadFile(p)
		kids = append(kids, strings.Fields(string(b))...)
	}
	return kids
}

func TestSetupFailure(t *testing.T) {
	before := len(childProcs())
	cases := []struct {
		name  string
		edit  func(*Config)
		stage string
	}{
		{"missing lower", func(c *Config) { c.Lowers = append(c.Lowers, "/nonexistent/layer") }, stageMountOverlay},
		{"upper is a file", func(c *Config) { c.Upper = "/etc/passwd" }, stageMountOverlay},
		{"hostname too long", func(c *Config) { c.SessionID = strings.Repeat("x", 65) }, stageHandshake},
		{"relative path", func(c *Config) { c.Scratch = "scratch" }, stageHandshake},
		{"relative shim", func(c *Config) { c.Shim = "sandbox-exec-shim" }, stageHandshake},
		{"missing shim", func(c *Config) { c.Shim = "/nonexistent/sandbox-exec-shim" }, stageMountRoot},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			cfg := f.config("sess-fail")
			tc.edit(&cfg)
			h, err := Start(context.Background(), testSelf, cfg)
			var se *SetupError
			if !errors.As(err, &se) || se.Stage != tc.stage {
				if h != nil {
					h.Close(time.Second)
				}
				t.Fatalf("Start = %v (%T), want a SetupError at %s", err, err, tc.stage)
			}
			if !strings.HasPrefix(err.Error(), "workspace setup failed at "+tc.stage+": ") {
				t.Errorf("message %q", err)
			}
			t.Log(err)
		})
	}
	t.Run("context expired", func(t *testing.T) {
		f := newFixture(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
		defer cancel()
		time.Sleep(time.Millisecond)
		_, err := Start(ctx, testSelf, f.config("sess-ctx"))
		var se *SetupError
		if !errors.As(err, &se) || se.Stage != stageReady {
			t.Fatalf("Start = %v, want a SetupError at ready", err)
		}
	})
	t.Run("no binary", func(t *testing.T) {
		f := newFixture(t)
		_, err := Start(context.Background(), "/nonexistent/sandbox-supervisor", f.config("sess-nobin"))
		var se *SetupError
		if !errors.As(err, &se) || se.Stage != stageSpawn {
			t.Fatalf("Start = %v, want a SetupError at spawn", err)
		}
	})
	if after := childProcs(); len(after) > before {
		t.Errorf("processes left after failed setups: %v", after)
	}
}

// TestExecShim runs commands through both exec shims, with either overlay
// driver (the FUSE holder has the shim change to /workspace with -C): the
// C sandbox-exec-shim of Config.Shim, and the fallback, the holder's own
// binary (`nsholder shim`) when Config.Shim is "". Each must leave the
// command with only the kept capabilities, no_new_privs and the filter.
func TestExecShim(t *testing.T) {
	if testShimErr != nil {
		if os.Getenv("ESBX_REQUIRE_ALL") == "1" {
			t.Fatalf("ESBX_REQUIRE_ALL=1: %v", testShimErr)
		}
		t.Skip(testShimErr)
	}
	for _, shim := range []struct{ name, path string }{{"c", testShim}, {"go", ""}} {
		for _, overlay := range []string{OverlayKernel, OverlayFuse} {
			t.Run(shim.name+"/"+overlay, func(t *testing.T) {
				f := newFixture(t)
				cfg := f.config("sess-shim")
				cfg.Shim, cfg.Overlay, cfg.PidsMax = shim.path, overlay, 321
				s := startSession(t, cfg)
				if got := s.ok("ulimit -Hu; ulimit -Su"); got != "321\n321" {
					t.Errorf("RLIMIT_NPROC through %q (PidsMax 321) = %q", shim.path, got)
				}
				if got := s.ok("grep -E '^(Seccomp|NoNewPrivs|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' /proc/self/status | tr -s ' \t' ' '"); got != "CapInh: 00000000880024ff\nCapPrm: 00000000880024ff\nCapEff: 00000000880024ff\nCapBnd: 00000000880024ff\nCapAmb: 0000000000000000\nNoNewPrivs: 1\nSeccomp: 2" {
					t.Errorf("hardening through %q = %q", shim.path, got)
				}
				if out, code := s.run("exit 7"); code != 7 || out != "" {
					t.Errorf("exit status through the shim: %q, %d", out, code)
				}
				if got := s.ok("pwd; unshare -U true 2>/dev/null; echo $?"); got != "/workspace\n1" {
					t.Errorf("cwd and unshare through the shim: %q", got)
				}
				if _, err := s.h.Spawn(context.Background(), SpawnRequest{Cmd: "true", Dir: "/nonexistent"}); overlay == OverlayKernel && (err == nil || !strings.Contains(err.Error(), "/nonexistent")) {
					t.Errorf("Spawn in a missing directory: %v", err)
				}
				if overlay == OverlayFuse {
					// The shim's -C fails: one line and 126, the command never runs.
					r := s.spawnIn("/workspace/nonexistent", "", "echo SHOULD-NOT-RUN")
					if out := r.wait(t, 10*time.Second); r.status.ExitStatus() != 126 || strings.Contains(out, "SHOULD-NOT-RUN") || !strings.HasPrefix(out, "sandbox: cannot start command: chdir /workspace/nonexistent: ") {
						t.Errorf("-C into a missing directory: %q, %d", out, r.status.ExitStatus())
					}
				}
			})
		}
	}

	// The holder execs Config.Shim itself with `-- shell…`: a binary that
	// only echoes its arguments shows exactly what the shim would get.
	f2 := newFixture(t)
	cfg := f2.config("sess-shim-argv")
	cfg.Shim = "/bin/echo"
	s := startSession(t, cfg)
	if got := s.ok("true"); got != "-- /bin/bash --noprofile --norc -c true" {
		t.Errorf("shim argv = %q", got)
	}
}

func TestNoShell(t *testing.T) {
	f := newFixture(t)
	cfg := f.config("sess-noshell")
	cfg.HostPaths = nil
	s := startSession(t, cfg)
	if _, err := s.h.Spawn(context.Background(), SpawnRequest{Cmd: "true"}); !errors.Is(err, ErrNoShell) {
		t.Errorf("Spawn without a shell: %v", err)
	}
	// File operations still work.
	if _, _, err := s.h.ReadFile(context.Background(), "hello.txt", 100); err != nil {
		t.Error(err)
	}
}
