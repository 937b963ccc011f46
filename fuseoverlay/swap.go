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
// Swap with a new upper (Chain.Upper) does the same walk with the upper
// replaced too. No upper entry is then the same as before unless it is the
// same inode, so every cached file of the old upper is dropped and every
// directory merged from it compared; entries that show the same number in
// both (an upper file over a lower one shows the lower's number) get a new
// node all the same: go-fuse hands a lookup the known node of the same
// identity, and with it the kernel's inode and its pages, so a detached
// node's identity is retired (ofs.retired) until the kernel forgets it
// and a new node takes another generation (TestSwapUpper reads the old
// upper's bytes without it). The origin map starts over for the new upper
// with the numbers its kept nodes show. A handle open for writing refuses
// the swap (its writes would go to the replaced upper); since the kernel
// sends RELEASE only after close(2) returned, the swap first waits a
// moment (releaseGrace) for write handles to go.
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
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// SwapLower replaces the lower chain (newest first) under the same upper;
// it is Swap(ctx, Chain{Lowers: lowers}).
func (s *Server) SwapLower(ctx context.Context, lowers []*os.File) error {
	return s.impl.swap(ctx, Chain{Lowers: lowers})
}

// Chain is what a Swap moves the mount onto.
type Chain struct {
	// Upper, when not nil, replaces the upper directory (a sync that
	// rewrote it renamed a new one into place). It must be a directory on
	// the current upper's filesystem and, with Options.Work, opened through
	// the same mount as Work (copy-up renames from Work into it, and a
	// rename between two mounts fails with EXDEV). nil keeps the upper.
	Upper *os.File
	// Lowers is the new lower chain, newest first.
	Lowers []*os.File
}

// Swap replaces the lower chain, and the upper when c.Upper is set,
// atomically for every request the server answers, and invalidates the
// kernel's cached entries, attributes, listings and pages of exactly the
// paths whose lookup result differs (see swap.go). It does not take
// ownership of c's files, nor close the previous ones: the caller may
// close those once Swap has returned. Invalid input (a nil or
// non-directory layer, an upper on another filesystem) returns an error
// and changes nothing; so does an upper swap while a handle is open for
// writing (*WriteHandlesError, ErrWriteHandles), since its writes would go
// to the replaced upper. An error from the kernel while invalidating is
// returned after the swap took effect; it wraps ErrSwapInvalidate.
func (s *Server) Swap(ctx context.Context, c Chain) error {
	return s.impl.swap(ctx, c)
}

// ErrSwapInvalidate says the lower chain was swapped but the kernel refused
// to drop some cached entries, which may then show the old chain until
// they expire.
var ErrSwapInvalidate = errors.New("fuseoverlay: lower chain swapped, but invalidating the kernel's caches failed")

// ErrWriteHandles: an upper swap was refused because handles are open for
// writing (see WriteHandlesError).
var ErrWriteHandles = errors.New("fuseoverlay: files are open for writing")

// OpenHandle is a handle open for writing.
type OpenHandle struct {
	Path    string // mount-relative, as opened
	Command string // the handle's owner (Options.Owner), "" when unknown
}

// WriteHandlesError lists the handles open for writing that kept an upper
// swap from happening; it matches ErrWriteHandles.
type WriteHandlesError struct{ Handles []OpenHandle }

func (e *WriteHandlesError) Error() string {
	var b strings.Builder
	b.WriteString("fuseoverlay: upper swap refused: open for writing:")
	for i, h := range e.Handles {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %s", h.Path)
		if h.Command != "" {
			fmt.Fprintf(&b, " (command %s)", h.Command)
		}
	}
	return b.String()
}

func (e *WriteHandlesError) Is(target error) bool { return target == ErrWriteHandles }

// chain is one set of layer directories: [0] the upper, [1:] the lowers.
type chain struct {
	fds   []int
	files []*os.File
	devs  []uint64
	// origin is the chain's ofs.origin when a swap replaces the upper;
	// nil otherwise (the map stays).
	origin map[uint64]uint64
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

func (s *server) swap(ctx context.Context, c Chain) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.Upper != nil {
		s.o.awaitWriters(ctx)
	}
	notes, err := s.o.swap(c)
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

// openChain validates the new chain and describes it; a nil c.Upper is
// the current upper (caller holds o.mu).
func (o *ofs) openChain(c Chain) (chain, error) {
	nw := chain{fds: []int{o.fds[0]}, files: []*os.File{o.files[0]}, devs: []uint64{o.upperDev}}
	if f := c.Upper; f != nil {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return chain{}, fmt.Errorf("fuseoverlay: swap: stat upper %s: %w", f.Name(), err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return chain{}, fmt.Errorf("fuseoverlay: swap: upper %s is not a directory", f.Name())
		}
		if st.Dev != o.upperDev {
			return chain{}, fmt.Errorf("fuseoverlay: swap: upper %s is on another filesystem than the current upper", f.Name())
		}
		// One filesystem is not enough: copy-up renames from Work into
		// the upper, and rename(2) between two mounts of one filesystem
		// (a descriptor opened in another mount namespace) fails with
		// EXDEV — every later write to a lower file would.
		if o.work >= 0 && !sameMount(o.work, int(f.Fd())) {
			return chain{}, fmt.Errorf("fuseoverlay: swap: upper %s is on another mount than the work directory (open it through the same mount)", f.Name())
		}
		nw.fds[0], nw.files[0] = int(f.Fd()), f
	}
	for i, f := range c.Lowers {
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
		nw.fds = append(nw.fds, fd)
		nw.files = append(nw.files, f)
		nw.devs = append(nw.devs, st.Dev)
	}
	return nw, nil
}

// sameMount reports whether two descriptors are on the same mount (when the
// kernel cannot tell, it assumes they are).
func sameMount(a, b int) bool {
	var sa, sb unix.Statx_t
	if unix.Statx(a, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &sa) != nil ||
		unix.Statx(b, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &sb) != nil ||
		sa.Mask&unix.STATX_MNT_ID == 0 || sb.Mask&unix.STATX_MNT_ID == 0 {
		return true
	}
	return sa.Mnt_id == sb.Mnt_id
}

// releaseGrace bounds how long an upper swap waits for write handles to
// go: the kernel sends RELEASE after the last close(2) has returned, so a
// file a (now stopped or ended) process closed may still be open here for
// a moment.
const releaseGrace = 500 * time.Millisecond

// awaitWriters waits until no handle is open for writing, ctx ends or
// releaseGrace has passed; the swap checks again under the lock.
func (o *ofs) awaitWriters(ctx context.Context) {
	deadline := time.Now().Add(releaseGrace)
	for {
		o.writersMu.Lock()
		n := len(o.writers)
		o.writersMu.Unlock()
		if n == 0 || ctx.Err() != nil || time.Now().After(deadline) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// openWriters lists the handles open for writing, sorted.
func (o *ofs) openWriters() []OpenHandle {
	o.writersMu.Lock()
	defer o.writersMu.Unlock()
	out := make([]OpenHandle, 0, len(o.writers))
	for h := range o.writers {
		out = append(out, OpenHandle{Path: h.path, Command: h.command})
	}
	slices.SortFunc(out, func(a, b OpenHandle) int { return strings.Compare(a.Path, b.Path) })
	return out
}

func (o *ofs) use(c chain) {
	o.fds, o.files, o.devs = c.fds, c.files, c.devs
	if c.origin != nil {
		o.originMu.Lock()
		o.origin = c.origin
		o.originMu.Unlock()
	}
}

// swap switches the chain and re-resolves every known node; it returns
// the invalidations to send once the lock is released.
func (o *ofs) swap(c Chain) ([]notice, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	nw, err := o.openChain(c)
	if err != nil {
		return nil, err
	}
	old := chain{fds: o.fds, files: o.files, devs: o.devs}
	// Another descriptor of the same directory is no new upper: nothing
	// in it changes, and writers may stay.
	newUpper := false
	if nw.fds[0] != old.fds[0] {
		var a, b unix.Stat_t
		newUpper = unix.Fstat(old.fds[0], &a) != nil || unix.Fstat(nw.fds[0], &b) != nil || a.Dev != b.Dev || a.Ino != b.Ino
	}
	if newUpper {
		hs := o.openWriters()
		for _, h := range o.procWriters() {
			if !slices.Contains(hs, h) {
				hs = append(hs, h)
			}
		}
		slices.SortFunc(hs, func(a, b OpenHandle) int { return strings.Compare(a.Path, b.Path) })
		if len(hs) > 0 {
			return nil, &WriteHandlesError{Handles: hs}
		}
		// Numbers of the old upper's entries mean nothing in the new
		// one: each chain has its own origin map while the walk switches
		// between them, and the new one holds what the nodes kept show.
		o.originMu.Lock()
		old.origin = o.origin
		o.originMu.Unlock()
		nw.origin = map[uint64]uint64{}
	}
	w := &swapWalk{o: o, old: old, nw: nw, newUpper: newUpper, seen: map[noticeKey]bool{}}
	o.use(nw)
	root := o.root
	oldLayers := root.dirLayers
	root.dirLayers = o.rootLayers()
	w.dir(root, "", oldLayers)
	return w.notes, nil
}

type swapWalk struct {
	o        *ofs
	old, nw  chain
	newUpper bool // the upper is replaced too
	notes    []notice
	seen     map[noticeKey]bool
}

// keep records, after an upper swap, the number a kept node shows for its
// entry in the new upper (the node keeps its identity).
func (w *swapWalk) keep(c *node, st *unix.Stat_t) {
	if w.newUpper && !c.IsRoot() {
		w.nw.origin[st.Ino] = c.StableAttr().Ino
	}
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
			// An open file keeps reading what it opened (noopen.go).
			w.onOld(func() { c.pin(c.layer, cp) })
			w.detach(d, name, ch, noticeDelete)
			continue
		}
		if wasDir {
			oldDirLayers := c.dirLayers
			c.layer, c.dirLayers = pr.layer, pr.dirLayers
			if pr.layer == 0 {
				w.keep(c, &pr.st)
			}
			w.dir(c, cp, oldDirLayers)
			continue
		}
		// The same upper (a lower swap) keeps what is in it; otherwise
		// only the same backing inode is the same file.
		same := !w.newUpper && c.layer == 0 && pr.layer == 0 ||
			oldErr == nil && oldSt.Dev == pr.st.Dev && oldSt.Ino == pr.st.Ino
		if !same {
			w.onOld(func() { c.pin(c.layer, cp) })
			w.detach(d, name, ch, noticeEntry)
			continue
		}
		c.layer = pr.layer
		if pr.layer == 0 {
			w.keep(c, &pr.st)
		}
	}
}

// detach unlinks the node of name from d so its old path no longer
// resolves, and queues the kernel invalidation.
func (w *swapWalk) detach(d *node, name string, ch *fs.Inode, kind noticeKind) {
	// The kernel may keep the detached inode (an open file, a cwd): a
	// later lookup of an entry that shows the same number must not get
	// it back, with its old pages (fresh).
	w.o.retire(ch)
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
