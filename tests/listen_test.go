package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tcpAddr reads listen.addr, written by a supervisor started with --listen.
func (e *env) tcpAddr() string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.home, "run", "listen.addr"))
	if err != nil {
		e.t.Fatalf("listen.addr: %v", err)
	}
	return strings.TrimSpace(string(b))
}

func (e *env) token() string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.home, "config", "gateway.token"))
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.TrimSuffix(string(b), "\n")
}

// tcpRaw sends one request object over TCP and decodes the single response line.
func tcpRaw(t *testing.T, addr string, req map[string]any) map[string]any {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatalf("response %q: %v", line, err)
	}
	return m
}

func TestTCPListener(t *testing.T) {
	e := newEnv(t)
	e.start("--listen", "tcp://127.0.0.1:0")
	addr, tok := e.tcpAddr(), e.token()
	if !strings.HasPrefix(addr, "tcp://127.0.0.1:") || len(tok) != 64 {
		t.Fatalf("addr %q token length %d", addr, len(tok))
	}
	root := e.project(map[string]string{"a.txt": "over tcp\n"})

	// The right token, from each client source (§2.2): flag, environment, token file.
	rec := e.ok("sandbox-manager-cli", "--endpoint", addr, "--auth-token", tok, "create_sandbox", "--workspace-bind-root", root)
	id, _ := rec["id"].(string)
	if !strings.HasPrefix(id, "sbx-") {
		t.Fatalf("create over tcp: %v", rec)
	}
	r := e.runEnv([]string{"SANDBOX_GATEWAY_AUTH_TOKEN=" + tok}, "sandbox-runtime-cli", "--endpoint", addr, "--sandbox-id", id, "file_read", "--path", "a.txt")
	if r.code != 0 || r.obj(t)["content"] != "over tcp" {
		t.Fatalf("file_read with the env token: %+v", r)
	}
	if got := e.ok("sandbox-runtime-cli", "--endpoint", addr, "--sandbox-id", id, "exec_command", "cat a.txt")["output"]; got != "over tcp" {
		t.Fatalf("exec with the token file: %v", got)
	}

	// Wrong or missing tokens are refused before anything happens.
	cases := []struct {
		name string
		req  map[string]any
	}{
		{"wrong", map[string]any{"op": "list_sandboxes", "scope": map[string]any{"kind": "system"}, "_sandbox_gateway_auth_token": strings.Repeat("0", 64)}},
		{"prefix", map[string]any{"op": "list_sandboxes", "scope": map[string]any{"kind": "system"}, "_sandbox_gateway_auth_token": tok[:63]}},
		{"with newline", map[string]any{"op": "list_sandboxes", "scope": map[string]any{"kind": "system"}, "_sandbox_gateway_auth_token": tok + "\n"}},
		{"not a string", map[string]any{"op": "list_sandboxes", "scope": map[string]any{"kind": "system"}, "_sandbox_gateway_auth_token": 7}},
		{"empty", map[string]any{"op": "list_sandboxes", "scope": map[string]any{"kind": "system"}, "_sandbox_gateway_auth_token": ""}},
		{"missing", map[string]any{"op": "list_sandboxes", "scope": map[string]any{"kind": "system"}}},
		{"missing, side effect", map[string]any{"op": "destroy_sandbox", "scope": map[string]any{"kind": "system"}, "args": map[string]any{"sandbox_id": id}}},
	}
	for _, tc := range cases {
		m := tcpRaw(t, addr, tc.req)
		if errKind(m) != "unauthorized" {
			t.Errorf("%s token: %v", tc.name, m)
		}
		if strings.Contains(errMsg(m), tok[:16]) {
			t.Errorf("%s token: the response echoes the token: %v", tc.name, m)
		}
	}
	body := e.fail(1, "unauthorized", "sandbox-manager-cli", "--endpoint", addr, "--auth-token", strings.Repeat("ab", 32), "list_sandboxes")
	if strings.Contains(body["message"].(string), "abab") {
		t.Errorf("the error echoes the presented token: %v", body)
	}
	// A right token does not excuse a bad envelope; bad JSON stays bad_json on TCP.
	if m := tcpRaw(t, addr, map[string]any{"op": "list_sandboxes", "scope": map[string]any{"kind": "system"}, "_sandbox_gateway_auth_token": tok, "extra": 1}); errKind(m) != "invalid_request" {
		t.Errorf("a valid token with an unknown field: %v", m)
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("{not json\n"))
	line, _ := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if !strings.Contains(line, `"bad_json"`) {
		t.Errorf("bad json over tcp: %q", line)
	}
	// The refused destroy changed nothing.
	if got := e.mgr("list_sandboxes")["sandboxes"].([]any); len(got) != 1 {
		t.Fatalf("sandboxes after refused requests: %v", got)
	}
	e.stop()
	if strings.Contains(e.log.String(), tok) {
		t.Fatal("the supervisor logged the gateway token")
	}
	if _, err := os.Stat(filepath.Join(e.home, "run", "listen.addr")); !os.IsNotExist(err) {
		t.Errorf("listen.addr left after stop: %v", err)
	}
}

func TestTCPListenerRefusesNonLoopback(t *testing.T) {
	refusesNonLoopback(t, "--listen", "supervisor", "listen.addr")
	// The config key opens the listener too.
	e := newEnv(t)
	writeConfig(t, e, "supervisor:\n  listen: tcp://127.0.0.1:0\n")
	e.start()
	if got := tcpRaw(t, e.tcpAddr(), map[string]any{"op": "list_sandboxes", "scope": map[string]any{"kind": "system"}, "_sandbox_gateway_auth_token": e.token()}); errKind(got) != "" {
		t.Fatalf("list over the configured listener: %v", got)
	}
}

// TestRuntimeFilesBeforeSocket: a client takes a connectable socket for a
// running supervisor (autostart and this harness wait for exactly that), so
// listen.addr and supervisor.pid are complete before the socket file even
// exists. The directory is watched with inotify, which orders the events
// deterministically, and the files are read the moment the socket answers.
func TestRuntimeFilesBeforeSocket(t *testing.T) {
	e := newEnv(t)
	watch := watchRunDir(t, e)
	e.start("--listen", "tcp://127.0.0.1:0")
	if addr := e.tcpAddr(); !strings.HasPrefix(addr, "tcp://127.0.0.1:") {
		t.Fatalf("listen.addr right after the socket answered: %q", addr)
	}
	b, err := os.ReadFile(filepath.Join(e.home, "run", "supervisor.pid"))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(e.sup.Process.Pid) {
		t.Fatalf("supervisor.pid right after the socket answered: %q %v (pid %d)", b, err, e.sup.Process.Pid)
	}
	watch.completeBeforeSocket(t, "listen.addr", "supervisor.pid")
}

// runDirWatch watches the supervisor's runtime directory with inotify, set up
// before the supervisor starts, so the order in which its files appear is
// read afterwards without any timing.
type runDirWatch struct{ fd int }

func watchRunDir(t *testing.T, e *env) runDirWatch {
	t.Helper()
	run := filepath.Join(e.home, "run")
	if err := os.MkdirAll(run, 0o700); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, run, unix.IN_CREATE|unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	return runDirWatch{fd}
}

// completeBeforeSocket checks that every file in files was completely
// written (closed after writing, or renamed into place) before
// supervisor.sock was created.
func (w runDirWatch) completeBeforeSocket(t *testing.T, files ...string) {
	t.Helper()
	complete := map[string]bool{}
	var seen []string
	buf := make([]byte, 64<<10)
	n, err := unix.Read(w.fd, buf)
	if err != nil {
		t.Fatalf("inotify read: %v", err)
	}
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
		off += unix.SizeofInotifyEvent + int(ev.Len)
		seen = append(seen, fmt.Sprintf("%s:%#x", name, ev.Mask))
		if name == "supervisor.sock" && ev.Mask&unix.IN_CREATE != 0 {
			for _, f := range files {
				if !complete[f] {
					t.Errorf("the socket was created before %s was complete; events %v", f, seen)
				}
			}
			return
		}
		if ev.Mask&(unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO) != 0 {
			complete[name] = true
		}
	}
	t.Fatalf("no creation of supervisor.sock among the events %v", seen)
}

// refusesNonLoopback: a listener flag (or its config section's listen key)
// naming anything but a loopback literal refuses the start with exit 2 and
// config_error, leaving neither the socket nor the listener's address file.
func refusesNonLoopback(t *testing.T, flag, section, addrFile string) {
	t.Helper()
	for _, tc := range []struct{ flag, config string }{
		{flag: "tcp://0.0.0.0:0"},
		{flag: "tcp://localhost:0"},
		{flag: "tcp://[::]:0"},
		{flag: "tcp://10.1.2.3:7000"},
		{flag: "tcp://192.168.1.2:8080"},
		{flag: "http://127.0.0.1:0"},
		{flag: "/tmp/x.sock"},
		{config: section + ":\n  listen: tcp://0.0.0.0:7000\n"},
		{config: section + ":\n  listen: tcp://example.com:7000\n"},
	} {
		e := newEnv(t)
		args := []string{"serve"}
		if tc.flag != "" {
			args = append(args, flag, tc.flag)
		}
		if tc.config != "" {
			writeConfig(t, e, tc.config)
		}
		cmd := exec.Command(bin("sandbox-supervisor"), args...)
		cmd.Env = e.environ()
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "config_error") {
			t.Errorf("%s %+v: want exit 2 with config_error, got %v %s", flag, tc, err, out)
		}
		for _, f := range []string{e.socket(), filepath.Join(e.home, "run", addrFile)} {
			if _, err := os.Stat(f); !os.IsNotExist(err) {
				t.Errorf("%s %+v: %s left behind: %v", flag, tc, f, err)
			}
		}
	}
}
