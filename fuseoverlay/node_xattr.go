package fuseoverlay

import (
	"context"
	"syscall"

	"golang.org/x/sys/unix"
)

// xattrFd opens the node's topmost entry for xattr access.
func (n *node) xattrFd() (int, syscall.Errno) {
	p, ok := n.path()
	if !ok {
		return -1, syscall.ESTALE
	}
	fd, err := openForXattr(n.o.fds[n.layer], p)
	if err == unix.ENOTSUP {
		return -1, syscall.ENODATA
	}
	return fd, errnoOf(err)
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if isOverlayXattr(attr) {
		return 0, syscall.ENODATA
	}
	n.o.mu.RLock()
	fd, errno := n.xattrFd()
	n.o.mu.RUnlock()
	if errno == syscall.ENODATA {
		return 0, errno
	}
	if errno != 0 {
		return 0, errno
	}
	defer unix.Close(fd)
	sz, err := unix.Fgetxattr(fd, attr, dest)
	if err == unix.ERANGE {
		sz, err = unix.Fgetxattr(fd, attr, nil)
		if err == nil {
			return uint32(sz), syscall.ERANGE
		}
	}
	return uint32(sz), errnoOf(err)
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	n.o.mu.RLock()
	fd, errno := n.xattrFd()
	n.o.mu.RUnlock()
	if errno == syscall.ENODATA {
		return 0, 0
	}
	if errno != 0 {
		return 0, errno
	}
	defer unix.Close(fd)
	sz, err := unix.Flistxattr(fd, nil)
	if err != nil {
		return 0, errnoOf(err)
	}
	buf := make([]byte, sz+64)
	sz, err = unix.Flistxattr(fd, buf)
	if err != nil {
		return 0, errnoOf(err)
	}
	var out []byte
	for _, nm := range splitNul(buf[:sz]) {
		if !isOverlayXattr(nm) {
			out = append(out, nm...)
			out = append(out, 0)
		}
	}
	if len(dest) < len(out) {
		return uint32(len(out)), syscall.ERANGE
	}
	copy(dest, out)
	return uint32(len(out)), 0
}

func splitNul(b []byte) []string {
	var out []string
	start := 0
	for i, c := range b {
		if c == 0 {
			if i > start {
				out = append(out, string(b[start:i]))
			}
			start = i + 1
		}
	}
	return out
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if isOverlayXattr(attr) {
		return syscall.EPERM
	}
	return n.xattrChange(func(fd int) error { return unix.Fsetxattr(fd, attr, data, int(flags)) })
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if isOverlayXattr(attr) {
		return syscall.ENODATA
	}
	return n.xattrChange(func(fd int) error { return unix.Fremovexattr(fd, attr) })
}

func (n *node) xattrChange(fn func(fd int) error) syscall.Errno {
	n.o.mu.Lock()
	defer n.o.mu.Unlock()
	if errno := n.copyUpEntry(); errno != 0 {
		return errno
	}
	fd, errno := n.xattrFd()
	if errno == syscall.ENODATA {
		return syscall.EPERM
	}
	if errno != 0 {
		return errno
	}
	defer unix.Close(fd)
	return errnoOf(fn(fd))
}
