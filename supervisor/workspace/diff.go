package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/aymanbagabas/go-udiff"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// diff_workspace_session (§3.5). The session's changes are captured from its
// upper dir directly (layers.Capture; no holder is needed, so restoring and
// restore_failed sessions are served too) and compared with a left side: the
// session's base view (against "base") or the current head (against "head").
//
// Result decisions beyond the contract's text:
//
//   - files are sorted by path bytes; carriers are never listed. Protected
//     drops (FIFOs, sockets and devices; non-UTF-8 names reported as
//     ".invalid-layer-path/<hex>") are listed with kind "other".
//   - A change that hides a base directory's content (a delete, an opaque
//     directory, or a file, symlink or special file replacing a directory)
//     also lists every visible base descendant the session does not itself
//     re-create, as status "deleted" (kind "absent"), like git lists each
//     deleted file. A directory with more than runtime.publish.expansion_limit
//     (4096) visible descendants is not expanded (its own entry is listed).
//     The set of listed paths is the same for both values of against.
//   - status describes the session's change: "deleted" (delete, and the
//     expanded descendants), "symlink", "dir" (directory or opaque_dir), and
//     for files and special files "added" when the left side is absent, else
//     "modified" (also when only the mode changed).
//   - mode is {old, new}, each a 4-digit octal string ("0644", "0755",
//     "1777" for a sticky directory) or null where that side is neither a
//     file nor a directory; mode is null when neither side is one.
//   - diff is non-null when at least one side is a regular file and every
//     regular-file side is text (valid UTF-8, no NUL, ≤ 8 MiB); a non-file
//     side counts as empty. It is "" when the texts are equal (a mode-only
//     change). binary is true when a regular-file side is not text; then diff
//     is null. Symlink targets are not diffed.
//   - The max_bytes budget is spent in path order: the first diff that does
//     not fit in what is left exhausts it, and from then on every file that
//     would carry a diff has diff:null, diff_truncated:true.
//   - The paths filter applies to files and head_changed_paths alike; both
//     are capped at 10000 entries (truncated:true when files is).
//   - head_changed_paths compares base and head fingerprints of every listed
//     path (expanded descendants included).

const (
	wsDiffMaxFiles     = 10000
	wsDiffMaxTextBytes = 8 << 20
	wsDiffContext      = udiff.DefaultContextLines
	wsDiffCaptureTries = 3
)

type wsDiffMode struct {
	Old *string `json:"old"`
	New *string `json:"new"`
}

type wsDiffFile struct {
	Path          string      `json:"path"`
	Status        string      `json:"status"`
	Kind          string      `json:"kind"`
	Route         string      `json:"route"`
	Binary        bool        `json:"binary"`
	Mode          *wsDiffMode `json:"mode"`
	Diff          *string     `json:"diff"`
	DiffTruncated bool        `json:"diff_truncated"`
}

// wsDiffItem is one path the session changed: its change (nil for an
// expanded descendant) and its drop (for protected drops).
type wsDiffItem struct {
	path     string
	change   *layers.Change
	dropKind bool // a protected drop: the session's result is "other"
}

// wsDiffSide is one side of a path: the left view's entry or the session's
// result.
type wsDiffSide struct {
	kind string // file, symlink, directory, other, absent
	mode fs.FileMode
	open func() (*os.File, int64, error) // files only: the content and its size
}

func (d wsDiffSide) hasMode() bool { return d.kind == "file" || d.kind == "directory" }

// errWsDiffUpperChanged marks a capture or read that raced a write in the upper dir.
var errWsDiffUpperChanged = errors.New("upper dir changed")

// DiffRequest is what diff_workspace_session asks for.
type DiffRequest struct {
	ID, Against string
	MaxBytes    int64
	// Paths is the normalized paths filter (DiffFilters); nil means everything.
	Paths []string
	// ExpansionLimit is runtime.publish.expansion_limit.
	ExpansionLimit int
}

// Diff is diff_workspace_session (§3.5) on session r.ID of sb.
func Diff(ctx context.Context, sb *Sandbox, r DiffRequest) (map[string]any, error) {
	id := r.ID
	against := r.Against
	maxBytes := r.MaxBytes
	filters := r.Paths
	ss, e := LookupSession(sb, id)
	if e != nil {
		return nil, e
	}
	// The gate keeps publish, destroy and file operations from changing or
	// removing the upper dir under the walk (running commands still may:
	// a walk that races one is retried).
	ss.Gate.Lock()
	defer ss.Gate.Unlock()
	if _, e := LookupSession(sb, id); e != nil {
		return nil, e // destroyed while we waited
	}
	if st := ss.State(); st == SessFinalizing {
		return nil, catalog.Errorf(catalog.OperationConflict, "workspace session %s is %s", id, st).
			With("workspace_session_id", id).With("session_state", st)
	}
	ss.Mu.Lock()
	rec := ss.Rec
	ss.Mu.Unlock()
	baseView := sb.Stack.View(layers.Manifest{SchemaVersion: layers.SchemaVersion, Layers: rec.Lease.Layers})
	lease, err := sb.Stack.Acquire("workspace-diff:" + id)
	if err != nil {
		return nil, fmt.Errorf("read head: %w", err)
	}
	defer func() { _, _ = lease.Release() }()
	head := lease.Manifest()
	headView := sb.Stack.View(head)
	left := baseView
	if against == "head" {
		left = headView
	}
	d := &wsDiffer{ctx: ctx, base: baseView, head: headView, left: left, ignorer: layers.NewIgnorer(baseView),
		expansionLimit: r.ExpansionLimit, budget: maxBytes}
	var res map[string]any
	for try := 1; ; try++ {
		res, err = d.run(ss.Upper(), filters, head.RootHash() != rec.BaseRevision.RootHash)
		if err == nil || !errors.Is(err, errWsDiffUpperChanged) || try == wsDiffCaptureTries {
			break
		}
		d.budget, d.exhausted = maxBytes, false
	}
	if err != nil {
		// Never fs.ErrNotExist upwards: that would read as an unknown session.
		return nil, catalog.Errorf(catalog.OperationFailed, "diff_workspace_session failed: %v", err).With("workspace_session_id", id)
	}
	res["workspace_session_id"], res["against"] = id, against
	res["base_revision"], res["head_revision"] = rec.BaseRevision, head.Revision()
	return res, nil
}

// DiffFilters normalizes the paths argument (§7.2); nil means everything.
func DiffFilters(raw []any) ([]string, *catalog.Error) {
	if raw == nil {
		return nil, nil
	}
	out := make([]string, 0, len(raw))
	for _, v := range raw {
		p, ok := v.(string)
		if !ok {
			return nil, catalog.Errorf(catalog.InvalidRequest, "paths must be an array of path strings")
		}
		n, e := catalog.WorkspacePath(p, false)
		if e != nil {
			return nil, e
		}
		out = append(out, n)
	}
	return out, nil
}

func wsDiffMatch(filters []string, p string) bool {
	if filters == nil {
		return true
	}
	for _, f := range filters {
		if p == f || strings.HasPrefix(p, f+"/") {
			return true
		}
	}
	return false
}

type wsDiffer struct {
	ctx            context.Context
	base, head     *layers.View
	left           *layers.View
	ignorer        *layers.Ignorer
	expansionLimit int
	budget         int64
	exhausted      bool
}

func (d *wsDiffer) run(upper string, filters []string, headMoved bool) (map[string]any, error) {
	if _, err := os.Lstat(upper); err != nil {
		return nil, fmt.Errorf("session upper dir: %w", err)
	}
	cs, err := layers.Capture(d.ctx, upper, d.base)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, layers.ErrChanged) {
			return nil, fmt.Errorf("%w: %w", errWsDiffUpperChanged, err)
		}
		return nil, err
	}
	defer cs.Close()
	items, err := d.items(cs)
	if err != nil {
		return nil, err
	}
	files := make([]wsDiffFile, 0, min(len(items), wsDiffMaxFiles))
	headChanged := []string{}
	truncated := false
	for _, it := range items {
		if err := d.ctx.Err(); err != nil {
			return nil, err
		}
		if !wsDiffMatch(filters, it.path) {
			continue
		}
		if len(files) == wsDiffMaxFiles {
			truncated = true
			break
		}
		f, err := d.file(it)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
		if headMoved {
			moved, err := d.headMoved(it.path)
			if err != nil {
				return nil, err
			}
			if moved {
				headChanged = append(headChanged, it.path)
			}
		}
	}
	return map[string]any{"files": files, "head_changed_paths": headChanged, "truncated": truncated || d.exhausted}, nil
}

// items lists the changes and drops, plus the expanded base descendants,
// sorted by path bytes.
func (d *wsDiffer) items(cs *layers.Changeset) ([]wsDiffItem, error) {
	present := make(map[string]bool, len(cs.Changes)+len(cs.Carriers)+len(cs.Drops))
	var items []wsDiffItem
	for i := range cs.Changes {
		ch := &cs.Changes[i]
		items = append(items, wsDiffItem{path: ch.Path, change: ch})
		if ch.Kind != layers.ChangeDelete {
			present[ch.Path] = true
		}
	}
	for _, ch := range cs.Carriers {
		present[ch.Path] = true
	}
	for _, dr := range cs.Drops {
		items = append(items, wsDiffItem{path: dr.Path, dropKind: true})
		present[dr.Path] = true
	}
	slices.SortStableFunc(items, func(a, b wsDiffItem) int { return strings.Compare(a.path, b.path) })
	// Cutting changes, outermost only (an inner cut hides nothing more).
	var cuts []string
	for _, it := range items {
		if it.change != nil && it.change.Kind == layers.ChangeDirectory {
			continue
		}
		if len(cuts) > 0 && strings.HasPrefix(it.path, cuts[len(cuts)-1]+"/") {
			continue
		}
		e, err := d.base.Lstat(it.path)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) {
				continue
			}
			return nil, fmt.Errorf("base view: %w", err)
		}
		if e.Kind == layers.KindDir {
			cuts = append(cuts, it.path)
		}
	}
	for _, dir := range cuts {
		desc, ok, err := d.descendants(dir)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		for _, p := range desc {
			if !present[p] {
				items = append(items, wsDiffItem{path: p})
			}
		}
	}
	slices.SortStableFunc(items, func(a, b wsDiffItem) int { return strings.Compare(a.path, b.path) })
	return items, nil
}

// descendants lists the visible base entries below dir; ok is false when
// there are more than the expansion limit.
func (d *wsDiffer) descendants(dir string) ([]string, bool, error) {
	var out []string
	var walk func(p string) (bool, error)
	walk = func(p string) (bool, error) {
		ents, err := d.base.ReadDir(p)
		if err != nil {
			return false, fmt.Errorf("base view: %w", err)
		}
		for _, e := range ents {
			if err := d.ctx.Err(); err != nil {
				return false, err
			}
			out = append(out, e.Path)
			if len(out) > d.expansionLimit {
				return false, nil
			}
			if e.Kind == layers.KindDir {
				if ok, err := walk(e.Path); !ok || err != nil {
					return false, err
				}
			}
		}
		return true, nil
	}
	ok, err := walk(dir)
	if !ok || err != nil {
		return nil, false, err
	}
	return out, true, nil
}

// wsDiffViewSide is the entry of a view at p.
func wsDiffViewSide(v *layers.View, p string) (wsDiffSide, error) {
	e, err := v.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) {
		return wsDiffSide{kind: "absent"}, nil
	}
	if err != nil {
		return wsDiffSide{}, err
	}
	s := wsDiffSide{kind: string(e.Kind), mode: e.Mode}
	if e.Kind == layers.KindFile {
		s.open = func() (*os.File, int64, error) {
			f, e, err := v.OpenFile(p)
			return f, e.Size, err
		}
	}
	return s, nil
}

// wsDiffSessionSide is the session's result at the item's path.
func wsDiffSessionSide(it wsDiffItem) wsDiffSide {
	switch {
	case it.dropKind:
		return wsDiffSide{kind: "other"}
	case it.change == nil:
		return wsDiffSide{kind: "absent"}
	}
	ch := it.change
	switch ch.Kind {
	case layers.ChangeWrite:
		src := *ch
		return wsDiffSide{kind: "file", mode: ch.Mode, open: func() (*os.File, int64, error) {
			// Beneath the upper dir's Root: a directory the session swapped
			// for a symlink since the capture is refused, never followed.
			f, fi, err := src.OpenSource()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, layers.ErrSymlink) ||
					errors.Is(err, layers.ErrNotRegular) || errors.Is(err, syscall.ENOTDIR) {
					err = fmt.Errorf("%w: %w", errWsDiffUpperChanged, err)
				}
				return nil, 0, err
			}
			return f, fi.Size(), nil
		}}
	case layers.ChangeSymlink:
		return wsDiffSide{kind: "symlink"}
	case layers.ChangeDirectory, layers.ChangeOpaqueDir:
		return wsDiffSide{kind: "directory", mode: ch.Mode}
	}
	return wsDiffSide{kind: "absent"}
}

func wsDiffOctalMode(m fs.FileMode) *string {
	bits := uint32(m.Perm())
	if m&fs.ModeSticky != 0 {
		bits |= 0o1000
	}
	s := fmt.Sprintf("%04o", bits)
	return &s
}

// wsDiffReadText returns a file side's content and whether it is text (§3.5).
func wsDiffReadText(side wsDiffSide) (string, bool, error) {
	f, size, err := side.open()
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	if size > wsDiffMaxTextBytes {
		return "", false, nil
	}
	data, err := io.ReadAll(io.LimitReader(f, wsDiffMaxTextBytes+1))
	if err != nil {
		return "", false, err
	}
	if len(data) > wsDiffMaxTextBytes || slices.Contains(data, 0) || !utf8.Valid(data) {
		return "", false, nil
	}
	return string(data), true, nil
}

func (d *wsDiffer) file(it wsDiffItem) (wsDiffFile, error) {
	l, err := wsDiffViewSide(d.left, it.path)
	if err != nil {
		return wsDiffFile{}, fmt.Errorf("left view: %w", err)
	}
	r := wsDiffSessionSide(it)
	f := wsDiffFile{Path: it.path, Kind: r.kind, Route: "source"}
	isDir := r.kind == "directory"
	if r.kind == "absent" {
		if b, err := wsDiffViewSide(d.base, it.path); err == nil && b.kind == "directory" {
			isDir = true
		}
	}
	if d.ignorer.Ignored(it.path, isDir) {
		f.Route = "ignored"
	}
	switch {
	case r.kind == "absent":
		f.Status = "deleted"
	case r.kind == "symlink":
		f.Status = "symlink"
	case r.kind == "directory":
		f.Status = "dir"
	case l.kind == "absent":
		f.Status = "added"
	default:
		f.Status = "modified"
	}
	if l.hasMode() || r.hasMode() {
		f.Mode = &wsDiffMode{}
		if l.hasMode() {
			f.Mode.Old = wsDiffOctalMode(l.mode)
		}
		if r.hasMode() {
			f.Mode.New = wsDiffOctalMode(r.mode)
		}
	}
	if l.kind != "file" && r.kind != "file" {
		return f, nil
	}
	var texts [2]string
	for i, side := range []wsDiffSide{l, r} {
		if side.kind != "file" {
			continue
		}
		t, ok, err := wsDiffReadText(side)
		if err != nil {
			return wsDiffFile{}, fmt.Errorf("read %s: %w", it.path, err)
		}
		if !ok {
			f.Binary = true
			return f, nil
		}
		texts[i] = t
	}
	if d.exhausted {
		f.DiffTruncated = true
		return f, nil
	}
	text, err := udiff.ToUnified(layers.QuoteDiffPath("a/"+it.path), layers.QuoteDiffPath("b/"+it.path), texts[0], wsDiffEdits(texts[0], texts[1]), wsDiffContext)
	if err != nil {
		return wsDiffFile{}, fmt.Errorf("diff %s: %w", it.path, err)
	}
	if int64(len(text)) > d.budget {
		d.exhausted = true
		f.DiffTruncated = true
		return f, nil
	}
	d.budget -= int64(len(text))
	f.Diff = &text
	return f, nil
}

// wsDiffEdits are the hunks of the module's one line diff (layers), so the
// rendered diff shows the lines blame and the publish merge see changed;
// go-udiff only prints them.
func wsDiffEdits(a, b string) []udiff.Edit {
	var out []udiff.Edit
	for _, e := range layers.TextEdits([]byte(a), []byte(b)) {
		out = append(out, udiff.Edit{Start: e.Start, End: e.End, New: e.New})
	}
	return out
}

// headMoved reports whether head's fingerprint of p differs from base's.
func (d *wsDiffer) headMoved(p string) (bool, error) {
	b, berr := d.base.Lstat(p)
	h, herr := d.head.Lstat(p)
	if berr == nil && herr == nil && b.HostPath == h.HostPath {
		return false, nil // the same layer entry
	}
	bf, err := wsDiffFingerprint(d.base, p)
	if err != nil {
		return false, fmt.Errorf("base view: %w", err)
	}
	hf, err := wsDiffFingerprint(d.head, p)
	if err != nil {
		return false, fmt.Errorf("head view: %w", err)
	}
	return !bf.Equal(hf), nil
}

// wsDiffFingerprint is View.Fingerprint with paths no layer can hold as absent.
func wsDiffFingerprint(v *layers.View, p string) (layers.Fingerprint, error) {
	fp, err := v.Fingerprint(p)
	if errors.Is(err, fs.ErrInvalid) {
		return layers.Fingerprint{Kind: "absent"}, nil
	}
	return fp, err
}
