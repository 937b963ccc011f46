package fuseoverlay

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// createHelperEnv makes the test binary create entries in the directory it
// names under its own umask and exit. The kernel applies the creating
// process's umask before the request reaches the server, so the creator
// must be another process than the server for the server's umask to show.
const createHelperEnv = "FUSEOVERLAY_TEST_CREATE"

// createCases are the helper's creates: name, the umask it runs under, the
// kind and requested mode, and the mode the kernel overlay (and a native
// directory) gives.
var createCases = []struct {
	name  string
	umask int
	kind  string
	mode  uint32
	want  uint32
}{
	{"open-0620-umask0", 0, "file", 0o620, 0o620},
	{"mkdir-0777-umask0", 0, "dir", 0o777, 0o777},
	{"fifo-0666-umask0", 0, "fifo", 0o666, 0o666},
	{"touch-umask002", 0o002, "file", 0o666, 0o664},
	{"mkdir-umask002", 0o002, "dir", 0o777, 0o775},
	{"open-0640-umask027", 0o027, "file", 0o660, 0o640},
	{"setgid-dir-umask0", 0, "dir", 0o2775, 0o0775}, // mkdir(2) ignores S_ISGID
	{"sticky-dir-umask0", 0, "dir", 0o1777, 0o1777},
}

// createHelper creates the cases in each directory of the list dirs.
func createHelper(dirs string) {
	for _, dir := range filepath.SplitList(dirs) {
		createIn(dir)
	}
	os.Exit(0)
}

func createIn(dir string) {
	for _, c := range createCases {
		unix.Umask(c.umask)
		p := filepath.Join(dir, c.name)
		var err error
		switch c.kind {
		case "file":
			var fd int
			fd, err = unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, c.mode)
			if err == nil {
				unix.Close(fd)
			}
		case "dir":
			err = unix.Mkdir(p, c.mode)
		case "fifo":
			err = unix.Mkfifo(p, c.mode)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, c.name, err)
			os.Exit(1)
		}
	}
}

func modeOf(t *testing.T, p string) uint32 {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	return st.Mode & 07777
}

// TestCreateModeIsTheRequestedMode: the server's own umask must not mask the
// mode the kernel sent (already masked by the caller's umask), for creates,
// mkdir and mknod, through the mount and in the upper, as in a native
// directory.
func TestCreateModeIsTheRequestedMode(t *testing.T) {
	old := unix.Umask(0o022) // the holder's umask
	defer unix.Umask(old)
	f := mountLayers(t, []tree{{"d/": ""}}, nil)
	native := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), createHelperEnv+"="+native+string(filepath.ListSeparator)+f.p("d"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("create helper: %v %s", err, out)
	}
	for _, c := range createCases {
		if got := modeOf(t, filepath.Join(native, c.name)); got != c.want {
			t.Errorf("%s: native mode %04o, want %04o", c.name, got, c.want)
		}
		if got := modeOf(t, f.p("d/"+c.name)); got != c.want {
			t.Errorf("%s: mode through the mount %04o, want %04o", c.name, got, c.want)
		}
		if got := modeOf(t, filepath.Join(f.upper, "d", c.name)); got != c.want {
			t.Errorf("%s: mode in the upper %04o, want %04o", c.name, got, c.want)
		}
	}
}

// TestCopyUpKeepsSpecialFileMode: a lower fifo copied up (by a utimes)
// keeps its mode; the server's umask must not reach it.
func TestCopyUpKeepsSpecialFileMode(t *testing.T) {
	old := unix.Umask(0o022)
	defer unix.Umask(old)
	requireNS(t)
	f := mountLayersWith(t, func(lower string) {
		must(t, unix.Mkfifo(filepath.Join(lower, "fifo"), 0o666))
		must(t, unix.Chmod(filepath.Join(lower, "fifo"), 0o666))
	})
	must(t, unix.UtimesNano(f.p("fifo"), []unix.Timespec{{Sec: 1}, {Sec: 2}}))
	if k := upperKind(t, filepath.Join(f.upper, "fifo")); k != fmt.Sprintf("mode %o", unix.S_IFIFO|0o666) {
		t.Fatalf("upper fifo after copy-up: %s", k)
	}
	if got := modeOf(t, f.p("fifo")); got != 0o666 {
		t.Fatalf("fifo mode through the mount %04o, want 0666", got)
	}
}

// mountLayersWith mounts one lower prepared by prep, and an empty upper.
func mountLayersWith(t *testing.T, prep func(lower string)) *fixture {
	t.Helper()
	f := mountLayers(t, []tree{{}}, nil)
	f.unmount()
	prep(f.lowers[0])
	return remount(t, f)
}

// remount mounts the fixture's layers again on its mountpoint.
func remount(t *testing.T, f *fixture) *fixture {
	t.Helper()
	var o Options
	for _, d := range f.lowers {
		lf, err := os.Open(d)
		must(t, err)
		t.Cleanup(func() { lf.Close() })
		o.Lowers = append(o.Lowers, lf)
	}
	uf, err := os.Open(f.upper)
	must(t, err)
	t.Cleanup(func() { uf.Close() })
	o.Upper = uf
	srv, err := Mount(t.Context(), f.mnt, o)
	must(t, err)
	nf := &fixture{t: t, mnt: f.mnt, upper: f.upper, lowers: f.lowers, srv: srv, mounted: true, owners: map[uint32]string{}}
	t.Cleanup(nf.unmount)
	return nf
}

// TestZeroModeIsReported: mode 0000 shows as 0000 (go-fuse would put 0644
// or 0755 in its place, and the kernel checks access against what it is
// shown), for lower entries and for entries chmod'ed through the mount.
func TestZeroModeIsReported(t *testing.T) {
	requireNS(t)
	f := mountLayersWith(t, func(lower string) {
		must(t, os.WriteFile(filepath.Join(lower, "lf"), []byte("x"), 0o644))
		must(t, os.Mkdir(filepath.Join(lower, "ld"), 0o755))
		must(t, os.Chmod(filepath.Join(lower, "lf"), 0))
		must(t, os.Chmod(filepath.Join(lower, "ld"), 0))
	})
	f.write("uf", "y")
	must(t, os.Mkdir(f.p("ud"), 0o755))
	must(t, os.Chmod(f.p("uf"), 0))
	must(t, os.Chmod(f.p("ud"), 0))
	for _, n := range []string{"lf", "ld", "uf", "ud"} {
		if got := modeOf(t, f.p(n)); got != 0 {
			t.Errorf("%s: mode %04o, want 0000", n, got)
		}
	}
	// Lookups after a remount start from a cold kernel cache.
	f.unmount()
	f = remount(t, f)
	for _, n := range []string{"lf", "ld", "uf", "ud"} {
		if got := modeOf(t, f.p(n)); got != 0 {
			t.Errorf("after remount %s: mode %04o, want 0000", n, got)
		}
	}
}

// longName is a component of the maximum length: a handful of them is a
// path past PATH_MAX.
func longName(c byte, i int) string {
	s := fmt.Sprintf("%c%03d", c, i)
	return s + strings.Repeat(string(c), 255-len(s))
}

// mkChain makes depth directories below dir one descriptor at a time (a
// path through them is too long for a single call) and returns an O_PATH
// descriptor of the deepest.
func mkChain(t *testing.T, dir string, c byte, depth int) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	for i := range depth {
		name := longName(c, i)
		if err := unix.Mkdirat(fd, name, 0o755); err != nil && err != unix.EEXIST {
			unix.Close(fd) // an open descriptor would keep the mount busy
			t.Fatalf("mkdir at depth %d: %v", i, err)
		}
		next, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatalf("open at depth %d: %v", i, err)
		}
		fd = next
	}
	return fd
}

func readAt(t *testing.T, dfd int, name string) string {
	t.Helper()
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 256)
	n, err := unix.Read(fd, buf)
	must(t, err)
	return string(buf[:n])
}

func writeAtFd(t *testing.T, dfd int, name, content string, flags int) {
	t.Helper()
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CLOEXEC|flags, 0o644)
	if err != nil {
		t.Fatalf("open %s for writing: %v", name, err)
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(content))
	must(t, err)
}

// TestPathsLongerThanPathMax: the overlay resolves entries whose path from
// the layer root is longer than PATH_MAX, in the upper and in a lower, as
// the kernel does: create, mkdir, write, copy-up, rename, link, symlink,
// readdir, unlink and rmdir at the bottom of a chain of 24 long names
// (about 6,100 bytes).
func TestPathsLongerThanPathMax(t *testing.T) {
	requireNS(t)
	const depth = 24
	f := mountLayersWith(t, func(lower string) {
		fd := mkChain(t, lower, 'l', depth)
		defer unix.Close(fd)
		writeAtFd(t, fd, "lower.txt", "from the lower\n", unix.O_CREAT|unix.O_EXCL)
	})

	// A lower chain: read, then write (copies every directory up).
	lfd := mkChain(t, f.mnt, 'l', depth) // exists: opens the merged chain
	defer unix.Close(lfd)
	if got := readAt(t, lfd, "lower.txt"); got != "from the lower\n" {
		t.Fatalf("lower file at depth: %q", got)
	}
	writeAtFd(t, lfd, "lower.txt", "rewritten\n", unix.O_TRUNC)
	if got := readAt(t, lfd, "lower.txt"); got != "rewritten\n" {
		t.Fatalf("after copy-up at depth: %q", got)
	}

	// A new chain in the upper.
	ufd := mkChain(t, f.mnt, 'u', depth)
	defer unix.Close(ufd)
	writeAtFd(t, ufd, "a.txt", "new\n", unix.O_CREAT|unix.O_EXCL)
	must(t, unix.Mkdirat(ufd, "sub", 0o755))
	must(t, unix.Renameat(ufd, "a.txt", ufd, "sub/b.txt"))
	must(t, unix.Linkat(ufd, "sub/b.txt", ufd, "hard.txt", 0))
	must(t, unix.Symlinkat("sub/b.txt", ufd, "sym"))
	must(t, unix.Mkfifoat(ufd, "fifo", 0o600))
	buf := make([]byte, 64)
	n, err := unix.Readlinkat(ufd, "sym", buf)
	must(t, err)
	if string(buf[:n]) != "sub/b.txt" {
		t.Fatalf("readlink at depth: %q", buf[:n])
	}
	if got := readAt(t, ufd, "hard.txt"); got != "new\n" {
		t.Fatalf("hard link at depth: %q", got)
	}
	must(t, unix.Fchmodat(ufd, "hard.txt", 0o600, 0))
	must(t, unix.Setxattr(fmt.Sprintf("/proc/self/fd/%d/sub", ufd), "user.k", []byte("v"), 0))
	names := func(dfd int) []string {
		fd, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		must(t, err)
		d := os.NewFile(uintptr(fd), "dir")
		defer d.Close()
		ns, err := d.Readdirnames(-1)
		must(t, err)
		return ns
	}
	if got := strings.Join(slices.Sorted(slices.Values(names(ufd))), ","); got != "fifo,hard.txt,sub,sym" {
		t.Fatalf("readdir at depth: %s", got)
	}

	// What the upper holds, read the same way on the host side.
	hfd := mkChain(t, f.upper, 'u', depth)
	defer unix.Close(hfd)
	if got := readAt(t, hfd, "sub/b.txt"); got != "new\n" {
		t.Fatalf("upper at depth: %q", got)
	}
	hl := mkChain(t, f.upper, 'l', depth)
	defer unix.Close(hl)
	if got := readAt(t, hl, "lower.txt"); got != "rewritten\n" {
		t.Fatalf("copied-up file in the upper: %q", got)
	}

	// Removal, including a whiteout at depth for the lower file.
	for _, name := range []string{"sub/b.txt", "hard.txt", "sym", "fifo"} {
		must(t, unix.Unlinkat(ufd, name, 0))
	}
	must(t, unix.Unlinkat(ufd, "sub", unix.AT_REMOVEDIR))
	must(t, unix.Unlinkat(lfd, "lower.txt", 0))
	if k := upperKind(t, fmt.Sprintf("/proc/self/fd/%d/lower.txt", hl)); k != "whiteout" {
		t.Fatalf("upper after unlinking the lower file at depth: %s", k)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(lfd, "lower.txt", &st, unix.AT_SYMLINK_NOFOLLOW); err != unix.ENOENT {
		t.Fatalf("unlinked lower file at depth: %v", err)
	}
}
