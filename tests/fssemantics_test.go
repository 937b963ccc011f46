package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// The filesystem-semantics suite runs one scripted sequence of operations
// (tests/internal/fssem) in a native directory, in a kernel-overlay session
// and in a FUSE-overlay session, each over the same two-layer lower content,
// and compares the reports. They must match except for the documented,
// intentional overlay differences below. A driver that create_sandbox refuses
// is a skip, and a failure under ESBX_REQUIRE_ALL=1 (CI), so the fuse run
// never silently disappears.

// overlayDifference is one intentional way an overlay session differs from
// a native directory. st_dev (and raw inode numbers) differ too; the probe
// never reports them, only equality facts about inode numbers.
type overlayDifference struct {
	drivers []string // nil: every overlay driver
	step    string
	result  string         // the overlay's result instead of the native one
	facts   map[string]any // facts the overlay reports differently
	why     string
}

var overlayDifferences = []overlayDifference{
	{step: "rename-lower-dir", result: "EXDEV",
		why: "a directory with lower content cannot be renamed without redirect_dir, which sessions never enable (contract §8.4); tools fall back to copy+delete"},
	{step: "rename-merged-dir", result: "EXDEV",
		why: "a merged directory (lower content plus upper entries) is a directory with lower content"},
	{drivers: []string{"kernel"}, step: "hardlink-lower", facts: map[string]any{"same ino": false},
		why: "without index=on (sessions never enable it) the kernel reports the lower inode number for the copied-up name and the upper one for the new link; the FUSE driver gives every name one inode number"},
}

// fssemReport mirrors the probe's JSON; steps and entries stay raw JSON
// values so a mismatch prints exactly what each side reported.
type fssemReport struct {
	Steps []map[string]any `json:"steps"`
	Final []map[string]any `json:"final"`
}

func TestFilesystemSemantics(t *testing.T) {
	probe := buildFssemProbe(t)
	native := nativeFssemReport(t, probe)
	checkNativeFacts(t, native)
	for _, driver := range []string{"kernel", "fuse"} {
		t.Run(driver, func(t *testing.T) {
			got := sessionFssemReport(t, probe, driver)
			compareFssem(t, driver, native, got, overlayDifferences)
		})
	}
}

// buildFssemProbe builds the probe as a static binary (it runs inside
// session roots too).
func buildFssemProbe(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "fssem")
	cmd := exec.Command("go", "build", "-o", out, "./tests/internal/fssem")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, b)
	}
	return out
}

func runProbe(t *testing.T, probe string, args ...string) {
	t.Helper()
	if b, err := exec.Command(probe, args...).CombinedOutput(); err != nil {
		t.Fatalf("fssem %v: %v\n%s", args, err, b)
	}
}

func nativeFssemReport(t *testing.T, probe string) fssemReport {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "t")
	report := filepath.Join(t.TempDir(), "report.json")
	runProbe(t, probe, "prepare", dir)
	runProbe(t, probe, "prepare2", dir)
	runProbe(t, probe, "run", dir, report)
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	return decodeFssem(t, "native", data)
}

func decodeFssem(t *testing.T, what string, data []byte) fssemReport {
	t.Helper()
	var r fssemReport
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("%s report: %v\n%s", what, err, data)
	}
	if len(r.Steps) == 0 || len(r.Final) == 0 {
		t.Fatalf("%s report is empty", what)
	}
	return r
}

// checkNativeFacts: every boolean fact the probe reports is phrased as a
// property that holds on a POSIX filesystem, so natively all must be true.
// This keeps the baseline honest: the overlays are compared against it.
func checkNativeFacts(t *testing.T, r fssemReport) {
	t.Helper()
	for _, s := range r.Steps {
		facts, _ := s["facts"].(map[string]any)
		for k, v := range facts {
			if b, ok := v.(bool); ok && !b {
				t.Errorf("native: step %s: fact %q is false", s["name"], k)
			}
		}
	}
}

// sessionFssemReport prepares the workspace root (layer 1), publishes the
// second layer through an implicit command, then runs the probe in an
// explicit session and reads its report back through file_read.
func sessionFssemReport(t *testing.T, probe, driver string) fssemReport {
	t.Helper()
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{})
	data, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "fssem"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	runProbe(t, probe, "prepare", filepath.Join(root, "t"))

	r := e.run("sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", root, "--overlay", driver)
	if r.code != 0 {
		// ESBX_REQUIRE_ALL=1 (CI) turns a refused driver into a failure.
		skipOrFail(t, "create_sandbox --overlay %s refused: %s", driver, r.stderr)
	}
	id, _ := r.obj(t)["id"].(string)
	if !strings.HasPrefix(id, "sbx-") {
		t.Fatalf("create_sandbox: %s", r.stdout)
	}
	if out := e.exec(id, "--yield-time-ms", "60000", "./fssem prepare2 t"); out["status"] != "ok" {
		t.Fatalf("prepare2 (implicit session): %v", out)
	}
	ws := e.session(id)
	if got := e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any)[0].(map[string]any)["overlay_driver"]; got != driver {
		t.Fatalf("session overlay_driver = %v, want %s", got, driver)
	}
	// The driver really serves /workspace (no silent fallback to the other one).
	fstype := e.exec(id, "--workspace-session-id", ws, `awk '$2 == "/workspace" { print $3 }' /proc/mounts`)["output"]
	if want := map[string]string{"kernel": "overlay", "fuse": "fuse"}[driver]; fstype != want && !strings.HasPrefix(fmt.Sprint(fstype), want+".") {
		t.Fatalf("/workspace of a %s session is mounted as %q", driver, fstype)
	}
	out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "120000", "./fssem run t report.json")
	if out["status"] != "ok" {
		t.Fatalf("fssem run in a %s session: %v", driver, out)
	}
	rep := e.rt(id, "file_read", "--workspace-session-id", ws, "--path", "report.json", "--limit", "2000")
	if rep["truncated"] != false {
		t.Fatalf("report truncated: %v", rep["total_lines"])
	}
	return decodeFssem(t, driver, []byte(rep["content"].(string)))
}

// compareFssem compares step by step and the final trees path by path,
// after applying the documented differences to the native report.
func compareFssem(t *testing.T, driver string, native, got fssemReport, diffs []overlayDifference) {
	t.Helper()
	want := make([]map[string]any, len(native.Steps))
	for i, s := range native.Steps {
		c := map[string]any{}
		for k, v := range s {
			c[k] = v
		}
		for _, d := range diffs {
			if c["name"] != d.step || (d.drivers != nil && !slices.Contains(d.drivers, driver)) {
				continue
			}
			if d.result != "" {
				c["result"] = d.result
			}
			if len(d.facts) > 0 {
				facts := map[string]any{}
				if f, ok := c["facts"].(map[string]any); ok {
					for k, v := range f {
						facts[k] = v
					}
				}
				for k, v := range d.facts {
					facts[k] = v
				}
				c["facts"] = facts
			}
		}
		want[i] = c
	}
	if len(want) != len(got.Steps) {
		t.Fatalf("native ran %d steps, the session %d", len(want), len(got.Steps))
	}
	for i := range want {
		if !reflect.DeepEqual(want[i], got.Steps[i]) {
			t.Errorf("step %v differs:%s\n  native:  %s\n  overlay: %s", want[i]["name"], namesDiff(want[i], got.Steps[i]), short(want[i]), short(got.Steps[i]))
		}
	}
	byPath := func(es []map[string]any) map[string]map[string]any {
		m := map[string]map[string]any{}
		for _, e := range es {
			m[fmt.Sprint(e["path"])] = e
		}
		return m
	}
	wf, gf := byPath(native.Final), byPath(got.Final)
	for p, w := range wf {
		if g, ok := gf[p]; !ok {
			t.Errorf("final: %s missing in the overlay (native: %s)", p, js(w))
		} else if !reflect.DeepEqual(w, g) {
			t.Errorf("final: %s differs:%s\n  native:  %s\n  overlay: %s", p, namesDiff(w, g), short(w), short(g))
		}
	}
	for p, g := range gf {
		if _, ok := wf[p]; !ok {
			t.Errorf("final: %s only in the overlay: %s", p, js(g))
		}
	}
}

// short is js cut to a readable length (directory listings can hold 800 names).
func short(v any) string {
	s := js(v)
	if len(s) > 1500 {
		s = s[:1500] + "…"
	}
	return s
}

// namesDiff lists the directory entries one side has and the other lacks,
// in an entry or in a step's state.
func namesDiff(want, got map[string]any) string {
	collect := func(m map[string]any) map[string]map[string]bool {
		out := map[string]map[string]bool{}
		add := func(e map[string]any) {
			if names, ok := e["names"].([]any); ok {
				set := map[string]bool{}
				for _, n := range names {
					set[fmt.Sprint(n)] = true
				}
				out[fmt.Sprint(e["path"])] = set
			}
		}
		add(m)
		if st, ok := m["state"].([]any); ok {
			for _, e := range st {
				if em, ok := e.(map[string]any); ok {
					add(em)
				}
			}
		}
		return out
	}
	w, g := collect(want), collect(got)
	var b strings.Builder
	for dir, ws := range w {
		gs := g[dir]
		var missing, extra []string
		for n := range ws {
			if !gs[n] {
				missing = append(missing, n)
			}
		}
		for n := range gs {
			if !ws[n] {
				extra = append(extra, n)
			}
		}
		slices.Sort(missing)
		slices.Sort(extra)
		if len(missing) > 0 || len(extra) > 0 {
			fmt.Fprintf(&b, "\n  %s: the overlay lists %d names the native directory has not %v and lacks %d %v", dir, len(extra), extra, len(missing), missing)
		}
	}
	return b.String()
}

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// otherUIDWant is what `fssem otheruid` must report everywhere: entries of
// mode 0000 (and the entries below a mode-0000 directory) refuse a user
// who is neither their owner nor root, whoever made them.
var otherUIDWant = map[string]any{
	"modes": map[string]any{".": "0755", "zero.txt": "0000", "zdir": "0000", "rdir": "0555"},
	"other": map[string]any{
		"not root":           "true",
		"open.txt open":      "ok",
		"zero.txt open":      "EACCES",
		"zero.txt write":     "EACCES",
		"zdir opendir":       "EACCES",
		"zdir/in.txt open":   "EACCES",
		"zdir/in.txt stat":   "EACCES",
		"rdir/in.txt unlink": "EACCES",
	},
}

// TestFilesystemPermissionsOtherUID: in a subordinate-ID session, uid 65534
// is refused root's mode-0000 file and whatever is below root's mode-0000
// directory, on both drivers, as another local user is natively. (The FUSE
// driver once reported mode 0000 as 0644/0755 and the kernel's
// default_permissions check let uid 65534 in.)
func TestFilesystemPermissionsOtherUID(t *testing.T) {
	probe := buildFssemProbe(t)
	t.Run("native", func(t *testing.T) {
		other := os.Getenv("ESBX_OTHER_USER")
		if other == "" {
			skipOrFail(t, "ESBX_OTHER_USER is not set: no second local user for the native baseline")
		}
		if out, err := exec.Command("sudo", "-n", "-u", other, "true").CombinedOutput(); err != nil {
			skipOrFail(t, "sudo -n -u %s: %v %s", other, err, out)
		}
		// The other user must reach the directory and run the probe: a
		// directory of its own below the temporary directory, open to all.
		dir, err := os.MkdirTemp("", "fssem-other-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(probe)
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "fssem")
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		report := filepath.Join(dir, "report.json")
		cmd := exec.Command(bin, "otheruid", filepath.Join(dir, "t"), report)
		cmd.Env = append(os.Environ(), "FSSEM_OTHER_SUDO="+other)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("fssem otheruid: %v\n%s", err, b)
		}
		got, err := os.ReadFile(report)
		if err != nil {
			t.Fatal(err)
		}
		compareOtherUID(t, "native", got)
	})
	forDrivers(t, func(t *testing.T) {
		if _, err := exec.LookPath("newuidmap"); err != nil {
			skipOrFail(t, "newuidmap is not installed (package uidmap): sandbox.id_mapping subid cannot work")
		}
		e := newEnv(t)
		writeConfig(t, e, "sandbox:\n  id_mapping: subid\n")
		e.start()
		root := e.project(map[string]string{})
		data, err := os.ReadFile(probe)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "fssem"), data, 0o755); err != nil {
			t.Fatal(err)
		}
		id := e.createSandbox(root)
		ws := e.session(id)
		// A layer's root is mode 0700: open it so uid 65534 reaches t/ and can run the probe.
		if out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "60000", "chmod 755 . && ./fssem otheruid t report.json"); out["status"] != "ok" {
			t.Fatalf("fssem otheruid: %v", out)
		}
		rep := e.rt(id, "file_read", "--workspace-session-id", ws, "--path", "report.json")
		compareOtherUID(t, driverOf(t), []byte(rep["content"].(string)))
	})
}

func compareOtherUID(t *testing.T, where string, data []byte) {
	t.Helper()
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("%s report: %v\n%s", where, err, data)
	}
	if !reflect.DeepEqual(got, otherUIDWant) {
		t.Errorf("%s:\n  got:  %s\n  want: %s", where, js(got), js(otherUIDWant))
	}
}
