package fuseoverlay

import (
	"context"
	"hash/fnv"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// ofs is the state shared by all nodes of one mount.
type ofs struct {
	// mu orders namespace changes (create, copy-up, unlink, rename, ...)
	// against lookups and readdir: writers take it exclusively, readers
	// shared. Data reads and writes on open handles do not take it.
	mu sync.RWMutex

	// fds, files and devs describe the chain: [0] upper, [1:] lowers
	// newest first. SwapLower replaces them (under mu, exclusively), so
	// code that runs without mu uses upper, which never changes.
	fds      []int
	files    []*os.File
	devs     []uint64
	upper    int
	upperDev uint64
	work     int // staging dir fd, or -1: stage in upper/.esbx-tmp
	// stageMu guards the hidden staging dir's reference count.
	stageMu   sync.Mutex
	stageRefs int
	stageFd   int
	hideTmp   bool // the root hides stagingName
	euid      int
	egid      int
	seq       atomic.Uint64

	// origin maps the inode number of a copied-up upper entry to the number
	// it had in its lower layer, so st_ino survives copy-up.
	originMu sync.Mutex
	origin   map[uint64]uint64

	rec      *recorder
	owner    func(pid uint32) string
	released func(path, command string)

	// root is the mount's root node, where SwapLower starts its walk.
	root *node
}

// node is one merged entry. Its layer state is guarded by ofs.mu.
type node struct {
	fs.Inode
	o *ofs
	// layer is the topmost layer holding the entry (0 = upper).
	layer int
	// dirLayers lists, for a directory, the layers whose directories merge
	// into it, topmost first (it stops at an opaque directory).
	dirLayers []int
	// copiedUp is set when a lower entry moved to the upper, so handles
	// opened on the lower file switch to the upper copy (see handle.fd).
	copiedUp atomic.Bool
	// cuMu serializes copyUpOpen of this node.
	cuMu sync.Mutex
}

var (
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeReadlinker     = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeStatfser       = (*node)(nil)
	_ fs.NodeGetxattrer     = (*node)(nil)
	_ fs.NodeSetxattrer     = (*node)(nil)
	_ fs.NodeListxattrer    = (*node)(nil)
	_ fs.NodeRemovexattrer  = (*node)(nil)
)

// path returns the node's path relative to the mount root; ok is false for
// a node that is no longer linked into the tree (unlinked while open).
func (n *node) path() (string, bool) {
	var segs []string
	in := &n.Inode
	for !in.IsRoot() {
		name, parent := in.Parent()
		if parent == nil {
			return "", false
		}
		segs = append(segs, name)
		in = parent
	}
	p := ""
	for i := len(segs) - 1; i >= 0; i-- {
		p = join(p, segs[i])
	}
	return p, true
}

func (n *node) isDir() bool { return n.StableAttr().Mode == syscall.S_IFDIR }

func (n *node) parentNode() *node {
	_, p := n.Parent()
	if p == nil {
		return nil
	}
	return p.Operations().(*node)
}

// hidden reports whether name is never visible in the directory: the
// reserved .wh.* names and the root's staging directory.
func (n *node) hidden(name string) bool {
	if kind, _ := parseName(name); kind != namePlain {
		return true
	}
	return n.o.hideTmp && name == stagingName && n.IsRoot()
}

// probe is the result of a merged lookup of one name.
type probe struct {
	found     bool
	st        unix.Stat_t
	layer     int
	dirLayers []int
	// origin is, for an upper entry that a lower also has at the same path
	// (a copy-up from before a remount), the lower's inode number.
	origin uint64
}

// probe resolves name in the directory dp whose merged layers are layers,
// honouring whiteouts (both encodings, and OCI .wh.<name> in lowers) and
// opaque directories (contract §8.4).
func (o *ofs) probe(layers []int, dp, name string) (probe, syscall.Errno) {
	var res probe
	p := join(dp, name)
	for _, l := range layers {
		fd := o.fds[l]
		var st unix.Stat_t
		err := fstatat(fd, p, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == unix.ENOENT || err == unix.ENOTDIR {
			if l > 0 {
				var wst unix.Stat_t
				if fstatat(fd, join(dp, whPrefix+name), &wst, unix.AT_SYMLINK_NOFOLLOW) == nil {
					break
				}
			}
			continue
		}
		if err != nil {
			return res, errnoOf(err)
		}
		if isWhiteout(fd, p, &st) {
			break
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if !res.found {
			res.found, res.st, res.layer = true, st, l
			if !isDir {
				if l == 0 && len(layers) > 1 && !o.hasOrigin(st.Ino) {
					res.origin = o.lowerOrigin(layers[1:], dp, name)
				}
				break
			}
			res.dirLayers = []int{l}
			if isOpaque(fd, p) {
				break
			}
			continue
		}
		if !isDir {
			break // a non-directory below a directory is hidden, and so is all below it
		}
		if len(res.dirLayers) == 1 && res.layer == 0 {
			res.origin = stableIno(&st, o.upperDev)
		}
		res.dirLayers = append(res.dirLayers, l)
		if isOpaque(fd, p) {
			break
		}
	}
	return res, 0
}

// lowerHas reports whether a lower layer of the parent dp would show name
// if the upper had nothing there: then deleting it needs a whiteout.
func (o *ofs) lowerHas(parentLayers []int, dp, name string) bool {
	var lowers []int
	for _, l := range parentLayers {
		if l > 0 {
			lowers = append(lowers, l)
		}
	}
	if len(lowers) == 0 {
		return false
	}
	pr, errno := o.probe(lowers, dp, name)
	return errno != 0 || pr.found
}

// lowerOrigin finds the inode number of the non-directory that the lower
// layers hold at dp/name, ignoring whatever the upper has there; 0 if none.
func (o *ofs) lowerOrigin(lowers []int, dp, name string) uint64 {
	p := join(dp, name)
	for _, l := range lowers {
		var st unix.Stat_t
		err := fstatat(o.fds[l], p, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			var wst unix.Stat_t
			if fstatat(o.fds[l], join(dp, whPrefix+name), &wst, unix.AT_SYMLINK_NOFOLLOW) == nil {
				return 0
			}
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR || isWhiteout(o.fds[l], p, &st) {
			return 0
		}
		return stableIno(&st, o.upperDev)
	}
	return 0
}

func (o *ofs) hasOrigin(upperIno uint64) bool {
	o.originMu.Lock()
	_, ok := o.origin[upperIno]
	o.originMu.Unlock()
	return ok
}

// noteOrigin remembers the number an upper entry shows (its lower's).
func (o *ofs) noteOrigin(upperIno, origin uint64) {
	o.originMu.Lock()
	o.origin[upperIno] = origin
	o.originMu.Unlock()
}

func (o *ofs) inoFor(layer int, st *unix.Stat_t) uint64 {
	if layer == 0 {
		o.originMu.Lock()
		v, ok := o.origin[st.Ino]
		o.originMu.Unlock()
		if ok {
			return v
		}
	}
	return stableIno(st, o.upperDev)
}

func (o *ofs) forgetOrigin(upperIno uint64) {
	o.originMu.Lock()
	delete(o.origin, upperIno)
	o.originMu.Unlock()
}

func fillAttr(st *unix.Stat_t, a *fuse.Attr) {
	a.Ino = st.Ino
	a.Size = uint64(st.Size)
	a.Blocks = uint64(st.Blocks)
	a.Atime, a.Atimensec = uint64(st.Atim.Sec), uint32(st.Atim.Nsec)
	a.Mtime, a.Mtimensec = uint64(st.Mtim.Sec), uint32(st.Mtim.Nsec)
	a.Ctime, a.Ctimensec = uint64(st.Ctim.Sec), uint32(st.Ctim.Nsec)
	a.Mode = st.Mode
	a.Nlink = uint32(st.Nlink)
	a.Owner = fuse.Owner{Uid: st.Uid, Gid: st.Gid}
	a.Rdev = uint32(st.Rdev)
	a.Blksize = uint32(st.Blksize)
}

// newChild registers the entry found by a probe (or created in the upper)
// as a child of n. Lower non-directories with several links get a
// per-path generation so each name stays its own node (go-fuse would
// otherwise merge them by inode number, and copy-up is per path).
func (n *node) newChild(ctx context.Context, p string, pr probe, out *fuse.EntryOut) *fs.Inode {
	if pr.layer == 0 && pr.origin != 0 {
		n.o.noteOrigin(pr.st.Ino, pr.origin)
	}
	ino := n.o.inoFor(pr.layer, &pr.st)
	mode := pr.st.Mode & unix.S_IFMT
	var gen uint64
	if pr.layer > 0 && mode != unix.S_IFDIR && pr.st.Nlink > 1 {
		h := fnv.New64a()
		h.Write([]byte(p))
		gen = h.Sum64() | 1
	}
	fillAttr(&pr.st, &out.Attr)
	out.Attr.Ino = ino
	if len(pr.dirLayers) > 1 {
		out.Attr.Nlink = 1 // merged: the count of subdirectories is unknown, as in the kernel overlay
	}
	child := &node{o: n.o, layer: pr.layer, dirLayers: pr.dirLayers}
	return n.NewInode(ctx, child, fs.StableAttr{Mode: mode, Ino: ino, Gen: gen})
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.ENOENT
	}
	n.o.mu.RLock()
	defer n.o.mu.RUnlock()
	dp, ok := n.path()
	if !ok {
		return nil, syscall.ENOENT
	}
	pr, errno := n.o.probe(n.dirLayers, dp, name)
	if errno != 0 {
		return nil, errno
	}
	if !pr.found {
		return nil, syscall.ENOENT
	}
	// A directory the kernel already knows stays the same node even when
	// the directories merged into it changed (a lower swap): a new node
	// (by the new number) would replace it, and with it every cwd inside.
	if ch := n.GetChild(name); ch != nil && pr.st.Mode&unix.S_IFMT == unix.S_IFDIR && ch.StableAttr().Mode == unix.S_IFDIR {
		fillAttr(&pr.st, &out.Attr)
		out.Attr.Ino = ch.StableAttr().Ino
		if len(pr.dirLayers) > 1 {
			out.Attr.Nlink = 1
		}
		return ch, 0
	}
	return n.newChild(ctx, join(dp, name), pr, out), 0
}

// stat lstat's the node's topmost backing entry (caller holds o.mu).
func (n *node) stat(st *unix.Stat_t) syscall.Errno {
	p, ok := n.path()
	if !ok {
		return syscall.ESTALE
	}
	return errnoOf(fstatat(n.o.fds[n.layer], rel(p), st, unix.AT_SYMLINK_NOFOLLOW))
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var st unix.Stat_t
	if h, ok := f.(*handle); ok {
		if err := unix.Fstat(h.fd, &st); err != nil {
			return errnoOf(err)
		}
	} else {
		n.o.mu.RLock()
		errno := n.stat(&st)
		n.o.mu.RUnlock()
		if errno != 0 {
			return errno
		}
	}
	fillAttr(&st, &out.Attr)
	if n.isDir() && n.mergedDir() {
		out.Attr.Nlink = 1
	}
	return 0
}

// mergedDir reports whether several layers merge into the directory.
func (n *node) mergedDir() bool {
	n.o.mu.RLock()
	defer n.o.mu.RUnlock()
	return len(n.dirLayers) > 1
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var s unix.Statfs_t
	if err := unix.Fstatfs(n.o.upper, &s); err != nil {
		return errnoOf(err)
	}
	out.Blocks, out.Bfree, out.Bavail = s.Blocks, s.Bfree, s.Bavail
	out.Files, out.Ffree = s.Files, s.Ffree
	out.Bsize, out.NameLen, out.Frsize = uint32(s.Bsize), uint32(s.Namelen), uint32(s.Frsize)
	return 0
}

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
	h := o.newHandle(fd, p, cmd, flags)
	return ch, h, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
}

// openFlags keeps the open flags that make sense on the backing file.
// O_APPEND is dropped: the kernel already passes the end-of-file offset for
// appends, and pwrite on an O_APPEND fd would ignore the offset.
func openFlags(flags uint32) int {
	keep := uint32(unix.O_ACCMODE | unix.O_TRUNC | unix.O_SYNC | unix.O_DSYNC)
	return int(flags&keep) | unix.O_NOFOLLOW | unix.O_CLOEXEC
}

func writeIntent(flags uint32) bool {
	return flags&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_TRUNC != 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	o := n.o
	write := writeIntent(flags)
	var cmd string
	if write {
		cmd = o.command(ctx)
	}
	o.mu.RLock()
	if write && n.layer != 0 {
		// Entries already in the upper (the common case for writes) open
		// under the shared lock; copy-up copies without it.
		o.mu.RUnlock()
		if errno := n.copyUpOpen(); errno != 0 {
			return nil, 0, errno
		}
		o.mu.RLock()
	}
	defer o.mu.RUnlock()
	p, ok := n.path()
	if !ok {
		return nil, 0, syscall.ESTALE
	}
	fd, err := openat(o.fds[n.layer], p, openFlags(flags), 0)
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	if flags&unix.O_TRUNC != 0 {
		o.rec.op(Record{Command: cmd, Op: "truncate", Path: p})
	}
	// Lowers never change and the upper changes only through this mount,
	// so the page cache stays valid across opens. No FLUSH at close: locks
	// are the kernel's own and writes are synchronous, so it has nothing
	// to do and would cost a round trip per close.
	h := o.newHandle(fd, p, cmd, flags)
	if n.layer != 0 {
		h.lowerOf = n
	}
	return h, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	o := n.o
	cmd := o.command(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	if errno := n.copyUpEntry(); errno != 0 {
		return errno
	}
	p, ok := n.path()
	h, _ := f.(*handle)
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

func opsOf(in *fs.Inode) (*node, bool) {
	if in == nil {
		return nil, false
	}
	n, ok := in.Operations().(*node)
	return n, ok
}

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

// copyUpEntry copies n up, a directory or anything else; callers hold o.mu.
func (n *node) copyUpEntry() syscall.Errno {
	if n.isDir() {
		return n.copyUpDir()
	}
	return n.copyUp()
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

func (o *ofs) tmpName() string {
	return "cu" + strconv.FormatUint(o.seq.Add(1), 10)
}
