// Package tests holds the end-to-end tests: they build the real binaries,
// start a supervisor on a temporary EPHEMERAL_SANDBOX_HOME and drive the
// CLIs, the MCP server and the raw socket as users and agents do.
//
// They must never drive the supervisor other than through its binaries (a
// few read what it left on disk with package layers).
package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "esbx-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = os.Chmod(dir, 0o755) // a second user runs these binaries too
	build := exec.Command("go", "build", "-o", dir+"/", "./cmd/...")
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build binaries:", err)
		os.Exit(1)
	}
	// The exec shim is C (./cmd/... has no Go package for it): built as
	// the Makefile builds it, next to the supervisor, which uses it.
	build = exec.Command("sh", "cmd/sandbox-exec-shim/build.sh", filepath.Join(dir, "sandbox-exec-shim"))
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build sandbox-exec-shim:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func bin(name string) string { return filepath.Join(binDir, name) }

// requireAll turns a skip for a missing host capability into a failure (CI sets it).
func skipOrFail(t *testing.T, format string, a ...any) {
	t.Helper()
	if os.Getenv("ESBX_REQUIRE_ALL") == "1" {
		t.Fatalf("required capability missing: "+format, a...)
	}
	t.Skipf(format, a...)
}

// env is one temporary supervisor home.
type env struct {
	t    *testing.T
	root string // short temp dir (socket paths must stay ≤ 107 bytes)
	home string // EPHEMERAL_SANDBOX_HOME
	sup  *exec.Cmd
	done chan error
	log  *bytes.Buffer
	// supEnv is extra environment for the supervisor only (failpoints).
	supEnv []string
	// overlay is the driver createSandbox asks for ("" = the default):
	// the name of the forDrivers subtest the env was made in.
	overlay string
	// supPrefix, when set, is the command the supervisor runs under (the
	// supervisor binary and its arguments follow it).
	supPrefix []string
	// bins, when set, is the directory of the binaries this env runs
	// instead of the ones TestMain built.
	bins string
}

// bin is the path of one of the env's binaries.
func (e *env) bin(name string) string {
	if e.bins != "" {
		return filepath.Join(e.bins, name)
	}
	return bin(name)
}

func newEnv(t *testing.T) *env {
	t.Helper()
	root, err := os.MkdirTemp("", "esbx-")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, root: root, home: filepath.Join(root, "home"), overlay: driverOf(t)}
	t.Cleanup(func() {
		e.stop()
		_ = filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
			if err == nil && info.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
		os.RemoveAll(root)
	})
	return e
}

func (e *env) socket() string { return filepath.Join(e.home, "run", "supervisor.sock") }
func (e *env) data() string   { return filepath.Join(e.home, "data") }

func (e *env) environ(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "EPHEMERAL_SANDBOX_HOME=") || strings.HasPrefix(kv, "SANDBOX_") {
			continue
		}
		out = append(out, kv)
	}
	out = append(out, "EPHEMERAL_SANDBOX_HOME="+e.home, "SANDBOX_NO_AUTOSTART=1")
	return append(out, extra...)
}

// start runs `sandbox-supervisor serve` and waits for its socket.
func (e *env) start(extra ...string) {
	e.t.Helper()
	if e.sup != nil {
		e.t.Fatal("supervisor already running")
	}
	argv := append([]string{e.bin("sandbox-supervisor"), "serve"}, extra...)
	if len(e.supPrefix) > 0 {
		argv = append(append([]string{}, e.supPrefix...), argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = e.environ(e.supEnv...)
	e.log = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = e.log, e.log
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.sup, e.done = cmd, make(chan error, 1)
	go func() { e.done <- cmd.Wait() }()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("unix", e.socket()); err == nil {
			c.Close()
			return
		}
		select {
		case err := <-e.done:
			e.sup = nil
			e.t.Fatalf("supervisor exited early: %v\n%s", err, e.log)
		case <-time.After(20 * time.Millisecond):
		}
	}
	e.t.Fatalf("supervisor did not listen on %s\n%s", e.socket(), e.log)
}

// stop sends SIGTERM and waits for a clean exit.
func (e *env) stop() {
	if e.sup == nil {
		return
	}
	_ = e.sup.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-e.done:
		if err != nil {
			e.t.Errorf("supervisor exit after SIGTERM: %v\n%s", err, e.log)
		}
	case <-time.After(20 * time.Second):
		_ = e.sup.Process.Kill()
		<-e.done
		e.t.Errorf("supervisor ignored SIGTERM\n%s", e.log)
	}
	e.sup = nil
}

// kill9 kills the supervisor without any chance to clean up.
func (e *env) kill9() {
	e.t.Helper()
	_ = e.sup.Process.Kill()
	<-e.done
	e.sup = nil
}

type result struct {
	stdout, stderr string
	code           int
}

// json decodes stdout (success) or stderr (error) as one JSON object line.
func (r result) obj(t *testing.T) map[string]any {
	t.Helper()
	s := r.stdout
	if r.code != 0 {
		s = r.stderr
	}
	var m map[string]any
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("not one JSON object (exit %d): stdout=%q stderr=%q", r.code, r.stdout, r.stderr)
	}
	if strings.Count(strings.TrimSpace(s), "\n") != 0 {
		t.Fatalf("more than one line: %q", s)
	}
	return m
}

func (e *env) run(name string, args ...string) result {
	e.t.Helper()
	return e.runEnv(nil, name, args...)
}

func (e *env) runEnv(extraEnv []string, name string, args ...string) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bin(name), args...)
	cmd.Env = e.environ(extraEnv...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("%s: %v", name, err)
	}
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

// ok runs a CLI that must succeed and returns its result object.
func (e *env) ok(name string, args ...string) map[string]any {
	e.t.Helper()
	r := e.run(name, args...)
	if r.code != 0 {
		e.t.Fatalf("%s %v: exit %d\nstdout=%s\nstderr=%s", name, args, r.code, r.stdout, r.stderr)
	}
	if r.stderr != "" {
		e.t.Fatalf("%s %v: unexpected stderr %q", name, args, r.stderr)
	}
	return r.obj(e.t)
}

// fail runs a CLI that must fail with the given exit code and error kind,
// with nothing on stdout, and returns the error body.
func (e *env) fail(code int, kind, name string, args ...string) map[string]any {
	e.t.Helper()
	r := e.run(name, args...)
	if r.code != code || r.stdout != "" {
		e.t.Fatalf("%s %v: want exit %d with empty stdout, got %d\nstdout=%s\nstderr=%s", name, args, code, r.code, r.stdout, r.stderr)
	}
	m := r.obj(e.t)
	body, _ := m["error"].(map[string]any)
	if body == nil || body["kind"] != kind {
		e.t.Fatalf("%s %v: want kind %s, got %s", name, args, kind, r.stderr)
	}
	if _, ok := body["details"].(map[string]any); !ok {
		e.t.Fatalf("%s %v: envelope without details object: %s", name, args, r.stderr)
	}
	return body
}

func (e *env) mgr(args ...string) map[string]any {
	e.t.Helper()
	return e.ok("sandbox-manager-cli", args...)
}

func (e *env) rt(id string, args ...string) map[string]any {
	e.t.Helper()
	return e.ok("sandbox-runtime-cli", append([]string{"--sandbox-id", id}, args...)...)
}

func (e *env) rtFail(id string, code int, kind string, args ...string) map[string]any {
	e.t.Helper()
	return e.fail(code, kind, "sandbox-runtime-cli", append([]string{"--sandbox-id", id}, args...)...)
}

// raw sends bytes on the socket and returns every line of the answer.
func (e *env) raw(payload []byte) []string {
	e.t.Helper()
	c, err := net.Dial("unix", e.socket())
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	go func() {
		_, _ = c.Write(payload)
		_ = c.(*net.UnixConn).CloseWrite() // EOF after the payload, as a client that is done sending
	}()
	var lines []string
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 1<<20), 32<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// rawObj sends one request object and decodes the single response.
func (e *env) rawObj(req any) map[string]any {
	e.t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		e.t.Fatal(err)
	}
	lines := e.raw(append(b, '\n'))
	if len(lines) != 1 {
		e.t.Fatalf("want one response line, got %q", lines)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		e.t.Fatal(err)
	}
	return m
}

func errKind(m map[string]any) string {
	body, _ := m["error"].(map[string]any)
	if body == nil {
		return ""
	}
	k, _ := body["kind"].(string)
	return k
}

func errMsg(m map[string]any) string {
	body, _ := m["error"].(map[string]any)
	if body == nil {
		return ""
	}
	k, _ := body["message"].(string)
	return k
}

// project writes a small sample workspace and returns its path.
func (e *env) project(files map[string]string) string {
	e.t.Helper()
	dir := filepath.Join(e.root, "project")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			e.t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
	return dir
}

// overlayDrivers are the workspace overlay drivers every session, command
// and publication test runs against.
var overlayDrivers = []string{"kernel", "fuse"}

// forDrivers runs body once per overlay driver, as subtests named after
// the driver; an env made inside (newEnv) creates its sandboxes with that
// driver.
func forDrivers(t *testing.T, body func(t *testing.T)) {
	for _, d := range overlayDrivers {
		t.Run(d, body)
	}
}

// driverOf is the driver of the innermost forDrivers subtest t is in;
// outside one, $ESBX_OVERLAY (kernel or fuse: run every other test on one
// driver) or "" (the supervisor's default).
func driverOf(t *testing.T) string {
	parts := strings.Split(t.Name(), "/")
	for i := len(parts) - 1; i > 0; i-- {
		for _, d := range overlayDrivers {
			if parts[i] == d {
				return d
			}
		}
	}
	return os.Getenv("ESBX_OVERLAY")
}

func (e *env) createSandbox(root string, args ...string) string {
	e.t.Helper()
	args = append([]string{"create_sandbox", "--workspace-bind-root", root}, args...)
	if e.overlay != "" && !slices.Contains(args, "--overlay") {
		args = append(args, "--overlay", e.overlay)
		// A driver the host lacks is a missing capability, not a failure
		// (unless ESBX_REQUIRE_ALL=1): health says why.
		if r := e.run("sandbox-manager-cli", args...); r.code != 0 && strings.Contains(r.stderr, "overlay driver "+e.overlay+" is unavailable") {
			skipOrFail(e.t, "overlay driver %s: %s", e.overlay, strings.TrimSpace(r.stderr))
		} else if r.code != 0 {
			e.t.Fatalf("create_sandbox %v: exit %d\nstdout=%s\nstderr=%s", args, r.code, r.stdout, r.stderr)
		} else {
			rec := r.obj(e.t)
			id, _ := rec["id"].(string)
			if !strings.HasPrefix(id, "sbx-") || rec["overlay_driver"] != e.overlay {
				e.t.Fatalf("bad sandbox record for overlay %s: %v", e.overlay, rec)
			}
			return id
		}
	}
	rec := e.mgr(args...)
	id, _ := rec["id"].(string)
	if !strings.HasPrefix(id, "sbx-") {
		e.t.Fatalf("bad sandbox record: %v", rec)
	}
	return id
}

func num(t *testing.T, v any) int64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("not a number: %#v", v)
	}
	i, err := n.Int64()
	if err != nil {
		t.Fatal(err)
	}
	return i
}
