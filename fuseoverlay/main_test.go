package fuseoverlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The tests mount for real. The test binary re-executes itself in a new
// user and mount namespace (the current uid mapped to 0), where /dev/fuse
// can be mounted with mount(2) — the holder's situation.
const inNSEnv = "FUSEOVERLAY_TEST_IN_NS"

var skipReason string

// mmapHelperEnv makes the test binary write through a shared mapping of
// the file it names and exit. Mapped writes must come from another process:
// a page fault on a FUSE file holds the faulting process's mmap lock, which
// the in-process server may need to grow its heap — a self-deadlock that
// real clients (other processes) never hit.
const mmapHelperEnv = "FUSEOVERLAY_TEST_MMAP"

func mmapHelper(path string) {
	fh, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	m, err := unix.Mmap(int(fh.Fd()), 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	copy(m[4096:], "mmap-write")
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	unix.Munmap(m)
	fh.Close()
	os.Exit(0)
}

// runMmapHelper runs mmapHelper on path in a child process.
func runMmapHelper(t *testing.T, path string) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), mmapHelperEnv+"="+path)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mmap helper: %v %s", err, out)
	}
}

func TestMain(m *testing.M) {
	if p := os.Getenv(mmapHelperEnv); p != "" {
		mmapHelper(p)
	}
	if p := os.Getenv(createHelperEnv); p != "" {
		createHelper(p)
	}
	if p := os.Getenv(privHelperEnv); p != "" {
		privHelper(p)
	}
	if os.Getenv(inNSEnv) == "" {
		if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
			skipReason = fmt.Sprintf("cannot open /dev/fuse: %v", err)
		} else {
			f.Close()
			cmd := exec.Command(os.Args[0], os.Args[1:]...)
			cmd.Env = append(os.Environ(), inNSEnv+"=1")
			cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{
				Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
				UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
				GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
			}
			err := cmd.Run()
			var ee *exec.ExitError
			switch {
			case err == nil:
				os.Exit(0)
			case errors.As(err, &ee) && ee.ExitCode() >= 0:
				os.Exit(ee.ExitCode())
			default:
				skipReason = fmt.Sprintf("cannot enter a user namespace: %v", err)
			}
		}
		os.Exit(m.Run())
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fmt.Fprintln(os.Stderr, "make mounts private:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func requireNS(t *testing.T) {
	t.Helper()
	if skipReason == "" {
		return
	}
	if os.Getenv("ESBX_REQUIRE_ALL") == "1" {
		t.Fatalf("ESBX_REQUIRE_ALL=1 but: %s", skipReason)
	}
	t.Skip(skipReason)
}

// tree describes layer content: "d/" is a directory, "l->target" a
// symlink, "x=wh" a 0:0 whiteout, "x=xwh" an xattr whiteout, "d/=opq" an
// opaque directory; anything else is a file with that content.
type tree map[string]string

func build(t *testing.T, dir string, tr tree) {
	t.Helper()
	keys := make([]string, 0, len(tr))
	for k := range tr {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := tr[k]
		p := filepath.Join(dir, strings.TrimSuffix(k, "/"))
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		switch {
		case strings.HasSuffix(k, "/"):
			must(t, os.MkdirAll(p, 0o755))
			if v == "opq" {
				must(t, unix.Setxattr(p, xUserOpaque, []byte("y"), 0))
			}
		case strings.HasPrefix(v, "->"):
			must(t, os.Symlink(v[2:], p))
		case v == "=wh":
			must(t, unix.Mknod(p, unix.S_IFCHR, 0))
		case v == "=xwh":
			must(t, os.WriteFile(p, nil, 0o644))
			must(t, unix.Setxattr(p, xUserWhiteout, []byte("y"), 0))
		default:
			must(t, os.WriteFile(p, []byte(v), 0o644))
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fixture is one mounted overlay.
type fixture struct {
	t       *testing.T
	mnt     string
	upper   string
	lowers  []string
	srv     *Server
	mu      sync.Mutex
	records []Record
	rels    []string
	owners  map[uint32]string
	mounted bool
}

type fixOpt func(*Options, *fixture)

func withSink() fixOpt {
	return func(o *Options, f *fixture) {
		o.Sink = func(rs []Record) {
			f.mu.Lock()
			f.records = append(f.records, rs...)
			f.mu.Unlock()
		}
		o.Released = func(path, cmd string) {
			f.mu.Lock()
			f.rels = append(f.rels, path+"@"+cmd)
			f.mu.Unlock()
		}
		o.Owner = func(pid uint32) string {
			f.mu.Lock()
			defer f.mu.Unlock()
			if c, ok := f.owners[pid]; ok {
				return c
			}
			return fmt.Sprintf("pid%d", pid)
		}
	}
}

// mountLayers builds the lowers (newest first) and mounts the overlay.
func mountLayers(t *testing.T, lowers []tree, upper tree, opts ...fixOpt) *fixture {
	t.Helper()
	requireNS(t)
	base := t.TempDir()
	f := &fixture{t: t, mnt: filepath.Join(base, "mnt"), upper: filepath.Join(base, "upper"), owners: map[uint32]string{}}
	must(t, os.Mkdir(f.mnt, 0o755))
	must(t, os.Mkdir(f.upper, 0o755))
	build(t, f.upper, upper)
	var o Options
	for i, lt := range lowers {
		d := filepath.Join(base, fmt.Sprintf("lower%d", i))
		must(t, os.Mkdir(d, 0o755))
		build(t, d, lt)
		f.lowers = append(f.lowers, d)
		lf, err := os.Open(d)
		must(t, err)
		t.Cleanup(func() { lf.Close() })
		o.Lowers = append(o.Lowers, lf)
	}
	uf, err := os.Open(f.upper)
	must(t, err)
	t.Cleanup(func() { uf.Close() })
	o.Upper = uf
	o.Name = "fuseoverlay-test"
	for _, fo := range opts {
		fo(&o, f)
	}
	srv, err := Mount(context.Background(), f.mnt, o)
	must(t, err)
	f.srv, f.mounted = srv, true
	t.Cleanup(f.unmount)
	return f
}

func (f *fixture) unmount() {
	if !f.mounted {
		return
	}
	f.mounted = false
	if err := f.srv.Unmount(); err != nil {
		f.t.Errorf("unmount: %v", err)
	}
}

func (f *fixture) p(rel string) string { return filepath.Join(f.mnt, rel) }

func (f *fixture) read(rel string) string {
	f.t.Helper()
	b, err := os.ReadFile(f.p(rel))
	if err != nil {
		f.t.Fatalf("read %s: %v", rel, err)
	}
	return string(b)
}

func (f *fixture) write(rel, content string) {
	f.t.Helper()
	must(f.t, os.WriteFile(f.p(rel), []byte(content), 0o644))
}

// list returns the sorted names of a merged directory.
func list(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// upperKind describes an upper entry the way the kernel format encodes it.
func upperKind(t *testing.T, p string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return "absent"
		}
		t.Fatal(err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			return "whiteout"
		}
	case unix.S_IFREG:
		if st.Size == 0 {
			if _, err := unix.Lgetxattr(p, xUserWhiteout, nil); err == nil {
				return "whiteout"
			}
		}
		return "file"
	case unix.S_IFDIR:
		buf := make([]byte, 8)
		if n, err := unix.Lgetxattr(p, xUserOpaque, buf); err == nil && string(buf[:n]) == "y" {
			return "opaque"
		}
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	}
	return fmt.Sprintf("mode %o", st.Mode)
}
