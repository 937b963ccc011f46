package layers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/internal/beneath"
	"golang.org/x/sys/unix"
)

// The resolver for trees a session controls (a session's upper dir, a
// recovery artifact). A process in the session can rename any directory of
// its upper dir into a symlink at any moment, so a host path such as
// upper/d/file names whatever d points to by the time it is opened:
// O_NOFOLLOW only protects the last component. Everything the supervisor
// reads from such a tree therefore goes through a Root: one descriptor of
// the tree's top, and every path below it resolved descriptor-relative with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS), or,
// where openat2 is unavailable, one openat(O_NOFOLLOW) per component: the
// module's one resolver, internal/beneath.
//
// A symlink is never followed, in any component, even one that points to
// another place inside the root: such a link is a path the session chose,
// and the upper dir's format records a symlink as a symlink, never as what
// it points to. (os.Root, Go 1.24+, refuses escapes but follows symlinks
// that stay inside, so it is not used.) A symlink met in a non-final
// component is ErrSymlink (also errors.Is unix.ELOOP); the final component
// is never followed either: Lstat and Readlink describe the link itself,
// Open refuses it.

// ErrSymlink is returned when resolving a path beneath a Root meets a
// symlink where it would have to follow it.
var ErrSymlink = errors.New("a path component is a symlink (symlinks are never followed)")

// ErrChanged marks a walk of a Root that raced a change of the tree (an
// entry vanished, or a directory turned into something else between
// listing and opening it): a retry may succeed.
var ErrChanged = errors.New("tree changed during the walk")

// Root is an open directory beneath which paths are resolved without
// following symlinks. Paths are slash-separated and relative ("" or "." is
// the root itself); ".." is refused. A Root is safe for concurrent use;
// after Close every method fails.
type Root struct {
	dir *Dir
}

// OpenRoot opens the directory dir (dir itself must not be a symlink).
func OpenRoot(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: symlinkErr(err, -1, "")}
	}
	return &Root{dir: &Dir{f: os.NewFile(uintptr(fd), dir), host: dir}}, nil
}

// Name is the host path the Root was opened with (for messages).
func (r *Root) Name() string { return r.dir.host }

// Close releases the Root's descriptor.
func (r *Root) Close() error { return r.dir.Close() }

// cleanRel validates a Root-relative path; "" and "." become "".
func cleanRel(rel string) (string, error) {
	if rel == "" || rel == "." {
		return "", nil
	}
	if strings.HasPrefix(rel, "/") || strings.HasSuffix(rel, "/") {
		return "", fs.ErrInvalid
	}
	for _, c := range strings.Split(rel, "/") {
		if c == "" || c == "." || c == ".." {
			return "", fs.ErrInvalid
		}
	}
	return rel, nil
}

func (r *Root) pathErr(op, rel string, err error) error {
	return &fs.PathError{Op: op, Path: r.dir.join(rel), Err: err}
}

// openFD opens rel beneath the root with flags (O_NOFOLLOW and O_CLOEXEC
// are added).
func (r *Root) openFD(op, rel string, flags int) (int, error) {
	clean, err := cleanRel(rel)
	if err != nil {
		return -1, r.pathErr(op, rel, err)
	}
	if clean == "" {
		clean = "."
	}
	fd := -1
	err = r.dir.control(func(rootfd int) error {
		var oerr error
		fd, oerr = openBeneath(rootfd, clean, flags)
		return oerr
	})
	if err != nil {
		return -1, r.pathErr(op, rel, err)
	}
	return fd, nil
}

// Open opens rel read-only (and non-blocking, so a FIFO cannot stall the
// caller). A symlink anywhere on the way, the final component included, is
// refused.
func (r *Root) Open(rel string) (*os.File, error) {
	fd, err := r.openFD("open", rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), r.dir.join(rel)), nil
}

// OpenFile opens the regular file rel for reading; anything else is
// ErrNotRegular.
func (r *Root) OpenFile(rel string) (*os.File, fs.FileInfo, error) {
	f, err := r.Open(rel)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", r.dir.join(rel), ErrNotRegular)
	}
	return f, fi, nil
}

// ReadFile returns the content of the regular file rel.
func (r *Root) ReadFile(rel string) ([]byte, error) {
	f, _, err := r.OpenFile(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	return b, nil
}

// OpenDir opens the directory rel.
func (r *Root) OpenDir(rel string) (*Dir, error) {
	clean, err := cleanRel(rel)
	if err != nil {
		return nil, r.pathErr("open", rel, err)
	}
	if clean == "" {
		return r.dir.dup()
	}
	rel = clean
	fd, err := r.openFD("open", rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	return &Dir{f: os.NewFile(uintptr(fd), r.dir.join(rel)), host: r.dir.join(rel), rel: rel}, nil
}

// parent opens the directory holding rel and returns it with rel's last
// component. rel must not be the root.
func (r *Root) parent(op, rel string) (*Dir, string, error) {
	clean, err := cleanRel(rel)
	if err != nil {
		return nil, "", r.pathErr(op, rel, err)
	}
	if clean == "" {
		return nil, "", r.pathErr(op, rel, fs.ErrInvalid)
	}
	dir, name := path.Split(clean)
	d, err := r.OpenDir(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return nil, "", err
	}
	return d, name, nil
}

// Lstat describes rel itself (a final symlink is not followed). Its Sys()
// is a *unix.Stat_t.
func (r *Root) Lstat(rel string) (fs.FileInfo, error) {
	if c, err := cleanRel(rel); err == nil && c == "" {
		return r.dir.stat()
	}
	d, name, err := r.parent("lstat", rel)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Lstat(name)
}

// Readlink returns the target of the symlink rel.
func (r *Root) Readlink(rel string) (string, error) {
	d, name, err := r.parent("readlink", rel)
	if err != nil {
		return "", err
	}
	defer d.Close()
	return d.Readlink(name)
}

// Getxattr returns the value of the xattr attr of rel (not following a
// final symlink) and whether it could be read.
func (r *Root) Getxattr(rel, attr string) (string, bool) {
	if c, err := cleanRel(rel); err == nil && c == "" {
		return r.dir.getxattr(".", attr)
	}
	d, name, err := r.parent("getxattr", rel)
	if err != nil {
		return "", false
	}
	defer d.Close()
	return d.Getxattr(name, attr)
}

// ReadDir lists the directory rel sorted by name, every entry described
// as by Lstat.
func (r *Root) ReadDir(rel string) ([]fs.FileInfo, error) {
	d, err := r.OpenDir(rel)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Names()
	if err != nil {
		return nil, err
	}
	out := make([]fs.FileInfo, 0, len(names))
	for _, n := range names {
		fi, err := d.Lstat(n)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	return out, nil
}

// WalkFunc is called by Walk for every entry below the root (never for the
// root itself), rel being its Root-relative path and fi its Lstat. For a
// directory, returning fs.SkipDir skips its content; any other error stops
// the walk and is returned.
type WalkFunc func(rel string, fi fs.FileInfo) error

// Walk visits the tree below the root depth-first in name order, each
// directory opened relative to its parent's descriptor without following
// symlinks (a symlink is visited, never entered). A directory that cannot
// be opened (removed, or replaced by something else meanwhile, or
// unreadable) is skipped; Walk stops at ctx's cancellation.
func (r *Root) Walk(ctx context.Context, fn WalkFunc) error {
	d, err := r.dir.dup()
	if err != nil {
		return err
	}
	return walkDir(ctx, d, fn)
}

func walkDir(ctx context.Context, d *Dir, fn WalkFunc) error {
	defer d.Close()
	names, err := d.Names()
	if err != nil {
		return nil // unreadable: nothing to visit
	}
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := d.Lstat(n)
		if err != nil {
			continue // removed since the listing
		}
		rel := joinRel(d.rel, n)
		err = fn(rel, fi)
		if fi.IsDir() && errors.Is(err, fs.SkipDir) {
			continue
		}
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			continue
		}
		sub, err := d.OpenDir(n)
		if err != nil {
			continue
		}
		if err := walkDir(ctx, sub, fn); err != nil {
			return err
		}
	}
	return nil
}

// Dir is one directory opened beneath a Root: its entries are looked up by
// name relative to its descriptor, never through a path.
type Dir struct {
	f    *os.File
	host string // host path, for messages
	rel  string // Root-relative path ("" for the root)
}

// Rel is the directory's Root-relative path.
func (d *Dir) Rel() string { return d.rel }

// Close releases the directory's descriptor.
func (d *Dir) Close() error { return d.f.Close() }

func (d *Dir) join(name string) string {
	if name == "" || name == "." {
		return d.host
	}
	return d.host + "/" + name
}

// control runs fn with the descriptor; Close cannot reuse it meanwhile.
func (d *Dir) control(fn func(fd int) error) error {
	rc, err := d.f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// dup opens the same directory again, with its own offset (a dup(2)
// would share the offset, and reading the entries of one would empty the
// listing of the other). "." relative to the descriptor is that directory
// wherever it has been moved.
func (d *Dir) dup() (*Dir, error) {
	fd := -1
	err := d.control(func(dfd int) error {
		var derr error
		fd, derr = unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return derr
	})
	if err != nil {
		return nil, &fs.PathError{Op: "dup", Path: d.host, Err: err}
	}
	return &Dir{f: os.NewFile(uintptr(fd), d.host), host: d.host, rel: d.rel}, nil
}

// validName refuses what is not one path component.
func validName(name string) error {
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return fs.ErrInvalid
	}
	return nil
}

// Names lists the directory's entry names sorted by bytes.
func (d *Dir) Names() ([]string, error) {
	// Read through a second open: reading moves the offset of the descriptor.
	dd, err := d.dup()
	if err != nil {
		return nil, err
	}
	defer dd.Close()
	names, err := dd.f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("read dir %s: %w", d.host, err)
	}
	slices.Sort(names)
	return names, nil
}

func (d *Dir) stat() (fs.FileInfo, error) {
	var st unix.Stat_t
	if err := d.control(func(fd int) error { return unix.Fstat(fd, &st) }); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: d.host, Err: err}
	}
	return &statInfo{name: path.Base(d.host), st: st}, nil
}

// Lstat describes the entry name (a symlink is not followed). Its Sys()
// is a *unix.Stat_t.
func (d *Dir) Lstat(name string) (fs.FileInfo, error) {
	if err := validName(name); err != nil {
		return nil, &fs.PathError{Op: "lstat", Path: d.join(name), Err: err}
	}
	var st unix.Stat_t
	err := d.control(func(fd int) error { return unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) })
	if err != nil {
		return nil, &fs.PathError{Op: "lstat", Path: d.join(name), Err: err}
	}
	return &statInfo{name: name, st: st}, nil
}

// OpenDir opens the subdirectory name; a symlink there is ErrSymlink.
func (d *Dir) OpenDir(name string) (*Dir, error) {
	if err := validName(name); err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	fd := -1
	err := d.control(func(dfd int) error {
		var oerr error
		fd, oerr = unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		return symlinkErr(oerr, dfd, name)
	})
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	return &Dir{f: os.NewFile(uintptr(fd), d.join(name)), host: d.join(name), rel: joinRel(d.rel, name)}, nil
}

// Open opens the entry name read-only and non-blocking; a symlink is
// ErrSymlink.
func (d *Dir) Open(name string) (*os.File, error) {
	if err := validName(name); err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	fd := -1
	err := d.control(func(dfd int) error {
		var oerr error
		fd, oerr = unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		return symlinkErr(oerr, dfd, name)
	})
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	return os.NewFile(uintptr(fd), d.join(name)), nil
}

// Readlink returns the target of the symlink name.
func (d *Dir) Readlink(name string) (string, error) {
	if err := validName(name); err != nil {
		return "", &fs.PathError{Op: "readlink", Path: d.join(name), Err: err}
	}
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n := 0
		err := d.control(func(fd int) error {
			var rerr error
			n, rerr = unix.Readlinkat(fd, name, buf)
			return rerr
		})
		if err != nil {
			return "", &fs.PathError{Op: "readlink", Path: d.join(name), Err: err}
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// Getxattr returns the value of the xattr attr of the entry name (a
// symlink's own) and whether it could be read.
func (d *Dir) Getxattr(name, attr string) (string, bool) {
	if validName(name) != nil {
		return "", false
	}
	return d.getxattr(name, attr)
}

// getxattr reads through /proc/self/fd/<dir>/<name> (or the directory's own
// xattr for name "."): the magic link is the directory this Dir holds
// (wherever it is now), and name is not followed. There is no fgetxattrat before Linux 6.13, and opening the
// entry itself would need read permission, or open a FIFO.
func (d *Dir) getxattr(name, attr string) (string, bool) {
	var val string
	var ok bool
	_ = d.control(func(fd int) error {
		// The directory itself: getxattr follows the magic link to it; an
		// entry: lgetxattr reads the entry, never what a symlink names.
		p, get := "/proc/self/fd/"+strconv.Itoa(fd), unix.Getxattr
		if name != "." {
			p, get = p+"/"+name, unix.Lgetxattr
		}
		var err error
		val, err = readXattr(func(buf []byte) (int, error) { return get(p, attr, buf) })
		if errors.Is(err, unix.ENOENT) {
			// The entry is gone, or there is no /proc: read through a
			// descriptor of the entry instead (a symlink has none to give).
			efd, oerr := unix.Openat(fd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if oerr != nil {
				return nil
			}
			defer unix.Close(efd)
			val, err = readXattr(func(buf []byte) (int, error) { return unix.Fgetxattr(efd, attr, buf) })
		}
		ok = err == nil
		return nil
	})
	return val, ok
}

// readXattr calls get with a buffer that grows until the value fits.
func readXattr(get func(buf []byte) (int, error)) (string, error) {
	buf := make([]byte, 64)
	for {
		n, err := get(buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < 1<<16 {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// symlinkErr turns the ELOOP or ENOTDIR that an O_NOFOLLOW open gives for
// a symlink into ErrSymlink (dirfd < 0: no lookup possible, ELOOP alone
// decides).
func symlinkErr(err error, dirfd int, name string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%w: %w", ErrSymlink, err)
	case errors.Is(err, unix.ENOTDIR) && dirfd >= 0:
		// O_DIRECTORY|O_NOFOLLOW on a symlink gives ENOTDIR.
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return fmt.Errorf("%w: %w", ErrSymlink, unix.ELOOP)
		}
	}
	return err
}

// resolve is the resolver beneath a descriptor (internal/beneath); a
// seam so that tests also run the per-component walk that replaces
// openat2 where the kernel lacks it.
var resolve = beneath.Open

// openBeneath opens rel (slash-separated, clean, relative, "." for the
// directory itself) below the directory open at rootfd without following
// any symlink: a symlink on the way, or as the final component unless
// flags has O_PATH, is ErrSymlink (errors.Is unix.ELOOP too).
func openBeneath(rootfd int, rel string, flags int) (int, error) {
	fd, err := resolve(rootfd, rel, flags)
	if errors.Is(err, unix.ELOOP) {
		return -1, fmt.Errorf("%w: %w", ErrSymlink, unix.ELOOP)
	}
	return fd, err
}

// statInfo is an fs.FileInfo made from a unix.Stat_t.
type statInfo struct {
	name string
	st   unix.Stat_t
}

func (s *statInfo) Name() string       { return s.name }
func (s *statInfo) Size() int64        { return s.st.Size }
func (s *statInfo) ModTime() time.Time { return time.Unix(s.st.Mtim.Unix()) }
func (s *statInfo) IsDir() bool        { return s.st.Mode&unix.S_IFMT == unix.S_IFDIR }
func (s *statInfo) Sys() any           { return &s.st }

// Mode maps st_mode as os.Lstat does.
func (s *statInfo) Mode() fs.FileMode {
	m := fs.FileMode(s.st.Mode & 0o777)
	switch s.st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	}
	if s.st.Mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if s.st.Mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if s.st.Mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}
