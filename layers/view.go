package layers

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// EntryKind is the type of a merged-view entry.
type EntryKind string

// Entry kinds.
const (
	KindFile    EntryKind = "file"
	KindDir     EntryKind = "directory"
	KindSymlink EntryKind = "symlink"
	KindOther   EntryKind = "other"
)

// ErrNotRegular is wrapped by ReadFile and OpenFile for entries that are not
// regular files.
var ErrNotRegular = errors.New("path is not a regular file")

// SymlinkError says that Path is not in a view because one of its parent
// components, Component (a workspace-relative prefix of Path), is a symlink
// there: views never follow symlinks. It matches fs.ErrNotExist, since the
// path is absent from the view, but callers that report to a user name the
// symlink rather than "not found".
type SymlinkError struct{ Path, Component string }

func (e *SymlinkError) Error() string {
	return fmt.Sprintf("path %q: component %q is a symlink", e.Path, e.Component)
}

func (e *SymlinkError) Is(target error) bool { return target == fs.ErrNotExist }

// ErrLayerMissing is wrapped by view reads when a layer of the manifest has no
// directory (the manifest and the disk disagree).
var ErrLayerMissing = errors.New("layer directory missing")

// Entry is one visible entry of a merged view.
type Entry struct {
	Path     string      // workspace-relative, "" for the root
	Kind     EntryKind   //
	Mode     fs.FileMode // permission bits (directories: plus fs.ModeSticky)
	Size     int64       //
	ModTime  time.Time   //
	Target   string      // symlink target
	HostPath string      // the physical path inside the winning layer
	LayerID  string      // the winning layer
}

// View is the read-only merged view of one manifest snapshot (§8.4). It never
// follows symlinks. A View is safe for concurrent use; it does not pin the
// layers (take a Lease for that).
type View struct {
	manifest Manifest
	layers   []viewLayer
}

type viewLayer struct {
	id   string
	root string
	// dirs memoizes probes of directory prefixes ("" = the layer root). A
	// published layer never changes, so a probe's result holds for the
	// View's life; without it every lookup re-probed each ancestor in each
	// layer (lstat + three xattr/marker checks per component), which made
	// a publish of thousands of files spend most of its time there.
	mu   *sync.Mutex
	dirs map[string]probeResult
}

// View returns the merged view of m.
func (s *Stack) View(m Manifest) *View {
	v := &View{manifest: m, layers: make([]viewLayer, len(m.Layers))}
	for i, l := range m.Layers {
		v.layers[i] = viewLayer{id: l.LayerID, root: s.LayerDir(l), mu: &sync.Mutex{}, dirs: map[string]probeResult{}}
	}
	return v
}

// probe is probe(l.root, comps) with the parent's probe memoized.
func (l *viewLayer) probe(comps []string) (probeResult, error) {
	if l.dirs == nil {
		return probe(l.root, comps)
	}
	if len(comps) == 0 {
		return l.probeDir(nil)
	}
	parent, err := l.probeDir(comps[:len(comps)-1])
	if err != nil {
		return probeResult{}, err
	}
	switch {
	case parent.state == probeBlocked:
		return parent, nil
	case parent.state == probeNone:
		return probeResult{state: probeNone, cut: parent.cut}, nil
	case !parent.fi.IsDir():
		// What probe does at a component that is not a real directory.
		return probeResult{state: probeBlocked, viaSymlink: parent.fi.Mode()&fs.ModeSymlink != 0}, nil
	}
	return probeLast(parent.host, comps[len(comps)-1], parent.cut)
}

// probeDir returns the memoized probe of a directory prefix. Errors (a
// missing layer) are not memoized.
func (l *viewLayer) probeDir(comps []string) (probeResult, error) {
	key := strings.Join(comps, "/")
	l.mu.Lock()
	r, ok := l.dirs[key]
	l.mu.Unlock()
	if ok {
		return r, nil
	}
	r, err := l.probeUncachedParent(comps)
	if err != nil {
		return probeResult{}, err
	}
	l.mu.Lock()
	l.dirs[key] = r
	l.mu.Unlock()
	return r, nil
}

// probeUncachedParent probes comps, reusing the memoized probe of its
// parent, so a deep prefix costs one component once.
func (l *viewLayer) probeUncachedParent(comps []string) (probeResult, error) {
	if len(comps) == 0 {
		return probe(l.root, nil)
	}
	return l.probe(comps)
}

// Manifest is the manifest this view shows.
func (v *View) Manifest() Manifest { return v.manifest }

// splitViewPath checks a clean workspace-relative path ("" = root).
func splitViewPath(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if len(p) > 4096 || strings.ContainsRune(p, 0) || !utf8.ValidString(p) {
		return nil, fmt.Errorf("invalid path %q: %w", p, fs.ErrInvalid)
	}
	comps := strings.Split(p, "/")
	for _, c := range comps {
		if c == "" || c == "." || c == ".." || len(c) > 255 {
			return nil, fmt.Errorf("invalid path %q: %w", p, fs.ErrInvalid)
		}
	}
	return comps, nil
}

type probeState int

const (
	probeNone    probeState = iota // this layer has nothing at the path
	probeFound                     // this layer has the entry
	probeBlocked                   // a whiteout or non-directory hides the path
)

type probeResult struct {
	state probeState
	// cut: an opaque directory at the path or at an ancestor in this layer
	// hides lower layers below it.
	cut  bool
	host string
	fi   fs.FileInfo
	// viaSymlink: blocked by a symlink at a parent component.
	viaSymlink bool
}

// probe resolves comps inside one layer, component by component with lstat,
// never descending through anything but a real directory.
func probe(root string, comps []string) (probeResult, error) {
	fi, err := os.Lstat(root)
	if err != nil {
		// Not fs.ErrNotExist: a missing layer is damage, not an absent path.
		return probeResult{}, fmt.Errorf("%w: %s (%v)", ErrLayerMissing, root, err)
	}
	if !fi.IsDir() {
		return probeResult{}, fmt.Errorf("layer %s: not a directory", root)
	}
	cut := isOpaqueDir(root)
	if len(comps) == 0 {
		return probeResult{state: probeFound, cut: cut, host: root, fi: fi}, nil
	}
	cur := root
	for j, c := range comps {
		r, err := probeLast(cur, c, cut)
		if err != nil || r.state != probeFound || j == len(comps)-1 {
			return r, err
		}
		if !r.fi.IsDir() {
			// Never descend through anything but a real directory.
			return probeResult{state: probeBlocked, viaSymlink: r.fi.Mode()&fs.ModeSymlink != 0}, nil
		}
		cur, cut = r.host, r.cut
	}
	return probeResult{state: probeNone, cut: cut}, nil
}

// probeLast probes the last component c in the real directory cur, cut
// saying whether an opaque directory above already hides lower layers.
func probeLast(cur, c string, cut bool) (probeResult, error) {
	p := filepath.Join(cur, c)
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		if _, werr := os.Lstat(filepath.Join(cur, whPrefix+c)); werr == nil {
			return probeResult{state: probeBlocked}, nil
		}
		return probeResult{state: probeNone, cut: cut}, nil
	}
	if err != nil {
		return probeResult{}, err
	}
	if isWhiteoutFile(p, fi) {
		return probeResult{state: probeBlocked}, nil
	}
	if fi.IsDir() && isOpaqueDir(p) {
		cut = true
	}
	return probeResult{state: probeFound, cut: cut, host: p, fi: fi}, nil
}

func notExist(op, p string) error {
	return &fs.PathError{Op: op, Path: p, Err: fs.ErrNotExist}
}

// lookup returns the winning layer's probe result and the layer index. A
// path absent because a visible parent component is a symlink is a
// *SymlinkError naming that component.
func (v *View) lookup(op, p string) (probeResult, int, error) {
	comps, err := splitViewPath(p)
	if err != nil {
		return probeResult{}, -1, fmt.Errorf("%s: %w", op, err)
	}
	for _, c := range comps {
		if hiddenName(c) {
			return probeResult{}, -1, notExist(op, p)
		}
	}
	r, i, viaSymlink, err := v.find(comps)
	switch {
	case err != nil:
		return probeResult{}, -1, fmt.Errorf("%s %q: %w", op, p, err)
	case i >= 0:
		return r, i, nil
	case viaSymlink:
		// Some layer has a symlink above p; it decides only if it is the
		// visible entry at its prefix (a newer directory may hide it).
		c, err := v.symlinkParent(comps)
		if err != nil {
			return probeResult{}, -1, fmt.Errorf("%s %q: %w", op, p, err)
		}
		if c != "" {
			return probeResult{}, -1, &SymlinkError{Path: p, Component: c}
		}
	}
	return probeResult{}, -1, notExist(op, p)
}

// find resolves comps across the layers, newest first: the winning probe
// and its layer index, or index -1 when the path is absent (viaSymlink:
// a layer's probe stopped at a symlink parent on the way).
func (v *View) find(comps []string) (probeResult, int, bool, error) {
	viaSymlink := false
	for i := range v.layers {
		r, err := v.layers[i].probe(comps)
		if err != nil {
			return probeResult{}, -1, false, err
		}
		viaSymlink = viaSymlink || r.viaSymlink
		switch r.state {
		case probeFound:
			return r, i, false, nil
		case probeBlocked:
			return probeResult{}, -1, viaSymlink, nil
		}
		if r.cut {
			break
		}
	}
	return probeResult{}, -1, viaSymlink, nil
}

// symlinkParent returns the shortest proper prefix of comps whose visible
// entry is a symlink, or "" when the first prefix that is not a directory
// is absent or something else.
func (v *View) symlinkParent(comps []string) (string, error) {
	for j := 1; j < len(comps); j++ {
		r, i, _, err := v.find(comps[:j])
		if err != nil || i < 0 {
			return "", err
		}
		if r.fi.Mode()&fs.ModeSymlink != 0 {
			return strings.Join(comps[:j], "/"), nil
		}
		if !r.fi.IsDir() {
			return "", nil
		}
	}
	return "", nil
}

func makeEntry(rel, layerID, host string, fi fs.FileInfo) (Entry, error) {
	e := Entry{Path: rel, HostPath: host, LayerID: layerID, Size: fi.Size(), ModTime: fi.ModTime(), Mode: fi.Mode().Perm()}
	m := fi.Mode()
	switch {
	case m.IsRegular():
		e.Kind = KindFile
	case m.IsDir():
		e.Kind = KindDir
		e.Mode |= m & fs.ModeSticky
	case m&fs.ModeSymlink != 0:
		e.Kind = KindSymlink
		t, err := os.Readlink(host)
		if err != nil {
			return Entry{}, err
		}
		e.Target = t
	default:
		e.Kind = KindOther
	}
	return e, nil
}

// Lstat returns the visible entry at path (clean, workspace-relative, "" for
// the root) or an error wrapping fs.ErrNotExist.
func (v *View) Lstat(path string) (Entry, error) {
	r, i, err := v.lookup("lstat", path)
	if err != nil {
		return Entry{}, err
	}
	e, err := makeEntry(path, v.layers[i].id, r.host, r.fi)
	if err != nil {
		return Entry{}, fmt.Errorf("lstat %q: %w", path, err)
	}
	return e, nil
}

// OpenFile opens the regular file visible at path for reading (no symlink is
// followed).
func (v *View) OpenFile(path string) (*os.File, Entry, error) {
	e, err := v.Lstat(path)
	if err != nil {
		return nil, Entry{}, err
	}
	if e.Kind != KindFile {
		return nil, e, fmt.Errorf("open %q: %w (%s)", path, ErrNotRegular, e.Kind)
	}
	f, err := os.OpenFile(e.HostPath, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, e, fmt.Errorf("open %q: %w", path, err)
	}
	return f, e, nil
}

// ReadFile returns the content of the regular file visible at path.
func (v *View) ReadFile(path string) ([]byte, error) {
	f, _, err := v.OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %q: %w", path, err)
	}
	return data, nil
}

// ReadDir lists the merged directory at path: the newest entry per name wins,
// whiteouts hide, opaque directories cut lower layers, markers are never
// listed. Entries are sorted by name bytes.
func (v *View) ReadDir(path string) ([]Entry, error) {
	comps, err := splitViewPath(path)
	if err != nil {
		return nil, fmt.Errorf("readdir: %w", err)
	}
	r, first, err := v.lookup("readdir", path)
	if err != nil {
		return nil, err
	}
	if !r.fi.IsDir() {
		return nil, fmt.Errorf("readdir %q: %w", path, syscall.ENOTDIR)
	}
	seen := make(map[string]bool) // name → decided (visible or hidden)
	var out []Entry
	for i := first; i < len(v.layers); i++ {
		if i > first {
			r, err = v.layers[i].probe(comps)
			if err != nil {
				return nil, fmt.Errorf("readdir %q: %w", path, err)
			}
			if r.state == probeBlocked || (r.state == probeFound && !r.fi.IsDir()) {
				break
			}
			if r.state == probeNone {
				if r.cut {
					break
				}
				continue
			}
		}
		if err := mergeDir(r.host, path, v.layers[i].id, seen, &out); err != nil {
			return nil, fmt.Errorf("readdir %q: %w", path, err)
		}
		if r.cut {
			break
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}

func mergeDir(host, rel, layerID string, seen map[string]bool, out *[]Entry) error {
	d, err := os.Open(host)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	var ociWhiteouts []string
	for _, name := range names {
		if kind, target := ParseName(LayerFormat, name); kind != NamePlain {
			if kind == NameOCIWhiteout {
				ociWhiteouts = append(ociWhiteouts, target)
			}
			continue
		}
		if seen[name] {
			continue
		}
		p := filepath.Join(host, name)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		seen[name] = true
		if isWhiteoutFile(p, fi) {
			continue
		}
		e, err := makeEntry(joinRel(rel, name), layerID, p, fi)
		if err != nil {
			return err
		}
		*out = append(*out, e)
	}
	for _, name := range ociWhiteouts {
		seen[name] = true
	}
	return nil
}
