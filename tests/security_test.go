package tests

// Escape attempts against the security boundary of contract §12, run as the
// unprivileged user that owns the supervisor. SECURITY.md maps each promise
// to the test that checks it. The peer-uid check of the Unix socket is
// TestOtherUserRefused (wire_test.go); the TCP listener is not tested here.

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// snapshotTree hashes every entry below dir (path, mode, content or link
// target) so a test can prove nothing in it changed.
func snapshotTree(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		line := fmt.Sprintf("%s %v", rel, info.Mode())
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func decodeLine(s string) (map[string]any, bool) {
	var m map[string]any
	return m, json.Unmarshal([]byte(strings.TrimSpace(s)), &m) == nil
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}

// rtTry runs a runtime CLI call that may fail and returns its decoded object
// and the error kind ("" on success).
func (e *env) rtTry(id string, args ...string) (map[string]any, string) {
	e.t.Helper()
	r := e.run("sandbox-runtime-cli", append([]string{"--sandbox-id", id}, args...)...)
	if r.code != 0 && r.code != 1 {
		e.t.Fatalf("%v: exit %d stdout=%q stderr=%q", args, r.code, r.stdout, r.stderr)
	}
	m := r.obj(e.t)
	if r.code == 0 {
		return m, ""
	}
	return m, errKind(m)
}

// TestSecuritySymlinkEscapes: symlinks planted by a command (to /, to a file
// outside the workspace, to ..) are never followed by file operations, in a
// session and sessionless (the links published to head).
func TestSecuritySymlinkEscapes(t *testing.T) {
	e, id := sandboxWithProject(t)
	root := filepath.Join(e.root, "project")
	hostBefore := snapshotTree(t, root)
	passwd := fileSum(t, "/etc/passwd")
	ws := e.session(id)
	plant := "ln -s / root && ln -s /etc/passwd pw && ln -s .. up && ln -s /proc/self/root pr && ln -s /tmp tmp && echo planted"
	if out := e.exec(id, "--workspace-session-id", ws, plant); out["output"] != "planted" {
		t.Fatalf("plant: %v", out)
	}
	// Publish the same links to head for the sessionless backend.
	if out := e.exec(id, plant); out["output"] != "planted" {
		t.Fatalf("plant (implicit): %v", out)
	}
	attempts := [][]string{
		{"file_read", "--path", "root/etc/passwd"},
		{"file_read", "--path", "pw"},
		{"file_read", "--path", "up/x"},
		{"file_read", "--path", "pr/etc/passwd"},
		{"file_read", "--path", "/workspace/root/etc/passwd"},
		{"file_write", "--path", "root/tmp/escaped", "--content", "escaped\n"},
		{"file_write", "--path", "pw", "--content", "escaped\n"},
		{"file_write", "--path", "up/escaped", "--content", "escaped\n"},
		{"file_write", "--path", "tmp/escaped", "--content", "escaped\n"},
		{"file_write", "--path", "up/up/escaped/deep", "--content", "escaped\n"},
		{"file_edit", "--path", "pw", "--edits", `[{"old_string":"root","new_string":"toor"}]`},
		{"file_edit", "--path", "root/etc/passwd", "--edits", `[{"old_string":"root","new_string":"toor"}]`},
		{"file_list", "--path", "root"},
		{"file_list", "--path", "root/etc"},
		{"file_list", "--path", "up"},
		{"file_list", "--path", "pr/etc"},
		{"file_blame", "--path", "pw"},
	}
	for _, sessionArgs := range [][]string{{"--workspace-session-id", ws}, nil} {
		for _, a := range attempts {
			m, kind := e.rtTry(id, append(append([]string{}, a...), sessionArgs...)...)
			if kind != "not_found" && kind != "invalid_request" {
				t.Errorf("%v %v: want not_found or invalid_request, got %v", a, sessionArgs, m)
			}
			if strings.Contains(fmt.Sprint(m), "root:x:0:0") {
				t.Errorf("%v %v: leaked /etc/passwd: %v", a, sessionArgs, m)
			}
		}
	}
	// file_list of the workspace root shows the links as links.
	entries := e.rt(id, "file_list", "--workspace-session-id", ws)["entries"].([]any)
	kinds := map[string]any{}
	for _, en := range entries {
		m := en.(map[string]any)
		kinds[m["name"].(string)] = m["kind"]
	}
	for _, n := range []string{"root", "pw", "up", "pr"} {
		if kinds[n] != "symlink" {
			t.Errorf("file_list shows %s as %v: %v", n, kinds[n], entries)
		}
	}
	// Nothing outside the workspace changed, inside the session or on the host.
	check := "test -e /escaped || test -e /tmp/escaped || test -e /escaped/deep || grep -q toor /etc/passwd; echo rc=$?"
	if out := e.exec(id, "--workspace-session-id", ws, check); out["output"] != "rc=1" {
		t.Errorf("something escaped inside the session: %v", out)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(root), "escaped")); !os.IsNotExist(err) {
		t.Errorf("a file appeared next to the host workspace: %v", err)
	}
	if _, err := os.Stat("/tmp/escaped"); !os.IsNotExist(err) {
		t.Errorf("/tmp/escaped on the host: %v", err)
	}
	if got := fileSum(t, "/etc/passwd"); got != passwd {
		t.Errorf("/etc/passwd changed")
	}
	if got := snapshotTree(t, root); got != hostBefore {
		t.Errorf("host workspace changed:\n%s\n---\n%s", hostBefore, got)
	}
}

// TestSecurityProcPaths: /proc/self/root and other absolute or dot-dot
// spellings are invalid paths for every file operation.
func TestSecurityProcPaths(t *testing.T) {
	e, id := sandboxWithProject(t)
	ws := e.session(id)
	paths := []string{
		"/proc/self/root/etc/passwd", "/proc/1/root/etc/passwd", "/proc/self/cwd/shared.txt", "/proc/self/fd/0",
		"/workspace/../proc/self/root/etc/passwd", "../../proc/self/root/etc/passwd", `..\..\etc\passwd`,
		"/workspace/../etc/passwd", "/etc/passwd", "//etc/passwd", "/workspacex/a", "a/../../x",
	}
	for _, sessionArgs := range [][]string{{"--workspace-session-id", ws}, nil} {
		for _, p := range paths {
			for _, a := range [][]string{
				{"file_read", "--path", p},
				{"file_write", "--path", p, "--content", "escaped\n"},
				{"file_edit", "--path", p, "--edits", `[{"old_string":"a","new_string":"b"}]`},
				{"file_list", "--path", p},
				{"file_blame", "--path", p},
			} {
				m, kind := e.rtTry(id, append(append([]string{}, a...), sessionArgs...)...)
				if kind != "invalid_request" || !strings.HasPrefix(errMsg(m), "invalid path") {
					t.Errorf("%q %v: want invalid_request invalid path, got %v", a, sessionArgs, m)
				}
			}
		}
	}
	// The same through the raw socket, where no client-side check applies.
	for _, p := range append(paths, "a\x00b", "/workspace/a\x00/../../etc/passwd") {
		m := e.rawObj(map[string]any{"op": "file_read", "scope": map[string]any{"kind": "sandbox", "sandbox_id": id},
			"args": map[string]any{"path": p, "workspace_session_id": ws}})
		if errKind(m) != "invalid_request" || !strings.HasPrefix(errMsg(m), "invalid path") {
			t.Errorf("raw file_read %q: %v", p, m)
		}
	}
	// A relative "proc/..." is inside the workspace and simply absent.
	e.rtFail(id, 1, "not_found", "file_read", "--workspace-session-id", ws, "--path", "proc/self/root/etc/passwd")
}

// TestSecuritySymlinkRace: a command flips d between a real directory and a
// symlink (to /, /tmp and /root) while file_write and file_read hit d/<name>
// 200 times each; no write lands outside /workspace, no read returns
// content from outside, and the host is untouched.
func TestSecuritySymlinkRace(t *testing.T) {
	e, id := sandboxWithProject(t)
	root := filepath.Join(e.root, "project")
	hostBefore := snapshotTree(t, root)
	canary := filepath.Join(e.data(), "canary.txt")
	if err := os.WriteFile(canary, []byte("canary\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("esbx-race-%d", time.Now().UnixNano())
	ws := e.session(id)
	// Outside the workspace (the session's writable /tmp and /root; / is
	// read-only) a decoy that a followed link would expose.
	decoy := fmt.Sprintf("echo outside > /tmp/%[1]s && echo outside > /root/%[1]s && touch /tmp/decoy-outside /root/decoy-outside && echo ok", name)
	if out := e.exec(id, "--workspace-session-id", ws, decoy); out["output"] != "ok" {
		t.Fatalf("decoy: %v", out)
	}
	flip := `end=$(($(date +%s)+120)); while [ $(date +%s) -lt $end ]; do
rm -rf d; mkdir d 2>/dev/null; echo inside > d/` + name + ` 2>/dev/null
rm -rf d; ln -s / d 2>/dev/null
rm -rf d; mkdir d 2>/dev/null
rm -rf d; ln -s /tmp d 2>/dev/null
rm -rf d; ln -s /root d 2>/dev/null
done`
	fl := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "200", flip)
	if fl["status"] != "running" {
		t.Fatalf("flipper: %v", fl)
	}
	const n = 200
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for _, op := range []string{"file_write", "file_read", "file_list"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n; i++ {
				var args []string
				switch op {
				case "file_write":
					args = []string{"file_write", "--workspace-session-id", ws, "--path", "d/" + name, "--content", "written\n"}
				case "file_read":
					args = []string{"file_read", "--workspace-session-id", ws, "--path", "d/" + name}
				default:
					args = []string{"file_list", "--workspace-session-id", ws, "--path", "d"}
				}
				r := e.run("sandbox-runtime-cli", append([]string{"--sandbox-id", id}, args...)...)
				out := r.stdout + r.stderr
				mu.Lock()
				outcome := "ok"
				if r.code != 0 {
					outcome = "exit " + fmt.Sprint(r.code)
					if m, ok := decodeLine(r.stderr); ok {
						outcome = errKind(m)
					}
				}
				counts[op+" "+outcome]++
				mu.Unlock()
				if r.code != 0 && r.code != 1 {
					t.Errorf("%s: exit %d %q", op, r.code, out)
				}
				if strings.Contains(out, "outside") || strings.Contains(out, `"proc"`) || strings.Contains(out, `"usr"`) ||
					strings.Contains(out, "internal_error") {
					t.Errorf("%s escaped or broke: %s", op, out)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("outcomes: %v", counts)
	e.rt(id, "write_command_stdin", "--command-session-id", fl["command_session_id"].(string), "\u0003")
	if counts["file_write ok"] == 0 {
		t.Logf("no write won the race (the flipper kept d a symlink); the check is still valid")
	}
	// The decoys are untouched and nothing was written beside them.
	check := fmt.Sprintf("cat /tmp/%[1]s /root/%[1]s; ls -A /tmp /root / | grep -c esbx-tmp; find / /tmp /root -maxdepth 1 -name '%[1]s*' | sort", name)
	if out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "10000", check); out["output"] != fmt.Sprintf("outside\noutside\n0\n/root/%[1]s\n/tmp/%[1]s", name) {
		t.Errorf("outside the workspace after the race: %v", out)
	}
	if b, err := os.ReadFile(canary); err != nil || string(b) != "canary\n" {
		t.Errorf("canary in the data dir: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join("/tmp", name)); !os.IsNotExist(err) {
		t.Errorf("the host /tmp got %s: %v", name, err)
	}
	if matches, _ := filepath.Glob(filepath.Join(e.root, "*", name)); len(matches) > 0 {
		t.Errorf("files outside the workspace on the host: %v", matches)
	}
	if got := snapshotTree(t, root); got != hostBefore {
		t.Errorf("host workspace changed")
	}
}

// TestSecurityInsideCommand: a command cannot reach the supervisor's state,
// the holder's memory or descriptors, or any privilege beyond the kept
// capabilities; masked paths (the mechanism that covers the supervisor's
// directories wherever a host path would expose them) show nothing.
func TestSecurityInsideCommand(t *testing.T) {
	e := newEnv(t)
	// The supervisor's own directories live below the private /tmp here, so
	// the masking of §5.4 is exercised through sandbox.hidden_paths, which
	// goes through the same covers (a directory and a file behind a symlink).
	var hidden []string
	if ents, err := os.ReadDir("/usr/share/doc"); err == nil && len(ents) > 0 {
		hidden = append(hidden, "/usr/share/doc")
	}
	osRelease, _ := filepath.EvalSymlinks("/etc/os-release")
	if fi, err := os.Stat(osRelease); err == nil && fi.Size() > 0 && strings.HasPrefix(osRelease, "/usr/") {
		hidden = append(hidden, "/etc/os-release")
	}
	writeConfig(t, e, fmt.Sprintf("sandbox:\n  hidden_paths: [%s]\n", strings.Join(hidden, ", ")))
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	if _, err := os.Stat(filepath.Join(e.home, "config", "gateway.token")); err != nil {
		t.Fatalf("the supervisor made no gateway token: %v", err)
	}
	ws := e.session(id)
	run := func(cmd string) string {
		t.Helper()
		out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "30000", cmd)
		if out["status"] != "ok" && out["status"] != "error" {
			t.Fatalf("%s: %v", cmd, out)
		}
		s, _ := out["output"].(string)
		return s
	}
	expect := func(cmd, want string) {
		t.Helper()
		if got := run(cmd); got != want {
			t.Errorf("%s:\n got %q\nwant %q", cmd, got, want)
		}
	}
	data, config, runtime := filepath.Join(e.home, "data"), filepath.Join(e.home, "config"), filepath.Join(e.home, "run")
	for _, d := range []string{e.root, e.home, data, config, runtime} {
		expect(fmt.Sprintf("ls -A %s 2>/dev/null | wc -l", d), "0")
		expect(fmt.Sprintf("touch %s/x 2>/dev/null; echo rc=$?", d), "rc=1")
	}
	if len(hidden) == 0 {
		t.Log("no /usr/share/doc or /etc/os-release on this host: masking not exercised")
	}
	for _, h := range hidden {
		if h == "/usr/share/doc" {
			expect("ls -A /usr/share/doc | wc -l; touch /usr/share/doc/x 2>/dev/null; echo rc=$?", "0\nrc=1")
		} else {
			expect(fmt.Sprintf("cat %s /etc/os-release 2>/dev/null | wc -c; { echo x >> %s; } 2>/dev/null; echo rc=$?", osRelease, osRelease), "0\nrc=1")
		}
	}
	expect(fmt.Sprintf("cat %s/gateway.token %s/ui.token 2>/dev/null | wc -c", config, config), "0")
	expect(fmt.Sprintf("test -e %s/supervisor.sock && echo visible || echo hidden", runtime), "hidden")
	expect(fmt.Sprintf("ls %s/sandboxes 2>/dev/null; echo rc=$?", data), "rc=2")
	// No environment hint of the supervisor's home.
	expect("env | grep -c -e EPHEMERAL_SANDBOX -e SANDBOX_SUPERVISOR -e SANDBOX_GATEWAY -e XDG_", "0")

	// The holder is PID 1: visible, but its environment, descriptors,
	// memory and root are not.
	if comm := run("cat /proc/1/comm"); comm == "" {
		t.Errorf("/proc/1/comm is empty")
	} else {
		t.Logf("holder comm: %s", comm)
	}
	for _, p := range []string{"environ", "mem", "maps", "auxv", "syscall", "stack"} {
		expect(fmt.Sprintf("head -c 64 /proc/1/%s >/dev/null 2>&1; echo rc=$?", p), "rc=1")
	}
	// The fd numbers may be listed (the directory belongs to namespace root);
	// opening or resolving any of them needs ptrace access, which fails.
	t.Logf("holder fds listed: %s", run("ls /proc/1/fd 2>&1 | wc -l"))
	expect("n=0; for f in /proc/1/fd/*; do timeout 2 head -c 0 $f 2>/dev/null && n=$((n+1)); done; echo opened=$n", "opened=0")
	expect("for f in /proc/1/fd/*; do timeout 2 head -c 1 $f; done 2>/dev/null | wc -c", "0")
	expect("ls -l /proc/1/fd/ 2>/dev/null | grep -c -- '->'", "0")
	expect("readlink /proc/1/root /proc/1/cwd /proc/1/exe /proc/1/fd/0 2>/dev/null | wc -l", "0")
	expect("kill -TERM 1 2>/dev/null; kill -KILL 1 2>/dev/null; sleep 0.2; echo alive", "alive")
	expect("echo still-served", "still-served")

	// Privileges: the kept capability set, no_new_privs, seccomp, single-ID map.
	// §6.2: every set holds at most the kept set (CHOWN, DAC_OVERRIDE,
	// DAC_READ_SEARCH, FOWNER, FSETID, KILL, SETGID, SETUID,
	// NET_BIND_SERVICE, NET_RAW, MKNOD, SETFCAP = 0x880024ff); the
	// ambient set may be empty.
	caps := run("grep -E '^Cap(Inh|Prm|Eff|Bnd):' /proc/self/status | tr -s '\\t ' ' '")
	if caps != "CapInh: 00000000880024ff\nCapPrm: 00000000880024ff\nCapEff: 00000000880024ff\nCapBnd: 00000000880024ff" {
		t.Errorf("capabilities: %q", caps)
	}
	if amb := run("grep CapAmb: /proc/self/status | tr -s '\\t ' ' '"); amb != "CapAmb: 0000000000000000" && amb != "CapAmb: 00000000880024ff" {
		t.Errorf("ambient capabilities: %q", amb)
	}
	expect("grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t ' ' '", "NoNewPrivs: 1\nSeccomp: 2")
	expect("cat /proc/self/uid_map /proc/self/gid_map | tr -s ' ' ' ' | sed 's/^ //'; cat /proc/self/setgroups",
		fmt.Sprintf("0 %d 1\n0 %d 1\ndeny", os.Getuid(), os.Getgid()))
	for _, c := range []string{
		"unshare -U true", "unshare -m true", "unshare -n true", "unshare -p -f true",
		"mkdir -p /tmp/m && mount -t tmpfs x /tmp/m", "mkdir -p /tmp/m && mount --bind /tmp /tmp/m", "umount /proc",
		"mknod /tmp/blk b 8 0", "mknod /tmp/chr c 1 3", "chown 1:1 /tmp", "nsenter -t 1 -m true",
	} {
		expect(c+" >/dev/null 2>&1 && echo allowed || echo refused", "refused")
	}
	if out := run("command -v keyctl >/dev/null && { keyctl show >/dev/null 2>&1; echo rc=$?; } || echo absent"); out != "absent" && out != "rc=1" {
		t.Errorf("keyctl: %q", out)
	}
}
