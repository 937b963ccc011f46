package fuseoverlay

import (
	"context"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// Read-only opens of lower files share one descriptor per node.
//
// A warm read of a small file costs the kernel an OPEN and a RELEASE (the
// data comes from the page cache, which FOPEN_KEEP_CACHE keeps across
// opens). Profiles of that workload put about a fifth of the server's time
// in the openat and close of the backing file. A lower file never changes
// and a read-only handle records nothing, so one descriptor opened at the
// first read-only open serves every later one until the kernel forgets the
// node. Writers never share it: they open their own (upper) descriptor, so
// write attribution stays per handle.

// sharedFdLimit bounds the descriptors held by read-only slots: at most a
// quarter of the process's descriptor limit, which the holder shares with
// everything else it does, and never more than 4096. Past the bound, opens
// fall back to a descriptor per handle.
func sharedFdLimit() int64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return int64(min(rl.Cur/4, 4096))
}

// sharedFd is a read-only descriptor of a lower file. refs counts the node's
// cache slot and every handle using it; the last one closes it.
type sharedFd struct {
	fd int
	// lf owns fd (its *os.File closes it when collected), so every handle
	// sharing fd uses this one.
	lf   *fs.LoopbackFile
	refs int // guarded by the node's roMu
}

// openShared returns the node's shared descriptor for a read-only open of
// the lower file at p (caller holds o.mu shared, and n.layer > 0), taking
// a reference for the handle; ok is false when none can be shared (the
// bound is reached): the caller then opens its own.
func (n *node) openShared(p string) (sf *sharedFd, ok bool, err error) {
	n.roMu.Lock()
	defer n.roMu.Unlock()
	if n.ro == nil {
		if n.o.sharedFds.Add(1) > n.o.maxSharedFds {
			n.o.sharedFds.Add(-1)
			return nil, false, nil
		}
		fd, err := openat(n.o.fds[n.layer], p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			n.o.sharedFds.Add(-1)
			return nil, false, err
		}
		n.ro = &sharedFd{fd: fd, lf: fs.NewLoopbackFile(fd).(*fs.LoopbackFile), refs: 1}
	}
	n.ro.refs++
	return n.ro, true, nil
}

// putShared drops one reference to sf, closing it with the last.
func (n *node) putShared(sf *sharedFd) {
	n.roMu.Lock()
	defer n.roMu.Unlock()
	sf.refs--
	if sf.refs == 0 {
		sf.lf.Release(context.Background())
		n.o.sharedFds.Add(-1)
	}
}

// dropShared releases the node's cache slot: at copy-up (the lower file no
// longer backs the node) and when the kernel forgets the node. Handles
// still reading through it keep it open until they are released.
func (n *node) dropShared() {
	n.roMu.Lock()
	sf := n.ro
	n.ro = nil
	n.roMu.Unlock()
	if sf != nil {
		n.putShared(sf)
	}
}
