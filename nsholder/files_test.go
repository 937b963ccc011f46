package nsholder

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const canary = "OUTSIDE-CANARY"

// filesFixture builds base/root (the workspace) and base/outside (with a
// canary file) and returns the open root and both paths.
//
//	root/file (0644 "hello"), root/exec (0755), root/dir/inner, root/fifo,
//	root/link -> file, root/dangling -> nowhere,
//	root/in -> dir, root/inabs -> <root>/dir, root/out -> ../outside,
//	root/outabs -> <outside>
func filesFixture(t *testing.T) (*os.File, string, string) {
	t.Helper()
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "dir"), 0o755))
	must(os.MkdirAll(outside, 0o755))
	must(os.WriteFile(filepath.Join(outside, "canary"), []byte(canary), 0o644))
	must(os.WriteFile(filepath.Join(root, "file"), []byte("hello"), 0o644))
	must(os.WriteFile(filepath.Join(root, "exec"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chmod(filepath.Join(root, "exec"), 0o755))
	must(os.WriteFile(filepath.Join(root, "dir", "inner"), []byte("inner"), 0o644))
	must(os.WriteFile(filepath.Join(root, "dir", "canary"), []byte("inside"), 0o644))
	must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o644))
	for name, target := range map[string]string{
		"link": "file", "dangling": "nowhere",
		"in": "dir", "inabs": filepath.Join(root, "dir"),
		"out": "../outside", "outabs": outside,
	} {
		must(os.Symlink(target, filepath.Join(root, name)))
	}
	f, err := os.Open(root)
	must(err)
	t.Cleanup(func() { f.Close() })
	return f, root, outside
}

// checkOutside fails when the outside directory changed in any way.
func checkOutside(t *testing.T, outside string) {
	t.Helper()
	ents, err := os.ReadDir(outside)
	if err != nil || len(ents) != 1 || ents[0].Name() != "canary" {
		t.Fatalf("outside directory changed: %v %v", ents, err)
	}
	if b, err := os.ReadFile(filepath.Join(outside, "canary")); err != nil || string(b) != canary {
		t.Fatalf("outside canary changed: %q %v", b, err)
	}
}

// tempFiles lists leftover temp files below dir.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	var left []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if d != nil && strings.HasPrefix(d.Name(), ".esbx-tmp-") {
			left = append(left, p)
		}
		return nil
	})
	return left
}

func kindOfErr(err error) string {
	var ke *KindError
	if errors.As(err, &ke) {
		return ke.Kind
	}
	return ""
}

func TestFilesLstat(t *testing.T) {
	root, _, _ := filesFixture(t)
	for _, tc := range []struct {
		path, kind string
		mode       fs.FileMode
		err        error
	}{
		{"", "directory", 0o755, nil},
		{"file", "file", 0o644, nil},
		{"exec", "file", 0o755, nil},
		{"dir", "directory", 0o755, nil},
		{"dir/inner", "file", 0o644, nil},
		{"fifo", "other", 0o644, nil},
		{"link", "symlink", 0o777, nil},
		{"dangling", "symlink", 0o777, nil},
		{"out", "symlink", 0o777, nil},
		{"absent", "", 0, ErrNotExist},
		{"absent/x", "", 0, ErrNotExist},
		{"file/x", "", 0, ErrNotDir},
		{"fifo/x", "", 0, ErrNotDir},
		{"link/x", "", 0, ErrSymlink},
		{"in/inner", "", 0, ErrSymlink},
		{"out/canary", "", 0, ErrSymlink},
	} {
		info, err := lstatAt(root, tc.path)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("lstat %q: err %v, want %v", tc.path, err, tc.err)
			}
			continue
		}
		if err != nil || info.Kind != tc.kind || (tc.mode != 0 && info.Mode != tc.mode) {
			t.Errorf("lstat %q = %+v, %v; want kind %s mode %v", tc.path, info, err, tc.kind, tc.mode)
		}
	}
	if info, _ := lstatAt(root, "file"); info.Name != "file" || info.Size != 5 {
		t.Errorf("lstat file = %+v", info)
	}
}

func TestFilesRead(t *testing.T) {
	root, _, outside := filesFixture(t)
	for _, tc := range []struct {
		path string
		max  int64
		want string
		err  error
		kind string
	}{
		{"file", 100, "hello", nil, ""},
		{"file", 5, "hello", nil, ""},
		{"file", 4, "", ErrTooLarge, ""},
		{"dir/inner", 100, "inner", nil, ""},
		{"", 100, "", ErrNotRegular, "directory"},
		{"dir", 100, "", ErrNotRegular, "directory"},
		{"link", 100, "", ErrNotRegular, "symlink"},
		{"dangling", 100, "", ErrNotRegular, "symlink"},
		{"fifo", 100, "", ErrNotRegular, "other"},
		{"absent", 100, "", ErrNotExist, ""},
		{"file/x", 100, "", ErrNotDir, ""},
		{"in/inner", 100, "", ErrSymlink, ""},
		{"inabs/inner", 100, "", ErrSymlink, ""},
		{"out/canary", 100, "", ErrSymlink, ""},
		{"outabs/canary", 100, "", ErrSymlink, ""},
	} {
		done := make(chan struct{})
		var data []byte
		var info FileInfo
		var err error
		go func() { data, info, err = readFileAt(root, tc.path, tc.max); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("read %q blocked", tc.path)
		}
		if tc.err != nil {
			if !errors.Is(err, tc.err) || kindOfErr(err) != tc.kind {
				t.Errorf("read %q: err %v, want %v (%s)", tc.path, err, tc.err, tc.kind)
			}
			continue
		}
		if err != nil || string(data) != tc.want || info.Kind != "file" || info.Size != int64(len(tc.want)) {
			t.Errorf("read %q = %q %+v %v", tc.path, data, info, err)
		}
	}
	_, _, err := readFileAt(root, "fifo", 100)
	if err == nil || err.Error() != "path is not a regular file (Other)" {
		t.Errorf("fifo error text: %v", err)
	}
	checkOutside(t, outside)
}

func TestFilesReadDir(t *testing.T) {
	root, _, _ := filesFixture(t)
	infos, err := readDirAt(root, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, i := range infos {
		got = append(got, i.Name+":"+i.Kind)
	}
	want := "dangling:symlink dir:directory exec:file fifo:other file:file in:symlink inabs:symlink link:symlink out:symlink outabs:symlink"
	if strings.Join(got, " ") != want {
		t.Errorf("readdir root = %v", got)
	}
	if infos, err := readDirAt(root, "dir"); err != nil || len(infos) != 2 || infos[0].Name != "canary" || infos[1].Size != 5 {
		t.Errorf("readdir dir = %+v %v", infos, err)
	}
	for _, tc := range []struct {
		path string
		err  error
	}{
		{"file", ErrNotDir},
		{"fifo", ErrNotDir},
		{"file/x", ErrNotDir},
		{"absent", ErrNotExist},
		{"link", ErrSymlink},
		{"in", ErrSymlink},
		{"inabs", ErrSymlink},
		{"out", ErrSymlink},
		{"outabs", ErrSymlink},
		{"dangling", ErrSymlink},
	} {
		if _, err := readDirAt(root, tc.path); !errors.Is(err, tc.err) {
			t.Errorf("readdir %q: err %v, want %v", tc.path, err, tc.err)
		}
	}
}

func TestFilesWrite(t *testing.T) {
	root, dir, outside := filesFixture(t)
	old := syscall.Umask(0o077) // created modes must not depend on the umask
	defer syscall.Umask(old)
	perm := func(m fs.FileMode) *fs.FileMode { return &m }
	for _, tc := range []struct {
		path    string
		mode    *fs.FileMode
		created bool
		want    fs.FileMode
		err     error
		kind    string
	}{
		{"file", nil, false, 0o644, nil, ""},
		{"exec", nil, false, 0o755, nil, ""}, // stays executable
		{"new", nil, true, 0o644, nil, ""},
		{"newx", perm(0o750), true, 0o750, nil, ""},
		{"dir/inner", perm(0o600), false, 0o600, nil, ""},
		{"a/b/c/new", nil, true, 0o644, nil, ""},
		{"", nil, false, 0, ErrNotRegular, "directory"},
		{"dir", nil, false, 0, ErrNotRegular, "directory"},
		{"link", nil, false, 0, ErrNotRegular, "symlink"},
		{"dangling", nil, false, 0, ErrNotRegular, "symlink"},
		{"fifo", nil, false, 0, ErrNotRegular, "other"},
		{"file/x", nil, false, 0, ErrNotDir, ""},
		{"file/x/y", nil, false, 0, ErrNotDir, ""},
		{"in/new", nil, false, 0, ErrSymlink, ""},
		{"inabs/new", nil, false, 0, ErrSymlink, ""},
		{"out/canary", nil, false, 0, ErrSymlink, ""},
		{"out/new", nil, false, 0, ErrSymlink, ""},
		{"outabs/canary", nil, false, 0, ErrSymlink, ""},
		{"outabs/x/y/new", nil, false, 0, ErrSymlink, ""},
	} {
		data := []byte("content of " + tc.path)
		created, err := writeFileAt(root, tc.path, data, tc.mode)
		if tc.err != nil {
			if !errors.Is(err, tc.err) || kindOfErr(err) != tc.kind {
				t.Errorf("write %q: err %v, want %v (%s)", tc.path, err, tc.err, tc.kind)
			}
			continue
		}
		if err != nil || created != tc.created {
			t.Errorf("write %q = %v, %v; want created %v", tc.path, created, err, tc.created)
			continue
		}
		got, info, err := readFileAt(root, tc.path, 1<<20)
		if err != nil || !bytes.Equal(got, data) || info.Mode != tc.want {
			t.Errorf("after write %q: %q %+v %v; want mode %v", tc.path, got, info, err, tc.want)
		}
	}
	for _, p := range []string{"a", "a/b", "a/b/c"} {
		if info, err := lstatAt(root, p); err != nil || info.Kind != "directory" || info.Mode != 0o755 {
			t.Errorf("parent %q = %+v %v; want directory 0755", p, info, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "file")); string(b) != "content of file" {
		t.Errorf("symlink target was written through: %q", b)
	}
	if b, _ := os.Readlink(filepath.Join(dir, "link")); b != "file" {
		t.Errorf("symlink replaced: %q", b)
	}
	if left := tempFiles(t, dir); len(left) > 0 {
		t.Errorf("temp files left: %v", left)
	}
	checkOutside(t, outside)
}

func TestFilesConcurrentWriters(t *testing.T) {
	root, dir, _ := filesFixture(t)
	const n = 20
	content := func(i int) []byte { return bytes.Repeat([]byte{byte('A' + i)}, 256<<10) }
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := writeFileAt(root, "x/y/z/f", content(i), nil)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	got, _, err := readFileAt(root, "x/y/z/f", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	whole := false
	for i := range n {
		whole = whole || bytes.Equal(got, content(i))
	}
	if !whole {
		t.Errorf("final content is not one writer's whole content (len %d)", len(got))
	}
	if left := tempFiles(t, dir); len(left) > 0 {
		t.Errorf("temp files left: %v", left)
	}
}

// TestFilesWalkFallback runs the component walk used without openat2 on
// the same cases openat2 resolves, and checks that both agree.
func TestFilesWalkFallback(t *testing.T) {
	root, _, outside := filesFixture(t)
	for _, tc := range []struct {
		path string
		err  error
	}{
		{"", nil}, {"dir", nil}, {"file", ErrNotDir}, {"fifo", ErrNotDir}, {"file/x", ErrNotDir},
		{"absent", ErrNotExist}, {"absent/x", ErrNotExist}, {"link", ErrSymlink}, {"dangling", ErrSymlink},
		{"in", ErrSymlink}, {"inabs", ErrSymlink}, {"out", ErrSymlink}, {"outabs", ErrSymlink},
		{"in/x", ErrSymlink}, {"out/x", ErrSymlink},
	} {
		for _, flags := range []int{unix.O_PATH, unix.O_RDONLY} {
			for name, open := range map[string]func() (int, error){
				"openat2": func() (int, error) { return openDir(root, tc.path, flags) },
				"walk":    func() (int, error) { return walkDir(root, tc.path, flags, false) },
			} {
				fd, err := open()
				if err == nil {
					unix.Close(fd)
				}
				if err != nil {
					err = pathErr("open", tc.path, err)
				}
				if !errors.Is(err, tc.err) {
					t.Errorf("%s %q flags %#x: err %v, want %v", name, tc.path, flags, err, tc.err)
				}
			}
		}
	}
	// Creating walk: makes real directories, refuses symlinks and files.
	for _, tc := range []struct {
		path string
		err  error
	}{
		{"m/n/o", nil}, {"dir/p", nil}, {"out/q", ErrSymlink}, {"outabs/q/r", ErrSymlink},
		{"in/q", ErrSymlink}, {"file/q", ErrNotDir},
	} {
		fd, err := walkDir(root, tc.path, unix.O_PATH, true)
		if err == nil {
			unix.Close(fd)
		}
		if err != nil {
			err = pathErr("mkdir", tc.path, err)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("walk create %q: err %v, want %v", tc.path, err, tc.err)
		}
	}
	if info, err := lstatAt(root, "m/n/o"); err != nil || info.Kind != "directory" {
		t.Errorf("walk create m/n/o: %+v %v", info, err)
	}
	checkOutside(t, outside)
}

// TestFilesSymlinkRace flips root/flip between a real directory and a
// symlink to outside while operations go through it: nothing outside may
// ever be read or written.
func TestFilesSymlinkRace(t *testing.T) {
	root, dir, outside := filesFixture(t)
	flip, alt := filepath.Join(dir, "flip"), filepath.Join(dir, "alt")
	if err := os.Mkdir(flip, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(flip, "canary"), []byte("inside"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, alt); err != nil {
		t.Fatal(err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, flip, unix.AT_FDCWD, alt, unix.RENAME_EXCHANGE); err != nil {
		t.Skipf("RENAME_EXCHANGE: %v", err)
	}
	stop := make(chan struct{})
	flipped := make(chan int, 1)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			<-flipped
		}
	}()
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				flipped <- n
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, flip, unix.AT_FDCWD, alt, unix.RENAME_EXCHANGE); err != nil {
				t.Error(err)
				flipped <- n
				return
			}
			n++
		}
	}()

	// Each operation either goes to the real directory or is refused.
	refused := func(err error) bool { return errors.Is(err, ErrSymlink) }
	ok := map[string]int{}
	for i := range 1000 {
		if data, _, err := readFileAt(root, "flip/canary", 100); err == nil {
			if string(data) == canary {
				t.Fatal("read the outside canary")
			}
			ok["read"]++
		} else if !refused(err) {
			t.Fatalf("read: %v", err)
		}
		if _, err := writeFileAt(root, "flip/canary", []byte(fmt.Sprint("inside ", i)), nil); err == nil {
			ok["write"]++
		} else if !refused(err) {
			t.Fatalf("write: %v", err)
		}
		if _, err := writeFileAt(root, "flip/sub/new", []byte("new"), nil); err == nil {
			ok["mkdir+write"]++
		} else if !refused(err) {
			t.Fatalf("write with parents: %v", err)
		}
		if infos, err := readDirAt(root, "flip"); err == nil {
			ok["readdir"]++
			for _, info := range infos {
				if info.Name == "canary" && info.Size == int64(len(canary)) {
					t.Fatal("listed the outside directory")
				}
			}
		} else if !refused(err) {
			t.Fatalf("readdir: %v", err)
		}
		if _, err := lstatAt(root, "flip/canary"); err != nil && !refused(err) {
			t.Fatalf("lstat: %v", err)
		}
		for _, flags := range []int{unix.O_PATH, unix.O_RDONLY} { // the fallback walk, too
			if fd, err := walkDir(root, "flip/sub", flags, true); err == nil {
				var st unix.Stat_t
				if unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
					t.Fatal("walk returned a non-directory")
				}
				unix.Close(fd)
			} else if !refused(pathErr("walk", "", err)) {
				t.Fatalf("walk: %v", err)
			}
		}
	}
	close(stop)
	t.Logf("flips %d, successes %v", <-flipped, ok)
	checkOutside(t, outside)
	if left := tempFiles(t, dir); len(left) > 0 {
		t.Errorf("temp files left: %v", left)
	}
}

// TestFilesWriteTargetRace flips the target between a regular file and a
// directory during writes: a write either lands or fails as "directory",
// and no temp file is ever left behind (also when the rename fails).
func TestFilesWriteTargetRace(t *testing.T) {
	root, dir, _ := filesFixture(t)
	target, alt := filepath.Join(dir, "t"), filepath.Join(dir, "t.alt")
	if err := os.WriteFile(target, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(alt, 0o755); err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if unix.Renameat2(unix.AT_FDCWD, target, unix.AT_FDCWD, alt, unix.RENAME_EXCHANGE) != nil {
				return
			}
		}
	}()
	kinds := map[string]int{}
	for range 500 {
		_, err := writeFileAt(root, "t", []byte("new"), nil)
		if err != nil && kindOfErr(err) != "directory" {
			t.Errorf("write: %v", err)
		}
		kinds[kindOfErr(err)]++
	}
	close(stop)
	<-done
	t.Logf("results by error kind: %v", kinds)
	if left := tempFiles(t, dir); len(left) > 0 {
		t.Errorf("temp files left: %v", left)
	}
}

func TestFilesKindError(t *testing.T) {
	for kind, want := range map[string]string{
		"directory": "path is not a regular file (Directory)",
		"symlink":   "path is not a regular file (Symlink)",
		"other":     "path is not a regular file (Other)",
	} {
		err := error(&KindError{kind})
		if err.Error() != want || !errors.Is(err, ErrNotRegular) || errors.Is(err, ErrNotDir) {
			t.Errorf("KindError{%s}: %q", kind, err)
		}
	}
}

// TestFilesSymlinkComponent: every file operation that meets a symlink on
// the way names the first symlink component in a *SymlinkError, and the
// error keeps its type and fields across the control channel.
func TestFilesSymlinkComponent(t *testing.T) {
	root, rootPath, outside := filesFixture(t)
	if err := os.Symlink(".", filepath.Join(rootPath, "dir", "self")); err != nil {
		t.Fatal(err)
	}
	ops := map[string]func(p string) error{
		"lstat": func(p string) error { _, err := lstatAt(root, p); return err },
		"read":  func(p string) error { _, _, err := readFileAt(root, p, 100); return err },
		"readdir": func(p string) error {
			_, err := readDirAt(root, p+"/x")
			return err
		},
		"write": func(p string) error { _, err := writeFileAt(root, p, []byte("x"), nil); return err },
	}
	for _, tc := range []struct{ path, component string }{
		{"in/inner", "in"},
		{"link/x", "link"},
		{"out/canary", "out"},
		{"outabs/x/y/new", "outabs"},
		{"dir/self/inner", "dir/self"},
		{"dir/self/self/new/deeper", "dir/self"},
	} {
		for name, op := range ops {
			err := op(tc.path)
			var se *SymlinkError
			if !errors.As(err, &se) || !errors.Is(err, ErrSymlink) {
				t.Errorf("%s %q: %v, want a SymlinkError", name, tc.path, err)
				continue
			}
			want := tc.path
			if name == "readdir" {
				want += "/x"
			}
			if se.Component != tc.component || se.Path != want {
				t.Errorf("%s %q: %+v, want component %q path %q", name, tc.path, se, tc.component, want)
			}
			var back *SymlinkError
			if got := encodeError(err).decode(); !errors.As(got, &back) || *back != *se || !errors.Is(got, ErrSymlink) {
				t.Errorf("%s %q: over the wire %#v, want %#v", name, tc.path, got, se)
			}
		}
	}
	checkOutside(t, outside)
	if left := tempFiles(t, rootPath); len(left) > 0 {
		t.Errorf("temp files left: %v", left)
	}
}
