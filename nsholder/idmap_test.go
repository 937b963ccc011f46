package nsholder

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// currentUserName is what planSubID matches in /etc/subuid.
func currentUserName(t *testing.T) string {
	t.Helper()
	name := strconv.Itoa(os.Geteuid())
	if u, err := user.LookupId(name); err == nil && u.Username != "" {
		name = u.Username
	}
	return name
}

// requireSubID skips (or, with ESBX_REQUIRE_ALL=1, fails) unless this host
// can map the caller's subordinate IDs, and returns the plan.
func requireSubID(t *testing.T) *subIDPlan {
	t.Helper()
	p, err := planSubID(defaultStartOptions)
	if err != nil {
		if os.Getenv("ESBX_REQUIRE_ALL") == "1" {
			t.Fatalf("ESBX_REQUIRE_ALL=1: subid mapping unavailable: %v", err)
		}
		t.Skipf("subid mapping unavailable (%v); set ESBX_REQUIRE_ALL=1 to fail instead", err)
	}
	return p
}

// mapLines is a uid_map/gid_map with its padding normalised.
func mapLines(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		out = append(out, strings.Join(strings.Fields(l), " "))
	}
	return out
}

func TestIDMapSubID(t *testing.T) {
	p := requireSubID(t)
	f := newFixture(t)
	cfg := f.config("sess-subid")
	cfg.IDMapping = IDMappingSubID
	s := startSession(t, cfg)

	uidMap := mapLines(s.ok("cat /proc/self/uid_map"))
	wantUID := []string{
		"0 " + strconv.Itoa(p.uid) + " 1",
		"1 " + strconv.FormatUint(uint64(p.uids.start), 10) + " " + strconv.FormatUint(uint64(p.uids.count), 10),
	}
	if strings.Join(uidMap, "|") != strings.Join(wantUID, "|") {
		t.Errorf("uid_map = %q, want %q", uidMap, wantUID)
	}
	gidMap := mapLines(s.ok("cat /proc/self/gid_map"))
	wantGID := []string{
		"0 " + strconv.Itoa(p.gid) + " 1",
		"1 " + strconv.FormatUint(uint64(p.gids.start), 10) + " " + strconv.FormatUint(uint64(p.gids.count), 10),
	}
	if strings.Join(gidMap, "|") != strings.Join(wantGID, "|") {
		t.Errorf("gid_map = %q, want %q", gidMap, wantGID)
	}
	if got := s.ok("id -u; id -g"); got != "0\n0" {
		t.Errorf("id = %q", got)
	}
	if got := s.ok("grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status | tr -s ' \t' ' '"); got != "NoNewPrivs: 1\nSeccomp: 2" {
		t.Errorf("hardening = %q", got)
	}
	// The holder itself re-exec'd into full capabilities of its namespace
	// and is still non-dumpable: its fds stay closed to the session.
	s.fails("readlink /proc/1/fd/0")

	// Files created as root inside belong to the user outside; chown to a
	// subordinate ID works and lands in the range outside.
	if got := s.ok("touch /workspace/f && chown 1000:1000 /workspace/f && stat -c %u:%g /workspace/f"); got != "1000:1000" {
		t.Errorf("after chown: %q", got)
	}
	s.ok("echo hi > /workspace/mine")
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(f.upper, "mine"), &st); err != nil {
		t.Fatal(err)
	} else if int(st.Uid) != p.uid || int(st.Gid) != p.gid {
		t.Errorf("upper/mine owned by %d:%d outside, want %d:%d", st.Uid, st.Gid, p.uid, p.gid)
	}
	if err := syscall.Lstat(filepath.Join(f.upper, "f"), &st); err != nil {
		t.Fatal(err)
	} else if want := p.uids.start + 999; st.Uid != want || st.Gid != p.gids.start+999 {
		t.Errorf("upper/f owned by %d:%d outside, want %d:%d", st.Uid, st.Gid, want, p.gids.start+999)
	}
	// Supervisor file operations work as under single mapping.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.h.WriteFile(ctx, "w.txt", []byte("w"), nil); err != nil {
		t.Fatal(err)
	}
	if b, _, err := s.h.ReadFile(ctx, "w.txt", 10); err != nil || string(b) != "w" {
		t.Errorf("ReadFile = %q, %v", b, err)
	}
	// The mapping helpers' environment flags do not reach commands.
	if out := s.ok("env"); strings.Contains(out, "ESBX_NSHOLDER") {
		t.Errorf("holder environment leaked: %q", out)
	}
}

func TestIDMapSingle(t *testing.T) {
	for _, mode := range []string{"", IDMappingSingle} {
		t.Run("mode="+mode, func(t *testing.T) {
			f := newFixture(t)
			cfg := f.config("sess-single")
			cfg.IDMapping = mode
			s := startSession(t, cfg)
			if got := mapLines(s.ok("cat /proc/self/uid_map")); len(got) != 1 || got[0] != "0 "+strconv.Itoa(os.Geteuid())+" 1" {
				t.Errorf("uid_map = %q", got)
			}
			if out := s.fails("touch /workspace/f && chown 1000 /workspace/f 2>&1"); !strings.Contains(out, "Invalid argument") {
				t.Errorf("chown under single: %q, want EINVAL", out)
			}
			if got := s.ok("cat /proc/self/setgroups"); got != "deny" {
				t.Errorf("setgroups = %q", got)
			}
		})
	}
}

// fakeHelpers puts newuidmap and newgidmap scripts with body into a new
// directory and makes it the whole PATH.
func fakeHelpers(t *testing.T, body string) {
	t.Helper()
	dir := t.TempDir()
	for _, n := range []string{"newuidmap", "newgidmap"} {
		must(t, os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"+body+"\n"), 0o755))
	}
	t.Setenv("PATH", dir)
}

// subIDFiles writes a subuid and a subgid file with content.
func subIDFiles(t *testing.T, content string) startOptions {
	t.Helper()
	dir := t.TempDir()
	o := startOptions{subuidFile: filepath.Join(dir, "subuid"), subgidFile: filepath.Join(dir, "subgid")}
	must(t, os.WriteFile(o.subuidFile, []byte(content), 0o644))
	must(t, os.WriteFile(o.subgidFile, []byte(content), 0o644))
	return o
}

func TestIDMapErrors(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh for the fake helpers")
	}
	name := currentUserName(t)
	good := name + ":100000:65536\n"
	before := len(childProcs())
	expect := func(t *testing.T, opts startOptions, mode string, want string) {
		t.Helper()
		f := newFixture(t)
		cfg := f.config("sess-idmap-err")
		cfg.IDMapping = mode
		h, err := start(context.Background(), testSelf, cfg, opts)
		var se *SetupError
		if !errors.As(err, &se) || se.Stage != stageIDMapping {
			if h != nil {
				h.Close(time.Second)
			}
			t.Fatalf("Start = %v (%T), want a SetupError at id_mapping", err, err)
		}
		if !strings.HasPrefix(err.Error(), "workspace setup failed at id_mapping: ") || !strings.Contains(se.Err, want) {
			t.Errorf("message %q, want it to contain %q", err, want)
		}
		t.Log(err)
	}
	t.Run("no newuidmap", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		expect(t, subIDFiles(t, good), IDMappingSubID, "newuidmap not found on PATH: install the uidmap package")
	})
	t.Run("no newgidmap", func(t *testing.T) {
		dir := t.TempDir()
		must(t, os.WriteFile(filepath.Join(dir, "newuidmap"), []byte("#!/bin/sh\nexit 0\n"), 0o755))
		t.Setenv("PATH", dir)
		expect(t, subIDFiles(t, good), IDMappingSubID, "newgidmap not found on PATH: install the uidmap package")
	})
	t.Run("no range", func(t *testing.T) {
		fakeHelpers(t, "exit 0")
		opts := subIDFiles(t, "# nobody here\nsomeone-else:100000:65536\n"+name+":5:0\n")
		expect(t, opts, IDMappingSubID, "no range for user "+name+" in "+opts.subuidFile)
	})
	t.Run("no subuid file", func(t *testing.T) {
		fakeHelpers(t, "exit 0")
		opts := startOptions{subuidFile: filepath.Join(t.TempDir(), "missing"), subgidFile: "/dev/null"}
		expect(t, opts, IDMappingSubID, "no range for user "+name+" in "+opts.subuidFile)
	})
	t.Run("helper fails", func(t *testing.T) {
		// The holder is already spawned and waiting when the helper fails:
		// it must be killed, and the helper's stderr reported.
		fakeHelpers(t, `echo "newuidmap: fake refusal for $1" >&2; exit 1`)
		expect(t, subIDFiles(t, good), IDMappingSubID, "exit status 1: newuidmap: fake refusal for ")
	})
	t.Run("unknown mode", func(t *testing.T) {
		expect(t, defaultStartOptions, "shared", `unknown id mapping "shared"`)
	})
	if after := childProcs(); len(after) > before {
		t.Errorf("processes left after failed setups: %v", after)
	}
}

func TestIDMapParse(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "subuid")
	must(t, os.WriteFile(file, []byte(strings.Join([]string{
		"# comment",
		"",
		"alice:100000:65536",
		"bob:bad:65536",      // malformed: skipped
		"bob:200000:0",       // empty: skipped
		"bob:300000:10:x",    // too many fields: skipped
		"1234:400000:1000",   // numeric owner
		"bob:500000:2000",    // first valid range of bob
		"bob:600000:3000",    // later ranges are ignored
		"carol:4294967295:1", // beyond the ID space: skipped
	}, "\n")), 0o644))
	cases := []struct {
		name  string
		uid   int
		want  subIDRange
		found bool
	}{
		{"alice", 1000, subIDRange{100000, 65536}, true},
		{"bob", 1001, subIDRange{500000, 2000}, true},
		{"dave", 1234, subIDRange{400000, 1000}, true},
		{"carol", 1002, subIDRange{}, false},
		{"erin", 1003, subIDRange{}, false},
	}
	for _, c := range cases {
		got, err := readSubIDRange(file, c.name, c.uid)
		if c.found && (err != nil || got != c.want) {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
		if !c.found {
			var se *SetupError
			if !errors.As(err, &se) || se.Stage != stageIDMapping || se.Err != "no range for user "+c.name+" in "+file {
				t.Errorf("%s: %v, %v; want no range", c.name, got, err)
			}
		}
	}
}
