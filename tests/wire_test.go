package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

var clis = []string{"sandbox-manager-cli", "sandbox-runtime-cli", "sandbox-observability-cli"}

func TestUnknownOperationOnEachCLI(t *testing.T) {
	e := newEnv(t) // no supervisor: usage errors never need one
	for _, cli := range clis {
		args := []string{"no_such_op"}
		if cli == "sandbox-runtime-cli" {
			args = []string{"--sandbox-id", "sbx-x", "no_such_op"}
		}
		body := e.fail(2, "invalid_request", cli, args...)
		if body["message"] != "unknown operation: no_such_op" {
			t.Errorf("%s: %v", cli, body)
		}
	}
	// An operation of another group is unknown to this CLI.
	e.fail(2, "invalid_request", "sandbox-manager-cli", "file_read", "--path", "x")
	e.fail(2, "invalid_request", "sandbox-runtime-cli", "file_read", "--path", "x") // no --sandbox-id
	body := e.fail(2, "invalid_request", "sandbox-runtime-cli", "--sandbox-id", "", "file_read", "--path", "x")
	if body["message"] != "--sandbox-id must be non-empty" {
		t.Errorf("empty sandbox id: %v", body)
	}
	e.fail(2, "config_error", "sandbox-manager-cli", "--endpoint", "relative.sock", "list_sandboxes")
}

func TestHelp(t *testing.T) {
	e := newEnv(t)
	r := e.run("sandbox-manager-cli", "help")
	if r.code != 0 || !strings.Contains(r.stdout, "create_sandbox") || !strings.Contains(r.stdout, "destroy_sandbox") || strings.Contains(r.stdout, "file_read") {
		t.Fatalf("manager help: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = e.run("sandbox-runtime-cli", "help")
	if r.code != 0 || !strings.Contains(r.stdout, "file_edit") || !strings.Contains(r.stdout, "shell_security") || strings.Index(r.stdout, "file") > strings.Index(r.stdout, "shell_security") {
		t.Fatalf("runtime help: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = e.run("sandbox-runtime-cli", "help", "file_read")
	for _, want := range []string{"--path", "--offset", "--limit", "2000", "--workspace-session-id", "Integer"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("help file_read lacks %q: %s", want, r.stdout)
		}
	}
	if r := e.run("sandbox-observability-cli", "help"); r.code != 0 || !strings.Contains(r.stdout, "health") {
		t.Fatalf("observability help: %v", r)
	}
	e.fail(2, "invalid_request", "sandbox-manager-cli", "help", "no_such_op")
	if _, err := os.Stat(e.home); !os.IsNotExist(err) {
		t.Fatal("help touched the supervisor home")
	}
}

func TestWireErrors(t *testing.T) {
	e := newEnv(t)
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a": "a"}))

	big := append([]byte(`{"op":"list_sandboxes","scope":{"kind":"system"},"args":{"pad":"`), bytes.Repeat([]byte("x"), 16<<20)...)
	big = append(big, "\"}}\n"...)
	lines := e.raw(big)
	if len(lines) != 1 {
		t.Fatalf("oversized: %d lines", len(lines))
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil || errKind(m) != "request_too_large" {
		t.Fatalf("oversized: %s", lines[0])
	}
	if d := m["error"].(map[string]any)["details"].(map[string]any); d["limit"] != float64(16<<20) {
		t.Fatalf("details.limit: %v", d)
	}

	cases := []struct {
		payload, kind, msg string
	}{
		{"not json\n", "bad_json", ""},
		{"[1,2]\n", "bad_json", ""},
		{`{"op":"list_sandboxes","scope":{"kind":"system"}}`, "invalid_request", "request is missing its terminating newline"},
		{`{"op":"list_sandboxes","scope":{"kind":"system"},"x":1}` + "\n", "invalid_request", "unknown request field: x"},
		{`{"op":"list_sandboxes"}` + "\n", "invalid_request", "scope is required and must be an object"},
		{`{"op":"teleport","scope":{"kind":"system"}}` + "\n", "unknown_op", ""},
		{`{"op":"squash_layerstacks","scope":{"kind":"system"}}` + "\n", "invalid_request", "sandbox_id is required for squash_layerstacks"},
		{`{"op":"file_read","scope":{"kind":"system"},"args":{"path":"a"}}` + "\n", "invalid_request", "operation file_read requires sandbox scope"},
		{`{"op":"list_sandboxes","scope":{"kind":"sandbox","sandbox_id":"` + id + `"}}` + "\n", "invalid_request", "operation list_sandboxes requires system scope"},
		{`{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":"sbx-nope"},"args":{"path":"a"}}` + "\n", "not_found", "sandbox not found: sbx-nope"},
		{`{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":"bad id"},"args":{"path":"a"}}` + "\n", "invalid_request", ""},
		{`{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":"` + id + `"},"args":{"path":"a","sandbox_id":"sbx-other"}}` + "\n", "invalid_request", "sandbox_id in args does not match scope"},
		{`{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":"` + id + `"},"args":{"path":"a","limit":"5"}}` + "\n", "invalid_request", "limit must be an unsigned integer"},
		{`{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":"` + id + `"},"args":{"path":"a","nope":1}}` + "\n", "invalid_request", "unknown argument for file_read: nope"},
	}
	for _, tc := range cases {
		lines := e.raw([]byte(tc.payload))
		if len(lines) != 1 {
			t.Errorf("%s: %d lines", tc.payload, len(lines))
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
			t.Errorf("%s: %v", tc.payload, err)
			continue
		}
		if errKind(m) != tc.kind || (tc.msg != "" && errMsg(m) != tc.msg) {
			t.Errorf("%s: got %s", strings.TrimSpace(tc.payload), lines[0])
		}
	}
	// sandbox_id in args normalizes into the scope; the token field is ignored on the Unix socket.
	ok := e.rawObj(map[string]any{"op": "file_list", "scope": map[string]any{"kind": "sandbox", "sandbox_id": id},
		"args": map[string]any{"sandbox_id": id}, "_sandbox_gateway_auth_token": "whatever", "request_id": "my-req.1"})
	if errKind(ok) != "" {
		t.Fatalf("normalized request failed: %v", ok)
	}
}

func TestSecondSupervisorRefused(t *testing.T) {
	e := newEnv(t)
	e.start()
	cmd := exec.Command(bin("sandbox-supervisor"), "serve")
	cmd.Env = e.environ()
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("second supervisor: %v %s", err, out)
	}
	if !strings.Contains(string(out), "config_error") {
		t.Fatalf("second supervisor output: %s", out)
	}
	e.mgr("list_sandboxes") // the first one still answers
}

func TestSocketDirectoryMustBePrivate(t *testing.T) {
	e := newEnv(t)
	run := filepath.Join(e.home, "run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(run, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin("sandbox-supervisor"), "serve")
	cmd.Env = e.environ()
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "0700") {
		t.Fatalf("open socket directory accepted: %v %s", err, out)
	}
	if err := os.Chmod(run, 0o700); err != nil {
		t.Fatal(err)
	}
	e.start()
	st, err := os.Stat(e.socket())
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v", st, err)
	}
	for _, tok := range []string{"gateway.token", "ui.token"} {
		st, err := os.Stat(filepath.Join(e.home, "config", tok))
		if err != nil || st.Mode().Perm() != 0o600 || st.Size() != 65 {
			t.Fatalf("%s: %v %v", tok, st, err)
		}
	}
}

func TestAutostart(t *testing.T) {
	e := newEnv(t)
	root := e.project(map[string]string{"a": "a"})
	r := e.run("sandbox-manager-cli", "list_sandboxes")
	if r.code != 1 || !strings.Contains(r.stderr, "connection_error") {
		t.Fatalf("with SANDBOX_NO_AUTOSTART=1: %v", r)
	}
	r = e.runEnv([]string{"SANDBOX_NO_AUTOSTART=0"}, "sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", root)
	if r.code != 0 {
		t.Fatalf("autostart: %v", r)
	}
	t.Cleanup(func() {
		b, err := os.ReadFile(filepath.Join(e.home, "run", "supervisor.pid"))
		if err != nil {
			return
		}
		var pid int
		fmt.Sscan(string(b), &pid)
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Signal(os.Interrupt)
			for i := 0; i < 100; i++ {
				if _, err := os.Stat(e.socket()); os.IsNotExist(err) {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	})
	if got := e.mgr("list_sandboxes")["sandboxes"].([]any); len(got) != 1 {
		t.Fatalf("after autostart: %v", got)
	}
}

// TestAutostartFailureReason: when an autostarted supervisor exits, the
// client's envelope carries the supervisor's own reason for this start
// (details.reason) and its log (details.log), not just an exit status.
func TestAutostartFailureReason(t *testing.T) {
	e := newEnv(t)
	logPath := filepath.Join(e.home, "run", "supervisor.log")
	for _, tc := range []struct {
		name   string
		setup  func() func()
		reason string
	}{
		{"unknown configuration key", func() func() {
			writeConfig(t, e, "supervisor:\n  no_such_key: 1\n")
			return func() { os.Remove(filepath.Join(e.home, "config", "config.yml")) }
		}, "no_such_key"},
		{"data directory held by another supervisor", func() func() {
			if err := os.MkdirAll(e.data(), 0o700); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(filepath.Join(e.data(), "supervisor.lock"), os.O_CREATE|os.O_RDWR, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
				t.Fatal(err)
			}
			return func() { f.Close() }
		}, "another supervisor holds " + filepath.Join(e.data(), "supervisor.lock")},
	} {
		undo := tc.setup()
		r := e.runEnv([]string{"SANDBOX_NO_AUTOSTART=0"}, "sandbox-manager-cli", "list_sandboxes")
		undo()
		if r.code != 1 || r.stdout != "" {
			t.Fatalf("%s: %+v", tc.name, r)
		}
		body, _ := r.obj(t)["error"].(map[string]any)
		details, _ := body["details"].(map[string]any)
		if body["kind"] != "connection_error" || details == nil {
			t.Fatalf("%s: %s", tc.name, r.stderr)
		}
		if reason, _ := details["reason"].(string); !strings.Contains(reason, tc.reason) {
			t.Errorf("%s: details.reason %q, want it to name %q", tc.name, reason, tc.reason)
		}
		if details["log"] != logPath {
			t.Errorf("%s: details.log %v, want %s", tc.name, details["log"], logPath)
		}
		if msg, _ := body["message"].(string); !strings.Contains(msg, tc.reason) {
			t.Errorf("%s: message %q lacks the reason", tc.name, msg)
		}
	}
}

// TestOtherUserRefused needs a second local account that this user may run
// commands as through `sudo -n -u $ESBX_OTHER_USER` (CI sets this up).
func TestOtherUserRefused(t *testing.T) {
	other := otherUser(t).Username
	e := newEnv(t)
	e.start()
	// Open the path on purpose: the directory mode is the first wall; the
	// peer check must hold even when someone loosens it.
	var opened []string
	for p := e.socket(); p != "/"; p = filepath.Dir(p) {
		if strings.HasPrefix(p, os.TempDir()) && p != os.TempDir() {
			_ = os.Chmod(p, 0o711)
			opened = append(opened, p)
		}
	}
	if err := os.Chmod(e.socket(), 0o666); err != nil {
		t.Fatal(err)
	}
	// The other user's CLI does not even try: the socket's directory is not
	// theirs (their own supervisor's would be).
	cmd := exec.Command("sudo", "-n", "-u", other, bin("sandbox-manager-cli"), "--endpoint", e.socket(), "list_sandboxes")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 || stdout.Len() != 0 {
		t.Fatalf("other user's CLI: %v stdout=%q stderr=%q", err, stdout.String(), stderr.String())
	}
	var m map[string]any
	if err := json.Unmarshal(stderr.Bytes(), &m); err != nil || errKind(m) != "config_error" || !strings.Contains(errMsg(m), "not by you") {
		t.Fatalf("other user's CLI got %q", stderr.String())
	}
	// A raw connection reaches the supervisor, which refuses by peer uid.
	out, err := exec.Command("sudo", "-n", "-u", other, peerBin(t), "send", e.socket(), `{"op":"list_sandboxes","scope":{"kind":"system"}}`).CombinedOutput()
	if err != nil {
		t.Fatalf("raw request as %s: %v %s", other, err, out)
	}
	if err := json.Unmarshal(out, &m); err != nil || errKind(m) != "unauthorized" || !strings.Contains(errMsg(m), "is not the supervisor owner") {
		t.Fatalf("other user got %q", out)
	}
	// The owner is still served once the directory is private again.
	for _, p := range opened {
		_ = os.Chmod(p, 0o700)
	}
	e.mgr("list_sandboxes")
}

func writeConfig(t *testing.T, e *env, yml string) {
	t.Helper()
	dir := filepath.Join(e.home, "config")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestConfig(t *testing.T) {
	e := newEnv(t)
	for _, bad := range []string{"supervisor:\n  no_such_key: 1\n", "manager:\n  max_create_count: 0\n", "sandbox:\n  default_overlay: zfs\n", "nonsense: [\n"} {
		writeConfig(t, e, bad)
		cmd := exec.Command(bin("sandbox-supervisor"), "serve")
		cmd.Env = e.environ()
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "config_error") {
			t.Errorf("config %q accepted: %v %s", bad, err, out)
		}
	}
	writeConfig(t, e, "supervisor:\n  request_read_timeout_s: 0.3\nmanager:\n  max_create_count: 2\n")
	e.start()
	c, err := net.Dial("unix", e.socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte(`{"op":"list_sandboxes"`))
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // far below the default 30 s: the configured 0.3 s applies
	b, _ := io.ReadAll(c)
	if !strings.Contains(string(b), "request read timed out") {
		t.Fatalf("read timeout: %q", b)
	}
	root := e.project(map[string]string{"a": "a"})
	body := e.fail(1, "invalid_request", "sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", root, "--count", "3")
	if body["message"] != "count must be between 1 and 2" {
		t.Fatalf("configured max_create_count: %v", body)
	}
}

// TestWireStrictJSON sends raw request bytes that encoding/json alone
// would read leniently — the last of duplicate keys wins, invalid UTF-8
// becomes U+FFFD — on the Unix socket and over TCP: each is refused with
// bad_json and changes nothing.
func TestWireStrictJSON(t *testing.T) {
	e := newEnv(t)
	e.start("--listen", "tcp://127.0.0.1:0")
	// A file whose name is what a replaced byte would look up.
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n", "\uFFFD.txt": "replacement\n", "secret.txt": "s\n"}))
	addr, tok := e.tcpAddr(), e.token()
	sb := `"scope":{"kind":"sandbox","sandbox_id":"` + id + `"}`
	cases := []struct{ name, line, msg string }{
		{"duplicate op", `{"op":"list_sandboxes","op":"destroy_sandbox","scope":{"kind":"system"},"args":{"sandbox_id":"` + id + `"}}`,
			`duplicate key "op" in the request`},
		{"duplicate arg", `{"op":"file_write",` + sb + `,"args":{"path":"a.txt","content":"x\n","path":"secret.txt"}}`,
			`duplicate key "path" in args`},
		{"duplicate arg, escaped", `{"op":"file_write",` + sb + `,"args":{"path":"a.txt","content":"x\n","p\u0061th":"secret.txt"}}`,
			`duplicate key "path" in args`},
		{"duplicate in an edit", `{"op":"file_edit",` + sb + `,"args":{"path":"a.txt","edits":[{"old_string":"a","new_string":"b","new_string":"c"}]}}`,
			`duplicate key "new_string" in args.edits[0]`},
		{"duplicate scope kind", `{"op":"file_write","scope":{"kind":"system","kind":"sandbox","sandbox_id":"` + id + `"},"args":{"path":"a.txt","content":"x\n"}}`,
			`duplicate key "kind" in scope`},
		{"raw invalid byte in a path", `{"op":"file_read",` + sb + `,"args":{"path":"` + "\xff" + `.txt"}}`,
			`string at args.path is not valid UTF-8`},
		{"lone surrogate in a path", `{"op":"file_read",` + sb + `,"args":{"path":"\udcff.txt"}}`,
			`string at args.path is not valid UTF-8`},
		{"invalid byte in content", `{"op":"file_write",` + sb + `,"args":{"path":"a.txt","content":"` + "\xc3(" + `"}}`,
			`string at args.content is not valid UTF-8`},
		{"invalid byte in a key", `{"op":"file_read",` + sb + `,"args":{"path":"a.txt","` + "\xfe" + `":1}}`,
			`an object key in args is not valid UTF-8`},
	}
	want := func(name, via, line string) {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("%s via %s: response %q: %v", name, via, line, err)
			return
		}
		for _, tc := range cases {
			kind, msg := "bad_json", "request is not valid JSON: "+tc.msg
			if strings.HasPrefix(tc.msg, "string at args.") {
				kind, msg = "invalid_request", tc.msg // a bad argument value
			}
			if tc.name == name && (errKind(m) != kind || errMsg(m) != msg) {
				t.Errorf("%s via %s: got %s, want %s %q", name, via, line, kind, msg)
			}
		}
	}
	for _, tc := range cases {
		lines := e.raw([]byte(tc.line + "\n"))
		if len(lines) != 1 {
			t.Errorf("%s: %d response lines", tc.name, len(lines))
			continue
		}
		want(tc.name, "unix", lines[0])
		// Over TCP with the right token: the token does not excuse it.
		tcpLine := strings.Replace(tc.line, `{"op":`, `{"_sandbox_gateway_auth_token":"`+tok+`","op":`, 1)
		c, err := net.Dial("tcp", strings.TrimPrefix(addr, "tcp://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		_, _ = c.Write([]byte(tcpLine + "\n"))
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		want(tc.name, "tcp", line)
	}
	// Nothing happened: the sandbox is there, its files as they were.
	if got := e.mgr("list_sandboxes")["sandboxes"].([]any); len(got) != 1 {
		t.Fatalf("sandboxes after refused requests: %v", got)
	}
	for p, content := range map[string]string{"a.txt": "a", "secret.txt": "s"} {
		if got := e.rt(id, "file_read", "--path", p)["content"]; got != content {
			t.Errorf("%s = %q after refused requests, want %q", p, got, content)
		}
	}
	// A CLI refuses such a path itself instead of letting its JSON encoder
	// send U+FFFD in its place.
	body := e.rtFail(id, 2, "invalid_request", "file_read", "--path", "\xff.txt")
	if body["message"] != "path must be valid UTF-8" {
		t.Errorf("CLI with a non-UTF-8 path: %v", body)
	}
	// The same requests written plainly still work.
	ok := e.raw([]byte(`{"op":"file_read",` + sb + `,"args":{"path":"\ufffd.txt"}}` + "\n"))
	if len(ok) != 1 || !strings.Contains(ok[0], `"content":"replacement"`) {
		t.Errorf("reading \\ufffd.txt by its real name: %q", ok)
	}
}
