package fuseoverlay

import (
	"strings"

	"golang.org/x/sys/unix"
)

// Paths longer than PATH_MAX.
//
// Nodes are addressed by their path from a layer root, and one *at() call
// takes at most PATH_MAX bytes, while a tree built through the mount can be
// deeper than that (the kernel resolves names one at a time). The wrappers
// below take the same (dirfd, path) as their unix counterparts: a path that
// fits goes to the kernel in one call, as before; a longer one has its
// parent directory opened by walking down from dirfd, and the call is made
// relative to that. The walk never follows a symlink: layers hold real
// directories at every name a node's path passes through, so a symlink
// there means the layer changed underneath and must not lead elsewhere.

// resolveAt returns a directory fd and a name within it that reach p below
// dirfd; done closes what the walk opened.
func resolveAt(dirfd int, p string) (fd int, name string, done func(), err error) {
	if len(p) < unix.PathMax {
		return dirfd, rel(p), noop, nil
	}
	i := strings.LastIndexByte(p, '/')
	if i <= 0 {
		return -1, "", nil, unix.ENAMETOOLONG
	}
	fd, err = walkDir(dirfd, p[:i])
	if err != nil {
		return -1, "", nil, err
	}
	return fd, p[i+1:], func() { unix.Close(fd) }, nil
}

func noop() {}

// walkDir opens the directory dir below dirfd as an O_PATH descriptor. It
// resolves as many components per call as fit in PATH_MAX, with openat2
// refusing symlinks on every component; where openat2 is missing (before
// Linux 5.6, or filtered) it opens one component at a time with O_NOFOLLOW.
func walkDir(dirfd int, dir string) (int, error) {
	cur := dirfd
	for dir != "" {
		chunk := dir
		if len(chunk) >= unix.PathMax {
			j := strings.LastIndexByte(dir[:unix.PathMax-1], '/')
			if j <= 0 {
				closeWalked(cur, dirfd)
				return -1, unix.ENAMETOOLONG
			}
			chunk = dir[:j]
		}
		dir = strings.TrimPrefix(dir[len(chunk):], "/")
		next, err := openDirNoFollow(cur, chunk)
		closeWalked(cur, dirfd)
		if err != nil {
			return -1, err
		}
		cur = next
	}
	if cur == dirfd {
		// Only reached for an empty dir, which resolveAt never passes.
		return unix.Openat(dirfd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	return cur, nil
}

func closeWalked(fd, start int) {
	if fd != start {
		unix.Close(fd)
	}
}

// openDirNoFollow opens the relative path rel (shorter than PATH_MAX) below
// dirfd as a directory without following a symlink anywhere in it.
func openDirNoFollow(dirfd int, rel string) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_BENEATH,
	}
	fd, err := unix.Openat2(dirfd, rel, &how)
	switch err {
	case nil:
		return fd, nil
	case unix.ELOOP:
		return -1, unix.ENOTDIR // a symlink where a directory was
	case unix.ENOSYS, unix.EPERM:
	default:
		return -1, err
	}
	cur := dirfd
	for _, c := range strings.Split(rel, "/") {
		next, err := unix.Openat(cur, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		closeWalked(cur, dirfd)
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// The *at wrappers: same arguments and results as in package unix, any
// path length.

func fstatat(dirfd int, p string, st *unix.Stat_t, flags int) error {
	fd, name, done, err := resolveAt(dirfd, p)
	if err != nil {
		return err
	}
	defer done()
	return unix.Fstatat(fd, name, st, flags)
}

func openat(dirfd int, p string, flags int, mode uint32) (int, error) {
	fd, name, done, err := resolveAt(dirfd, p)
	if err != nil {
		return -1, err
	}
	defer done()
	return unix.Openat(fd, name, flags, mode)
}

func mkdirat(dirfd int, p string, mode uint32) error {
	fd, name, done, err := resolveAt(dirfd, p)
	if err != nil {
		return err
	}
	defer done()
	return unix.Mkdirat(fd, name, mode)
}

func mknodat(dirfd int, p string, mode uint32, dev int) error {
	fd, name, done, err := resolveAt(dirfd, p)
	if err != nil {
		return err
	}
	defer done()
	return unix.Mknodat(fd, name, mode, dev)
}

func symlinkat(target string, dirfd int, p string) error {
	fd, name, done, err := resolveAt(dirfd, p)
	if err != nil {
		return err
	}
	defer done()
	return unix.Symlinkat(target, fd, name)
}

func unlinkat(dirfd int, p string, flags int) error {
	fd, name, done, err := resolveAt(dirfd, p)
	if err != nil {
		return err
	}
	defer done()
	return unix.Unlinkat(fd, name, flags)
}

func fchmodat(dirfd int, p string, mode uint32, flags int) error {
	fd, name, done, err := resolveAt(dirfd, p)
	if err != nil {
		return err
	}
	defer done()
	return unix.Fchmodat(fd, name, mode, flags)
}

func fchownat(dirfd int, p string, uid, gid, flags int) error {
	fd, name, done, err := resolveAt(dirfd, p)
	if err != nil {
		return err
	}
	defer done()
	return unix.Fchownat(fd, name, uid, gid, flags)
}

func utimesNanoAt(dirfd int, p string, ts []unix.Timespec, flags int) error {
	fd, name, done, err := resolveAt(dirfd, p)
	if err != nil {
		return err
	}
	defer done()
	return unix.UtimesNanoAt(fd, name, ts, flags)
}

func readlinkat(dirfd int, p string, buf []byte) (int, error) {
	fd, name, done, err := resolveAt(dirfd, p)
	if err != nil {
		return 0, err
	}
	defer done()
	return unix.Readlinkat(fd, name, buf)
}

func renameat(olddirfd int, oldp string, newdirfd int, newp string) error {
	ofd, oname, odone, err := resolveAt(olddirfd, oldp)
	if err != nil {
		return err
	}
	defer odone()
	nfd, nname, ndone, err := resolveAt(newdirfd, newp)
	if err != nil {
		return err
	}
	defer ndone()
	return unix.Renameat(ofd, oname, nfd, nname)
}

func linkat(olddirfd int, oldp string, newdirfd int, newp string, flags int) error {
	ofd, oname, odone, err := resolveAt(olddirfd, oldp)
	if err != nil {
		return err
	}
	defer odone()
	nfd, nname, ndone, err := resolveAt(newdirfd, newp)
	if err != nil {
		return err
	}
	defer ndone()
	return unix.Linkat(ofd, oname, nfd, nname, flags)
}
