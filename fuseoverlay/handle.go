package fuseoverlay

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// handle is a file CREATE made while the kernel still sent OPEN (files
// are otherwise opened without a handle: noopen.go). It is attributed to
// the command that created it: every write through it (including mmap
// writes, which the kernel sends with pid 0) is recorded for that command.
type handle struct {
	*fs.LoopbackFile
	fd       int
	o        *ofs
	path     string // at open; records use it (an unlinked file has no other)
	command  string
	writable bool
	wrote    atomic.Bool
	ru       run // guarded by o.rec.mu

	// lowerOf is the node of a read-only handle opened on a lower file.
	// Once that node is copied up, reads go to the upper copy (opened
	// lazily into upper): the lower file no longer shows writes made
	// through other handles.
	lowerOf *node
	mu      sync.Mutex
	upper   *fs.LoopbackFile
	// shared is the node's shared read-only descriptor (rofd.go) when fd
	// is that one: release drops a reference instead of closing it.
	shared *sharedFd
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if h.lowerOf != nil && h.lowerOf.copiedUp.Load() {
		u, errno := h.upperFile()
		if errno != 0 {
			return nil, errno
		}
		return u.Read(ctx, dest, off)
	}
	return h.LoopbackFile.Read(ctx, dest, off)
}

func (h *handle) upperFile() (*fs.LoopbackFile, syscall.Errno) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.upper != nil {
		return h.upper, 0
	}
	n := h.lowerOf
	n.o.mu.RLock()
	p, ok := n.path()
	var fd int
	var err error
	if ok {
		// Under the lock: an upper swap replaces the upper.
		fd, err = openat(n.o.fds[0], p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	n.o.mu.RUnlock()
	if !ok {
		return h.LoopbackFile, 0 // unlinked since: the lower copy is all there is
	}
	if err != nil {
		return nil, errnoOf(err)
	}
	h.upper = fs.NewLoopbackFile(fd).(*fs.LoopbackFile)
	return h.upper, 0
}

// newHandle makes the handle of an open file (caller holds o.mu, shared
// or exclusive, so an upper swap sees every writable handle; see
// ofs.writers).
func (o *ofs) newHandle(fd int, path, command string, flags uint32) *handle {
	h := &handle{
		LoopbackFile: fs.NewLoopbackFile(fd).(*fs.LoopbackFile),
		fd:           fd,
		o:            o,
		path:         path,
		command:      command,
		writable:     flags&syscall.O_ACCMODE != syscall.O_RDONLY,
	}
	if h.writable {
		o.writersMu.Lock()
		o.writers[h] = struct{}{}
		o.writersMu.Unlock()
	}
	return h
}

// PassthroughFd refuses FUSE passthrough: it would hide writes from the
// recorder (and needs CAP_SYS_ADMIN in the initial namespace anyway).
func (h *handle) PassthroughFd() (int, bool) { return -1, false }

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if h.o.kill.marked(ctx) {
		if errno := killPrivs(h.fd); errno != 0 {
			return 0, errno
		}
	}
	n, errno := h.LoopbackFile.Write(ctx, data, off)
	if n > 0 {
		h.wrote.Store(true)
		h.o.rec.write(&h.ru, h.command, h.path, off, int64(n))
	}
	return n, errno
}

func (h *handle) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	if h.o.kill.marked(ctx) {
		if errno := killPrivs(h.fd); errno != 0 {
			return 0, errno
		}
	}
	n, errno := h.LoopbackFile.Writev(ctx, data, off)
	if n > 0 {
		h.wrote.Store(true)
		h.o.rec.write(&h.ru, h.command, h.path, off, int64(n))
	}
	return n, errno
}

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	errno := h.LoopbackFile.Fsync(ctx, flags)
	h.o.rec.flush()
	return errno
}

// Ioctl is refused: ioctls such as FICLONE would change data unrecorded.
func (h *handle) Ioctl(ctx context.Context, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	return 0, syscall.ENOTTY
}

func (h *handle) Release(ctx context.Context) syscall.Errno {
	if h.writable {
		h.o.writersMu.Lock()
		delete(h.o.writers, h)
		h.o.writersMu.Unlock()
	}
	var errno syscall.Errno
	if h.shared != nil {
		h.lowerOf.putShared(h.shared)
	} else {
		errno = h.LoopbackFile.Release(ctx)
	}
	h.mu.Lock()
	if h.upper != nil {
		h.upper.Release(ctx)
	}
	h.mu.Unlock()
	if h.wrote.Load() {
		h.o.rec.flush()
		if h.o.released != nil {
			h.o.released(h.path, h.command)
		}
	}
	return errno
}
