package fuseoverlay

import (
	"context"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
)

// handle is an open file. It is attributed to the command that opened it:
// every write through it (including mmap and page-cache writes, which the
// kernel sends with pid 0) is recorded for that command.
type handle struct {
	*fs.LoopbackFile
	fd       int
	o        *ofs
	path     string // at open; records use it (an unlinked file has no other)
	command  string
	writable bool
	wrote    atomic.Bool
	ru       run // guarded by o.rec.mu
}

func (o *ofs) newHandle(fd int, path, command string, flags uint32) *handle {
	return &handle{
		LoopbackFile: fs.NewLoopbackFile(fd).(*fs.LoopbackFile),
		fd:           fd,
		o:            o,
		path:         path,
		command:      command,
		writable:     flags&syscall.O_ACCMODE != syscall.O_RDONLY,
	}
}

// PassthroughFd refuses FUSE passthrough: it would hide writes from the
// recorder (and needs CAP_SYS_ADMIN in the initial namespace anyway).
func (h *handle) PassthroughFd() (int, bool) { return -1, false }

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, errno := h.LoopbackFile.Write(ctx, data, off)
	if n > 0 {
		h.wrote.Store(true)
		h.o.rec.write(&h.ru, h.command, h.path, off, int64(n))
	}
	return n, errno
}

func (h *handle) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
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
	errno := h.LoopbackFile.Release(ctx)
	if h.wrote.Load() {
		h.o.rec.flush()
		if h.o.released != nil {
			h.o.released(h.path, h.command)
		}
	}
	return errno
}
