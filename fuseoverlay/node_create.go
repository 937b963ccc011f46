package fuseoverlay

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// command attributes a request to its command through Options.Owner.
func (o *ofs) command(ctx context.Context) string {
	if o.rec == nil || o.owner == nil {
		return ""
	}
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return ""
	}
	return o.owner(c.Pid)
}

// chownToCaller gives a new upper entry the caller's ids when they differ
// from the server's (best effort, like the kernel creating as the caller).
func (o *ofs) chownToCaller(ctx context.Context, p string) {
	c, ok := fuse.FromContext(ctx)
	if !ok || (int(c.Uid) == o.euid && int(c.Gid) == o.egid) {
		return
	}
	_ = fchownat(o.fds[0], p, int(c.Uid), int(c.Gid), unix.AT_SYMLINK_NOFOLLOW)
}

// settleNew gives the entry just created at p (fd, or -1 to go by path)
// the caller's ids and exactly the permission bits of the request. The
// kernel has applied the caller's umask to mode already (the mount does not
// ask for FUSE_CAP_DONT_MASK), but creating in the upper applies this
// process's umask a second time, and chown clears set-id bits. Setting the
// server's umask to 0 instead would change it for the whole process (umask
// is per process, and the holder creates files of its own), so the bits are
// put right here, after the chown.
func (o *ofs) settleNew(ctx context.Context, p string, fd int, mode uint32) error {
	var st unix.Stat_t
	var err error
	if fd >= 0 {
		err = unix.Fstat(fd, &st)
	} else {
		err = fstatat(o.fds[0], p, &st, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return err
	}
	chowned := false
	if c, ok := fuse.FromContext(ctx); ok && (int(c.Uid) != o.euid || int(c.Gid) != o.egid) {
		gid := int(c.Gid)
		if st.Gid != uint32(o.egid) {
			gid = -1 // inherited from a set-group-ID directory, as the kernel does
		}
		if fd >= 0 {
			err = unix.Fchown(fd, int(c.Uid), gid)
		} else {
			err = fchownat(o.fds[0], p, int(c.Uid), gid, unix.AT_SYMLINK_NOFOLLOW)
		}
		chowned = err == nil // best effort, like chownToCaller
	}
	want := mode & 07777
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		want |= st.Mode & unix.S_ISGID // a set-group-ID parent passes it on
	}
	if st.Mode&07777 == want && !(chowned && want&(unix.S_ISUID|unix.S_ISGID) != 0) {
		return nil
	}
	if fd >= 0 {
		return unix.Fchmod(fd, want)
	}
	return fchmodat(o.fds[0], p, want, 0)
}

// clearWhiteout removes a whiteout at p in the upper; it reports whether
// there was one. Any other entry there is EEXIST.
func (o *ofs) clearWhiteout(p string) (bool, syscall.Errno) {
	var st unix.Stat_t
	err := fstatat(o.fds[0], p, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.ENOENT {
		return false, 0
	}
	if err != nil {
		return false, errnoOf(err)
	}
	if !isWhiteout(o.fds[0], p, &st) {
		return false, syscall.EEXIST
	}
	return true, errnoOf(unlinkat(o.fds[0], p, 0))
}

// makeNew creates the new upper entry name in n with mk: the parent is
// copied up and a whiteout in the way is removed first (mk needs the name
// free), then put back if mk fails, so a failed create never lets a deleted
// lower entry show again. hadWhiteout tells mk that lower content was hidden
// there. Callers hold o.mu.
func (n *node) makeNew(name string, mk func(p string, hadWhiteout bool) error) (string, syscall.Errno) {
	if errno := n.copyUpDir(); errno != 0 {
		return "", errno
	}
	dp, ok := n.path()
	if !ok {
		return "", syscall.ENOENT
	}
	p := join(dp, name)
	hadWhiteout, errno := n.o.clearWhiteout(p)
	if errno != 0 {
		return "", errno
	}
	if err := mk(p, hadWhiteout); err != nil {
		if hadWhiteout {
			_ = makeWhiteout(n.o.fds[0], p)
		}
		return "", errnoOf(err)
	}
	return p, 0
}

// newUpperChild registers the freshly created upper entry at p.
func (n *node) newUpperChild(ctx context.Context, p string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	pr := probe{found: true, layer: 0}
	if err := fstatat(n.o.fds[0], p, &pr.st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, errnoOf(err)
	}
	if pr.st.Mode&unix.S_IFMT == unix.S_IFDIR {
		pr.dirLayers = []int{0}
	}
	return n.newChild(ctx, p, pr, out), 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.hidden(name) {
		return nil, nil, 0, syscall.EPERM
	}
	o := n.o
	cmd := o.command(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	fd := -1
	p, errno := n.makeNew(name, func(p string, _ bool) (err error) {
		fd, err = openat(o.fds[0], p, openFlags(flags)|unix.O_CREAT|unix.O_EXCL, mode&07777)
		if err != nil {
			return err
		}
		if err = o.settleNew(ctx, p, fd, mode); err != nil {
			unix.Close(fd)
			_ = unlinkat(o.fds[0], p, 0)
		}
		return err
	})
	if errno != 0 {
		return nil, nil, 0, errno
	}
	ch, errno := n.newUpperChild(ctx, p, out)
	if errno != 0 {
		unix.Close(fd)
		return nil, nil, 0, errno
	}
	o.rec.op(Record{Command: cmd, Op: "create", Path: p})
	if o.noOpen.Load() {
		// The kernel opens without OPEN now, and then sends no RELEASE
		// for a created file either: it gets no handle (noopen.go).
		unix.Close(fd)
		return ch, nil, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
	}
	h := o.newHandle(fd, p, cmd, flags)
	return ch, h, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.EPERM
	}
	o := n.o
	cmd := o.command(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	p, errno := n.makeNew(name, func(p string, hadWhiteout bool) error {
		if err := mkdirat(o.fds[0], p, mode&07777); err != nil {
			return err
		}
		if err := o.settleNew(ctx, p, -1, mode); err != nil {
			_ = unlinkat(o.fds[0], p, unix.AT_REMOVEDIR)
			return err
		}
		// A directory created where a whiteout hid lower content must not
		// let that content show through again: opaque, as the kernel does.
		if hadWhiteout {
			if err := setOpaque(o.fds[0], p); err != nil {
				_ = unlinkat(o.fds[0], p, unix.AT_REMOVEDIR)
				return err
			}
		}
		return nil
	})
	if errno != 0 {
		return nil, errno
	}
	ch, errno := n.newUpperChild(ctx, p, out)
	if errno != 0 {
		return nil, errno
	}
	o.rec.op(Record{Command: cmd, Op: "mkdir", Path: p})
	return ch, 0
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.EPERM
	}
	o := n.o
	cmd := o.command(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	if mode&unix.S_IFMT == unix.S_IFCHR && dev == 0 {
		return nil, syscall.EPERM // would read back as a whiteout
	}
	p, errno := n.makeNew(name, func(p string, _ bool) error {
		if err := mknodat(o.fds[0], p, mode, int(dev)); err != nil {
			return err
		}
		err := o.settleNew(ctx, p, -1, mode)
		if err != nil {
			_ = unlinkat(o.fds[0], p, 0)
		}
		return err
	})
	if errno != 0 {
		return nil, errno
	}
	ch, errno := n.newUpperChild(ctx, p, out)
	if errno != 0 {
		return nil, errno
	}
	o.rec.op(Record{Command: cmd, Op: "create", Path: p})
	return ch, 0
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.EPERM
	}
	o := n.o
	cmd := o.command(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	p, errno := n.makeNew(name, func(p string, _ bool) error { return symlinkat(target, o.fds[0], p) })
	if errno != 0 {
		return nil, errno
	}
	o.chownToCaller(ctx, p)
	ch, errno := n.newUpperChild(ctx, p, out)
	if errno != 0 {
		return nil, errno
	}
	o.rec.op(Record{Command: cmd, Op: "symlink", Path: p})
	return ch, 0
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.EPERM
	}
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	o := n.o
	cmd := o.command(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	if errno := t.copyUp(); errno != 0 {
		return nil, errno
	}
	tp, ok := t.path()
	if !ok {
		return nil, syscall.ENOENT
	}
	p, errno := n.makeNew(name, func(p string, _ bool) error { return linkat(o.fds[0], tp, o.fds[0], p, 0) })
	if errno != 0 {
		return nil, errno
	}
	var st unix.Stat_t
	if err := fstatat(o.fds[0], p, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, errnoOf(err)
	}
	fillAttr(&st, &out.Attr)
	out.Attr.Ino = t.StableAttr().Ino
	o.rec.op(Record{Command: cmd, Op: "create", Path: p})
	return t.EmbeddedInode(), 0
}
