package fuseoverlay

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// stdLowers: two lowers (newest first) with a whiteout and an opaque dir in
// the newer one.
func stdLowers() []tree {
	return []tree{
		{
			"a.txt":      "A1",
			"shared.txt": "new",
			"gone.txt":   "=wh",
			"gonex.txt":  "=xwh",
			"opq/":       "opq",
			"opq/top":    "t",
			"d/":         "",
			"d/new":      "n",
		},
		{
			"a.txt":      "A0",
			"shared.txt": "old",
			"gone.txt":   "G",
			"gonex.txt":  "G",
			"opq/hidden": "h",
			"d/old":      "o",
			"d/sub/deep": "x",
			"lowonly":    "L",
			"ln":         "->lowonly",
			".wh.ociwh":  "",
		},
	}
}

func TestMergedView(t *testing.T) {
	f := mountLayers(t, stdLowers(), tree{"u.txt": "U", "lowonly": "=wh"})
	cases := []struct {
		path string
		want string // "" = absent
	}{
		{"a.txt", "A1"},
		{"shared.txt", "new"},
		{"gone.txt", ""},
		{"gonex.txt", ""},
		{"opq/top", "t"},
		{"opq/hidden", ""},
		{"d/new", "n"},
		{"d/old", "o"},
		{"d/sub/deep", "x"},
		{"lowonly", ""},
		{"u.txt", "U"},
		{".wh.ociwh", ""},
	}
	for _, c := range cases {
		b, err := os.ReadFile(f.p(c.path))
		if c.want == "" {
			if !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: want absent, got %q, %v", c.path, b, err)
			}
			continue
		}
		if err != nil || string(b) != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.path, b, err, c.want)
		}
	}
	if got, want := list(t, f.mnt), []string{"a.txt", "d", "ln", "opq", "shared.txt", "u.txt"}; !reflect.DeepEqual(got, want) {
		t.Errorf("root listing %v, want %v", got, want)
	}
	if got, want := list(t, f.p("d")), []string{"new", "old", "sub"}; !reflect.DeepEqual(got, want) {
		t.Errorf("d listing %v, want %v", got, want)
	}
	if got, want := list(t, f.p("opq")), []string{"top"}; !reflect.DeepEqual(got, want) {
		t.Errorf("opq listing %v, want %v", got, want)
	}
	if _, err := os.Readlink(f.p("ln")); err != nil {
		t.Errorf("readlink: %v", err)
	}
}

// TestOps runs each operation on a lower-only, an upper-only and a mixed
// path and checks the merged result and the upper's kernel-format encoding.
func TestOps(t *testing.T) {
	lowers := []tree{{
		"lo.txt":    "lower",
		"both.txt":  "lower-both",
		"ld/":       "",
		"ld/f":      "1",
		"mixd/":     "",
		"mixd/lf":   "l",
		"emptyd/":   "",
		"lsym":      "->lo.txt",
		"hard1":     "H",
		"wdir/":     "",
		"wdir/keep": "k",
	}}
	upper := tree{
		"up.txt":   "upper",
		"both.txt": "upper-both",
		"ud/":      "",
		"ud/f":     "2",
		"mixd/":    "",
		"mixd/uf":  "u",
	}
	type check struct {
		path   string
		merged string // content, "dir", or "" for absent
		upper  string // upperKind, or "" to skip
	}
	cases := []struct {
		name   string
		op     func(t *testing.T, f *fixture)
		checks []check
	}{
		{"write lower file", func(t *testing.T, f *fixture) {
			fh, err := os.OpenFile(f.p("lo.txt"), os.O_WRONLY|os.O_APPEND, 0)
			must(t, err)
			_, err = fh.WriteString("+app")
			must(t, err)
			must(t, fh.Close())
		}, []check{{"lo.txt", "lower+app", "file"}}},
		{"truncate lower file", func(t *testing.T, f *fixture) {
			must(t, os.Truncate(f.p("lo.txt"), 2))
		}, []check{{"lo.txt", "lo", "file"}}},
		{"write upper file", func(t *testing.T, f *fixture) { f.write("up.txt", "new") },
			[]check{{"up.txt", "new", "file"}}},
		{"create new file", func(t *testing.T, f *fixture) { f.write("ld/new", "n") },
			[]check{{"ld/new", "n", "file"}, {"ld", "dir", "dir"}, {"ld/f", "1", "absent"}}},
		{"unlink lower file", func(t *testing.T, f *fixture) { must(t, os.Remove(f.p("lo.txt"))) },
			[]check{{"lo.txt", "", "whiteout"}}},
		{"unlink upper-only file", func(t *testing.T, f *fixture) { must(t, os.Remove(f.p("up.txt"))) },
			[]check{{"up.txt", "", "absent"}}},
		{"unlink mixed file", func(t *testing.T, f *fixture) { must(t, os.Remove(f.p("both.txt"))) },
			[]check{{"both.txt", "", "whiteout"}}},
		{"recreate after unlink", func(t *testing.T, f *fixture) {
			must(t, os.Remove(f.p("lo.txt")))
			f.write("lo.txt", "again")
		}, []check{{"lo.txt", "again", "file"}}},
		{"mkdir", func(t *testing.T, f *fixture) { must(t, os.Mkdir(f.p("nd"), 0o755)) },
			[]check{{"nd", "dir", "dir"}}},
		{"rmdir lower dir then mkdir is opaque", func(t *testing.T, f *fixture) {
			must(t, os.Remove(f.p("emptyd")))
			must(t, os.Mkdir(f.p("emptyd"), 0o755))
		}, []check{{"emptyd", "dir", "opaque"}}},
		{"rm -r lower dir then mkdir hides old content", func(t *testing.T, f *fixture) {
			must(t, os.RemoveAll(f.p("ld")))
			must(t, os.Mkdir(f.p("ld"), 0o755))
		}, []check{{"ld", "dir", "opaque"}, {"ld/f", "", "absent"}}},
		{"rmdir upper-only dir", func(t *testing.T, f *fixture) { must(t, os.RemoveAll(f.p("ud"))) },
			[]check{{"ud", "", "absent"}}},
		{"rmdir mixed dir", func(t *testing.T, f *fixture) { must(t, os.RemoveAll(f.p("mixd"))) },
			[]check{{"mixd", "", "whiteout"}}},
		{"rename lower file", func(t *testing.T, f *fixture) { must(t, os.Rename(f.p("lo.txt"), f.p("ud/moved"))) },
			[]check{{"lo.txt", "", "whiteout"}, {"ud/moved", "lower", "file"}}},
		{"rename over existing lower", func(t *testing.T, f *fixture) { must(t, os.Rename(f.p("up.txt"), f.p("lo.txt"))) },
			[]check{{"lo.txt", "upper", "file"}, {"up.txt", "", "absent"}}},
		{"rename upper-only dir", func(t *testing.T, f *fixture) { must(t, os.Rename(f.p("ud"), f.p("ud2"))) },
			[]check{{"ud2/f", "2", "file"}, {"ud", "", "absent"}}},
		{"rename upper dir over lower name", func(t *testing.T, f *fixture) {
			must(t, os.RemoveAll(f.p("emptyd")))
			must(t, os.Rename(f.p("ud"), f.p("emptyd")))
		}, []check{{"emptyd/f", "2", "file"}, {"ud", "", "absent"}}},
		{"symlink", func(t *testing.T, f *fixture) { must(t, os.Symlink("up.txt", f.p("s"))) },
			[]check{{"s", "upper", "symlink"}}},
		{"chmod lower file", func(t *testing.T, f *fixture) {
			must(t, os.Chmod(f.p("lo.txt"), 0o600))
			st, err := os.Stat(f.p("lo.txt"))
			must(t, err)
			if st.Mode().Perm() != 0o600 {
				t.Errorf("mode %v", st.Mode())
			}
		}, []check{{"lo.txt", "lower", "file"}}},
		{"chmod lower dir", func(t *testing.T, f *fixture) { must(t, os.Chmod(f.p("ld"), 0o700)) },
			[]check{{"ld", "dir", "dir"}, {"ld/f", "1", "absent"}}},
		{"hard link of lower file", func(t *testing.T, f *fixture) {
			must(t, os.Link(f.p("hard1"), f.p("hard2")))
			var a, b unix.Stat_t
			must(t, unix.Stat(f.p("hard1"), &a))
			must(t, unix.Stat(f.p("hard2"), &b))
			if a.Ino != b.Ino || b.Nlink != 2 {
				t.Errorf("link: ino %d/%d nlink %d", a.Ino, b.Ino, b.Nlink)
			}
		}, []check{{"hard1", "H", "file"}, {"hard2", "H", "file"}}},
		{"utimes lower file", func(t *testing.T, f *fixture) {
			must(t, exec.Command("touch", "-d", "2001-01-01", f.p("lo.txt")).Run())
		}, []check{{"lo.txt", "lower", "file"}}},
		{"setxattr lower file", func(t *testing.T, f *fixture) {
			must(t, unix.Setxattr(f.p("lo.txt"), "user.test", []byte("v"), 0))
			buf := make([]byte, 16)
			n, err := unix.Getxattr(f.p("lo.txt"), "user.test", buf)
			must(t, err)
			if string(buf[:n]) != "v" {
				t.Errorf("xattr %q", buf[:n])
			}
			n, err = unix.Listxattr(f.p("lo.txt"), buf)
			must(t, err)
			if !strings.Contains(string(buf[:n]), "user.test") {
				t.Errorf("listxattr %q", buf[:n])
			}
			must(t, unix.Removexattr(f.p("lo.txt"), "user.test"))
		}, []check{{"lo.txt", "lower", "file"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := mountLayers(t, lowers, upper)
			c.op(t, f)
			for _, ch := range c.checks {
				checkMerged(t, f, ch.path, ch.merged)
			}
			f.unmount()
			for _, ch := range c.checks {
				if ch.upper == "" {
					continue
				}
				if got := upperKind(t, filepath.Join(f.upper, ch.path)); got != ch.upper {
					t.Errorf("upper %s: %s, want %s", ch.path, got, ch.upper)
				}
			}
			if _, err := os.Lstat(filepath.Join(f.upper, stagingName)); err == nil {
				t.Errorf("staging dir left in upper")
			}
		})
	}
}

func checkMerged(t *testing.T, f *fixture, path, want string) {
	t.Helper()
	st, err := os.Stat(f.p(path))
	switch {
	case want == "":
		if !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: want absent, got %v", path, err)
		}
	case want == "dir":
		if err != nil || !st.IsDir() {
			t.Errorf("%s: want dir, got %v", path, err)
		}
	default:
		if got := f.read(path); got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
}

func TestRenameSemantics(t *testing.T) {
	lowers := []tree{{"ld/": "", "ld/f": "1", "x": "x", "y": "y"}}
	f := mountLayers(t, lowers, tree{"ud/": "", "ud/g": "2"})
	if err := os.Rename(f.p("ld"), f.p("ld2")); !errors.Is(err, syscall.EXDEV) {
		t.Errorf("rename of lower dir: %v, want EXDEV", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, f.p("x"), unix.AT_FDCWD, f.p("y"), unix.RENAME_NOREPLACE); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("RENAME_NOREPLACE: %v", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, f.p("x"), unix.AT_FDCWD, f.p("z"), unix.RENAME_NOREPLACE); err != nil {
		t.Errorf("RENAME_NOREPLACE to new name: %v", err)
	}
	// mv falls back to copy + delete on EXDEV.
	out, err := exec.Command("mv", f.p("ld"), f.p("ud/ld")).CombinedOutput()
	if err != nil {
		t.Fatalf("mv: %v %s", err, out)
	}
	checkMerged(t, f, "ud/ld/f", "1")
	checkMerged(t, f, "ld", "")
	if err := os.Rename(f.p("ud"), f.p("ud3")); err != nil {
		t.Errorf("rename of upper dir: %v", err)
	}
	checkMerged(t, f, "ud3/ld/f", "1")
}

func TestMiscOps(t *testing.T) {
	f := mountLayers(t, []tree{{"a": "A", "b": "B"}}, nil)
	if err := unix.Renameat2(unix.AT_FDCWD, f.p("a"), unix.AT_FDCWD, f.p("b"), unix.RENAME_EXCHANGE); err == nil {
		t.Errorf("RENAME_EXCHANGE succeeded")
	}
	must(t, unix.Mkfifo(f.p("fifo"), 0o644))
	var st unix.Stat_t
	must(t, unix.Lstat(f.p("fifo"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("mkfifo mode %o", st.Mode)
	}
	if err := os.WriteFile(f.p(".wh.x"), nil, 0o644); err == nil {
		t.Errorf("created a reserved .wh. name")
	}
	fh, err := os.OpenFile(f.p("a"), os.O_RDWR, 0)
	must(t, err)
	_, err = fh.WriteAt([]byte("Z"), 0)
	must(t, err)
	must(t, fh.Sync())
	must(t, fh.Close())
	checkMerged(t, f, "a", "Z")
}

// TestFailedCreateKeepsWhiteout: creating over a deleted lower name removes
// the whiteout first; when the create then fails (here ENOSPC: the upper is
// a full tmpfs and a long symlink target needs a page), the whiteout must
// come back, or the deleted lower file would show again.
func TestFailedCreateKeepsWhiteout(t *testing.T) {
	requireNS(t)
	base := t.TempDir()
	lower, upper, mnt := filepath.Join(base, "lower"), filepath.Join(base, "upper"), filepath.Join(base, "mnt")
	for _, d := range []string{lower, upper, mnt} {
		must(t, os.Mkdir(d, 0o755))
	}
	build(t, lower, tree{"gone.txt": "deleted", "d/": ""})
	must(t, unix.Mount("tmpfs", upper, "tmpfs", 0, "size=256k"))
	t.Cleanup(func() { _ = unix.Unmount(upper, unix.MNT_DETACH) })
	lf, err := os.Open(lower)
	must(t, err)
	defer lf.Close()
	uf, err := os.Open(upper)
	must(t, err)
	defer uf.Close()
	srv, err := Mount(context.Background(), mnt, Options{Lowers: []*os.File{lf}, Upper: uf, Name: "fuseoverlay-test"})
	must(t, err)
	t.Cleanup(func() { _ = srv.Unmount() })

	must(t, os.Remove(filepath.Join(mnt, "gone.txt"))) // a whiteout in the upper
	must(t, os.Remove(filepath.Join(mnt, "d")))
	fill, err := os.Create(filepath.Join(upper, "fill"))
	must(t, err)
	for err == nil {
		_, err = fill.Write(make([]byte, 4096))
	}
	fill.Close()
	long := strings.Repeat("t", 3000)
	for _, tc := range []struct {
		name string
		mk   func() error
	}{
		{"symlink", func() error { return os.Symlink(long, filepath.Join(mnt, "gone.txt")) }},
		{"symlink over a deleted directory", func() error { return os.Symlink(long, filepath.Join(mnt, "d")) }},
	} {
		if err := tc.mk(); !errors.Is(err, unix.ENOSPC) {
			t.Fatalf("%s on a full upper: %v, want ENOSPC", tc.name, err)
		}
	}
	// The kernel may answer from its negative dentry; the upper dir is what
	// a remount, capture and publication read.
	for _, name := range []string{"gone.txt", "d"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(upper, name), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Errorf("upper %s after a failed create: %v mode %o, want the whiteout back", name, err, st.Mode)
		}
		if _, err := os.Lstat(filepath.Join(mnt, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after a failed create: %v, want it still deleted", name, err)
		}
	}
}
