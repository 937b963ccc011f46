package fuseoverlay

// Files are opened without OPEN (FUSE_NO_OPEN_SUPPORT).
//
// The server answers the first OPEN with ENOSYS; the kernel then opens
// every regular file of the mount without asking again, keeps its pages
// across opens (FOPEN_KEEP_CACHE semantics) and sends no RELEASE. The first
// FLUSH is answered ENOSYS too, so close(2) costs nothing either. A warm
// read of a file is then no request at all, and a cold one a LOOKUP and a
// READ. Directories are still opened (a listing needs a handle). CREATE
// returns a handle (handle.go) only until OPEN was refused: after that the
// kernel sends no RELEASE for a created file either.
//
// Requests on a file opened this way carry no handle (Fh 0): the node
// serves them (Read, Write, Fsync, ... below) from its backing file: a
// lower file's shared read-only descriptor (rofd.go), else a descriptor of
// the upper file opened for the request. The first WRITE to a lower file
// copies it up (an open for writing alone no longer does; O_TRUNC arrives
// as a SETATTR, which copies up as before).
//
// Attribution: a WRITE carries the pid of the writing thread, so it is
// credited to that thread's command (Options.Owner, cached per pid for a
// second). A write through a shared mapping arrives with pid 0, from the
// kernel's write-back; it is held until an fsync or msync of the file (the
// FSYNC request carries the syncing process) credits it to that process's
// command, and otherwise goes out with no command at the next explicit
// Flush (command end). A mapping written and unmapped without msync is
// therefore recorded without its command: the price of no OPEN (which
// attributed such writes to the handle that mapped the file).
//
// Released is called for each path and command that wrote without a
// handle at the next explicit Flush (the holder flushes at command end),
// since no RELEASE marks the end of those writes.
//
// A file unlinked, renamed over or detached by a swap while the kernel
// may still have it open is pinned first: the node keeps a descriptor of
// it (readable, and writable when it is in the upper) until the kernel
// forgets the node, so an open file stays readable and writable after its
// name is gone, as on a native filesystem.

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var (
	_ fs.NodeReader    = (*node)(nil)
	_ fs.NodeWriter    = (*node)(nil)
	_ fs.NodeWritever  = (*node)(nil)
	_ fs.NodeFsyncer   = (*node)(nil)
	_ fs.NodeAllocater = (*node)(nil)
	_ fs.NodeLseeker   = (*node)(nil)
	_ fs.NodeIoctler   = (*node)(nil)
)

// Open is answered ENOSYS, once: the kernel stops sending OPEN.
func (r *rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	r.o.noOpen.Store(true)
	return fuse.ENOSYS
}

// Release of handle 0: a file CREATE made while the kernel still sent
// OPEN, answered after OPEN was refused (no handle was given).
func (r *rawFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	if in.Fh == 0 {
		return
	}
	r.RawFileSystem.Release(cancel, in)
}

// Flush is answered ENOSYS, once: the kernel stops sending FLUSH.
func (r *rawFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	return fuse.ENOSYS
}

// pinnedFd is the descriptor a node keeps once its name is gone.
type pinnedFd struct {
	fd       int
	writable bool
	path     string // the name it had: records use it
}

// pin keeps a descriptor of the node's backing file at p in layer (caller
// holds o.mu exclusively, with the chain p is in): only regular files, and
// only once.
func (n *node) pin(layer int, p string) {
	if n.StableAttr().Mode != unix.S_IFREG {
		return
	}
	n.pinMu.Lock()
	defer n.pinMu.Unlock()
	if n.pinned != nil {
		return
	}
	// Bounded like the shared read-only descriptors (rofd.go): pins are
	// short-lived (the kernel forgets an unlinked file nobody has open),
	// but an rm -rf or a swap may make many at once.
	if n.o.pins.Add(1) > n.o.maxSharedFds {
		n.o.pins.Add(-1)
		return
	}
	flags := unix.O_RDONLY
	if layer == 0 {
		flags = unix.O_RDWR
	}
	fd, err := openat(n.o.fds[layer], p, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		n.o.pins.Add(-1)
		return // best effort: the node then answers ESTALE
	}
	n.pinned = &pinnedFd{fd: fd, writable: layer == 0, path: p}
}

// writablePin gives a node pinned read-only (a lower file whose name is
// gone) a private writable copy to pin instead: an O_TMPFILE in the work
// directory, or in the upper, that no name will ever show; as the kernel
// overlay would have copied the file up when it was opened for writing.
func (n *node) writablePin() (*pinnedFd, syscall.Errno) {
	o := n.o
	dir := o.work
	if dir < 0 {
		o.mu.RLock()
		d, err := unix.FcntlInt(uintptr(o.fds[0]), unix.F_DUPFD_CLOEXEC, 0)
		o.mu.RUnlock()
		if err != nil {
			return nil, errnoOf(err)
		}
		defer unix.Close(d)
		dir = d
	}
	n.pinMu.Lock()
	defer n.pinMu.Unlock()
	pf := n.pinned
	if pf == nil {
		return nil, syscall.ESTALE
	}
	if pf.writable {
		return pf, 0
	}
	var st unix.Stat_t
	if err := unix.Fstat(pf.fd, &st); err != nil {
		return nil, errnoOf(err)
	}
	fd, err := unix.Openat(dir, ".", unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, st.Mode&07777)
	if err != nil {
		return nil, errnoOf(err)
	}
	if err := copyData(pf.fd, fd, st.Size); err != nil {
		unix.Close(fd)
		return nil, errnoOf(err)
	}
	unix.Close(pf.fd)
	n.pinned = &pinnedFd{fd: fd, writable: true, path: pf.path}
	return n.pinned, 0
}

func (n *node) pinnedFd() *pinnedFd {
	n.pinMu.Lock()
	defer n.pinMu.Unlock()
	return n.pinned
}

// unpin closes the pinned descriptor (the kernel forgot the node).
func (n *node) unpin() {
	n.pinMu.Lock()
	pf := n.pinned
	n.pinned = nil
	n.pinMu.Unlock()
	if pf != nil {
		unix.Close(pf.fd)
		n.o.pins.Add(-1)
	}
}

// pinChild pins the node of name in n, if the kernel knows it (caller
// holds o.mu exclusively).
func (n *node) pinChild(name, p string) {
	if cn, ok := opsOf(n.GetChild(name)); ok {
		cn.pin(cn.layer, p)
	}
}

// ioFd returns a descriptor of the node's backing file for a request
// without a handle, and what to call when done with it. A write copies a
// lower file up first.
func (n *node) ioFd(write bool) (int, func(), syscall.Errno) {
	if pf := n.pinnedFd(); pf != nil {
		if write && !pf.writable {
			var errno syscall.Errno
			if pf, errno = n.writablePin(); errno != 0 {
				return -1, nil, errno
			}
		}
		return pf.fd, noop, 0
	}
	o := n.o
	if write {
		o.mu.RLock()
		lower := n.layer != 0
		o.mu.RUnlock()
		if lower {
			if errno := n.copyUpOpen(); errno != 0 {
				return -1, nil, errno
			}
		}
	}
	o.mu.RLock()
	defer o.mu.RUnlock()
	p, ok := n.path()
	if !ok {
		return -1, nil, syscall.ESTALE
	}
	if !write && n.layer != 0 && n.StableAttr().Mode == unix.S_IFREG {
		sf, shared, err := n.openShared(p)
		if err != nil {
			return -1, nil, errnoOf(err)
		}
		if shared {
			return sf.fd, func() { n.putShared(sf) }, 0
		}
	}
	flags := unix.O_RDONLY
	if write {
		flags = unix.O_WRONLY
	}
	fd, err := openat(o.fds[n.layer], p, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, errnoOf(err)
	}
	return fd, func() { unix.Close(fd) }, 0
}

// recPath is the path records name the node by.
func (n *node) recPath() string {
	if pf := n.pinnedFd(); pf != nil {
		return pf.path
	}
	n.o.mu.RLock()
	p, _ := n.path()
	n.o.mu.RUnlock()
	return p
}

func (n *node) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if h, ok := f.(*handle); ok {
		return h.Read(ctx, dest, off)
	}
	fd, done, errno := n.ioFd(false)
	if errno != 0 {
		return nil, errno
	}
	defer done()
	nr, err := unix.Pread(fd, dest, off)
	if err != nil {
		return nil, errnoOf(err)
	}
	return fuse.ReadResultData(dest[:nr]), 0
}

func (n *node) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if h, ok := f.(*handle); ok {
		return h.Write(ctx, data, off)
	}
	return n.write(ctx, [][]byte{data}, off)
}

func (n *node) Writev(ctx context.Context, f fs.FileHandle, data [][]byte, off int64) (uint32, syscall.Errno) {
	if h, ok := f.(*handle); ok {
		return h.Writev(ctx, data, off)
	}
	return n.write(ctx, data, off)
}

func (n *node) write(ctx context.Context, iov [][]byte, off int64) (uint32, syscall.Errno) {
	fd, done, errno := n.ioFd(true)
	if errno != 0 {
		return 0, errno
	}
	if n.o.kill.marked(ctx) {
		if errno := killPrivs(fd); errno != 0 {
			done()
			return 0, errno
		}
	}
	var w int
	var err error
	if len(iov) == 1 {
		w, err = unix.Pwrite(fd, iov[0], off)
	} else {
		w, err = unix.Pwritev(fd, iov, off)
	}
	done()
	if w > 0 {
		n.recordWrite(ctx, off, int64(w))
		return uint32(w), 0
	}
	return 0, errnoOf(err)
}

func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	o := n.o
	if c, ok := fuse.FromContext(ctx); ok && c.Pid != 0 {
		o.settlePending(n, o.ownerOf(c.Pid))
	}
	if h, ok := f.(*handle); ok {
		return h.Fsync(ctx, flags)
	}
	o.mu.RLock()
	lower := n.layer != 0
	o.mu.RUnlock()
	var errno syscall.Errno
	if !lower || n.pinnedFd() != nil {
		fd, done, e := n.ioFd(false)
		if e != 0 {
			return e
		}
		if flags&1 != 0 {
			errno = errnoOf(unix.Fdatasync(fd))
		} else {
			errno = errnoOf(unix.Fsync(fd))
		}
		done()
	}
	o.rec.flush()
	return errno
}

func (n *node) Allocate(ctx context.Context, f fs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	if h, ok := f.(*handle); ok {
		return h.Allocate(ctx, off, size, mode)
	}
	fd, done, errno := n.ioFd(true)
	if errno != 0 {
		return errno
	}
	defer done()
	return errnoOf(unix.Fallocate(fd, mode, int64(off), int64(size)))
}

func (n *node) Lseek(ctx context.Context, f fs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	if h, ok := f.(*handle); ok {
		return h.Lseek(ctx, off, whence)
	}
	fd, done, errno := n.ioFd(false)
	if errno != 0 {
		return 0, errno
	}
	defer done()
	r, err := unix.Seek(fd, int64(off), int(whence))
	if err != nil {
		return 0, errnoOf(err)
	}
	return uint64(r), 0
}

// Ioctl is refused: ioctls such as FICLONE would change data unrecorded.
func (n *node) Ioctl(ctx context.Context, f fs.FileHandle, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	return 0, syscall.ENOTTY
}

// ------------------------------------------------------------ attribution

// ownerTTL bounds how long a pid's command is reused without asking
// Options.Owner again: far shorter than the time the kernel takes to hand
// the same pid to another process.
const ownerTTL = time.Second

type ownerEntry struct {
	cmd string
	at  time.Time
}

// ownerOf is Options.Owner(pid), cached for ownerTTL.
func (o *ofs) ownerOf(pid uint32) string {
	if o.owner == nil || o.rec == nil {
		return ""
	}
	now := time.Now()
	o.ownersMu.Lock()
	e, hit := o.owners[pid]
	o.ownersMu.Unlock()
	if hit && now.Sub(e.at) < ownerTTL {
		return e.cmd
	}
	cmd := o.owner(pid)
	o.ownersMu.Lock()
	if o.owners == nil || len(o.owners) >= 4096 {
		o.owners = map[uint32]ownerEntry{}
	}
	o.owners[pid] = ownerEntry{cmd: cmd, at: now}
	o.ownersMu.Unlock()
	return cmd
}

// pendingWrite is a write through a shared mapping, waiting for the
// fsync that names its process.
type pendingWrite struct {
	n   *node
	rec Record
}

// maxPending bounds the held mapped writes; past it they go out without a
// command.
const maxPending = 4096

// recordWrite records w bytes written at off without a handle.
func (n *node) recordWrite(ctx context.Context, off, w int64) {
	o := n.o
	if o.rec == nil {
		return
	}
	p := n.recPath()
	c, _ := fuse.FromContext(ctx)
	if c == nil || c.Pid == 0 {
		o.pendMu.Lock()
		o.pending = append(o.pending, pendingWrite{n: n, rec: Record{Time: time.Now(), Op: "write", Path: p, Offset: off, Length: w}})
		over := len(o.pending) > maxPending
		o.pendMu.Unlock()
		if over {
			o.settlePending(nil, "")
		}
		return
	}
	cmd := o.ownerOf(c.Pid)
	o.rec.write(&n.ru, cmd, p, off, w)
	o.wroteMu.Lock()
	if o.wrote == nil {
		o.wrote = map[[2]string]bool{}
	}
	o.wrote[[2]string{p, cmd}] = true
	o.wroteMu.Unlock()
}

// settlePending credits the held mapped writes of n (nil: all) to cmd.
func (o *ofs) settlePending(n *node, cmd string) {
	o.pendMu.Lock()
	var take []Record
	keep := o.pending[:0]
	for _, pw := range o.pending {
		if n == nil || pw.n == n {
			pw.rec.Command = cmd
			take = append(take, pw.rec)
		} else {
			keep = append(keep, pw)
		}
	}
	clear(o.pending[len(keep):])
	o.pending = keep
	o.pendMu.Unlock()
	for _, r := range take {
		o.rec.add(r)
	}
}

// flushAll is an explicit flush: held mapped writes go out (without a
// command), then every record, then Released for the paths written
// without a handle.
func (o *ofs) flushAll() {
	o.settlePending(nil, "")
	o.rec.flush()
	o.wroteMu.Lock()
	wrote := o.wrote
	o.wrote = nil
	o.wroteMu.Unlock()
	if o.released == nil || len(wrote) == 0 {
		return
	}
	keys := make([][2]string, 0, len(wrote))
	for k := range wrote {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [2]string) int {
		if c := strings.Compare(a[0], b[0]); c != 0 {
			return c
		}
		return strings.Compare(a[1], b[1])
	})
	for _, k := range keys {
		o.released(k[0], k[1])
	}
}

// ------------------------------------------------------------ writers

// mountID finds the id of the mount at mountpoint in /proc/self/mountinfo
// (the newest one there), 0 if none.
func mountID(mountpoint string) uint64 {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0
	}
	mp := filepath.Clean(mountpoint)
	var id uint64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && unescapeMountinfo(f[4]) == mp {
			id, _ = strconv.ParseUint(f[0], 10, 64)
		}
	}
	return id
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 and the like).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// procWriters lists the files of this mount that processes have open for
// writing without a handle (the kernel sent no OPEN), from /proc: the
// path by the node that shows the descriptor's inode number, the command
// by the process (caller holds o.mu exclusively).
func (o *ofs) procWriters() []OpenHandle {
	if o.mntID == 0 {
		return nil
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	type hit struct {
		pid uint32
		ino uint64
	}
	var hits []hit
	for _, pe := range procs {
		pid, err := strconv.ParseUint(pe.Name(), 10, 32)
		if err != nil {
			continue
		}
		dir := "/proc/" + pe.Name() + "/fdinfo"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fe := range fds {
			b, err := os.ReadFile(dir + "/" + fe.Name())
			if err != nil {
				continue
			}
			var mnt, flags, ino uint64
			for _, line := range strings.Split(string(b), "\n") {
				k, v, ok := strings.Cut(line, ":")
				if !ok {
					continue
				}
				v = strings.TrimSpace(v)
				switch k {
				case "mnt_id":
					mnt, _ = strconv.ParseUint(v, 10, 64)
				case "flags":
					flags, _ = strconv.ParseUint(v, 8, 64)
				case "ino":
					ino, _ = strconv.ParseUint(v, 10, 64)
				}
			}
			if mnt == o.mntID && flags&unix.O_ACCMODE != unix.O_RDONLY && ino != 0 {
				hits = append(hits, hit{uint32(pid), ino})
			}
		}
	}
	if len(hits) == 0 {
		return nil
	}
	paths := map[uint64]string{}
	var walk func(n *node)
	walk = func(n *node) {
		for _, ch := range n.Children() {
			cn, ok := opsOf(ch)
			if !ok {
				continue
			}
			if cn.isDir() {
				walk(cn)
				continue
			}
			if _, seen := paths[ch.StableAttr().Ino]; !seen {
				if p, ok := cn.path(); ok {
					paths[ch.StableAttr().Ino] = p
				}
			}
		}
	}
	walk(o.root)
	seen := map[OpenHandle]bool{}
	var out []OpenHandle
	for _, h := range hits {
		p, ok := paths[h.ino]
		if !ok {
			continue // a file whose name is gone: its writes stay where they were
		}
		oh := OpenHandle{Path: p, Command: o.ownerOf(h.pid)}
		if !seen[oh] {
			seen[oh] = true
			out = append(out, oh)
		}
	}
	return out
}
