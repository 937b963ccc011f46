package layers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/internal/beneath"
)

// ExportDir applies a Fold to a host directory (§8.9); the decisions are listed in export.go.

// DirStats is the outcome of ExportDir.
type DirStats struct {
	FilesWritten       int64
	DirectoriesWritten int64
	SymlinksWritten    int64
	DeletesApplied     int64
	OpaqueClears       int64
	SkippedUnchanged   int64
	BytesWritten       int64
}

// CheckDirCaps fails with a *CapError when a dir export of f exceeds caps.
func (f *Fold) CheckDirCaps(caps ExportCaps) error {
	if n := f.Entries(); caps.MaxApplyEntries > 0 && n > caps.MaxApplyEntries {
		return &CapError{Cap: "max_apply_entries", Limit: caps.MaxApplyEntries, Need: n}
	}
	if n := f.FileBytes(); caps.MaxDecompressedBytes > 0 && n > caps.MaxDecompressedBytes {
		return &CapError{Cap: "max_decompressed_bytes", Limit: caps.MaxDecompressedBytes, Need: n}
	}
	return nil
}

// destTree walks dest descriptor-relative, never following a symlink; it
// keeps the chain of the directories opened last.
type destTree struct {
	root   string
	rootfd int
	chain  []destLink
	// kept are the directories that existed in dest before the export,
	// with their mode: they keep it (#27 item 2); the final pass restores
	// the ones ensureDir had to make writable.
	kept map[string]uint32
}

type destLink struct {
	name string
	fd   int
}

func (d *destTree) close() {
	d.truncate(0)
	unix.Close(d.rootfd)
}

func (d *destTree) truncate(n int) {
	for _, l := range d.chain[n:] {
		unix.Close(l.fd)
	}
	d.chain = d.chain[:n]
}

func (d *destTree) abs(rel string) string {
	if rel == "" {
		return d.root
	}
	return filepath.Join(d.root, filepath.FromSlash(rel))
}

// forget drops rel and everything below it from the chain (after rel was
// removed or replaced).
func (d *destTree) forget(rel string) {
	comps := strings.Split(rel, "/")
	if len(comps) > len(d.chain) {
		return
	}
	for j, c := range comps {
		if d.chain[j].name != c {
			return
		}
	}
	d.truncate(len(comps) - 1)
}

// errNoDir: the directory is absent or a non-directory (no symlink on the
// way).
var errNoDir = errors.New("no such directory")

// dir returns a descriptor of the directory at rel ("" = dest). A symlink on
// the way is a *DestSymlinkError; an absent or non-directory component is
// errNoDir.
func (d *destTree) dir(rel string) (int, error) {
	if rel == "" {
		return d.rootfd, nil
	}
	comps := strings.Split(rel, "/")
	k := 0
	for k < len(comps) && k < len(d.chain) && d.chain[k].name == comps[k] {
		k++
	}
	d.truncate(k)
	for ; k < len(comps); k++ {
		parent := d.rootfd
		if k > 0 {
			parent = d.chain[k-1].fd
		}
		fd, err := unix.Openat(parent, comps[k], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			var st unix.Stat_t
			if serr := unix.Fstatat(parent, comps[k], &st, unix.AT_SYMLINK_NOFOLLOW); serr == nil {
				switch st.Mode & unix.S_IFMT {
				case unix.S_IFLNK:
					return -1, &DestSymlinkError{Path: d.abs(strings.Join(comps[:k+1], "/"))}
				case unix.S_IFDIR:
					return -1, &fs.PathError{Op: "open", Path: d.abs(strings.Join(comps[:k+1], "/")), Err: err}
				}
				return -1, errNoDir
			} else if errors.Is(serr, unix.ENOENT) {
				return -1, errNoDir
			}
			return -1, &fs.PathError{Op: "open", Path: d.abs(strings.Join(comps[:k+1], "/")), Err: err}
		}
		d.chain = append(d.chain, destLink{name: comps[k], fd: fd})
	}
	return d.chain[len(d.chain)-1].fd, nil
}

// lstatAt returns the type bits of name in dirfd, 0 when absent.
func lstatAt(dirfd int, name string) (unix.Stat_t, bool, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return st, false, nil
	}
	if err != nil {
		return st, false, err
	}
	return st, true, nil
}

// removeAllAt removes name in dirfd recursively, descriptor-relative,
// without following symlinks (read-only directories are made writable first).
func removeAllAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return &fs.PathError{Op: "unlink", Path: name, Err: err}
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EACCES) {
		// A directory its owner cannot read (mode 000, the kernel's work
		// dir): grant rwx through an O_PATH descriptor of exactly this
		// entry, never by a path that could lead elsewhere, and retry.
		if cerr := chmodDirAt(dirfd, name, 0o700); cerr == nil {
			fd, err = unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
	}
	if err != nil {
		return &fs.PathError{Op: "open", Path: name, Err: err}
	}
	err = clearDirAt(fd)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("%s/%w", name, err)
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "rmdir", Path: name, Err: err}
	}
	return nil
}

// chmodDirAt changes the mode of the directory name in dirfd without
// following a symlink: fchmod does not take an O_PATH descriptor, so the
// chmod goes through its /proc/self/fd link, which names that very inode.
func chmodDirAt(dirfd int, name string, mode uint32) error {
	pfd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return unix.Chmod("/proc/self/fd/"+strconv.Itoa(pfd), mode)
}

// clearDirAt removes everything inside the directory open at fd.
func clearDirAt(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&0o700 != 0o700 {
		if err := unix.Fchmod(fd, (st.Mode&0o7777)|0o700); err != nil {
			return &fs.PathError{Op: "chmod", Path: ".", Err: err}
		}
	}
	names, err := readDirFD(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeAllAt(fd, n); err != nil {
			return err
		}
	}
	return nil
}

func exportTempName() (string, error) {
	h, err := randHex(8)
	if err != nil {
		return "", err
	}
	return ".esbx-export" + tmpInfix + h, nil
}

func unixPerm(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSticky != 0 {
		u |= unix.S_ISVTX
	}
	return u
}

// ExportDir applies the fold to the directory dest (which must exist) in
// three passes: opaque clears, deletions, content. A *CapError is returned
// before anything is written, so is a *DestSymlinkError found by the
// pre-flight walk.
func (f *Fold) ExportDir(ctx context.Context, dest string, caps ExportCaps, progress func(string)) (DirStats, error) {
	if err := f.CheckDirCaps(caps); err != nil {
		return DirStats{}, err
	}
	rootfd, err := unix.Open(dest, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if fi, lerr := os.Lstat(dest); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return DirStats{}, &DestSymlinkError{Path: dest}
		}
		return DirStats{}, &fs.PathError{Op: "open", Path: dest, Err: err}
	}
	return f.ExportDirFD(ctx, rootfd, dest, caps, progress)
}

// OpenDestBeneath opens the directory rel below the directory root for an
// export, descriptor-relative, refusing a symlink in any component of rel
// (a *DestSymlinkError) and, with create, making the missing components
// (0755). root itself is opened by path: it is an allowed root, its own
// symlinks resolved by the caller. The caller closes the descriptor.
func OpenDestBeneath(root, rel string, create bool) (int, error) {
	rfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rfd)
	var pfd int
	if create {
		pfd, err = beneath.MkdirAll(rfd, rel, 0o755)
	} else {
		pfd, err = beneath.Walk(rfd, rel, unix.O_PATH|unix.O_DIRECTORY)
	}
	full := filepath.Join(root, filepath.FromSlash(rel))
	if errors.Is(err, unix.ELOOP) {
		if l := beneath.FirstSymlink(rfd, rel); l != "" {
			full = filepath.Join(root, filepath.FromSlash(l))
		}
		return -1, &DestSymlinkError{Path: full}
	}
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: full, Err: err}
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: full, Err: err}
	}
	return fd, nil
}

// ExportDirFD is ExportDir into the directory open at rootfd (dest names it
// in messages); it takes rootfd over and closes it.
func (f *Fold) ExportDirFD(ctx context.Context, rootfd int, dest string, caps ExportCaps, progress func(string)) (DirStats, error) {
	var st DirStats
	d := &destTree{root: dest, rootfd: rootfd, kept: map[string]uint32{}}
	defer d.close()
	if err := f.CheckDirCaps(caps); err != nil {
		return st, err
	}
	roots, err := f.openRoots()
	if err != nil {
		return st, err
	}
	defer closeFDs(roots)
	if err := f.preflight(ctx, d); err != nil {
		return st, err
	}
	pr := newExportProgress(progress, "export", f.Entries())
	wrap := func(op, rel string, err error) error {
		var dse *DestSymlinkError
		if errors.As(err, &dse) {
			return err
		}
		return fmt.Errorf("export %s %s: %w", op, d.abs(rel), err)
	}

	// Pass 1: opaque clears.
	kinds := make(map[string]foldKind, len(f.Dirs)+len(f.Files)+len(f.Symlinks))
	if len(f.OpaqueClears) > 0 {
		for _, x := range f.Dirs {
			kinds[x.Path] = foldDir
		}
		for _, x := range f.Files {
			kinds[x.Path] = foldFile
		}
		for _, x := range f.Symlinks {
			kinds[x.Path] = foldSymlink
		}
	}
	for _, p := range f.OpaqueClears {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		if err := d.clearOpaque(p, kinds); err != nil {
			return st, wrap("opaque clear", p, err)
		}
		st.OpaqueClears++
		pr.step()
	}
	// Pass 2: deletions.
	for _, p := range f.Deletions {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		removed, err := d.deleteEntry(p)
		if err != nil {
			return st, wrap("delete", p, err)
		}
		if removed {
			st.DeletesApplied++
		}
		pr.step()
	}
	// Pass 3: content. Directories first (parents before children, writable
	// until their final mode is set at the end), then files and symlinks.
	for _, x := range f.Dirs {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		if err := d.ensureDir(x); err != nil {
			return st, wrap("mkdir", x.Path, err)
		}
		st.DirectoriesWritten++
		pr.step()
	}
	for _, x := range f.Files {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		n, skipped, err := d.writeFile(f, roots, x)
		if err != nil {
			return st, wrap("write", x.Path, err)
		}
		if skipped {
			st.SkippedUnchanged++
		} else {
			st.FilesWritten++
			st.BytesWritten += n
		}
		pr.step()
	}
	for _, x := range f.Symlinks {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		if err := d.writeSymlink(x); err != nil {
			return st, wrap("symlink", x.Path, err)
		}
		st.SymlinksWritten++
		pr.step()
	}
	for i := len(f.Dirs) - 1; i >= 0; i-- {
		x := f.Dirs[i]
		mode, existed := d.kept[x.Path]
		if existed && mode&0o700 == 0o700 {
			continue // never touched
		}
		if !existed {
			mode = unixPerm(x.Mode)
		}
		fd, err := d.dir(x.Path)
		if err != nil {
			return st, wrap("chmod", x.Path, err)
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			return st, wrap("chmod", x.Path, err)
		}
	}
	d.truncate(0)
	if err := unix.Syncfs(rootfd); err != nil {
		return st, wrap("syncfs", "", err)
	}
	if pr.done > 0 {
		pr.fn(fmt.Sprintf("export: %d/%d entries applied", pr.done, pr.total))
	}
	return st, nil
}

// preflight walks every directory of the fold in dest and refuses a symlink
// where a directory is needed before anything is written. Below an absent or
// replaced entry nothing exists to check.
func (f *Fold) preflight(ctx context.Context, d *destTree) error {
	// fresh is the last directory that will be created anew; the paths below
	// it are contiguous in the sorted list.
	fresh := ""
	for _, x := range f.Dirs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if fresh != "" && strings.HasPrefix(x.Path, fresh+"/") {
			continue
		}
		_, err := d.dir(x.Path)
		var dse *DestSymlinkError
		switch {
		case err == nil:
			if x.Opaque {
				fresh = x.Path // pass 1 empties it
			}
		case errors.As(err, &dse):
			if x.Opaque && dse.Path == d.abs(x.Path) {
				fresh = x.Path
				continue
			}
			return err
		case errors.Is(err, errNoDir):
			fresh = x.Path
		default:
			return err
		}
	}
	d.truncate(0)
	return nil
}

// clearOpaque removes everything inside the directory p of dest that the
// fold does not write itself (those entries are pass 3's, so unchanged files
// can be skipped; the result is the same as emptying p). A symlink at p is
// unlinked (not followed); a missing p or parent is nothing to clear.
func (d *destTree) clearOpaque(p string, kinds map[string]foldKind) error {
	pfd, err := d.dir(parentOf(p))
	if errors.Is(err, errNoDir) {
		return nil
	}
	if err != nil {
		return err
	}
	name := path.Base(p)
	st, ok, err := lstatAt(pfd, name)
	if err != nil || !ok {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		fd, err := d.dir(p)
		if err != nil {
			return err
		}
		return pruneAt(fd, p, kinds)
	case unix.S_IFLNK:
		return unix.Unlinkat(pfd, name, 0)
	}
	return nil // a non-directory: pass 3 replaces it
}

// pruneAt removes every entry below the directory open at fd (dest path rel,
// inside an opaque directory of the fold) that the fold does not have with a
// compatible kind: directories of the fold are pruned recursively, its files
// and symlinks are left for pass 3 to compare or replace.
func pruneAt(fd int, rel string, kinds map[string]foldKind) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&0o700 != 0o700 {
		if err := unix.Fchmod(fd, (st.Mode&0o7777)|0o700); err != nil {
			return &fs.PathError{Op: "chmod", Path: rel, Err: err}
		}
	}
	names, err := readDirFD(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		childRel := joinRel(rel, n)
		if ClassifyGit(childRel, true).Kind != GitNone || ClassifyGit(childRel, false).Kind != GitNone {
			continue // a git directory below an opaque one is the destination's (export.go)
		}
		k := kinds[childRel]
		if k == foldFile || k == foldSymlink {
			continue
		}
		if k == foldDir {
			cst, ok, err := lstatAt(fd, n)
			if err != nil {
				return err
			}
			if ok && cst.Mode&unix.S_IFMT == unix.S_IFDIR {
				cfd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					return &fs.PathError{Op: "open", Path: childRel, Err: err}
				}
				err = pruneAt(cfd, childRel, kinds)
				unix.Close(cfd)
				if err != nil {
					return err
				}
				continue
			}
		}
		if err := removeAllAt(fd, n); err != nil {
			return fmt.Errorf("%s: %w", childRel, err)
		}
	}
	return nil
}

// deleteEntry removes p from dest (recursively for a directory).
func (d *destTree) deleteEntry(p string) (bool, error) {
	pfd, err := d.dir(parentOf(p))
	if errors.Is(err, errNoDir) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	name := path.Base(p)
	_, ok, err := lstatAt(pfd, name)
	if err != nil || !ok {
		return false, err
	}
	d.forget(p)
	if err := removeAllAt(pfd, name); err != nil {
		return false, err
	}
	return true, nil
}

// ensureDir makes p a directory of dest, writable by its owner until the
// final chmod.
func (d *destTree) ensureDir(x FoldDir) error {
	pfd, err := d.dir(parentOf(x.Path))
	if err != nil {
		return err
	}
	name := path.Base(x.Path)
	st, ok, err := lstatAt(pfd, name)
	if err != nil {
		return err
	}
	if ok {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			// An existing directory keeps its mode: an export writes the
			// sandbox's changes into it, it does not open a directory the
			// user closed (a 0700 stays 0700).
			if _, seen := d.kept[x.Path]; !seen {
				d.kept[x.Path] = st.Mode & 0o7777
			}
			if st.Mode&0o700 == 0o700 {
				return nil
			}
			fd, err := d.dir(x.Path)
			if err != nil {
				return err
			}
			return unix.Fchmod(fd, (st.Mode&0o7777)|0o700)
		case unix.S_IFLNK:
			return &DestSymlinkError{Path: d.abs(x.Path)}
		default:
			if err := unix.Unlinkat(pfd, name, 0); err != nil {
				return err
			}
			ok = false
		}
	}
	if !ok {
		if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
			return err
		}
	}
	fd, err := d.dir(x.Path)
	if err != nil {
		return err
	}
	return unix.Fchmod(fd, unixPerm(x.Mode)|0o700)
}

// sameContent compares an open file with the fold file's source.
func sameContent(a, b *os.File) (bool, error) {
	const n = 64 << 10
	ba, bb := make([]byte, n), make([]byte, n)
	for {
		na, ea := io.ReadFull(a, ba)
		nb, eb := io.ReadFull(b, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if ea == io.EOF || ea == io.ErrUnexpectedEOF {
			return eb == io.EOF || eb == io.ErrUnexpectedEOF, nil
		}
		if ea != nil {
			return false, ea
		}
		if eb != nil && eb != io.EOF && eb != io.ErrUnexpectedEOF {
			return false, eb
		}
	}
}

// writeFile writes one file through a temp file and rename; it reports the
// bytes written, or skipped when dest already holds the same content and mode.
func (d *destTree) writeFile(f *Fold, roots []int, x FoldFile) (int64, bool, error) {
	pfd, err := d.dir(parentOf(x.Path))
	if err != nil {
		return 0, false, err
	}
	name := path.Base(x.Path)
	st, ok, err := lstatAt(pfd, name)
	if err != nil {
		return 0, false, err
	}
	src, err := f.openSource(roots, x)
	if err != nil {
		return 0, false, err
	}
	defer src.Close()
	if ok && st.Mode&unix.S_IFMT == unix.S_IFREG && ClassifyGit(x.Path, false).Kind == GitObject {
		// Objects are a union and named by their content: an existing one
		// is never replaced (a layer's copy could only be the same or
		// corrupt).
		return 0, true, nil
	}
	if ok {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if fs.FileMode(st.Mode&0o777) == x.Mode && st.Mode&0o7000 == 0 && st.Size == x.Size {
				same, err := d.sameFile(pfd, name, src)
				if err != nil {
					return 0, false, err
				}
				if same {
					return 0, true, nil
				}
				if _, err := src.Seek(0, io.SeekStart); err != nil {
					return 0, false, err
				}
			}
		case unix.S_IFDIR:
			d.forget(x.Path)
			if err := removeAllAt(pfd, name); err != nil {
				return 0, false, err
			}
		}
	}
	tmp, err := exportTempName()
	if err != nil {
		return 0, false, err
	}
	tfd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, false, err
	}
	out := os.NewFile(uintptr(tfd), tmp)
	done := false
	defer func() {
		if !done {
			out.Close()
			_ = unix.Unlinkat(pfd, tmp, 0)
		}
	}()
	n, err := io.Copy(out, io.LimitReader(src, x.Size+1))
	if err != nil {
		return 0, false, err
	}
	if n != x.Size {
		return 0, false, fmt.Errorf("%s in layer %s changed during the export", x.Path, x.LayerID)
	}
	if err := unix.Fchmod(tfd, uint32(x.Mode.Perm())); err != nil {
		return 0, false, err
	}
	ts := unix.NsecToTimespec(x.MTime.UnixNano())
	if err := unix.UtimesNanoAt(pfd, tmp, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return 0, false, err
	}
	if err := out.Close(); err != nil {
		return 0, false, err
	}
	if err := unix.Renameat(pfd, tmp, pfd, name); err != nil {
		return 0, false, err
	}
	done = true
	return n, false, nil
}

func (d *destTree) sameFile(pfd int, name string, src *os.File) (bool, error) {
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EACCES) {
			return false, nil // unreadable: rewrite it
		}
		return false, err
	}
	cur := os.NewFile(uintptr(fd), name)
	defer cur.Close()
	return sameContent(cur, src)
}

// writeSymlink creates the symlink through a temp name and rename.
func (d *destTree) writeSymlink(x FoldSymlink) error {
	pfd, err := d.dir(parentOf(x.Path))
	if err != nil {
		return err
	}
	name := path.Base(x.Path)
	st, ok, err := lstatAt(pfd, name)
	if err != nil {
		return err
	}
	if ok && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		d.forget(x.Path)
		if err := removeAllAt(pfd, name); err != nil {
			return err
		}
	}
	tmp, err := exportTempName()
	if err != nil {
		return err
	}
	if err := unix.Symlinkat(x.Target, pfd, tmp); err != nil {
		return err
	}
	ts := unix.NsecToTimespec(x.MTime.UnixNano())
	_ = unix.UtimesNanoAt(pfd, tmp, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
	if err := unix.Renameat(pfd, tmp, pfd, name); err != nil {
		_ = unix.Unlinkat(pfd, tmp, 0)
		return err
	}
	return nil
}
