package tests

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSystemdInstall: install --print renders both user units; install
// writes them under $XDG_CONFIG_HOME/systemd/user/ and succeeds without a
// user manager; uninstall removes them.
func TestSystemdInstall(t *testing.T) {
	e := newEnv(t)
	cfgHome := filepath.Join(e.root, "xdg-config")
	xdg := []string{"XDG_CONFIG_HOME=" + cfgHome}
	self, err := filepath.EvalSymlinks(bin("sandbox-supervisor"))
	if err != nil {
		t.Fatal(err)
	}

	r := e.runEnv(xdg, "sandbox-supervisor", "install", "--print")
	if r.code != 0 {
		t.Fatalf("install --print: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"# ephemeral-sandbox.service", "# ephemeral-sandbox.socket", "Type=notify\n", "Delegate=yes\n",
		"KillMode=mixed\n", "ExecStart=" + self + " serve\n", "ListenStream=" + e.socket() + "\n", "SocketMode=0600\n",
		`Environment="EPHEMERAL_SANDBOX_HOME=` + e.home + `"`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("install --print lacks %q:\n%s", want, r.stdout)
		}
	}
	unitDir := filepath.Join(cfgHome, "systemd", "user")
	if _, err := os.Stat(unitDir); err == nil {
		t.Fatal("--print wrote files")
	}

	r = e.runEnv(xdg, "sandbox-supervisor", "install")
	if r.code != 0 {
		t.Fatalf("install: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "daemon-reload skipped") && !strings.Contains(r.stdout, "ran systemctl --user daemon-reload") {
		t.Errorf("install does not say what happened to daemon-reload:\n%s", r.stdout)
	}
	var printed strings.Builder
	for _, name := range []string{"ephemeral-sandbox.service", "ephemeral-sandbox.socket"} {
		b, err := os.ReadFile(filepath.Join(unitDir, name))
		if err != nil {
			t.Fatalf("install did not write %s: %v\n%s", name, err, r.stdout)
		}
		if printed.Len() > 0 {
			printed.WriteString("\n")
		}
		printed.Write(b)
	}
	if again := e.runEnv(xdg, "sandbox-supervisor", "install", "--print"); again.stdout != printed.String() {
		t.Errorf("installed units differ from --print:\n%s\n---\n%s", printed.String(), again.stdout)
	}

	r = e.runEnv(xdg, "sandbox-supervisor", "uninstall")
	if r.code != 0 {
		t.Fatalf("uninstall: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, name := range []string{"ephemeral-sandbox.service", "ephemeral-sandbox.socket"} {
		if _, err := os.Stat(filepath.Join(unitDir, name)); !os.IsNotExist(err) {
			t.Errorf("uninstall left %s: %v", name, err)
		}
	}
	if r = e.runEnv(xdg, "sandbox-supervisor", "uninstall"); r.code != 0 {
		t.Fatalf("second uninstall: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestSystemdSocketActivation runs the supervisor under
// systemd-socket-activate: it serves on the passed socket (a path it would
// not choose itself), and a fake NOTIFY_SOCKET sees READY=1, then STOPPING=1
// after SIGTERM.
func TestSystemdSocketActivation(t *testing.T) {
	if _, err := exec.LookPath("systemd-socket-activate"); err != nil {
		skipOrFail(t, "systemd-socket-activate not installed (Debian package systemd)")
	}
	e := newEnv(t)
	actDir := filepath.Join(e.root, "act")
	if err := os.Mkdir(actDir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(actDir, "sup.sock")
	notifyPath := filepath.Join(e.root, "notify.sock")
	nc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msgs := make(chan string, 256)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := nc.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()

	cmd := exec.Command("systemd-socket-activate", "-l", sock,
		"-E", "EPHEMERAL_SANDBOX_HOME", "-E", "NOTIFY_SOCKET", "-E", "SANDBOX_NO_AUTOSTART", "-E", "PATH", "-E", "HOME",
		bin("sandbox-supervisor"), "serve")
	cmd.Env = e.environ("NOTIFY_SOCKET=" + notifyPath)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.WaitDelay = 5 * time.Second // holders may keep the output pipe open
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() { done <- cmd.Wait(); close(exited) }()
	defer func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("systemd-socket-activate did not create %s\n%s", sock, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	root := e.project(map[string]string{"a.txt": "hello\n"})
	rec := e.mgr("--endpoint", sock, "create_sandbox", "--workspace-bind-root", root)
	id, _ := rec["id"].(string)
	if !strings.HasPrefix(id, "sbx-") {
		t.Fatalf("create_sandbox over the activated socket: %v", rec)
	}
	list := e.mgr("--endpoint", sock, "list_sandboxes")["sandboxes"].([]any)
	if len(list) != 1 || list[0].(map[string]any)["id"] != id {
		t.Fatalf("list_sandboxes: %v", list)
	}
	if _, err := os.Stat(filepath.Join(actDir, "supervisor.pid")); err != nil {
		t.Errorf("no pid file next to the activated socket: %v", err)
	}

	ready := waitNotify(t, msgs, "READY=1", &log)
	if !strings.Contains(ready, "STATUS=") {
		t.Errorf("READY=1 without a STATUS= line: %q", ready)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitNotify(t, msgs, "STOPPING=1", &log)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("supervisor exit after SIGTERM: %v\n%s", err, log.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("supervisor ignored SIGTERM\n%s", log.String())
	}
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("the supervisor removed the socket it was passed: %v", err)
	}
}

// waitNotify returns the first notify datagram containing the line want.
func waitNotify(t *testing.T, msgs <-chan string, want string, log *bytes.Buffer) string {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatalf("notify socket closed before %s", want)
			}
			for _, line := range strings.Split(m, "\n") {
				if line == want {
					return m
				}
			}
		case <-timeout:
			t.Fatalf("no %s on NOTIFY_SOCKET\n%s", want, log.String())
		}
	}
}
