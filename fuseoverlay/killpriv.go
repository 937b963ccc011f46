package fuseoverlay

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Set-id bits and file capabilities (FUSE_HANDLE_KILLPRIV_V2).
//
// Without it the kernel asks GETXATTR security.capability before every
// write(2) to decide whether the write must drop privileges. With it the
// superblock is SB_NOSEC, so the kernel asks once per inode, and the server
// does the clearing the kernel would have done: on a WRITE carrying
// FUSE_WRITE_KILL_SUIDGID (the writer lacks CAP_FSETID and the file has
// S_ISUID, or S_ISGID with S_IXGRP) and on a SETATTR carrying
// FATTR_KILL_SUIDGID (a truncate by such a caller, and every chown of a
// non-directory). The server itself holds CAP_FSETID in its namespace, so
// its own pwrite/ftruncate on the backing file would keep the bits: it has
// to clear them explicitly, with the kernel's rule (should_remove_suid):
// S_ISUID always, S_ISGID only with S_IXGRP, and security.capability.

// killMarks carries WRITE's kill flag to the handle: go-fuse's node API
// passes the request's cancel channel (in fuse.Context) but not the
// write flags, so rawFS marks the channel, unique to the request while it
// runs, and the handle looks it up.
type killMarks struct {
	n  atomic.Int32 // marks present: the common case skips the map
	mu sync.Mutex
	m  map[<-chan struct{}]struct{}
}

func (k *killMarks) mark(c <-chan struct{}) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[<-chan struct{}]struct{}{}
	}
	k.m[c] = struct{}{}
	k.mu.Unlock()
	k.n.Add(1)
}

func (k *killMarks) unmark(c <-chan struct{}) {
	k.n.Add(-1)
	k.mu.Lock()
	delete(k.m, c)
	k.mu.Unlock()
}

// marked reports whether the request of ctx asked to clear set-id bits.
func (k *killMarks) marked(ctx context.Context) bool {
	if k.n.Load() == 0 {
		return false
	}
	c, ok := ctx.(*fuse.Context)
	if !ok || c.Cancel == nil {
		return false
	}
	k.mu.Lock()
	_, hit := k.m[c.Cancel]
	k.mu.Unlock()
	return hit
}

// rawFS is go-fuse's node bridge with the WRITE flags passed on.
type rawFS struct {
	fuse.RawFileSystem
	kill *killMarks
	o    *ofs
}

func (r *rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		r.kill.mark(cancel)
		defer r.kill.unmark(cancel)
	}
	return r.RawFileSystem.Write(cancel, in, data)
}

func (r *rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		r.kill.mark(cancel)
		defer r.kill.unmark(cancel)
	}
	return r.RawFileSystem.Writev(cancel, in, data)
}

// killPrivs drops what a write or truncate by an unprivileged caller
// drops: S_ISUID, S_ISGID when group-executable, and security.capability.
func killPrivs(fd int) syscall.Errno {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return errnoOf(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0
	}
	mode := st.Mode & 07777
	keep := mode &^ unix.S_ISUID
	if mode&(unix.S_ISGID|unix.S_IXGRP) == unix.S_ISGID|unix.S_IXGRP {
		keep &^= unix.S_ISGID
	}
	if keep != mode {
		if err := unix.Fchmod(fd, keep); err != nil {
			return errnoOf(err)
		}
	}
	// Most files have none (ENODATA); a namespace may refuse it (EPERM).
	_ = unix.Fremovexattr(fd, "security.capability")
	return 0
}
