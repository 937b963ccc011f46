package layers

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

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
//   - Git directories (#27 item 1, design rule 10): a fold never carries
//     what exportKeepsOut names — the files that make git run a program or
//     read elsewhere (ClassifyGit's GitProtected: config, hooks/**, info/**,
//     alternates, gitlinks…) and a session's private git state
//     (GitPrivate: index, logs, lock files…; the destination's own index
//     and logs describe its own work tree, a session's would clobber them),
//     even from layers published before publication protected them. A
//     path is also kept out when its lower-cased spelling is protected, for
//     destinations on case-insensitive file systems (.GIT/Config). Inside a
//     git directory no symlink is written, nothing is deleted and no
//     directory is emptied (objects are a union, refs are the git route's,
//     the destination's protected files stay); an opaque clear elsewhere
//     spares every git directory below it. Objects and refs are written
//     like any file. The kept-out paths are listed in Fold.KeptOut, which
//     export_changes reports. The base layer is never folded, so a
//     destination's own .git is never overwritten from the snapshot.
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
	// KeptOut are the paths of the folded layers that no export writes,
	// deletes or archives (exportKeepsOut): a git directory's private and
	// protected files, whatever layer holds them.
	KeptOut []string

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
		if exportKeepsOut(p, nd.kind) {
			f.KeptOut = append(f.KeptOut, p)
			continue
		}
		switch nd.kind {
		case foldDir:
			if ClassifyGit(p, true).Kind != GitNone {
				// A git directory is never emptied by an export: its
				// private and protected files stay the destination's,
				// objects are a union.
				nd.opaque = false
			}
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
