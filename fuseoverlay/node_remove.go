package fuseoverlay

import (
	"context"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, name, false)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, name, true)
}

// remove deletes name: the upper entry goes, and a whiteout takes its place
// when a lower layer would otherwise show the name again.
func (n *node) remove(ctx context.Context, name string, dir bool) syscall.Errno {
	if n.hidden(name) {
		return syscall.ENOENT
	}
	o := n.o
	cmd := o.command(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	dp, ok := n.path()
	if !ok {
		return syscall.ENOENT
	}
	pr, errno := o.probe(n.dirLayers, dp, name)
	if errno != 0 {
		return errno
	}
	if !pr.found {
		return syscall.ENOENT
	}
	isDir := pr.st.Mode&unix.S_IFMT == unix.S_IFDIR
	if dir && !isDir {
		return syscall.ENOTDIR
	}
	if !dir && isDir {
		return syscall.EISDIR
	}
	p := join(dp, name)
	if isDir {
		names, errno := o.mergedNames(pr.dirLayers, p, false)
		if errno != 0 {
			return errno
		}
		if len(names) > 0 {
			return syscall.ENOTEMPTY
		}
	}
	if !isDir {
		// The kernel may have it open: keep it readable and writable.
		n.pinChild(name, p)
	}
	needWh := o.lowerHas(n.dirLayers, dp, name)
	if needWh {
		if errno := n.copyUpDir(); errno != 0 {
			return errno
		}
	}
	if pr.layer == 0 {
		if isDir {
			if errno := o.clearDir(p); errno != 0 {
				return errno
			}
		}
		flag := 0
		if isDir {
			flag = unix.AT_REMOVEDIR
		}
		if err := unlinkat(o.fds[0], p, flag); err != nil {
			return errnoOf(err)
		}
		if pr.st.Nlink <= 1 || isDir {
			o.forgetOrigin(pr.st.Ino)
		}
	}
	if needWh {
		if err := makeWhiteout(o.fds[0], p); err != nil {
			return errnoOf(err)
		}
	}
	op := "unlink"
	if dir {
		op = "rmdir"
	}
	o.rec.op(Record{Command: cmd, Op: op, Path: p})
	return 0
}

// clearDir removes the whiteouts (and an OCI opaque marker) left in an
// upper directory whose merged view is empty, so it can be removed.
func (o *ofs) clearDir(p string) syscall.Errno {
	fd, err := openat(o.fds[0], p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return errnoOf(err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return errnoOf(err)
	}
	for _, nm := range names {
		cp := join(p, nm)
		var st unix.Stat_t
		if err := fstatat(o.fds[0], cp, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return errnoOf(err)
		}
		if !isWhiteout(o.fds[0], cp, &st) && nm != opaqueMarker {
			return syscall.ENOTEMPTY
		}
		if err := unlinkat(o.fds[0], cp, 0); err != nil {
			return errnoOf(err)
		}
	}
	return 0
}
