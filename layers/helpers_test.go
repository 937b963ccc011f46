package layers

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tempDir is t.TempDir that also copes with read-only directories inside.
func tempDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	t.Cleanup(func() { _ = forceRemoveAll(d) })
	return d
}

func writeFile(t *testing.T, p, content string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, p string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// newTestStack snapshots a small workspace and returns the stack.
func newTestStack(t *testing.T) *Stack {
	t.Helper()
	root := tempDir(t)
	ws := filepath.Join(root, "ws")
	writeFile(t, filepath.Join(ws, "README.md"), "hello\n", 0o644)
	writeFile(t, filepath.Join(ws, "src", "main.go"), "package main\n", 0o644)
	writeFile(t, filepath.Join(ws, "src", "lib", "util.go"), "package lib\n", 0o600)
	writeFile(t, filepath.Join(ws, "docs", "a.md"), "a\n", 0o644)
	writeFile(t, filepath.Join(ws, "docs", "b.md"), "b\n", 0o644)
	s, _, err := Create(context.Background(), filepath.Join(root, "sbx", "layerstack"), ws, SnapshotOptions{})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return s
}

func mustHead(t *testing.T, s *Stack) Manifest {
	t.Helper()
	m, err := s.Head()
	if err != nil {
		t.Fatalf("Head: %v", err)
	}
	return m
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	n, err := readNames(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n == nil {
		n = []string{}
	}
	return n
}

func readString(t *testing.T, v *View, p string) string {
	t.Helper()
	b, err := v.ReadFile(p)
	if err != nil {
		t.Fatalf("ReadFile(%q): %v", p, err)
	}
	return string(b)
}

func entryNames(es []Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = filepath.Base(e.Path)
	}
	return out
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// canMknodWhiteout reports whether this user may create 0:0 char devices in dir.
func canMknodWhiteout(dir string) bool {
	p := filepath.Join(dir, ".probe-whiteout")
	if err := unix.Mknod(p, unix.S_IFCHR, 0); err != nil {
		return false
	}
	os.Remove(p)
	return true
}

// canUserXattr reports whether user.* xattrs work in dir.
func canUserXattr(dir string) bool {
	p := filepath.Join(dir, ".probe-xattr")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		return false
	}
	defer os.Remove(p)
	return unix.Setxattr(p, "user.probe", []byte("y"), 0) == nil
}

func equalStrings(a, b []string) bool { return slices.Equal(a, b) }

var fixedTime = time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)

func mkfifo(p string) error { return unix.Mkfifo(p, 0o644) }

func contains(list []string, s string) bool { return slices.Contains(list, s) }

func slicesSort(s []string) { slices.Sort(s) }
