package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Export (§8.9): Fold folds every non-base layer of a manifest into one
// delta; ExportDir applies it to a host directory, ExportTar writes it as a
// deterministic (optionally zstd-compressed) tar archive.
//
// Decisions where the contract is silent:
//
//   - Layer contents are hostile input: every name must be valid UTF-8 and a
//     valid path component, OCI whiteouts must name a valid component, special
//     files other than the 0:0 whiteout are refused, symlink targets must be
//     non-empty valid UTF-8, and an opaque layer root is refused. Layers are
//     walked descriptor-relative with O_NOFOLLOW; files are opened below their
//     layer root with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), or a
//     per-component O_NOFOLLOW walk where openat2 is unavailable.
//   - A directory of the fold is opaque when any layer that reaches it marks
//     it opaque, and also when a lower folded layer holds a non-directory or a
//     whiteout at its path (that entry hides the base below it in the merged
//     view too). Deletions below an opaque directory of the fold are redundant
//     and dropped.
//   - ExportDir: deletes_applied counts deletions that removed an existing
//     entry; opaque_clears counts every opaque directory of the fold;
//     directories_written and symlinks_written count every directory and
//     symlink of the fold; bytes_written is the content bytes of the files
//     written. A non-directory in dest where the fold has a directory is
//     replaced, a directory where the fold has a file or symlink is removed
//     first; a symlink at the path of an opaque directory is unlinked (never
//     followed: the sandbox replaced that entry), a symlink anywhere else
//     where a directory is needed is the "refusing to traverse" error, which
//     a pre-flight walk reports before anything is written. An opaque clear
//     spares the entries the fold writes itself below the directory (pass 3
//     compares or replaces them, so the result is the same as emptying it and
//     unchanged files are still skipped). Directory mtimes
//     are not restored (writing their children changes them anyway). One
//     syncfs of dest ends the export.
//   - ExportTar: whiteout and opaque-marker entries are empty regular files
//     with mode 0644; a whiteout has mtime 0, an opaque marker its
//     directory's mtime; the marker sorts right after its directory, before
//     the directory's children. whiteouts_emitted counts both kinds. Names of
//     directories end in "/", symlinks have mode 0777. USTAR headers, PAX
//     records only where USTAR cannot hold a field (Go's archive/tar choice).
//   - Caps: max_apply_entries bounds the entries of the fold (every kind
//     counted); max_decompressed_bytes the file bytes of a dir export and the
//     plain tar size of an archive; max_stream_bytes the archive as written
//     (exact before writing for plain tar; for tar-zst the compressed size is
//     not knowable beforehand, so it is enforced while streaming and the
//     caller discards its temporary file). A zero cap is unlimited.

// ExportCaps are the limits of one export; zero means unlimited.
type ExportCaps struct {
	MaxStreamBytes       int64
	MaxDecompressedBytes int64
	MaxApplyEntries      int64
}

// CapError reports an exceeded export cap. Cap is the configuration key's
// last component: max_stream_bytes, max_decompressed_bytes or
// max_apply_entries.
type CapError struct {
	Cap   string
	Limit int64
	Need  int64 // the total the export would need (for a streamed cap: at least)
}

func (e *CapError) Error() string {
	return fmt.Sprintf("export exceeds %s: needs %d, limit %d", e.Cap, e.Need, e.Limit)
}

// ErrDestSymlink is matched (errors.Is) by the error of an export that found
// a symlink in dest where it needed a directory.
var ErrDestSymlink = errors.New("symlink in dest")

// DestSymlinkError is that error; Path is the absolute path in dest.
type DestSymlinkError struct{ Path string }

func (e *DestSymlinkError) Error() string {
	return "refusing to traverse a symlink in dest: " + e.Path
}

// Is makes errors.Is(err, ErrDestSymlink) true.
func (e *DestSymlinkError) Is(target error) bool { return target == ErrDestSymlink }

// ErrHostileLayer is wrapped by Fold errors about layer content that no
// writer of this package produces (invalid names, special files, …).
var ErrHostileLayer = errors.New("invalid layer content")

// FoldDir is a directory of the fold.
type FoldDir struct {
	Path   string
	Mode   fs.FileMode // permission bits and fs.ModeSticky
	MTime  time.Time
	Opaque bool // lower content below it is cut (it is in OpaqueClears)
}

// FoldFile is a regular file of the fold.
type FoldFile struct {
	Path    string
	Source  string // host path of the file inside its layer
	LayerID string
	Mode    fs.FileMode // permission bits
	Size    int64
	MTime   time.Time
	layer   int // index into Fold.roots
	rel     string
}

// FoldSymlink is a symbolic link of the fold.
type FoldSymlink struct {
	Path   string
	Target string
	MTime  time.Time
}

// Fold is the delta of every non-base layer of a manifest: newest wins,
// whiteouts and opaque cuts applied. Every slice is sorted by path bytes.
type Fold struct {
	Manifest     Manifest
	LayerIDs     []string // the folded layers, newest first (never nil)
	Deletions    []string
	OpaqueClears []string
	Dirs         []FoldDir
	Files        []FoldFile
	Symlinks     []FoldSymlink

	roots []string // layer root per index of LayerIDs
}

// Entries is the number of entries of the fold (what max_apply_entries
// bounds).
func (f *Fold) Entries() int64 {
	return int64(len(f.Deletions) + len(f.OpaqueClears) + len(f.Dirs) + len(f.Files) + len(f.Symlinks))
}

// FileBytes is the total size of the fold's regular files.
func (f *Fold) FileBytes() int64 {
	var n int64
	for _, x := range f.Files {
		n += x.Size
	}
	return n
}

// Empty reports whether the fold changes nothing.
func (f *Fold) Empty() bool { return f.Entries() == 0 }

type foldKind int

const (
	foldDir foldKind = iota + 1
	foldFile
	foldSymlink
	foldDelete
)

type foldNode struct {
	kind   foldKind
	opaque bool
	mode   fs.FileMode
	mtime  time.Time
	size   int64
	target string
	layer  int
	rel    string
}

type folder struct {
	ctx   context.Context
	nodes map[string]*foldNode
	roots []string
	ids   []string
}

func hostile(layerID, rel, format string, a ...any) error {
	return fmt.Errorf("layer %s: %q: %s: %w", layerID, rel, fmt.Sprintf(format, a...), ErrHostileLayer)
}

// Fold folds every non-base layer of m (which the caller keeps leased). The
// oldest layer of m must be a B* layer and the only one.
func (s *Stack) Fold(m Manifest) (*Fold, error) {
	return s.FoldContext(context.Background(), m)
}

// FoldContext is Fold with cancellation.
func (s *Stack) FoldContext(ctx context.Context, m Manifest) (*Fold, error) {
	n := len(m.Layers)
	if n == 0 || !strings.HasPrefix(m.Layers[n-1].LayerID, "B") {
		return nil, fmt.Errorf("export: manifest version %d has no base layer", m.Version)
	}
	fo := &folder{ctx: ctx, nodes: make(map[string]*foldNode)}
	for _, l := range m.Layers[:n-1] {
		if strings.HasPrefix(l.LayerID, "B") {
			return nil, fmt.Errorf("export: base layer %s is not the oldest layer of manifest version %d", l.LayerID, m.Version)
		}
		fo.ids = append(fo.ids, l.LayerID)
		fo.roots = append(fo.roots, s.LayerDir(l))
	}
	for i := range fo.ids {
		if err := fo.foldLayer(i); err != nil {
			return nil, fmt.Errorf("export: %w", err)
		}
	}
	f := &Fold{Manifest: cloneManifest(m), LayerIDs: append([]string{}, fo.ids...), roots: fo.roots}
	paths := make([]string, 0, len(fo.nodes))
	for p := range fo.nodes {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	opaque := map[string]bool{}
	for _, p := range paths {
		nd := fo.nodes[p]
		switch nd.kind {
		case foldDir:
			f.Dirs = append(f.Dirs, FoldDir{Path: p, Mode: nd.mode, MTime: nd.mtime, Opaque: nd.opaque})
			if nd.opaque {
				f.OpaqueClears = append(f.OpaqueClears, p)
				opaque[p] = true
			}
		case foldFile:
			f.Files = append(f.Files, FoldFile{Path: p, Source: filepath.Join(fo.roots[nd.layer], filepath.FromSlash(nd.rel)),
				LayerID: fo.ids[nd.layer], Mode: nd.mode, Size: nd.size, MTime: nd.mtime, layer: nd.layer, rel: nd.rel})
		case foldSymlink:
			f.Symlinks = append(f.Symlinks, FoldSymlink{Path: p, Target: nd.target, MTime: nd.mtime})
		case foldDelete:
			if !underOpaque(p, opaque) {
				f.Deletions = append(f.Deletions, p)
			}
		}
	}
	return f, nil
}

// underOpaque reports whether a strict ancestor of p is in opaque.
func underOpaque(p string, opaque map[string]bool) bool {
	for q := parentOf(p); q != ""; q = parentOf(q) {
		if opaque[q] {
			return true
		}
	}
	return false
}

func (fo *folder) foldLayer(i int) error {
	root := fo.roots[i]
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: layer %s: %s (%v)", ErrLayerMissing, fo.ids[i], root, err)
	}
	defer unix.Close(fd)
	op, err := fdOpaque(fd)
	if err != nil {
		return fmt.Errorf("layer %s: %w", fo.ids[i], err)
	}
	if op {
		return hostile(fo.ids[i], "", "an opaque layer root is not supported")
	}
	return fo.walk(i, fd, root, "")
}

// readDirFD lists the directory open at fd (through a new open file
// description, so fd's offset is untouched), sorted by name bytes.
func readDirFD(fd int) ([]string, error) {
	nfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(nfd), ".")
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

func validComponent(name string) bool {
	return name != "" && name != "." && name != ".." && len(name) <= 255 &&
		!strings.ContainsAny(name, "/\x00") && utf8.ValidString(name)
}

func statTime(ts unix.Timespec) time.Time { return time.Unix(ts.Sec, ts.Nsec) }

// walk folds the directory open at fd (layer i, workspace path rel).
func (fo *folder) walk(i, fd int, host, rel string) error {
	if err := fo.ctx.Err(); err != nil {
		return err
	}
	id := fo.ids[i]
	names, err := readDirFD(fd)
	if err != nil {
		return fmt.Errorf("layer %s: read dir %q: %w", id, rel, err)
	}
	local := make(map[string]bool, len(names))
	var ociWhiteouts []string
	for _, name := range names {
		switch kind, target := ParseName(LayerFormat, name); kind {
		case NameOpaqueMarker:
			continue
		case NameOCIWhiteout:
			if !validComponent(target) || hiddenName(target) {
				return hostile(id, joinRel(rel, name), "invalid whiteout name")
			}
			ociWhiteouts = append(ociWhiteouts, target)
			continue
		}
		childRel := joinRel(rel, name)
		if !validComponent(name) {
			return hostile(id, childRel, "invalid name")
		}
		if _, err := splitViewPath(childRel); err != nil {
			return hostile(id, childRel, "invalid path")
		}
		local[name] = true
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("layer %s: lstat %q: %w", id, childRel, err)
		}
		nd := &foldNode{layer: i, rel: childRel, mtime: statTime(st.Mtim)}
		childHost := filepath.Join(host, name)
		var cfd = -1
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			nd.kind = foldDir
			nd.mode = fs.FileMode(st.Mode & 0o777)
			if st.Mode&unix.S_ISVTX != 0 {
				nd.mode |= fs.ModeSticky
			}
			cfd, err = unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("layer %s: open dir %q: %w", id, childRel, err)
			}
			op, err := fdOpaque(cfd)
			if err != nil {
				unix.Close(cfd)
				return fmt.Errorf("layer %s: %q: %w", id, childRel, err)
			}
			nd.opaque = op
		case unix.S_IFREG:
			nd.kind = foldFile
			nd.mode = fs.FileMode(st.Mode & 0o777)
			nd.size = st.Size
			if IsWhiteout(&st, PathXattr(childHost)) {
				nd.kind = foldDelete
			}
		case unix.S_IFLNK:
			nd.kind = foldSymlink
			t, err := readlinkat(fd, name)
			if err != nil {
				return fmt.Errorf("layer %s: readlink %q: %w", id, childRel, err)
			}
			if t == "" || strings.ContainsRune(t, 0) || !utf8.ValidString(t) {
				return hostile(id, childRel, "invalid symlink target")
			}
			nd.target = t
		case unix.S_IFCHR:
			if !IsWhiteout(&st, nil) {
				return hostile(id, childRel, "unsupported device node")
			}
			nd.kind = foldDelete
		default:
			return hostile(id, childRel, "unsupported file type %#o", st.Mode&unix.S_IFMT)
		}
		descend := fo.decide(childRel, nd)
		if cfd >= 0 {
			if descend {
				err = fo.walk(i, cfd, childHost, childRel)
			}
			unix.Close(cfd)
			if err != nil {
				return err
			}
		}
	}
	for _, name := range ociWhiteouts {
		if local[name] {
			continue // the real entry of this layer wins over its own OCI whiteout
		}
		fo.decide(joinRel(rel, name), &foldNode{kind: foldDelete, layer: i, rel: joinRel(rel, name)})
	}
	return nil
}

// decide records nd at p unless a newer layer decided p, and reports whether
// the walk descends into nd (a directory whose lower content is visible).
func (fo *folder) decide(p string, nd *foldNode) bool {
	w := fo.nodes[p]
	if w == nil {
		fo.nodes[p] = nd
		return nd.kind == foldDir
	}
	if w.kind != foldDir || w.opaque {
		return false // decided and hiding everything lower
	}
	if nd.kind != foldDir {
		// A lower non-directory or whiteout hides the base below w.
		w.opaque = true
		return false
	}
	if nd.opaque {
		w.opaque = true // cuts the layers below this one (after this walk)
	}
	return true
}

// layerRoots opens the layer roots of a fold; close with closeFDs.
func (f *Fold) openRoots() ([]int, error) {
	fds := make([]int, len(f.roots))
	for i := range fds {
		fds[i] = -1
	}
	for i, r := range f.roots {
		fd, err := unix.Open(r, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			closeFDs(fds)
			return nil, fmt.Errorf("%w: %s (%v)", ErrLayerMissing, r, err)
		}
		fds[i] = fd
	}
	return fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// openSource opens a fold file inside its layer and checks it is still the
// regular file of the fold's size.
func (f *Fold) openSource(roots []int, x FoldFile) (*os.File, error) {
	fd, err := openBeneath(roots[x.layer], x.rel, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("open %s in layer %s: %w", x.Path, x.LayerID, err)
	}
	src := os.NewFile(uintptr(fd), x.Source)
	fi, err := src.Stat()
	if err != nil {
		src.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() != x.Size {
		src.Close()
		return nil, fmt.Errorf("%s in layer %s changed during the export", x.Path, x.LayerID)
	}
	return src, nil
}

// ---------------------------------------------------------------------------
// Progress.

type exportProgress struct {
	fn    func(string)
	what  string
	total int64
	done  int64
	last  time.Time
}

func newExportProgress(fn func(string), what string, total int64) *exportProgress {
	if fn == nil {
		fn = func(string) {}
	}
	return &exportProgress{fn: fn, what: what, total: total, last: time.Now()}
}

func (p *exportProgress) step() {
	p.done++
	if p.done%1000 == 0 || time.Since(p.last) >= time.Second {
		p.last = time.Now()
		p.fn(fmt.Sprintf("%s: %d/%d entries", p.what, p.done, p.total))
	}
}

// ---------------------------------------------------------------------------
// ExportDir.

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
	var st DirStats
	if err := f.CheckDirCaps(caps); err != nil {
		return st, err
	}
	rootfd, err := unix.Open(dest, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if fi, lerr := os.Lstat(dest); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return st, &DestSymlinkError{Path: dest}
		}
		return st, &fs.PathError{Op: "open", Path: dest, Err: err}
	}
	d := &destTree{root: dest, rootfd: rootfd}
	defer d.close()
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
		fd, err := d.dir(x.Path)
		if err != nil {
			return st, wrap("chmod", x.Path, err)
		}
		if err := unix.Fchmod(fd, unixPerm(x.Mode)); err != nil {
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

// ---------------------------------------------------------------------------
// ExportTar.

// TarStats is the outcome of ExportTar.
type TarStats struct {
	FilesWritten       int64
	DirectoriesWritten int64
	SymlinksWritten    int64
	WhiteoutsEmitted   int64
	BytesWritten       int64 // bytes written to w (compressed for zstd)
}

type tarEntry struct {
	key  string
	hdr  tar.Header
	file int // index into Fold.Files, -1 otherwise
}

var epoch = time.Unix(0, 0)

func secs(t time.Time) time.Time {
	if t.IsZero() {
		return epoch
	}
	return time.Unix(t.Unix(), 0)
}

// tarEntries returns the archive entries in order.
func (f *Fold) tarEntries() []tarEntry {
	out := make([]tarEntry, 0, f.Entries())
	base := tar.Header{Uid: 0, Gid: 0, Uname: "", Gname: ""}
	for _, x := range f.Dirs {
		h := base
		h.Typeflag, h.Name, h.Mode, h.ModTime = tar.TypeDir, x.Path+"/", int64(unixPerm(x.Mode)), secs(x.MTime)
		out = append(out, tarEntry{key: x.Path, hdr: h, file: -1})
		if x.Opaque {
			h := base
			h.Typeflag, h.Name, h.Mode, h.ModTime = tar.TypeReg, x.Path+"/"+opaqueMarker, 0o644, secs(x.MTime)
			out = append(out, tarEntry{key: x.Path + "/", hdr: h, file: -1})
		}
	}
	for i, x := range f.Files {
		h := base
		h.Typeflag, h.Name, h.Mode, h.ModTime, h.Size = tar.TypeReg, x.Path, int64(x.Mode.Perm()), secs(x.MTime), x.Size
		out = append(out, tarEntry{key: x.Path, hdr: h, file: i})
	}
	for _, x := range f.Symlinks {
		h := base
		h.Typeflag, h.Name, h.Linkname, h.Mode, h.ModTime = tar.TypeSymlink, x.Path, x.Target, 0o777, secs(x.MTime)
		out = append(out, tarEntry{key: x.Path, hdr: h, file: -1})
	}
	for _, p := range f.Deletions {
		name := joinRel(parentOf(p), whPrefix+path.Base(p))
		h := base
		h.Typeflag, h.Name, h.Mode, h.ModTime = tar.TypeReg, name, 0o644, epoch
		out = append(out, tarEntry{key: name, hdr: h, file: -1})
	}
	slices.SortFunc(out, func(a, b tarEntry) int { return strings.Compare(a.key, b.key) })
	return out
}

type countWriter struct {
	w     io.Writer
	n     int64
	limit int64 // 0 = none
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.limit > 0 && c.n+int64(len(p)) > c.limit {
		return 0, &CapError{Cap: "max_stream_bytes", Limit: c.limit, Need: c.n + int64(len(p))}
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// tarSize is the exact size of the plain tar archive of entries.
func tarSize(entries []tarEntry) (int64, error) {
	var total int64
	for i := range entries {
		c := &countWriter{w: io.Discard}
		tw := tar.NewWriter(c)
		h := entries[i].hdr
		if err := tw.WriteHeader(&h); err != nil {
			return 0, fmt.Errorf("tar header %s: %w", h.Name, err)
		}
		total += c.n + (h.Size+511)/512*512
	}
	return total + 1024, nil
}

// CheckTarCaps fails with a *CapError when an archive of f exceeds caps
// (compressed: the stream cap is checked while writing).
func (f *Fold) CheckTarCaps(caps ExportCaps, compressed bool) error {
	_, err := f.checkTarCaps(f.tarEntries(), caps, compressed)
	return err
}

func (f *Fold) checkTarCaps(entries []tarEntry, caps ExportCaps, compressed bool) (int64, error) {
	if n := int64(len(entries)); caps.MaxApplyEntries > 0 && n > caps.MaxApplyEntries {
		return 0, &CapError{Cap: "max_apply_entries", Limit: caps.MaxApplyEntries, Need: n}
	}
	size, err := tarSize(entries)
	if err != nil {
		return 0, err
	}
	if caps.MaxDecompressedBytes > 0 && size > caps.MaxDecompressedBytes {
		return 0, &CapError{Cap: "max_decompressed_bytes", Limit: caps.MaxDecompressedBytes, Need: size}
	}
	if !compressed && caps.MaxStreamBytes > 0 && size > caps.MaxStreamBytes {
		return 0, &CapError{Cap: "max_stream_bytes", Limit: caps.MaxStreamBytes, Need: size}
	}
	return size, nil
}

// ExportTar writes the fold to w as a deterministic tar archive, compressed
// with zstd at zstdLevel (1..22) unless zstdLevel is 0. The caps are checked
// before anything is written, except max_stream_bytes of a compressed
// archive, which fails the write once exceeded.
func (f *Fold) ExportTar(ctx context.Context, w io.Writer, zstdLevel int, caps ExportCaps, progress func(string)) (TarStats, error) {
	var st TarStats
	entries := f.tarEntries()
	if _, err := f.checkTarCaps(entries, caps, zstdLevel != 0); err != nil {
		return st, err
	}
	roots, err := f.openRoots()
	if err != nil {
		return st, err
	}
	defer closeFDs(roots)
	cw := &countWriter{w: w, limit: caps.MaxStreamBytes}
	var out io.Writer = cw
	var zw *zstd.Encoder
	if zstdLevel != 0 {
		zw, err = zstd.NewWriter(cw, zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(zstdLevel)), zstd.WithEncoderConcurrency(1))
		if err != nil {
			return st, fmt.Errorf("zstd: %w", err)
		}
		defer func() {
			if zw != nil {
				_ = zw.Close()
			}
		}()
		out = zw
	}
	tw := tar.NewWriter(out)
	pr := newExportProgress(progress, "export", int64(len(entries)))
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			return st, fmt.Errorf("tar %s: %w", h.Name, err)
		}
		switch {
		case e.file >= 0:
			x := f.Files[e.file]
			src, err := f.openSource(roots, x)
			if err != nil {
				return st, err
			}
			n, err := io.Copy(tw, io.LimitReader(src, x.Size))
			src.Close()
			if err != nil {
				return st, fmt.Errorf("tar %s: %w", h.Name, err)
			}
			if n != x.Size {
				return st, fmt.Errorf("%s in layer %s changed during the export", x.Path, x.LayerID)
			}
			st.FilesWritten++
		case h.Typeflag == tar.TypeDir:
			st.DirectoriesWritten++
		case h.Typeflag == tar.TypeSymlink:
			st.SymlinksWritten++
		default:
			st.WhiteoutsEmitted++
		}
		pr.step()
	}
	if err := tw.Close(); err != nil {
		return st, fmt.Errorf("tar: %w", err)
	}
	if zw != nil {
		err := zw.Close()
		zw = nil
		if err != nil {
			return st, fmt.Errorf("zstd: %w", err)
		}
	}
	st.BytesWritten = cw.n
	if pr.done > 0 {
		pr.fn(fmt.Sprintf("export: %d/%d entries archived", pr.done, pr.total))
	}
	return st, nil
}
