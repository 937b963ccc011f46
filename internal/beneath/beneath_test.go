package beneath

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

const secret = "outside-secret"

// fixture builds a root with real entries and every kind of link the
// resolver must refuse, and a directory outside it holding secret.
func fixture(t *testing.T) (rootfd int, root, outside string) {
	t.Helper()
	base := t.TempDir()
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(root, "dir", "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(outside, "file"), secret)
	write(filepath.Join(root, "file"), "inside")
	write(filepath.Join(root, "dir", "file"), "inside")
	write(filepath.Join(root, "dir", "sub", "file"), "inside")
	for link, target := range map[string]string{
		"in":          "dir",             // stays inside
		"dir/last":    "file",            // last component, inside
		"out":         outside,           // absolute, outside
		"rel":         "../outside",      // relative, outside
		"up":          "..",              // the parent
		"dir/up":      "..",              // the root itself, via ..
		"abs":         "/",               // absolute root
		"magic":       "/proc/self/root", // a link to a magic link
		"dir/dangles": "nowhere",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd, root, outside
}

// resolvers are the two resolutions every case must agree on.
var resolvers = map[string]func(dirfd int, rel string, flags int) (int, error){
	"openat2": Open,
	"walk":    Walk,
}

func readFD(t *testing.T, fd int) string {
	t.Helper()
	f := os.NewFile(uintptr(fd), "x")
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return ""
	}
	return string(b)
}

// TestResolverTable: every symlink is refused wherever it sits (last or
// middle component, inside or outside target, absolute, "..", a magic
// link), ".." and absolute paths are invalid, real paths open; openat2 and
// the per-component walk give the same answer.
func TestResolverTable(t *testing.T) {
	rootfd, _, _ := fixture(t)
	for _, tc := range []struct {
		rel   string
		flags int
		want  error // nil: opens
	}{
		{"", unix.O_RDONLY | unix.O_DIRECTORY, nil},
		{".", unix.O_RDONLY | unix.O_DIRECTORY, nil},
		{"file", unix.O_RDONLY, nil},
		{"dir/sub/file", unix.O_RDONLY, nil},
		{"dir/sub", unix.O_PATH | unix.O_DIRECTORY, nil},
		// symlink in the last component
		{"dir/last", unix.O_RDONLY, unix.ELOOP},
		{"in", unix.O_RDONLY | unix.O_DIRECTORY, unix.ELOOP},
		{"in", unix.O_PATH | unix.O_DIRECTORY, unix.ELOOP},
		{"dir/dangles", unix.O_RDONLY, unix.ELOOP},
		// symlink in a middle component, inside and outside
		{"in/file", unix.O_RDONLY, unix.ELOOP},
		{"in/sub/file", unix.O_RDONLY, unix.ELOOP},
		{"out/file", unix.O_RDONLY, unix.ELOOP},
		{"rel/file", unix.O_RDONLY, unix.ELOOP},
		{"dir/up/file", unix.O_RDONLY, unix.ELOOP},
		{"up/outside/file", unix.O_RDONLY, unix.ELOOP},
		// absolute symlinks
		{"abs/etc/passwd", unix.O_RDONLY, unix.ELOOP},
		{"abs", unix.O_RDONLY | unix.O_DIRECTORY, unix.ELOOP},
		// a symlink to a magic link, and through it
		{"magic", unix.O_RDONLY | unix.O_DIRECTORY, unix.ELOOP},
		{"magic/etc/passwd", unix.O_RDONLY, unix.ELOOP},
		// .. and absolute paths never resolve
		{"..", unix.O_RDONLY | unix.O_DIRECTORY, fs.ErrInvalid},
		{"dir/../file", unix.O_RDONLY, fs.ErrInvalid},
		{"dir/../../outside/file", unix.O_RDONLY, fs.ErrInvalid},
		{"/etc/passwd", unix.O_RDONLY, fs.ErrInvalid},
		{"dir//file", unix.O_RDONLY, fs.ErrInvalid},
		// not a directory, absent
		{"file/x", unix.O_RDONLY, unix.ENOTDIR},
		{"absent", unix.O_RDONLY, unix.ENOENT},
		{"absent/x", unix.O_RDONLY, unix.ENOENT},
	} {
		for name, open := range resolvers {
			fd, err := open(rootfd, tc.rel, tc.flags)
			if err == nil {
				got := ""
				if tc.flags&unix.O_DIRECTORY == 0 {
					got = readFD(t, fd)
				} else {
					unix.Close(fd)
				}
				if got == secret {
					t.Errorf("%s %q: read the outside secret", name, tc.rel)
				}
			}
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("%s %q flags %#x: err %v, want %v", name, tc.rel, tc.flags, err, tc.want)
			}
		}
	}
}

// TestResolverPathFinalSymlink: with O_PATH|O_NOFOLLOW a final symlink is
// the link itself (so a caller can lstat it), in both resolutions.
func TestResolverPathFinalSymlink(t *testing.T) {
	rootfd, _, _ := fixture(t)
	for name, open := range resolvers {
		fd, err := open(rootfd, "out", unix.O_PATH)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			t.Errorf("%s: O_PATH open of a final symlink gave mode %#o, %v; want the link", name, st.Mode, err)
		}
	}
}

// TestResolverMagicLinkDirfd: resolving below /proc/self, whose "root",
// "cwd" and "fd/N" are magic links, refuses them.
func TestResolverMagicLinkDirfd(t *testing.T) {
	self, err := unix.Open("/proc/self", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	defer unix.Close(self)
	for _, rel := range []string{"root", "root/etc/passwd", "cwd", "fd/" + strconv.Itoa(self)} {
		for name, open := range resolvers {
			fd, err := open(self, rel, unix.O_RDONLY)
			if err == nil {
				unix.Close(fd)
			}
			if !errors.Is(err, unix.ELOOP) {
				t.Errorf("%s %q: err %v, want ELOOP", name, rel, err)
			}
		}
	}
}

// TestResolverSwappedPath: while another goroutine keeps swapping a
// directory of the root with a symlink to the outside, no resolution ever
// reads the outside file: each either reads the inside one or is refused.
func TestResolverSwappedPath(t *testing.T) {
	rootfd, root, outside := fixture(t)
	flip := filepath.Join(root, "flip")
	if err := os.MkdirAll(flip, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(flip, "file"), []byte("inside"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "flip-link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			// RENAME_EXCHANGE swaps the directory and the symlink atomically.
			_ = unix.Renameat2(unix.AT_FDCWD, flip, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE)
		}
	}()
	var refused, opened int
	for i := 0; i < 4000; i++ {
		for name, open := range resolvers {
			fd, err := open(rootfd, "flip/file", unix.O_RDONLY)
			switch {
			case err == nil:
				opened++
				if got := readFD(t, fd); got == secret {
					t.Errorf("%s: read the outside file through a swapped component", name)
				}
			case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
				refused++
			default:
				t.Errorf("%s: unexpected error %v", name, err)
			}
			// The swapped name itself, as a directory: the directory or
			// ELOOP, never ENOTDIR from a second look at a swapped name.
			for _, flags := range []int{unix.O_PATH | unix.O_DIRECTORY, unix.O_RDONLY | unix.O_DIRECTORY} {
				dfd, err := open(rootfd, "flip", flags)
				if err != nil {
					if !errors.Is(err, unix.ELOOP) {
						t.Errorf("%s flip flags %#x: err %v, want ELOOP or the directory", name, flags, err)
					}
					continue
				}
				var st unix.Stat_t
				if unix.Fstat(dfd, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
					t.Errorf("%s flip: opened a non-directory", name)
				}
				var in unix.Stat_t
				if unix.Fstatat(dfd, "file", &in, 0) == nil && in.Size == int64(len(secret)) {
					t.Errorf("%s flip: opened the outside directory", name)
				}
				unix.Close(dfd)
			}
		}
		if t.Failed() {
			break
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("opened %d, refused %d", opened, refused)
}

// TestMkdirAll: creates missing directories with the exact mode and never
// through a symlink or a file.
func TestMkdirAll(t *testing.T) {
	rootfd, root, outside := fixture(t)
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	for _, tc := range []struct {
		rel  string
		want error
	}{
		{"m/n/o", nil}, {"dir/p", nil}, {"dir", nil},
		{"out/q", unix.ELOOP}, {"in/q", unix.ELOOP}, {"abs/tmp/q", unix.ELOOP},
		{"file/q", unix.ENOTDIR}, {"../q", fs.ErrInvalid},
	} {
		fd, err := MkdirAll(rootfd, tc.rel, 0o755)
		if err == nil {
			unix.Close(fd)
		}
		if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("MkdirAll %q: err %v, want %v", tc.rel, err, tc.want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(root, "m", "n", "o")); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
		t.Errorf("m/n/o: %v %v, want a 0755 directory", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(outside, "q")); err == nil {
		t.Error("MkdirAll created a directory outside the root")
	}
}

// TestFirstSymlink names the first symlink component for messages.
func TestFirstSymlink(t *testing.T) {
	rootfd, _, _ := fixture(t)
	for rel, want := range map[string]string{
		"in/file": "in", "dir/up/x": "dir/up", "dir/sub/file": "", "out": "out", "absent/x": "",
	} {
		if got := FirstSymlink(rootfd, rel); got != want {
			t.Errorf("FirstSymlink %q = %q, want %q", rel, got, want)
		}
	}
}
