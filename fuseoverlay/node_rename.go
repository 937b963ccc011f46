package fuseoverlay

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.hidden(name) || n.hidden(newName) {
		return syscall.EPERM
	}
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if flags&unix.RENAME_EXCHANGE != 0 || flags&unix.RENAME_WHITEOUT != 0 {
		return syscall.EINVAL
	}
	o := n.o
	cmd := o.command(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	dp, ok1 := n.path()
	ndp, ok2 := np.path()
	if !ok1 || !ok2 {
		return syscall.ENOENT
	}
	src, errno := o.probe(n.dirLayers, dp, name)
	if errno != 0 {
		return errno
	}
	if !src.found {
		return syscall.ENOENT
	}
	srcDir := src.st.Mode&unix.S_IFMT == unix.S_IFDIR
	if srcDir && (src.layer != 0 || len(src.dirLayers) > 1) {
		// Like the kernel without redirect_dir: tools fall back to copy + delete.
		return syscall.EXDEV
	}
	op, p := join(dp, name), join(ndp, newName)
	if op == p {
		return 0
	}
	dst, errno := o.probe(np.dirLayers, ndp, newName)
	if errno != 0 {
		return errno
	}
	if dst.found {
		if flags&unix.RENAME_NOREPLACE != 0 {
			return syscall.EEXIST
		}
		dstDir := dst.st.Mode&unix.S_IFMT == unix.S_IFDIR
		switch {
		case srcDir && !dstDir:
			return syscall.ENOTDIR
		case !srcDir && dstDir:
			return syscall.EISDIR
		case dstDir:
			names, errno := o.mergedNames(dst.dirLayers, p, false)
			if errno != 0 {
				return errno
			}
			if len(names) > 0 {
				return syscall.ENOTEMPTY
			}
		}
	}
	if dst.found && dst.st.Mode&unix.S_IFMT != unix.S_IFDIR {
		// The replaced file may be open: keep it readable and writable.
		np.pinChild(newName, p)
	}
	// Copy-up happens first so a failure leaves the tree unchanged.
	if !srcDir {
		if sn, ok := opsOf(n.GetChild(name)); ok {
			if errno := sn.copyUp(); errno != 0 {
				return errno
			}
		} else if src.layer != 0 {
			// Not known to the kernel right now: copy up by path.
			if errno := n.copyUpDir(); errno != 0 {
				return errno
			}
			upIno, errno := o.copyUpEntry(src.layer, op)
			if errno != 0 {
				return errno
			}
			o.noteOrigin(upIno, o.inoFor(src.layer, &src.st))
		}
	}
	if errno := np.copyUpDir(); errno != 0 {
		return errno
	}
	if errno := n.copyUpDir(); errno != 0 {
		return errno
	}
	up := o.fds[0]
	// Clear what the upper holds at the target so rename(2) can replace it.
	var dstUpper unix.Stat_t
	if err := fstatat(up, p, &dstUpper, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		switch {
		case isWhiteout(up, p, &dstUpper):
			if err := unlinkat(up, p, 0); err != nil {
				return errnoOf(err)
			}
		case dstUpper.Mode&unix.S_IFMT == unix.S_IFDIR:
			if errno := o.clearDir(p); errno != 0 {
				return errno
			}
		}
	}
	dstLowerHas := o.lowerHas(np.dirLayers, ndp, newName)
	srcLowerHas := o.lowerHas(n.dirLayers, dp, name)
	if err := renameat(up, op, up, p); err != nil {
		return errnoOf(err)
	}
	if dst.found && dst.layer == 0 && (dst.st.Nlink <= 1 || dst.st.Mode&unix.S_IFMT == unix.S_IFDIR) && dstUpper.Ino != 0 {
		o.forgetOrigin(dstUpper.Ino)
	}
	// Like the kernel: a directory moved into a merged directory is made
	// opaque, so nothing a lower holds under the new name can show through.
	if srcDir && (dstLowerHas || len(np.dirLayers) > 1) {
		if err := setOpaque(up, p); err != nil {
			return errnoOf(err)
		}
	}
	if srcLowerHas {
		if err := makeWhiteout(up, op); err != nil {
			return errnoOf(err)
		}
	}
	o.rec.op(Record{Command: cmd, Op: "rename", Path: op, NewPath: p})
	return 0
}
