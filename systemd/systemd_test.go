package systemd

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
)

func skipOrFail(t *testing.T, format string, a ...any) {
	t.Helper()
	if os.Getenv("ESBX_REQUIRE_ALL") == "1" {
		t.Fatalf("required capability missing: "+format, a...)
	}
	t.Skipf(format, a...)
}

func render(t *testing.T, c UnitConfig) (service, socket string) {
	t.Helper()
	units, err := Units(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(units) != 2 || units[0].Name != ServiceName || units[1].Name != SocketName {
		t.Fatalf("units: %+v", units)
	}
	return units[0].Text, units[1].Text
}

func TestUnitsContent(t *testing.T) {
	svc, sock := render(t, UnitConfig{Binary: "/opt/esbx/bin/sandbox-supervisor", Socket: "/run/user/1000/ephemeral-sandbox/supervisor.sock",
		Environment: []string{"EPHEMERAL_SANDBOX_HOME=/srv/esbx 100%"}})
	for _, want := range []string{"Type=notify\n", "Delegate=yes\n", "KillMode=mixed\n", "NotifyAccess=main\n",
		"ExecStart=/opt/esbx/bin/sandbox-supervisor serve\n", "WatchdogSec=", "Requires=" + SocketName + "\n",
		`Environment="EPHEMERAL_SANDBOX_HOME=/srv/esbx 100%%"` + "\n"} {
		if !strings.Contains(svc, want) {
			t.Errorf("service lacks %q:\n%s", want, svc)
		}
	}
	for _, want := range []string{"ListenStream=/run/user/1000/ephemeral-sandbox/supervisor.sock\n", "SocketMode=0600\n",
		"DirectoryMode=0700\n", "Service=" + ServiceName + "\n", "WantedBy=sockets.target\n"} {
		if !strings.Contains(sock, want) {
			t.Errorf("socket lacks %q:\n%s", want, sock)
		}
	}
	svc, _ = render(t, UnitConfig{Binary: "/opt/my bin/sandbox-supervisor", Socket: "/tmp/s.sock"})
	if !strings.Contains(svc, `ExecStart="/opt/my bin/sandbox-supervisor" serve`+"\n") {
		t.Errorf("path with a space not quoted:\n%s", svc)
	}
	for _, bad := range []UnitConfig{{Binary: "sandbox-supervisor", Socket: "/tmp/s"}, {Binary: "/bin/x", Socket: "s.sock"},
		{Binary: "/bin/x", Socket: "/tmp/s", Environment: []string{"NOEQUALS"}}, {Binary: "/bin/x\n", Socket: "/tmp/s"}} {
		if _, err := Units(bad); err == nil {
			t.Errorf("Units(%+v) accepted", bad)
		}
	}
}

// TestUnitsVerify runs systemd-analyze verify offline on the rendered units;
// ExecStart points at an existing executable (this test binary, copied under
// the supervisor's name).
func TestUnitsVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		skipOrFail(t, "systemd-analyze not installed (Debian package systemd)")
	}
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin", "sandbox-supervisor")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	units, err := Units(UnitConfig{Binary: bin, Socket: filepath.Join(dir, "run", "supervisor.sock"),
		Environment: []string{"EPHEMERAL_SANDBOX_HOME=" + filepath.Join(dir, "home")}})
	if err != nil {
		t.Fatal(err)
	}
	unitDir := filepath.Join(dir, "systemd", "user")
	paths, err := WriteUnits(unitDir, units)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o644 {
			t.Fatalf("%s: %v %v", p, st.Mode(), err)
		}
	}
	rt := filepath.Join(dir, "xdg-run")
	if err := os.Mkdir(rt, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("systemd-analyze", append([]string{"--user", "--man=no", "verify"}, paths...)...)
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+rt)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}

	// A broken unit is caught (the check is real).
	broken := filepath.Join(dir, "broken", ServiceName)
	_ = os.MkdirAll(filepath.Dir(broken), 0o755)
	_ = os.WriteFile(broken, []byte(strings.Replace(units[0].Text, "Type=notify", "Type=notfy", 1)), 0o644)
	cmd = exec.Command("systemd-analyze", "--user", "--man=no", "verify", broken)
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+rt)
	if out, err := cmd.CombinedOutput(); err == nil && !strings.Contains(string(out), "Failed to parse service type") {
		t.Fatalf("systemd-analyze accepted Type=notfy: %s", out)
	}

	removed, err := RemoveUnits(unitDir)
	if err != nil || len(removed) != 2 {
		t.Fatalf("RemoveUnits: %v %v", removed, err)
	}
	if removed, err := RemoveUnits(unitDir); err != nil || len(removed) != 0 {
		t.Fatalf("second RemoveUnits: %v %v", removed, err)
	}
}

func TestUserUnitDir(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", "/x/cfg")
	if d, _ := UserUnitDir(); d != "/x/cfg/systemd/user" {
		t.Fatal(d)
	}
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("HOME", "/x/home")
	if d, _ := UserUnitDir(); d != "/x/home/.config/systemd/user" {
		t.Fatal(d)
	}
}

// fakeNotify listens on a unixgram NOTIFY_SOCKET and returns the datagrams.
func fakeNotify(t *testing.T) <-chan string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	ch := make(chan string, 1024)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(ch)
				return
			}
			ch <- string(buf[:n])
		}
	}()
	return ch
}

func next(t *testing.T, ch <-chan string, skipWatchdog bool) string {
	t.Helper()
	for {
		select {
		case m := <-ch:
			if skipWatchdog && m == "WATCHDOG=1" {
				continue
			}
			return m
		case <-time.After(5 * time.Second):
			t.Fatal("no notify datagram")
		}
	}
}

func TestNotify(t *testing.T) {
	ch := fakeNotify(t)
	if !Notify() {
		t.Fatal("Notify() false with NOTIFY_SOCKET set")
	}
	t.Setenv("WATCHDOG_USEC", "20000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	if d := WatchdogInterval(); d != 20*time.Millisecond {
		t.Fatalf("WatchdogInterval = %v", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Watchdog(ctx); close(done) }()
	for range 3 {
		if m := next(t, ch, false); m != "WATCHDOG=1" {
			t.Fatalf("want WATCHDOG=1, got %q", m)
		}
	}
	cancel()
	<-done
	drain(ch)

	if err := Ready("serving: 0 sandboxes"); err != nil {
		t.Fatal(err)
	}
	if m := next(t, ch, true); m != "READY=1\nSTATUS=serving: 0 sandboxes" {
		t.Fatalf("ready: %q", m)
	}
	if err := Status("two\nlines"); err != nil {
		t.Fatal(err)
	}
	if m := next(t, ch, true); m != "STATUS=two lines" {
		t.Fatalf("status: %q", m)
	}
	n := 0
	ctx, cancel = context.WithCancel(context.Background())
	go StatusLoop(ctx, 5*time.Millisecond, func() string { n++; return "tick " + strconv.Itoa(min(n, 2)) })
	for _, want := range []string{"STATUS=tick 1", "STATUS=tick 2"} {
		if m := next(t, ch, true); m != want {
			t.Fatalf("status loop: want %q, got %q", want, m)
		}
	}
	time.Sleep(30 * time.Millisecond) // unchanged status lines are not resent
	cancel()
	select {
	case m := <-ch:
		t.Fatalf("unchanged status resent: %q", m)
	default:
	}
	if err := Stopping("bye"); err != nil {
		t.Fatal(err)
	}
	if m := next(t, ch, true); m != "STOPPING=1\nSTATUS=bye" {
		t.Fatalf("stopping: %q", m)
	}

	// Another process's watchdog, or none: no pings.
	t.Setenv("WATCHDOG_PID", "1")
	if d := WatchdogInterval(); d != 0 {
		t.Fatalf("watchdog for pid 1 enabled: %v", d)
	}
}

func drain(ch <-chan string) {
	for {
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
			return
		}
	}
}

func TestNotifyWithoutManager(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if Notify() {
		t.Fatal("Notify() true")
	}
	if err := Ready("x"); err != nil {
		t.Fatal(err)
	}
	Watchdog(context.Background()) // returns at once
	StatusLoop(context.Background(), time.Millisecond, func() string { return "x" })
}

// TestListener passes a listening socket as fd 3 to a child copy of this
// test, as systemd does; the child sets LISTEN_PID to its own pid.
func TestListener(t *testing.T) {
	if os.Getenv("ESBX_LISTENER_CHILD") == "1" {
		listenerChild()
		return
	}
	t.Setenv("LISTEN_FDS", "")
	if ln, err := Listener(); ln != nil || err != nil {
		t.Fatalf("no activation: %v %v", ln, err)
	}
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestListener$", "-test.v")
	cmd.Env = append(os.Environ(), "ESBX_LISTENER_CHILD=1", "LISTEN_FDS=1", "LISTEN_FDNAMES=api")
	cmd.ExtraFiles = []*os.File{f}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, _ := c.Read(buf)
	c.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	if got := string(buf[:n]); got != "hello "+sock {
		t.Fatalf("child answered %q\n%s", got, out.String())
	}
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("socket unlinked by the activated process: %v", err)
	}
}

func listenerChild() {
	os.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	ln, err := Listener()
	if err != nil || ln == nil {
		println("Listener:", err)
		os.Exit(3)
	}
	if os.Getenv("LISTEN_FDS") != "" || os.Getenv("LISTEN_PID") != "" {
		println("LISTEN_* not unset")
		os.Exit(4)
	}
	c, err := ln.Accept()
	if err != nil {
		os.Exit(5)
	}
	_, _ = c.Write([]byte("hello " + ln.Addr().String()))
	c.Close()
	ln.Close()
	os.Exit(0)
}

type sent struct {
	msg  string
	pri  journal.Priority
	vars map[string]string
}

func TestJournalHandler(t *testing.T) {
	t.Setenv("INVOCATION_ID", "")
	if h := JournalHandler(nil); h != nil {
		t.Fatal("journal handler outside systemd")
	}
	var got []sent
	h := newJournalHandler(slog.LevelInfo, func(msg string, pri journal.Priority, vars map[string]string) error {
		got = append(got, sent{msg, pri, vars})
		return nil
	})
	log := slog.New(h).With("sandbox", "sb-1").WithGroup("req")
	log.Debug("hidden")
	log.Info("created", "id", "r 1", slog.Group("g", "n", 3), "_trusted", "x", "9lives", 1)
	slog.New(h).Error("boom", "err", "disk full")
	slog.New(h).Warn("careful")
	if len(got) != 3 {
		t.Fatalf("sent %d entries: %+v", len(got), got)
	}
	e := got[0]
	if e.pri != journal.PriInfo || e.msg != `created sandbox=sb-1 req.id="r 1" req.g.n=3 req._trusted=x req.9lives=1` {
		t.Fatalf("entry: %+v", e)
	}
	for k, v := range map[string]string{"SANDBOX": "sb-1", "REQ_ID": "r 1", "REQ_G_N": "3", "REQ__TRUSTED": "x", "REQ_9LIVES": "1"} {
		if e.vars[k] != v {
			t.Errorf("field %s = %q, want %q (%v)", k, e.vars[k], v, e.vars)
		}
	}
	if e.vars["SYSLOG_IDENTIFIER"] == "" {
		t.Errorf("no SYSLOG_IDENTIFIER: %v", e.vars)
	}
	if got[1].pri != journal.PriErr || got[1].vars["ERR"] != "disk full" || got[2].pri != journal.PriWarning {
		t.Fatalf("priorities: %+v", got[1:])
	}
	for key, want := range map[string]string{"_x": "X", "9": "", "message": "", "a-b.c": "A_B_C"} {
		if f := fieldName(key); f != want {
			t.Errorf("fieldName(%q) = %q, want %q", key, f, want)
		}
	}
}
