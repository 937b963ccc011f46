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
	// newest first. Swap replaces them (under mu, exclusively), the upper
	// too when it is given one, so code that runs without mu must not
	// use them. upperDev never changes (a new upper must be on the same
	// filesystem: copy-up renames from Work into it, and shown inode
	// numbers are folded with it).
	fds      []int
	files    []*os.File
	devs     []uint64
	upperDev uint64
	work     int // staging dir fd, or -1: stage in upper/.esbx-tmp
	// stageMu guards the hidden staging dir's reference count.
	stageMu   sync.Mutex
	stageRefs int
	stageFd   int
	stageUp   int  // the upper the staging directory is in
	hideTmp   bool // the root hides stagingName
	euid      int
	egid      int
	seq       atomic.Uint64
	// sharedFds counts the descriptors held by nodes' read-only slots.
	sharedFds    atomic.Int64
	maxSharedFds int64 // see sharedFdLimit

	// origin maps the inode number of a copied-up upper entry to the number
	// it had in its lower layer, so st_ino survives copy-up. An upper swap
	// replaces the map (under mu and originMu).
	originMu sync.Mutex
	origin   map[uint64]uint64

	// writers are the open handles that may write (to the upper): an
	// upper swap is refused while there is one. Added under mu (shared),
	// so a swap that holds mu exclusively sees them all.
	writersMu sync.Mutex
	writers   map[*handle]struct{}

	// retired are the identities of nodes a swap detached while the kernel
	// may still know them: go-fuse would hand a new lookup with the same
	// identity the old node (and the kernel its old inode and pages), so
	// newChild picks another generation for such a lookup (see fresh).
	retiredMu sync.Mutex
	retired   map[fs.StableAttr]*fs.Inode

	// kill marks the WRITE requests that must clear set-id bits.
	kill killMarks

	// Writes without a handle (noopen.go): owners caches Owner per pid,
	// pending holds mapped writes until an fsync names their process,
	// wrote the paths and commands to pass to Released at the next
	// explicit flush.
	ownersMu sync.Mutex
	owners   map[uint32]ownerEntry
	pendMu   sync.Mutex
	pending  []pendingWrite
	wroteMu  sync.Mutex
	wrote    map[[2]string]bool
	// mntID is the mount's id in /proc (procWriters), 0 if not found.
	mntID uint64
	// noOpen is set once OPEN was answered ENOSYS (before the reply).
	noOpen atomic.Bool
	// pins counts the descriptors nodes keep once their name is gone.
	pins atomic.Int64

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
	// ro is the descriptor shared by read-only handles of a lower file
	// (rofd.go), guarded by roMu.
	roMu sync.Mutex
	ro   *sharedFd
	// pinned is the descriptor kept once the node's name is gone while the
	// kernel may still have it open (noopen.go), guarded by pinMu.
	pinMu  sync.Mutex
	pinned *pinnedFd
	// ru is the open write range of writes without a handle, guarded by
	// o.rec.mu.
	ru run
}

var (
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
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
	_ fs.NodeOnForgetter    = (*node)(nil)
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
	return n.NewInode(ctx, child, n.o.fresh(fs.StableAttr{Mode: mode, Ino: ino, Gen: gen}))
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
	} else if pf := n.pinnedFd(); pf != nil {
		if err := unix.Fstat(pf.fd, &st); err != nil {
			return errnoOf(err)
		}
		if !pf.writable {
			st.Nlink = 0 // the lower file keeps its name there, not here
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
	n.o.mu.RLock()
	err := unix.Fstatfs(n.o.fds[0], &s)
	n.o.mu.RUnlock()
	if err != nil {
		return errnoOf(err)
	}
	out.Blocks, out.Bfree, out.Bavail = s.Blocks, s.Bfree, s.Bavail
	out.Files, out.Ffree = s.Files, s.Ffree
	out.Bsize, out.NameLen, out.Frsize = uint32(s.Bsize), uint32(s.Namelen), uint32(s.Frsize)
	return 0
}

// fresh returns id, or id with another generation when a node a swap
// detached still holds id (see ofs.retired).
func (o *ofs) fresh(id fs.StableAttr) fs.StableAttr {
	o.retiredMu.Lock()
	defer o.retiredMu.Unlock()
	for o.retired[id] != nil {
		id.Gen++
	}
	return id
}

// retire records the identity of a node a swap detaches; call it before
// the node leaves the tree, so its OnForget comes after.
func (o *ofs) retire(in *fs.Inode) {
	o.retiredMu.Lock()
	o.retired[in.StableAttr()] = in
	o.retiredMu.Unlock()
}

// OnForget is called when the kernel no longer references the node. It
// drops the node's retired identity (nothing can revive it any more) and
// its shared read-only descriptor (go-fuse may also call it spuriously; the
// slot is then simply refilled by the next open).
func (n *node) OnForget() {
	n.dropShared()
	n.unpin()
	id := n.StableAttr()
	n.o.retiredMu.Lock()
	if n.o.retired[id] == &n.Inode {
		delete(n.o.retired, id)
	}
	n.o.retiredMu.Unlock()
}

func opsOf(in *fs.Inode) (*node, bool) {
	if in == nil {
		return nil, false
	}
	n, ok := in.Operations().(*node)
	return n, ok
}

// copyUpEntry copies n up, a directory or anything else; callers hold o.mu.
func (n *node) copyUpEntry() syscall.Errno {
	if n.isDir() {
		return n.copyUpDir()
	}
	return n.copyUp()
}

func (o *ofs) tmpName() string {
	return "cu" + strconv.FormatUint(o.seq.Add(1), 10)
}
