package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// doctor runs `sandbox-supervisor doctor ARGS` in env and returns stdout and the exit code.
func doctor(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin("sandbox-supervisor"), append([]string{"doctor"}, args...)...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if errb.Len() > 0 {
		t.Logf("doctor stderr: %s", errb.String())
	}
	return out.String(), code
}

func TestDoctor(t *testing.T) {
	e := newEnv(t)
	if err := os.MkdirAll(e.data(), 0o700); err != nil {
		t.Fatal(err)
	}
	out, code := doctor(t, e.environ())
	t.Logf("doctor:\n%s", out)
	if code != 0 {
		t.Fatalf("doctor exit %d, want 0:\n%s", code, out)
	}
	for _, want := range []string{"PASS userns: ", "PASS kernel_overlay: "} {
		if !strings.Contains(out, "\n"+want) && !strings.HasPrefix(out, want) {
			t.Errorf("output lacks a line starting %q", want)
		}
	}
	if !strings.Contains(out, " at "+e.data()+",") {
		t.Errorf("the overlay probe did not run in the data directory %s", e.data())
	}

	js, code := doctor(t, e.environ(), "--json")
	if code != 0 {
		t.Fatalf("doctor --json exit %d", code)
	}
	var r struct {
		OK     bool `json:"ok"`
		Checks []struct {
			ID       string `json:"id"`
			Required bool   `json:"required"`
			OK       bool   `json:"ok"`
			Detail   string `json:"detail"`
			Fix      string `json:"fix"`
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, js)
	}
	seen := map[string]bool{}
	for _, c := range r.Checks {
		seen[c.ID] = true
		if c.ID == "userns" || c.ID == "kernel_overlay" {
			if !c.Required || !c.OK {
				t.Errorf("%s = %+v", c.ID, c)
			}
		}
		if !c.OK && c.Fix == "" {
			t.Errorf("%s failed without a fix", c.ID)
		}
	}
	for _, id := range []string{"userns", "kernel_overlay", "fuse_device", "fuse_overlay", "subid", "cgroup_delegation", "docker", "systemd_user"} {
		if !seen[id] {
			t.Errorf("no %s check in %s", id, js)
		}
	}
	if !r.OK {
		t.Errorf("ok = false")
	}
}

// TestDoctorSubIDMissingHelpers: a PATH without newuidmap/newgidmap makes
// the optional subid check fail with the install fix; the exit code stays 0.
func TestDoctorSubIDMissingHelpers(t *testing.T) {
	e := newEnv(t)
	binPath := filepath.Join(e.root, "bin")
	if err := os.Mkdir(binPath, 0o755); err != nil {
		t.Fatal(err)
	}
	// Only what doctor runs from PATH: systemctl (for systemd_user).
	if p, err := exec.LookPath("systemctl"); err == nil {
		if err := os.Symlink(p, filepath.Join(binPath, "systemctl")); err != nil {
			t.Fatal(err)
		}
	}
	var env []string
	for _, kv := range e.environ() {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+binPath)
	out, code := doctor(t, env)
	if code != 0 {
		t.Errorf("doctor exit %d, want 0 (subid is optional):\n%s", code, out)
	}
	if !strings.Contains(out, "WARN subid: newuidmap and newgidmap not found on PATH") ||
		!strings.Contains(out, "    fix: sudo apt-get install uidmap") {
		t.Errorf("output:\n%s", out)
	}
}

// doctorReport is doctor --json's output.
type doctorReport struct {
	OK     bool `json:"ok"`
	Checks []struct {
		ID       string `json:"id"`
		Required bool   `json:"required"`
		OK       bool   `json:"ok"`
		Detail   string `json:"detail"`
		Fix      string `json:"fix"`
	} `json:"checks"`
}

func (r doctorReport) check(t *testing.T, id string) (required, ok bool, detail, fix string) {
	t.Helper()
	for _, c := range r.Checks {
		if c.ID == id {
			return c.Required, c.OK, c.Detail, c.Fix
		}
	}
	t.Fatalf("no %s check", id)
	return
}

// TestDoctorFuseDeviceFails: a FUSE device that is missing or unreadable
// fails the fuse_device check with the fix for that cause, in text and JSON,
// and the exit code follows whether the check is required.
func TestDoctorFuseDeviceFails(t *testing.T) {
	e := newEnv(t)
	if err := os.MkdirAll(e.data(), 0o700); err != nil {
		t.Fatal(err)
	}
	unreadable := filepath.Join(e.root, "fuse-0000")
	if err := os.WriteFile(unreadable, nil, 0o000); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, dev, fix string
	}{
		{"missing", filepath.Join(e.root, "no-such-fuse"), "modprobe fuse"},
		{"unreadable", unreadable, "sudo chmod 0666 " + unreadable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "unreadable" && os.Geteuid() == 0 {
				t.Skip("root opens a mode-0000 file") // CI runs this as esbx-ci
			}
			env := e.environ("SANDBOX_DOCTOR_FUSE_DEVICE=" + tc.dev)
			js, code := doctor(t, env, "--json")
			var r doctorReport
			if err := json.Unmarshal([]byte(js), &r); err != nil {
				t.Fatalf("doctor --json: %v\n%s", err, js)
			}
			required, ok, detail, fix := r.check(t, "fuse_device")
			if ok || !strings.Contains(detail, tc.dev) || !strings.Contains(fix, tc.fix) {
				t.Fatalf("fuse_device: ok=%v detail=%q fix=%q", ok, detail, fix)
			}
			wantCode := 0
			if !r.OK {
				wantCode = 1
			}
			if code != wantCode || (required && r.OK) {
				t.Fatalf("exit %d, ok %v, fuse_device required %v", code, r.OK, required)
			}
			text, code2 := doctor(t, env)
			status := "WARN"
			if required {
				status = "FAIL"
			}
			if code2 != code || !strings.Contains(text, "\n"+status+" fuse_device: ") && !strings.HasPrefix(text, status+" fuse_device: ") {
				t.Fatalf("text (exit %d):\n%s", code2, text)
			}
			if !strings.Contains(text, "    fix: "+strings.Split(fix, "\n")[0]) {
				t.Fatalf("text lacks the fix %q:\n%s", fix, text)
			}
		})
	}
}

// TestDoctorRequiredCheckFails: with sandbox.id_mapping: subid the subid
// check is required, so newuidmap missing from PATH fails doctor (exit 1)
// with the install fix.
func TestDoctorRequiredCheckFails(t *testing.T) {
	e := newEnv(t)
	cfgDir := filepath.Join(e.home, "config")
	if err := os.MkdirAll(cfgDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yml"), []byte("sandbox:\n  id_mapping: subid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(e.data(), 0o700); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range e.environ() {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+filepath.Join(e.root, "empty-bin"))
	out, code := doctor(t, env)
	if code != 1 || !strings.Contains(out, "FAIL subid: newuidmap and newgidmap not found on PATH") ||
		!strings.Contains(out, "    fix: sudo apt-get install uidmap") || !strings.Contains(out, "not ok:") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	js, code := doctor(t, env, "--json")
	var r doctorReport
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		t.Fatal(err)
	}
	if required, ok, _, fix := r.check(t, "subid"); code != 1 || r.OK || !required || ok || fix == "" {
		t.Fatalf("json (exit %d): %s", code, js)
	}
}
