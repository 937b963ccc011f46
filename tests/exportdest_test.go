package tests

import (
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
)

// TestExportDestinationRule (#27 item 2): export_changes writes only below
// the sandbox's workspace root or a directory of
// manager.export.allowed_roots (empty by default), never through a symlink
// below the root and never into a git directory; /home with a layer path
// "<user>/x.txt" and $HOME/.config/… are refused; an existing destination
// directory keeps its mode.
func TestExportDestinationRule(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"a.txt": "a\n", "priv/keep.txt": "k\n"})
	if err := os.Chmod(filepath.Join(root, "priv"), 0o700); err != nil {
		t.Fatal(err)
	}
	gitIn(t, root, "init", "-q")
	id := e.createSandbox(root)
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	home, _ := os.UserHomeDir()
	e.rt(id, "file_write", "--path", u.Username+"/x.txt", "--content", "x\n")
	e.rt(id, "file_write", "--path", "priv/new.txt", "--content", "n\n")
	outside := filepath.Join(e.root, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	homeX := filepath.Join(home, "x.txt")
	if _, err := os.Lstat(homeX); err == nil {
		t.Fatalf("%s exists before the test", homeX)
	}
	t.Cleanup(func() { os.Remove(homeX) })

	for _, c := range []struct{ name, dest, format, msg string }{
		// First the ones whose unfixed export would not touch $HOME.
		{"beside the workspace", filepath.Join(e.root, "beside"), "dir", "below the sandbox's workspace root"},
		{"archive beside", filepath.Join(e.root, "beside.tar"), "tar", "below the sandbox's workspace root"},
		{"through a symlink", filepath.Join(root, "escape", "sub"), "dir", "symlink"},
		{"archive through a symlink", filepath.Join(root, "escape", "x.tar"), "tar", "symlink"},
		{"the symlink itself", filepath.Join(root, "escape"), "dir", "symlink"},
		{"into .git", filepath.Join(root, ".git", "hooks"), "dir", "git directory"},
		{"$HOME/.config", filepath.Join(home, ".config", "esbx-export-test"), "dir", "below the sandbox's workspace root"},
		{"/home", "/home", "dir", "below the sandbox's workspace root"},
	} {
		body := e.fail(1, "invalid_request", "sandbox-manager-cli", "export_changes", "--sandbox-id", id, "--dest", c.dest, "--format", c.format)
		if m, _ := body["message"].(string); !strings.Contains(m, c.msg) {
			t.Errorf("%s: message %q does not say %q", c.name, m, c.msg)
		}
	}
	for _, p := range []string{homeX, filepath.Join(home, ".config", "esbx-export-test"), filepath.Join(e.root, "beside"),
		filepath.Join(e.root, "beside.tar"), filepath.Join(outside, "sub"), filepath.Join(outside, "x.tar"), filepath.Join(root, ".git", "hooks", "a.txt")} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("a refused export wrote %s", p)
		}
	}

	// Below the workspace root: written; the existing 0700 directory stays 0700.
	r := e.mgr("export_changes", "--sandbox-id", id, "--dest", root)
	if num(t, r["files_written"]) != 2 {
		t.Errorf("export into the workspace root: %v", r)
	}
	if b, err := os.ReadFile(filepath.Join(root, u.Username, "x.txt")); err != nil || string(b) != "x\n" {
		t.Errorf("%s/x.txt: %q %v", u.Username, b, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "priv")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("priv after the export: %v %v, want 0700", fi.Mode(), err)
	}
	e.mgr("export_changes", "--sandbox-id", id, "--dest", filepath.Join(root, "changes.tar"), "--format", "tar")
	e.fail(1, "invalid_request", "sandbox-manager-cli", "export_changes", "--sandbox-id", id, "--dest", filepath.Join(root, "out", "changes.tar"), "--format", "tar")
	if _, err := os.Stat(filepath.Join(root, "out")); err == nil {
		t.Errorf("an archive export created its missing parent")
	}

	// manager.export.allowed_roots opens another directory, and only it.
	e.stop()
	allowed := filepath.Join(e.root, "allowed")
	if err := os.Mkdir(allowed, 0o755); err != nil {
		t.Fatal(err)
	}
	writeConfig(t, e, "manager:\n  export:\n    allowed_roots: ["+allowed+"]\n")
	e.start()
	e.mgr("export_changes", "--sandbox-id", id, "--dest", filepath.Join(allowed, "copy"))
	e.mgr("export_changes", "--sandbox-id", id, "--dest", filepath.Join(allowed, "changes.tar"), "--format", "tar")
	if b, err := os.ReadFile(filepath.Join(allowed, "copy", "priv", "new.txt")); err != nil || string(b) != "n\n" {
		t.Errorf("export into an allowed root: %q %v", b, err)
	}
	e.fail(1, "invalid_request", "sandbox-manager-cli", "export_changes", "--sandbox-id", id, "--dest", filepath.Join(e.root, "beside"))
}
