package tests

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxTrackedSize bounds a tracked file: the largest legitimate ones are
// vendored console libraries (xterm.js, a few hundred KB).
const maxTrackedSize = 4 << 20

// TestNoBuildOutputsTracked keeps build outputs out of the repository: a
// 23 MB sandbox-supervisor binary was once committed by accident (every
// clone carried it). It fails on a tracked executable (ELF) or a tracked
// file over maxTrackedSize.
func TestNoBuildOutputsTracked(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		skipOrFail(t, "not a git checkout (git ls-files: %v)", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		p := root + "/" + name
		st, err := os.Lstat(p)
		if err != nil || !st.Mode().IsRegular() {
			continue // deleted in the work tree, or a symlink
		}
		if st.Size() > maxTrackedSize {
			t.Errorf("%s is tracked and %d bytes (over %d): a build output?", name, st.Size(), maxTrackedSize)
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		head := make([]byte, 4)
		n, _ := f.Read(head)
		f.Close()
		if bytes.Equal(head[:n], []byte("\x7fELF")) {
			t.Errorf("%s is a tracked ELF executable: build outputs belong in bin/ (ignored)", name)
		}
	}
}

// TestNoReferencesOutsideRepository (issue #27 item 11, contract amendment
// A6): what a user needs is in the repository; no tracked file sends a
// reader to the team's shared folder beside it.
func TestNoReferencesOutsideRepository(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		skipOrFail(t, "not a git checkout (git ls-files: %v)", err)
	}
	// Spelled in pieces so that this file does not match itself.
	needles := []string{".." + "/shared", "shared" + "/contract.md", "/work" + "/shared"}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name == "" || strings.Contains(name, "/vendor/") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			continue // deleted in the work tree, or not a file
		}
		for _, n := range needles {
			if i := bytes.Index(b, []byte(n)); i >= 0 {
				line := bytes.Count(b[:i], []byte("\n")) + 1
				t.Errorf("%s:%d refers to %q, outside the repository: move what it needs into docs/", name, line, n)
			}
		}
	}
}
