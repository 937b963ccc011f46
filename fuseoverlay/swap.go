package fuseoverlay

// Lower-chain swap: a live mount moves onto another lower chain (a squash
// of its layers, or a newer head under the same upper) without unmounting.
//
// The switch itself is one critical section under ofs.mu (exclusive): the
// new chain's directories replace the old ones, and every node the kernel
// knows (go-fuse's tree) is re-resolved against the new chain, parents
// before children, comparing what its lookup returned before with what it
// returns now:
//
//   - a non-directory whose backing file is the same (the upper's own, or
//     the same lower inode, as a squash's hardlinks are) only has its layer
//     index renumbered: nothing cached about it differs;
//   - a non-directory backed by another file now, an entry that is gone, or
//     one whose type changed is detached from the tree (its path no longer
//     resolves, so path-based operations on the old node fail with ESTALE)
//     and its dentry is invalidated: the next lookup makes a new node with
//     the new inode number and an empty page cache. Open handles keep their
//     own descriptors, so a file opened before the swap reads what it
//     opened until it is closed;
//   - a directory keeps its node (a cwd inside it stays valid); when the
//     directories merged into it are not the same ones as before, its old
//     and new listings are compared, every name that was added, removed or
//     changed (type or inode number) gets its dentry invalidated (that also
//     drops negative dentries of names that appear), its cached listing
//     pages are dropped when the listing differs and its attributes when
//     the directory shown (mode, owner, times) differs.
//
// The kernel is told after the lock is released, since go-fuse's notify
// calls must not be made while a request that holds a kernel lock the
// notification needs (a LOOKUP holds its parent's i_rwsem) waits on ofs.mu.
// Between the switch and the end of SwapLower, a process may therefore
// still be served an entry, attribute or page the kernel had cached from
// the old chain for a path that differs; every reply from the server is
// from the new chain. A caller that needs the session to see no mix at all
// stops the session's processes around the call. An operation the kernel
// sends to a detached node in that window fails with ESTALE; open and stat
// are retried once by the VFS with a fresh lookup, so only a second swap
// of the same path within that retry makes ESTALE reach the process.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// SwapLower replaces the lower chain (newest first) under the same upper,
// atomically for every request the server answers, and invalidates the
// kernel's cached entries, attributes, listings and pages of exactly the
// paths whose lookup result differs (see swap.go). It does not take
// ownership of lowers, nor close the previous lower descriptors: the
// caller may close those once SwapLower has returned. Invalid input (a
// nil or non-directory layer) returns an error and changes nothing. An
// error from the kernel while invalidating is returned after the swap took
// effect; it wraps ErrSwapInvalidate.
func (s *Server) SwapLower(ctx context.Context, lowers []*os.File) error {
	return s.impl.swapLower(ctx, lowers)
}

// ErrSwapInvalidate says the lower chain was swapped but the kernel refused
// to drop some cached entries, which may then show the old chain until
// they expire.
var ErrSwapInvalidate = errors.New("fuseoverlay: lower chain swapped, but invalidating the kernel's caches failed")

// chain is one set of layer directories: [0] the upper, [1:] the lowers.
type chain struct {
	fds   []int
	files []*os.File
	devs  []uint64
}

// notice is one invalidation to send to the kernel once ofs.mu is released.
type notice struct {
	kind  noticeKind
	dir   *fs.Inode // the directory (entry, delete) or the inode (content, attr)
	name  string
	child *fs.Inode // delete: the detached node
}

type noticeKind int

const (
	noticeEntry   noticeKind = iota // the name's dentry (positive or negative)
	noticeDelete                    // the name is gone: dentry and inotify
	noticeContent                   // a directory's cached listing and attributes
	noticeAttr                      // attributes only
)

func (s *server) swapLower(ctx context.Context, lowers []*os.File) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	notes, err := s.o.swapLower(lowers)
	if err != nil {
		return err
	}
	return notify(notes)
}

// notify sends the invalidations of a swap to the kernel (no lock held).
func notify(notes []notice) error {
	var errs []error
	for _, nt := range notes {
		var errno syscall.Errno
		switch nt.kind {
		case noticeEntry:
			errno = nt.dir.NotifyEntry(nt.name)
		case noticeDelete:
			errno = nt.dir.NotifyDelete(nt.name, nt.child)
		case noticeContent:
			errno = nt.dir.NotifyContent(0, 0)
		case noticeAttr:
			errno = nt.dir.NotifyContent(-1, 0)
		}
		// ENOENT: the kernel has nothing cached there, which is fine.
		if errno != 0 && errno != syscall.ENOENT {
			errs = append(errs, fmt.Errorf("%q: %w", nt.name, errno))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrSwapInvalidate, errors.Join(errs...))
	}
	return nil
}

// openChain validates the new lowers and describes the chain they make
// under the current upper.
func (o *ofs) openChain(lowers []*os.File) (chain, error) {
	c := chain{fds: []int{o.upper}, files: []*os.File{o.files[0]}, devs: []uint64{o.upperDev}}
	for i, f := range lowers {
		if f == nil {
			return chain{}, fmt.Errorf("fuseoverlay: swap lower: layer %d is nil", i)
		}
		var st unix.Stat_t
		fd := int(f.Fd())
		if err := unix.Fstat(fd, &st); err != nil {
			return chain{}, fmt.Errorf("fuseoverlay: swap lower: stat layer %s: %w", f.Name(), err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return chain{}, fmt.Errorf("fuseoverlay: swap lower: layer %s is not a directory", f.Name())
		}
		c.fds = append(c.fds, fd)
		c.files = append(c.files, f)
		c.devs = append(c.devs, st.Dev)
	}
	return c, nil
}

func (o *ofs) use(c chain) { o.fds, o.files, o.devs = c.fds, c.files, c.devs }

// swapLower switches the chain and re-resolves every known node; it returns
// the invalidations to send once the lock is released.
func (o *ofs) swapLower(lowers []*os.File) ([]notice, error) {
	nw, err := o.openChain(lowers)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	w := &swapWalk{o: o, old: chain{fds: o.fds, files: o.files, devs: o.devs}, nw: nw, seen: map[noticeKey]bool{}}
	o.use(nw)
	root := o.root
	oldLayers := root.dirLayers
	root.dirLayers = o.rootLayers()
	w.dir(root, "", oldLayers)
	return w.notes, nil
}

type swapWalk struct {
	o       *ofs
	old, nw chain
	notes   []notice
	seen    map[noticeKey]bool
}

type noticeKey struct {
	kind noticeKind
	dir  *fs.Inode
	name string
}

// add queues an invalidation once (a changed child is found both by its
// node and by its directory's listing).
func (w *swapWalk) add(nt notice) {
	k := noticeKey{nt.kind, nt.dir, nt.name}
	if nt.kind == noticeContent || nt.kind == noticeAttr {
		k.name = ""
	}
	if w.seen[k] {
		return
	}
	w.seen[k] = true
	w.notes = append(w.notes, nt)
}

// onOld runs f with the old chain in place (the walk holds ofs.mu).
func (w *swapWalk) onOld(f func()) {
	w.o.use(w.old)
	defer w.o.use(w.nw)
	f()
}

// dirIdentity lists the directories that merge into p, as device and inode.
func (w *swapWalk) dirIdentity(layers []int, p string) []uint64 {
	out := make([]uint64, 0, 2*len(layers))
	for _, l := range layers {
		var st unix.Stat_t
		if fstatat(w.o.fds[l], rel(p), &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			out = append(out, 0, 0)
			continue
		}
		out = append(out, st.Dev, st.Ino)
	}
	return out
}

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// sameShown reports whether two stats of a directory show the same
// attributes through the mount.
func sameShown(a, b *unix.Stat_t) bool {
	return a.Mode == b.Mode && a.Uid == b.Uid && a.Gid == b.Gid && a.Size == b.Size &&
		a.Mtim == b.Mtim && a.Ctim == b.Ctim
}

// dir re-resolves the directory node d (its dirLayers already set for the
// new chain) and its known children; oldLayers are its old chain's layers.
func (w *swapWalk) dir(d *node, p string, oldLayers []int) {
	o := w.o
	var oldID []uint64
	var oldTop unix.Stat_t
	oldTopErr := errors.New("no layer")
	w.onOld(func() {
		oldID = w.dirIdentity(oldLayers, p)
		if len(oldLayers) > 0 {
			oldTopErr = fstatat(o.fds[oldLayers[0]], rel(p), &oldTop, unix.AT_SYMLINK_NOFOLLOW)
		}
	})
	if !equalU64(oldID, w.dirIdentity(d.dirLayers, p)) {
		var oldList []fullEntry
		var oldErr syscall.Errno
		w.onOld(func() { oldList, oldErr = o.mergedFull(oldLayers, p, d.IsRoot()) })
		newList, newErr := o.mergedFull(d.dirLayers, p, d.IsRoot())
		changed := diffListings(oldList, newList)
		if oldErr != 0 || newErr != 0 {
			changed = nil // unreadable: drop the whole listing, names go by their nodes
		}
		for _, name := range changed {
			w.add(notice{kind: noticeEntry, dir: &d.Inode, name: name})
		}
		var newTop unix.Stat_t
		topErr := fstatat(o.fds[d.dirLayers[0]], rel(p), &newTop, unix.AT_SYMLINK_NOFOLLOW)
		switch {
		case len(changed) > 0 || oldErr != 0 || newErr != 0:
			w.add(notice{kind: noticeContent, dir: &d.Inode, name: p})
		case oldTopErr != nil || topErr != nil || !sameShown(&oldTop, &newTop) || (len(oldLayers) > 1) != (len(d.dirLayers) > 1):
			w.add(notice{kind: noticeAttr, dir: &d.Inode, name: p})
		}
	}
	for name, ch := range d.Children() {
		c, ok := ch.Operations().(*node)
		if !ok {
			continue
		}
		cp := join(p, name)
		wasDir := c.isDir()
		var oldSt unix.Stat_t
		var oldErr error
		if !wasDir {
			w.onOld(func() { oldErr = fstatat(o.fds[c.layer], cp, &oldSt, unix.AT_SYMLINK_NOFOLLOW) })
		}
		pr, errno := o.probe(d.dirLayers, p, name)
		if errno != 0 || !pr.found || (pr.st.Mode&unix.S_IFMT == unix.S_IFDIR) != wasDir {
			w.detach(d, name, ch, noticeDelete)
			continue
		}
		if wasDir {
			oldDirLayers := c.dirLayers
			c.layer, c.dirLayers = pr.layer, pr.dirLayers
			w.dir(c, cp, oldDirLayers)
			continue
		}
		same := c.layer == 0 && pr.layer == 0 ||
			oldErr == nil && oldSt.Dev == pr.st.Dev && oldSt.Ino == pr.st.Ino
		if !same {
			w.detach(d, name, ch, noticeEntry)
			continue
		}
		c.layer = pr.layer
	}
}

// detach unlinks the node of name from d so its old path no longer
// resolves, and queues the kernel invalidation.
func (w *swapWalk) detach(d *node, name string, ch *fs.Inode, kind noticeKind) {
	d.RmChild(name)
	nt := notice{kind: kind, dir: &d.Inode, name: name}
	if kind == noticeDelete {
		nt.child = ch
		// A delete invalidates the entry too; drop a queued plain one.
		for i, q := range w.notes {
			if q.kind == noticeEntry && q.dir == nt.dir && q.name == name {
				w.notes = append(w.notes[:i], w.notes[i+1:]...)
				break
			}
		}
		w.seen[noticeKey{noticeEntry, nt.dir, name}] = true
	}
	w.add(nt)
}

// fullEntry is a listed name with what a readdir shows of it.
type fullEntry struct {
	name string
	mode uint32
	ino  uint64
}

func (o *ofs) mergedFull(layers []int, p string, root bool) ([]fullEntry, syscall.Errno) {
	ents, errno := o.merged(layers, p, root)
	if errno != 0 {
		return nil, errno
	}
	out := make([]fullEntry, len(ents))
	for i, e := range ents {
		out[i] = fullEntry{e.Name, e.Mode & unix.S_IFMT, e.Ino}
	}
	return out, 0
}

// diffListings returns the names that are in one listing only, or in both
// with another type or, for non-directories, another inode number. A
// directory keeps its node (and the number it shows) across a swap, so
// invalidating its dentry would only replace a live node, and with it the
// cwd of whoever is inside.
func diffListings(a, b []fullEntry) []string {
	am := make(map[string]fullEntry, len(a))
	for _, e := range a {
		am[e.name] = e
	}
	var out []string
	for _, e := range b {
		old, ok := am[e.name]
		if !ok || old.mode != e.mode || (old.ino != e.ino && e.mode != unix.S_IFDIR) {
			out = append(out, e.name)
		}
		delete(am, e.name)
	}
	for name := range am {
		out = append(out, name)
	}
	return out
}
