package views

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestViewBoundedWalk(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{}
	for i := range 10 {
		files[fmt.Sprintf("d/f%02d", i)] = strings.Repeat("x", 100)
	}
	writeTree(t, root, files)
	w, err := boundedWalk(root, 1024, 64)
	if err != nil || w.Logical != 1000 || w.Truncated || w.Nodes != 11 || w.Allocated <= 0 {
		t.Fatalf("full walk: %+v %v", w, err)
	}
	w, _ = boundedWalk(root, 5, 64)
	if !w.Truncated || w.Nodes != 5 || w.Logical >= 1000 {
		t.Fatalf("node bound: %+v", w)
	}
	deep := t.TempDir()
	writeTree(t, deep, map[string]string{"a/b/c/d/e/f.txt": "12345", "top.txt": "abc"})
	w, _ = boundedWalk(deep, 1024, 2)
	if !w.Truncated || w.Logical != 3 {
		t.Fatalf("depth bound: %+v", w)
	}
	w, _ = boundedWalk(deep, 1024, 64)
	if w.Truncated || w.Logical != 8 {
		t.Fatalf("deep full walk: %+v", w)
	}
	if _, err := boundedWalk(filepath.Join(deep, "missing"), 10, 10); err == nil {
		t.Fatal("missing root: no error")
	}
}

func TestViewLayerEntries(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{"src/a.go": "package a\n", "opq/keep.txt": "k", "z.txt": "z"})
	if err := os.Symlink("src/a.go", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "src", ".wh.old.go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "opq", ".wh..wh..opq"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want := []layerEntry{{"link", "symlink"}, {"opq", "opaque_dir"}, {"opq/keep.txt", "write"},
		{"src", "directory"}, {"src/a.go", "write"}, {"src/old.go", "delete"}, {"z.txt", "write"}}
	// A character device 0:0 is the kernel's whiteout; unprivileged mknod needs Linux ≥ 5.8.
	if unix.Mknod(filepath.Join(root, "gone"), unix.S_IFCHR|0o600, 0) == nil {
		want = append([]layerEntry{{"gone", "delete"}}, want...)
	}
	got, truncated, err := layerEntries(root, 100, 64)
	if err != nil || truncated || !reflect.DeepEqual(got, want) {
		t.Fatalf("entries = %v truncated=%v err=%v\nwant %v", got, truncated, err, want)
	}
	got, truncated, _ = layerEntries(root, 3, 64)
	if !truncated || len(got) != 3 {
		t.Fatalf("limit 3: %v truncated=%v", got, truncated)
	}
	if _, _, err := layerEntries(filepath.Join(root, "missing"), 10, 10); err == nil {
		t.Fatal("missing layer: no error")
	}
}
