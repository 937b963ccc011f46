package tests

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// otherUser is the second local account this user may act as through
// `sudo -n -u` (CI creates it and sets ESBX_OTHER_USER).
func otherUser(t *testing.T) *user.User {
	t.Helper()
	name := os.Getenv("ESBX_OTHER_USER")
	if name == "" {
		skipOrFail(t, "ESBX_OTHER_USER is not set: no second local user to act as")
	}
	u, err := user.Lookup(name)
	if err != nil {
		skipOrFail(t, "user %s: %v", name, err)
	}
	if out, err := exec.Command("sudo", "-n", "-u", name, "true").CombinedOutput(); err != nil {
		skipOrFail(t, "sudo -n -u %s: %v %s", name, err, out)
	}
	return u
}

var peerBuild struct {
	once sync.Once
	path string
	err  error
}

// peerBin builds tests/internal/peer into the binaries' directory, which the
// second user can read and execute.
func peerBin(t *testing.T) string {
	t.Helper()
	peerBuild.once.Do(func() {
		p := bin("esbx-peer")
		cmd := exec.Command("go", "build", "-o", p, "./tests/internal/peer")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			peerBuild.err = fmt.Errorf("build peer: %v\n%s", err, out)
			return
		}
		peerBuild.path = p
	})
	if peerBuild.err != nil {
		t.Fatal(peerBuild.err)
	}
	return peerBuild.path
}

// squatter is a `peer squat` running as the other user.
type squatter struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	stderr bytes.Buffer
	done   bool
	conns  int
	bytes  int
}

func startSquatter(t *testing.T, other *user.User, args ...string) *squatter {
	t.Helper()
	s := &squatter{cmd: exec.Command("sudo", append([]string{"-n", "-u", other.Username, peerBin(t), "squat"}, args...)...)}
	s.cmd.Stderr = &s.stderr
	var err error
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.out = bufio.NewReader(stdout)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.finish(t) })
	if line, err := s.out.ReadString('\n'); strings.TrimSpace(line) != "ready" {
		t.Fatalf("squatter did not get ready: %q %v %s", line, err, s.stderr.String())
	}
	return s
}

// finish stops the squatter (it removes what it made) and records what it
// received: accepted connections and request bytes.
func (s *squatter) finish(t *testing.T) {
	t.Helper()
	if s.done {
		return
	}
	s.done = true
	s.stdin.Close()
	line, _ := s.out.ReadString('\n')
	if err := s.cmd.Wait(); err != nil {
		t.Errorf("squatter: %v %s", err, s.stderr.String())
	}
	if _, err := fmt.Sscanf(line, "conns %d bytes %d", &s.conns, &s.bytes); err != nil {
		t.Errorf("squatter report %q: %v", line, err)
	}
}

// squatEnv is a client environment without XDG_RUNTIME_DIR and
// EPHEMERAL_SANDBOX_HOME, so the runtime directory is the shared-temp
// fallback: $TMPDIR/ephemeral-sandbox-<uid>, with a TMPDIR of the test's
// own (sticky and world-writable like /tmp) instead of the machine's /tmp.
type squatEnv struct {
	t      *testing.T
	tmp    string
	home   string
	rundir string
	env    []string
}

func newSquatEnv(t *testing.T, other *user.User) *squatEnv {
	t.Helper()
	tmp, err := os.MkdirTemp("", "esbx-sq-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	home, err := os.MkdirTemp("", "esbx-sqh-")
	if err != nil {
		t.Fatal(err)
	}
	s := &squatEnv{t: t, tmp: tmp, home: home, rundir: filepath.Join(tmp, fmt.Sprintf("ephemeral-sandbox-%d", os.Geteuid()))}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "EPHEMERAL_SANDBOX_HOME" || k == "TMPDIR" || k == "HOME" || strings.HasPrefix(k, "XDG_") || strings.HasPrefix(k, "SANDBOX_") {
			continue
		}
		s.env = append(s.env, kv)
	}
	s.env = append(s.env, "HOME="+home, "TMPDIR="+tmp,
		"XDG_DATA_HOME="+filepath.Join(home, "data"), "XDG_CONFIG_HOME="+filepath.Join(home, "config"))
	t.Cleanup(func() {
		s.stopSupervisor()
		// Whatever the other user left (a squatter that died early).
		_ = exec.Command("sudo", "-n", "-u", other.Username, "find", tmp, "-mindepth", "1", "-user", other.Username, "-delete").Run()
		os.RemoveAll(home)
		os.RemoveAll(tmp)
	})
	return s
}

// stopSupervisor ends a supervisor an autostart left running in rundir.
func (s *squatEnv) stopSupervisor() {
	b, err := os.ReadFile(filepath.Join(s.rundir, "supervisor.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return
	}
	if syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	for i := 0; i < 400; i++ {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// run runs a CLI; autostart says whether it may start a supervisor.
func (s *squatEnv) run(autostart bool, name string, args ...string) result {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(name), args...)
	cmd.Env = append(append([]string{}, s.env...), "SANDBOX_NO_AUTOSTART="+map[bool]string{true: "0", false: "1"}[autostart])
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatalf("%s: %v", name, err)
	}
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

// secretWrite is the request a squatter must never see.
var secretWrite = []string{"--sandbox-id", "sbx-squat", "file_write", "--path", ".env", "--content", "AWS_SECRET=hunter2"}

// refused asserts a config_error (exit 2, nothing on stdout) whose message
// holds every want, and returns its details.
func refused(t *testing.T, r result, want ...string) map[string]any {
	t.Helper()
	if r.code != 2 || r.stdout != "" {
		t.Fatalf("want exit 2 with empty stdout (config_error), got %d\nstdout=%s\nstderr=%s", r.code, r.stdout, r.stderr)
	}
	body, _ := r.obj(t)["error"].(map[string]any)
	if body == nil || body["kind"] != "config_error" {
		t.Fatalf("want config_error, got %s", r.stderr)
	}
	msg, _ := body["message"].(string)
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("message %q lacks %q", msg, w)
		}
	}
	details, _ := body["details"].(map[string]any)
	return details
}

// unchanged asserts that the file still holds content.
func unchanged(t *testing.T, p, content string) {
	t.Helper()
	if b, err := os.ReadFile(p); err != nil || string(b) != content {
		t.Errorf("%s changed: %q %v", p, b, err)
	}
}

// TestRuntimeDirSquatting: without XDG_RUNTIME_DIR, the runtime directory
// is in a directory every local user can write. A client uses it only when
// it is a real directory of the user's with mode 0700 and only talks to a
// listener that is the user (SO_PEERCRED), checked before a byte is sent;
// autostart never writes its log through a symlink. Every refusal is a
// config_error naming the directory (or socket) and its owner.
func TestRuntimeDirSquatting(t *testing.T) {
	other := otherUser(t)

	t.Run("other user's directory with a listener", func(t *testing.T) {
		s := newSquatEnv(t, other)
		sq := startSquatter(t, other, "-listen", s.rundir)
		r := s.run(true, "sandbox-runtime-cli", secretWrite...)
		sq.finish(t)
		if sq.conns != 0 || sq.bytes != 0 {
			t.Errorf("the squatter got %d connections and %d bytes", sq.conns, sq.bytes)
		}
		d := refused(t, r, s.rundir, "uid "+other.Uid+" ("+other.Username+")")
		if d["owner"] != other.Username || d["path"] != s.rundir {
			t.Errorf("details %v", d)
		}
	})

	t.Run("other user's directory with a planted log", func(t *testing.T) {
		s := newSquatEnv(t, other)
		target := filepath.Join(s.home, "precious.txt")
		if err := os.WriteFile(target, []byte("precious\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		startSquatter(t, other, "-link-log", target, s.rundir)
		r := s.run(true, "sandbox-manager-cli", "list_sandboxes")
		unchanged(t, target, "precious\n")
		refused(t, r, s.rundir, other.Username)
	})

	t.Run("own directory, listener of the other user", func(t *testing.T) {
		s := newSquatEnv(t, other)
		theirs := filepath.Join(s.tmp, "theirs")
		sq := startSquatter(t, other, "-listen", theirs)
		// The directory passes every check; only the peer check can tell.
		if err := os.Mkdir(s.rundir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(theirs, "supervisor.sock"), filepath.Join(s.rundir, "supervisor.sock")); err != nil {
			t.Fatal(err)
		}
		r := s.run(false, "sandbox-runtime-cli", secretWrite...)
		sq.finish(t)
		if sq.bytes != 0 {
			t.Errorf("the other user's listener received %d bytes", sq.bytes)
		}
		d := refused(t, r, "served by uid "+other.Uid+" ("+other.Username+")")
		if d["peer"] != other.Username {
			t.Errorf("details %v", d)
		}
	})

	t.Run("own directory, planted log symlink", func(t *testing.T) {
		s := newSquatEnv(t, other)
		target := filepath.Join(s.home, "precious.txt")
		if err := os.WriteFile(target, []byte("precious\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(s.rundir, 0o700); err != nil {
			t.Fatal(err)
		}
		logPath := filepath.Join(s.rundir, "supervisor.log")
		if err := os.Symlink(target, logPath); err != nil {
			t.Fatal(err)
		}
		r := s.run(true, "sandbox-manager-cli", "list_sandboxes")
		unchanged(t, target, "precious\n")
		refused(t, r, logPath, "symlink")
		if _, err := os.Stat(filepath.Join(s.rundir, "supervisor.pid")); !os.IsNotExist(err) {
			t.Errorf("a supervisor was started: %v", err)
		}
	})

	t.Run("own directory with mode 0755", func(t *testing.T) {
		s := newSquatEnv(t, other)
		if err := os.Mkdir(s.rundir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(s.rundir, 0o755); err != nil {
			t.Fatal(err)
		}
		got := listenCounting(t, filepath.Join(s.rundir, "supervisor.sock"))
		r := s.run(true, "sandbox-runtime-cli", secretWrite...)
		if n := got(); n != 0 {
			t.Errorf("the listener in the loose directory received %d bytes", n)
		}
		d := refused(t, r, s.rundir, "mode 0755", "chmod 0700")
		if d["mode"] != "0755" {
			t.Errorf("details %v", d)
		}
	})

	// The fallback still works for its owner: autostart makes the
	// directory 0700 and the supervisor serves there.
	t.Run("fresh directory", func(t *testing.T) {
		s := newSquatEnv(t, other)
		r := s.run(true, "sandbox-manager-cli", "list_sandboxes")
		if r.code != 0 {
			t.Fatalf("autostart in the fallback directory: %+v", r)
		}
		st, err := os.Lstat(s.rundir)
		if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Fatalf("runtime directory: %v %v", st, err)
		}
		if r := s.run(false, "sandbox-manager-cli", "list_sandboxes"); r.code != 0 {
			t.Fatalf("second call: %+v", r)
		}
	})
}

// listenCounting listens on sock as this user, answers each request line
// with a success and returns a function that stops listening and reports
// how many request bytes arrived.
func listenCounting(t *testing.T, sock string) func() int {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var handlers sync.WaitGroup
	total := 0
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			handlers.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				line, _ := bufio.NewReader(c).ReadBytes('\n')
				mu.Lock()
				total += len(line)
				mu.Unlock()
				if len(line) > 0 {
					_, _ = c.Write([]byte(`{"ok":true}` + "\n"))
				}
			})
		}
	}()
	stopped := false
	stop := func() int {
		if !stopped {
			stopped = true
			ln.Close()
			<-accepting
			handlers.Wait()
		}
		mu.Lock()
		defer mu.Unlock()
		return total
	}
	t.Cleanup(func() { stop() })
	return stop
}
