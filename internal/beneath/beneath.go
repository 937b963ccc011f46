package beneath

import (
	"errors"
	"io/fs"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// noOpenat2 remembers that openat2 is unavailable (old kernel, seccomp). It
// is a fact about the host, found on the first call and never reset, so a
// package-level flag is its natural home; it changes no result, only which
// of two equivalent resolutions runs.
var noOpenat2 atomic.Bool

// Errors are the kernel's, so callers can compare or errors.Is them:
//   - unix.ELOOP: a symlink (or magic link) in some component, the last
//     one included unless flags hold O_PATH|O_NOFOLLOW;
//   - unix.ENOTDIR: a non-directory where a directory is needed;
//   - unix.ENOENT and the rest: as openat(2) reports them;
//   - fs.ErrInvalid: rel is absolute, has an empty, "." or ".." component
//     (beyond "" and "." for dirfd itself).

// Open opens rel (slash-separated, relative; "" or "." is dirfd itself)
// below the directory open at dirfd, following no symlink in any
// component. O_NOFOLLOW and O_CLOEXEC are added to flags; with O_PATH a
// final symlink is opened as the link itself, as openat2 does.
func Open(dirfd int, rel string, flags int) (int, error) {
	rel, err := clean(rel)
	if err != nil {
		return -1, err
	}
	flags |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	if !noOpenat2.Load() {
		o2 := flags
		if flags&unix.O_DIRECTORY != 0 {
			// RESOLVE_NO_SYMLINKS refuses a final symlink with ELOOP; with
			// O_PATH|O_NOFOLLOW it would open the link, and O_DIRECTORY
			// then fail with an ENOTDIR that says less.
			o2 &^= unix.O_NOFOLLOW
		}
		how := unix.OpenHow{Flags: uint64(o2), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
		for i := 0; ; i++ {
			fd, err := unix.Openat2(dirfd, rel, &how)
			switch {
			case err == nil:
				return fd, nil
			case (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)) && i < 10:
				continue // a concurrent rename somewhere: try again
			case errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM):
				noOpenat2.Store(true)
			case errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP):
				return -1, unix.ELOOP
			case errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
				// ENOTDIR: a file on the way, or a final symlink with
				// O_DIRECTORY; the walk (as safe) tells which.
			default:
				return -1, err
			}
			break
		}
	}
	return walk(dirfd, rel, flags, false, 0)
}

// Walk is Open without openat2: the per-component resolution Open falls
// back to, exported so that callers' tests can run both.
func Walk(dirfd int, rel string, flags int) (int, error) {
	rel, err := clean(rel)
	if err != nil {
		return -1, err
	}
	return walk(dirfd, rel, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, false, 0)
}

// MkdirAll resolves the directory rel below dirfd like Walk, creating each
// missing component with exactly mode perm (not masked by the umask), and
// returns an O_PATH descriptor of it. A symlink on the way is ELOOP, a
// non-directory ENOTDIR: nothing is created through either.
func MkdirAll(dirfd int, rel string, perm uint32) (int, error) {
	rel, err := clean(rel)
	if err != nil {
		return -1, err
	}
	return walk(dirfd, rel, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, true, perm)
}

// FirstSymlink returns the shortest prefix of rel that is a symlink below
// dirfd (for messages: openat2 only says ELOOP), or "" when a walk no
// longer meets one (the tree changed meanwhile).
func FirstSymlink(dirfd int, rel string) string {
	rel, err := clean(rel)
	if err != nil || rel == "." {
		return ""
	}
	fd, err := unix.Openat(dirfd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	comps := strings.Split(rel, "/")
	for i, c := range comps {
		next, err := component(fd, c)
		unix.Close(fd)
		switch {
		case errors.Is(err, unix.ELOOP):
			return strings.Join(comps[:i+1], "/")
		case err != nil:
			return ""
		}
		fd = next
	}
	unix.Close(fd)
	return ""
}

// clean validates rel; "" becomes ".".
func clean(rel string) (string, error) {
	if rel == "" || rel == "." {
		return ".", nil
	}
	if strings.HasPrefix(rel, "/") {
		return "", fs.ErrInvalid
	}
	for _, c := range strings.Split(rel, "/") {
		if c == "" || c == "." || c == ".." {
			return "", fs.ErrInvalid
		}
	}
	return rel, nil
}

// walk opens every directory component with component and the last one
// with flags. With create, a missing component is made (mode perm).
func walk(dirfd int, rel string, flags int, create bool, perm uint32) (int, error) {
	fd, err := unix.Openat(dirfd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if rel == "." {
		defer unix.Close(fd)
		return unix.Openat(fd, ".", flags&^unix.O_NOFOLLOW, 0)
	}
	comps := strings.Split(rel, "/")
	for i, c := range comps {
		if i == len(comps)-1 && !create && flags&unix.O_DIRECTORY != 0 {
			// Classify what was opened, not what a second look finds: the
			// name may be swapped between the two.
			nfd, err := component(fd, c)
			unix.Close(fd)
			if err != nil || flags&unix.O_PATH != 0 {
				return nfd, err
			}
			defer unix.Close(nfd)
			return unix.Openat(nfd, ".", flags&^unix.O_NOFOLLOW, 0)
		}
		if i == len(comps)-1 && !create {
			nfd, err := unix.Openat(fd, c, flags, 0) // O_NOFOLLOW: a symlink is ELOOP
			unix.Close(fd)
			return nfd, err
		}
		next, err := component(fd, c)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(fd, c, perm); err == nil || errors.Is(err, unix.EEXIST) {
				made := err == nil
				if next, err = component(fd, c); err == nil && made {
					// Through the resolved descriptor, regardless of the umask.
					err = unix.Fchmodat(next, ".", perm, 0)
				}
			}
		}
		unix.Close(fd)
		if err != nil {
			if next >= 0 {
				unix.Close(next)
			}
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// component opens the directory name in dfd as O_PATH: ELOOP when it is a
// symlink (the descriptor's own fstat says so, so a swap between a check
// and the open cannot slip through), ENOTDIR when it is anything else but
// a directory; the descriptor is -1 on error.
func component(dfd int, name string) (int, error) {
	fd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err == nil {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			return fd, nil
		case unix.S_IFLNK:
			err = unix.ELOOP
		default:
			err = unix.ENOTDIR
		}
	}
	unix.Close(fd)
	return -1, err
}
