package layers

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRemoveAllNeverLeavesTheTree: RemoveAll removes read-only trees, removes
// a symlink as a link, and — while something swaps a directory of the tree
// with a symlink to an outside directory — never changes the mode of, nor
// removes, anything outside the tree.
func TestRemoveAllNeverLeavesTheTree(t *testing.T) {
	outside := t.TempDir()
	for _, d := range []string{"x", "x/y"} {
		if err := os.Mkdir(filepath.Join(outside, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "x/y/keep"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Read-only outside dirs: a chmod that followed the swap would open them.
	for _, d := range []string{"x/y", "x"} {
		if err := os.Chmod(filepath.Join(outside, d), 0o555); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = os.Chmod(filepath.Join(outside, "x"), 0o755)
		_ = os.Chmod(filepath.Join(outside, "x/y"), 0o755)
	})
	check := func(t *testing.T) {
		t.Helper()
		for d, want := range map[string]os.FileMode{"x": 0o555, "x/y": 0o555} {
			fi, err := os.Lstat(filepath.Join(outside, d))
			if err != nil || fi.Mode().Perm() != want {
				t.Fatalf("outside %s: %v %v, want mode %v untouched", d, fi.Mode(), err, want)
			}
		}
		if b, err := os.ReadFile(filepath.Join(outside, "x/y/keep")); err != nil || string(b) != "keep" {
			t.Fatalf("outside file: %q %v", b, err)
		}
	}

	t.Run("read-only tree and a symlink", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), "tree")
		must(t, os.MkdirAll(filepath.Join(root, "a/b"), 0o755))
		must(t, os.WriteFile(filepath.Join(root, "a/b/f"), []byte("f"), 0o444))
		must(t, os.Symlink(outside, filepath.Join(root, "a/link")))
		must(t, os.Chmod(filepath.Join(root, "a/b"), 0o500))
		must(t, os.Chmod(filepath.Join(root, "a"), 0o000))
		if err := RemoveAll(root); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(root); !os.IsNotExist(err) {
			t.Fatalf("tree still there: %v", err)
		}
		if err := RemoveAll(root); err != nil {
			t.Fatalf("missing path: %v", err)
		}
		check(t)
	})

	t.Run("directory swapped for a symlink", func(t *testing.T) {
		for round := 0; round < 200; round++ {
			root := filepath.Join(t.TempDir(), "tree")
			must(t, os.MkdirAll(filepath.Join(root, "d/x/y"), 0o755))
			must(t, os.Chmod(filepath.Join(root, "d/x/y"), 0o555))
			must(t, os.Chmod(filepath.Join(root, "d/x"), 0o555))
			must(t, os.Symlink(outside, filepath.Join(root, "s")))
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := 0; i < 50; i++ {
					_ = unix.Renameat2(unix.AT_FDCWD, filepath.Join(root, "d"), unix.AT_FDCWD, filepath.Join(root, "s"), unix.RENAME_EXCHANGE)
				}
			}()
			_ = RemoveAll(root)
			<-done
			_ = RemoveAll(root)
			check(t)
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
