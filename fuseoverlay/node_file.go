package fuseoverlay

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// openFlags keeps the open flags that make sense on the backing file.
// O_APPEND is dropped: the kernel already passes the end-of-file offset for
// appends, and pwrite on an O_APPEND fd would ignore the offset.
func openFlags(flags uint32) int {
	keep := uint32(unix.O_ACCMODE | unix.O_TRUNC | unix.O_SYNC | unix.O_DSYNC)
	return int(flags&keep) | unix.O_NOFOLLOW | unix.O_CLOEXEC
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	o := n.o
	cmd := o.command(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	h, _ := f.(*handle)
	if pf := n.pinnedFd(); h == nil && pf != nil {
		// Its name is gone (noopen.go): the kept descriptor is the file.
		if !pf.writable {
			// Under o.mu (exclusive): writablePin takes it shared.
			o.mu.Unlock()
			var errno syscall.Errno
			pf, errno = n.writablePin()
			o.mu.Lock()
			if errno != 0 {
				return errno
			}
		}
		h = &handle{fd: pf.fd, o: o, path: pf.path, writable: true}
	} else if errno := n.copyUpEntry(); errno != 0 {
		return errno
	}
	p, ok := n.path()
	if !ok && h == nil {
		return syscall.ESTALE
	}
	up := o.fds[0]
	if m, ok2 := in.GetMode(); ok2 {
		var err error
		if h != nil {
			err = unix.Fchmod(h.fd, m&07777)
		} else {
			err = fchmodat(up, rel(p), m&07777, 0)
		}
		if err != nil {
			return errnoOf(err)
		}
		o.rec.op(Record{Command: cmd, Op: "chmod", Path: p})
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		var err error
		if h != nil {
			err = unix.Fchown(h.fd, u, g)
		} else {
			err = fchownat(up, rel(p), u, g, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil {
			return errnoOf(err)
		}
	}
	if sz, ok2 := in.GetSize(); ok2 {
		var err error
		if h != nil && h.writable {
			err = unix.Ftruncate(h.fd, int64(sz))
		} else {
			var fd int
			fd, err = openat(up, p, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err == nil {
				err = unix.Ftruncate(fd, int64(sz))
				unix.Close(fd)
			}
		}
		if err != nil {
			return errnoOf(err)
		}
		rc := cmd
		if h != nil && h.command != "" {
			rc = h.command
		}
		o.rec.op(Record{Command: rc, Op: "truncate", Path: p, Offset: int64(sz)})
	}
	if in.Valid&fuse.FATTR_KILL_SUIDGID != 0 && n.StableAttr().Mode == unix.S_IFREG {
		// A chown, or a truncate by a caller without CAP_FSETID
		// (killpriv.go).
		var errno syscall.Errno
		if h != nil && h.lowerOf == nil {
			errno = killPrivs(h.fd) // an upper file (fchmod needs no write access)
		} else if !ok {
			errno = syscall.ESTALE
		} else if fd, err := openat(up, p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			errno = errnoOf(err)
		} else {
			errno = killPrivs(fd)
			unix.Close(fd)
		}
		if errno != 0 {
			return errno
		}
	}
	mt, mok := in.GetMTime()
	at, aok := in.GetATime()
	if mok || aok {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if aok {
			ts[0] = unix.NsecToTimespec(at.UnixNano())
		}
		if mok {
			ts[1] = unix.NsecToTimespec(mt.UnixNano())
		}
		var err error
		if h != nil {
			err = unix.UtimesNanoAt(h.fd, "", ts, unix.AT_EMPTY_PATH)
		} else {
			err = utimesNanoAt(up, rel(p), ts, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil {
			return errnoOf(err)
		}
	}
	var st unix.Stat_t
	var err error
	if h != nil {
		err = unix.Fstat(h.fd, &st)
	} else {
		err = fstatat(up, rel(p), &st, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return errnoOf(err)
	}
	fillAttr(&st, &out.Attr)
	return 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	n.o.mu.RLock()
	defer n.o.mu.RUnlock()
	p, ok := n.path()
	if !ok {
		return nil, syscall.ESTALE
	}
	buf := make([]byte, 4096)
	for {
		sz, err := readlinkat(n.o.fds[n.layer], p, buf)
		if err != nil {
			return nil, errnoOf(err)
		}
		if sz < len(buf) {
			return buf[:sz], 0
		}
		buf = make([]byte, len(buf)*4)
	}
}
