package tests

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// headTree lists the sandbox head through file_list/file_read:
// path → "dir", "symlink" or "file <content as file_read shows it>".
func (e *env) headTree(id, dir string, out map[string]string) {
	e.t.Helper()
	args := []string{"file_list"}
	if dir != "" {
		args = append(args, "--path", dir)
	}
	lst := e.rt(id, args...)
	for _, en := range lst["entries"].([]any) {
		m := en.(map[string]any)
		p := m["name"].(string)
		if dir != "" {
			p = dir + "/" + p
		}
		switch m["kind"] {
		case "directory":
			out[p] = "dir"
			e.headTree(id, p, out)
		case "file":
			out[p] = "file " + e.rt(id, "file_read", "--path", p)["content"].(string)
		default:
			out[p] = m["kind"].(string)
		}
	}
}

// hostTreeOf describes a host directory like headTree (file content with one
// trailing newline removed, as file_read shows it).
func hostTreeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			out[rel] = "symlink"
		case d.IsDir():
			out[rel] = "dir"
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = "file " + strings.TrimSuffix(string(b), "\n")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	keys := map[string]bool{}
	for k := range got {
		keys[k] = true
	}
	for k := range want {
		keys[k] = true
	}
	var ks []string
	for k := range keys {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		if got[k] != want[k] {
			t.Errorf("%s: %s: got %q, want %q", what, k, got[k], want[k])
		}
	}
}

func tarNames(t *testing.T, r io.Reader) []string {
	t.Helper()
	tr := tar.NewReader(r)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner %d/%d %q/%q", h.Name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		names = append(names, h.Name)
	}
}

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func TestExportChanges(t *testing.T) {
	e := newEnv(t)
	// The destinations below are beside the workspace, not below it.
	writeConfig(t, e, "manager:\n  export:\n    allowed_roots: ["+e.root+"]\n")
	e.start()
	root := e.project(map[string]string{"x": "gone\n", "keep.txt": "keep\n", "src/a.go": "package a\n", "a": "link target\n"})
	orig := filepath.Join(e.root, "orig")
	if out, err := exec.Command("cp", "-a", root, orig).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	id := e.createSandbox(root)

	// An empty delta first.
	empty := filepath.Join(e.root, "empty-export")
	r0 := e.mgr("export_changes", "--sandbox-id", id, "--dest", empty)
	for _, k := range []string{"files_written", "directories_written", "symlinks_written", "deletes_applied", "opaque_clears", "skipped_unchanged", "bytes_written"} {
		if num(t, r0[k]) != 0 {
			t.Errorf("empty delta %s = %v", k, r0[k])
		}
	}
	if l := r0["layers_exported"].([]any); len(l) != 0 || num(t, r0["manifest_version"]) != 1 {
		t.Errorf("empty delta: %v", r0)
	}
	if names := dirNames(t, empty); len(names) != 0 {
		t.Errorf("empty export wrote %v", names)
	}

	e.rt(id, "file_write", "--path", "notes/todo.txt", "--content", "one\ntwo\n")
	e.rt(id, "file_edit", "--path", "src/a.go", "--edits", `[{"old_string":"package a","new_string":"package b"}]`)
	if out := e.exec(id, "rm x; mkdir d; echo y > d/y; ln -s a l"); out["status"] != "ok" {
		t.Fatalf("exec: %v", out)
	}
	head := map[string]string{}
	e.headTree(id, "", head)
	if head["l"] != "symlink" || head["d/y"] != "file y" || head["x"] != "" || head["src/a.go"] != "file package b" {
		t.Fatalf("head: %v", head)
	}

	// dir: onto a fresh copy of the original workspace.
	dest := filepath.Join(e.root, "copy")
	if out, err := exec.Command("cp", "-a", orig, dest).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	r := e.mgr("export_changes", "--sandbox-id", id, "--dest", dest)
	wantKeys := []string{"bytes_written", "deletes_applied", "directories_written", "files_written", "format", "layers_exported",
		"manifest_version", "opaque_clears", "skipped_unchanged", "symlinks_written"}
	if got := keysOf(r); !slices.Equal(got, wantKeys) {
		t.Fatalf("dir result keys %v", got)
	}
	if r["format"] != "dir" || num(t, r["manifest_version"]) != 4 || len(r["layers_exported"].([]any)) != 3 ||
		num(t, r["files_written"]) != 3 || num(t, r["symlinks_written"]) != 1 || num(t, r["deletes_applied"]) != 1 ||
		num(t, r["opaque_clears"]) != 0 || num(t, r["skipped_unchanged"]) != 0 || num(t, r["directories_written"]) < 2 ||
		num(t, r["bytes_written"]) != int64(len("one\ntwo\n")+len("package b\n")+len("y\n")) {
		t.Fatalf("dir result %v", r)
	}
	for i, l := range r["layers_exported"].([]any) {
		if want := manifestLayers(t, e, id)[i]; l != want {
			t.Errorf("layers_exported[%d] = %v, want %s", i, l, want)
		}
	}
	sameTree(t, "dir export", hostTreeOf(t, dest), head)
	if target, err := os.Readlink(filepath.Join(dest, "l")); err != nil || target != "a" {
		t.Errorf("symlink l: %q %v", target, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "d", "y")); string(b) != "y\n" {
		t.Errorf("d/y = %q", b)
	}
	again := e.mgr("export_changes", "--sandbox-id", id, "--dest", dest, "--format", "dir")
	if num(t, again["skipped_unchanged"]) != 3 || num(t, again["files_written"]) != 0 || num(t, again["deletes_applied"]) != 0 {
		t.Errorf("second export %v", again)
	}
	// Into an absent directory: exactly the delta.
	fresh := filepath.Join(e.root, "fresh", "sub")
	e.mgr("export_changes", "--sandbox-id", id, "--dest", fresh)
	sameTree(t, "fresh export", hostTreeOf(t, fresh), map[string]string{
		"notes": "dir", "notes/todo.txt": "file one\ntwo", "src": "dir", "src/a.go": "file package b",
		"d": "dir", "d/y": "file y", "l": "symlink",
	})

	// tar and tar-zst.
	wantNames := []string{".wh.x", "d/", "d/y", "l", "notes/", "notes/todo.txt", "src/", "src/a.go"}
	tarPath := filepath.Join(e.root, "out.tar")
	rt := e.mgr("export_changes", "--sandbox-id", id, "--dest", tarPath, "--format", "tar")
	wantKeys = []string{"bytes_written", "directories_written", "files_written", "format", "layers_exported", "manifest_version",
		"symlinks_written", "whiteouts_emitted"}
	if got := keysOf(rt); !slices.Equal(got, wantKeys) {
		t.Fatalf("tar result keys %v", got)
	}
	plain, err := os.ReadFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	if rt["format"] != "tar" || num(t, rt["files_written"]) != 3 || num(t, rt["symlinks_written"]) != 1 ||
		num(t, rt["whiteouts_emitted"]) != 1 || num(t, rt["directories_written"]) != 3 || num(t, rt["bytes_written"]) != int64(len(plain)) {
		t.Errorf("tar result %v", rt)
	}
	if got := tarNames(t, bytes.NewReader(plain)); !slices.Equal(got, wantNames) {
		t.Errorf("tar listing %q, want %q", got, wantNames)
	}
	zstPath := filepath.Join(e.root, "out.tar.zst")
	if err := os.WriteFile(zstPath, []byte("an old archive"), 0o644); err != nil {
		t.Fatal(err)
	}
	rz := e.mgr("export_changes", "--sandbox-id", id, "--dest", zstPath, "--format", "tar-zst")
	comp, err := os.ReadFile(zstPath)
	if err != nil {
		t.Fatal(err)
	}
	if rz["format"] != "tar-zst" || num(t, rz["bytes_written"]) != int64(len(comp)) || num(t, rz["whiteouts_emitted"]) != 1 {
		t.Errorf("tar-zst result %v", rz)
	}
	dec, err := zstd.NewReader(bytes.NewReader(comp))
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	unz, err := io.ReadAll(dec)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(unz, plain) {
		t.Error("tar-zst does not decompress to the same tar")
	}
	for _, n := range dirNames(t, e.root) {
		if strings.Contains(n, "esbx-export") {
			t.Errorf("temp file left: %s", n)
		}
	}

	// Refused destinations: exit 1 invalid_request, nothing written.
	home, _ := os.UserHomeDir()
	archiveDir := filepath.Join(e.root, "archive-dir")
	if err := os.Mkdir(archiveDir, 0o755); err != nil {
		t.Fatal(err)
	}
	rootBefore, homeBefore := dirNames(t, e.root), []string(nil)
	if home != "" {
		homeBefore = dirNames(t, home)
	}
	for _, c := range []struct{ dest, format string }{
		{"/", "dir"},
		{home, "dir"},
		{e.data(), "dir"},
		{filepath.Join(e.data(), "sandboxes", "inside"), "dir"},
		{e.home, "dir"}, // an ancestor of the data directory
		{filepath.Join(e.home, "config"), "tar"},
		{"relative/dir", "dir"},
		{archiveDir, "tar"},
		{archiveDir, "tar-zst"},
		{filepath.Join(e.root, "missing", "out.tar"), "tar"},
		{tarPath, "dir"}, // an existing file is no directory
	} {
		if c.dest == "" {
			continue
		}
		body := e.fail(1, "invalid_request", "sandbox-manager-cli", "export_changes", "--sandbox-id", id, "--dest", c.dest, "--format", c.format)
		if !strings.Contains(body["message"].(string), "dest") {
			t.Errorf("%s: message %q", c.dest, body["message"])
		}
	}
	if got := dirNames(t, e.root); !slices.Equal(got, rootBefore) {
		t.Errorf("refused exports changed %s: %v → %v", e.root, rootBefore, got)
	}
	if home != "" && !slices.Equal(dirNames(t, home), homeBefore) {
		t.Errorf("refused exports changed $HOME")
	}
	if names := dirNames(t, archiveDir); len(names) != 0 {
		t.Errorf("archive-dir: %v", names)
	}
	if _, err := os.Stat(filepath.Join(e.root, "relative")); err == nil {
		t.Error("relative dest created")
	}
	e.fail(1, "not_found", "sandbox-manager-cli", "export_changes", "--sandbox-id", "sbx-nope", "--dest", filepath.Join(e.root, "nope"))
	e.fail(2, "invalid_request", "sandbox-manager-cli", "export_changes", "--sandbox-id", id, "--dest", filepath.Join(e.root, "f"), "--format", "zip") // checked by the CLI

	// A symlink in dest where a directory is needed: operation_failed.
	trap := filepath.Join(e.root, "trap")
	outside := filepath.Join(e.root, "outside")
	if err := os.MkdirAll(trap, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(trap, "notes")); err != nil {
		t.Fatal(err)
	}
	body := e.fail(1, "operation_failed", "sandbox-manager-cli", "export_changes", "--sandbox-id", id, "--dest", trap)
	if body["message"] != "refusing to traverse a symlink in dest: "+filepath.Join(trap, "notes") {
		t.Errorf("symlink refusal: %v", body)
	}
	if names := dirNames(t, outside); len(names) != 0 {
		t.Errorf("wrote through the symlink: %v", names)
	}
	if names := dirNames(t, trap); !slices.Equal(names, []string{"notes"}) {
		t.Errorf("trap dest written: %v", names)
	}

	// --progress prints progress lines on stderr.
	pr := e.run("sandbox-manager-cli", "--progress", "export_changes", "--sandbox-id", id, "--dest", filepath.Join(e.root, "progress.tar"), "--format", "tar")
	if pr.code != 0 {
		t.Fatalf("--progress: exit %d %s", pr.code, pr.stderr)
	}
	line := regexp.MustCompile(`^\[progress \d+\.\ds\] export`)
	lines := strings.Split(strings.TrimSpace(pr.stderr), "\n")
	if len(lines) < 2 {
		t.Fatalf("progress lines: %q", pr.stderr)
	}
	for _, l := range lines {
		if !line.MatchString(l) {
			t.Errorf("progress line %q", l)
		}
	}
	if m := pr.obj(t); m["format"] != "tar" {
		t.Errorf("--progress result %v", m)
	}
}

// TestExportReportsLiveSessions: unpublished session changes are not exported
// and the live sessions are named.
func TestExportReportsLiveSessions(t *testing.T) {
	e, id := sandboxWithProject(t)
	e.rt(id, "file_write", "--path", "published.txt", "--content", "p\n")
	ws := e.session(id)
	e.rt(id, "file_write", "--workspace-session-id", ws, "--path", "unpublished.txt", "--content", "u\n")
	dest := filepath.Join(e.root, "project", "out") // below the workspace root
	r := e.mgr("export_changes", "--sandbox-id", id, "--dest", dest)
	live, _ := r["live_workspace_sessions"].([]any)
	if len(live) != 1 || live[0] != ws || num(t, r["files_written"]) != 1 {
		t.Fatalf("result %v", r)
	}
	sameTree(t, "export", hostTreeOf(t, dest), map[string]string{"published.txt": "file p"})
}
