package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
)

// File operations (§7): the views they read, the path rules, text reading
// and the edit engine. The handlers choose the view: the head's merged view
// (sessionless) or a session's, through its holder.

// FileEntry is one entry of whichever view a file operation reads.
type FileEntry struct {
	Name string
	Kind layers.EntryKind
	Mode fs.FileMode
	Size int64
}

// FileView is the read side of a file operation: the head's merged view
// (sessionless) or a session's view through its holder.
type FileView interface {
	Lstat(ctx context.Context, p string) (FileEntry, error)
	ReadFile(ctx context.Context, p string, max int64) ([]byte, error)
	ReadDir(ctx context.Context, p string) ([]FileEntry, error)
}

type HeadFiles struct{ V *layers.View }

func toEntry(e layers.Entry) FileEntry {
	return FileEntry{Name: path.Base(e.Path), Kind: e.Kind, Mode: e.Mode, Size: e.Size}
}

func (h HeadFiles) Lstat(_ context.Context, p string) (FileEntry, error) {
	e, err := h.V.Lstat(p)
	return toEntry(e), err
}

func (h HeadFiles) ReadFile(_ context.Context, p string, _ int64) ([]byte, error) {
	return h.V.ReadFile(p)
}

func (h HeadFiles) ReadDir(_ context.Context, p string) ([]FileEntry, error) {
	ents, err := h.V.ReadDir(p)
	out := make([]FileEntry, len(ents))
	for i, e := range ents {
		out[i] = toEntry(e)
	}
	return out, err
}

// SessionFiles reads through the holder. A file as a parent component
// makes the path absent, exactly as in the merged head view; a symlink is
// reported (symlinkComponentError).
type SessionFiles struct{ H FileHolder }

func holderEntry(fi nsholder.FileInfo) FileEntry {
	return FileEntry{Name: fi.Name, Kind: layers.EntryKind(fi.Kind), Mode: fi.Mode, Size: fi.Size}
}

func holderReadErr(err error) error {
	if errors.Is(err, nsholder.ErrNotDir) {
		return fs.ErrNotExist
	}
	return err
}

func (f SessionFiles) Lstat(ctx context.Context, p string) (FileEntry, error) {
	fi, err := f.H.Lstat(ctx, p)
	return holderEntry(fi), holderReadErr(err)
}

func (f SessionFiles) ReadFile(ctx context.Context, p string, max int64) ([]byte, error) {
	sp := obs.From(ctx).Child("holder.file_op", map[string]any{"op": "read", "path": p})
	b, _, err := f.H.ReadFile(ctx, p, max)
	sp.Done(err, nil)
	return b, holderReadErr(err)
}

func (f SessionFiles) ReadDir(ctx context.Context, p string) ([]FileEntry, error) {
	sp := obs.From(ctx).Child("holder.file_op", map[string]any{"op": "read_dir", "path": p})
	fis, err := f.H.ReadDir(ctx, p)
	sp.Done(err, nil)
	out := make([]FileEntry, len(fis))
	for i, fi := range fis {
		out[i] = holderEntry(fi)
	}
	return out, holderReadErr(err)
}

// SymlinkComponentError is the one rule for a path that leads through a
// symlink (§7.3: file operations never follow one): every file operation,
// with or without a session and on either overlay driver, refuses it with
// invalid_request naming the symlink component. The resolvers (layers'
// merged view, the holder's descriptor walk) decide; this only words it.
// It returns nil for any other error. A symlink as the last component is
// not this case: each operation keeps the contract's message for the
// target's kind ("path is not a regular file (Symlink)", "path is not a
// directory (Symlink)").
func SymlinkComponentError(err error) *catalog.Error {
	var path, comp string
	var le *layers.SymlinkError
	var he *nsholder.SymlinkError
	switch {
	case errors.As(err, &le):
		path, comp = le.Path, le.Component
	case errors.As(err, &he):
		path, comp = he.Path, he.Component
	default:
		return nil
	}
	return catalog.Errorf(catalog.InvalidRequest, "path %q: component %q is a symlink", path, comp).
		With("path", path).With("component", comp)
}

// Absent reports whether err means that the path is not in the view. A
// path behind a symlink is absent from the view too, but is reported as
// such (symlinkComponentError), never as "not found".
func Absent(err error) bool {
	return errors.Is(err, fs.ErrNotExist) && SymlinkComponentError(err) == nil
}

func FileNotFound(p string) *catalog.Error {
	return catalog.Errorf(catalog.NotFound, "file not found: %s", p).With("path", p)
}

func KindName(k layers.EntryKind) string {
	switch k {
	case layers.KindDir:
		return "Directory"
	case layers.KindSymlink:
		return "Symlink"
	case layers.KindFile:
		return "File"
	}
	return "Other"
}

// LstatFile resolves p in the view and insists on a regular file.
func LstatFile(ctx context.Context, v FileView, p string) (FileEntry, error) {
	e, err := v.Lstat(ctx, p)
	if Absent(err) {
		return e, FileNotFound(p)
	}
	if err != nil {
		return e, err
	}
	if e.Kind != layers.KindFile {
		return e, catalog.Errorf(catalog.InvalidRequest, "path is not a regular file (%s)", KindName(e.Kind)).With("path", p)
	}
	return e, nil
}

// ReadText reads a regular UTF-8 file of at most max bytes.
func ReadText(ctx context.Context, v FileView, p string, max int64) ([]byte, FileEntry, error) {
	e, err := LstatFile(ctx, v, p)
	if err != nil {
		return nil, e, err
	}
	if e.Size > max {
		return nil, e, catalog.Errorf(catalog.InvalidRequest, "file is too large").With("path", p).With("size", e.Size)
	}
	raw, err := v.ReadFile(ctx, p, max)
	if Absent(err) {
		return nil, e, FileNotFound(p)
	}
	if errors.Is(err, nsholder.ErrTooLarge) {
		return nil, e, catalog.Errorf(catalog.InvalidRequest, "file is too large").With("path", p)
	}
	if err != nil {
		return nil, e, fmt.Errorf("read %s: %w", p, err)
	}
	if !utf8.Valid(raw) {
		return nil, e, catalog.Errorf(catalog.InvalidRequest, "file is not valid UTF-8: %s", p).With("path", p)
	}
	return raw, e, nil
}

// NormalizeText drops a BOM and turns CRLF and lone CR into LF.
func NormalizeText(b []byte) string {
	b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
	s := strings.ReplaceAll(string(b), "\r\n", "\n")
	return strings.ReplaceAll(s, "\r", "\n")
}

// SplitLines splits normalized text into lines; one trailing newline does not
// start another line.
func SplitLines(t string) []string {
	if t == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(t, "\n"), "\n")
}

// WriteTarget checks that p can be written as a regular file in the view:
// every ancestor is a directory (or absent) and p itself is absent or a
// regular file. It returns the existing entry, if any.
func WriteTarget(v *layers.View, p string) (*layers.Entry, error) {
	e, err := v.Lstat(p)
	switch {
	case err == nil:
		if e.Kind != layers.KindFile {
			return nil, catalog.Errorf(catalog.InvalidRequest, "path is not a regular file (%s)", KindName(e.Kind)).With("path", p)
		}
		return &e, nil
	case !Absent(err): // including a symlink parent, which the view names
		return nil, err
	}
	parts := strings.Split(p, "/")
	for i := 1; i < len(parts); i++ {
		anc := strings.Join(parts[:i], "/")
		e, err := v.Lstat(anc)
		if Absent(err) {
			break
		}
		if err != nil {
			return nil, err
		}
		if e.Kind != layers.KindDir {
			return nil, catalog.Errorf(catalog.InvalidRequest, "a parent component is a %s, not a directory: %s", strings.ToLower(KindName(e.Kind)), anc).With("path", p)
		}
	}
	return nil, nil
}

func WriteType(created bool) string {
	if created {
		return "create"
	}
	return "update"
}

// SessionWrite writes through the holder, keeping an existing file's mode.
func SessionWrite(ctx context.Context, ss *Session, p string, data []byte) (bool, error) {
	h := ss.CurrentHolder()
	sp := obs.From(ctx).Child("holder.file_op", map[string]any{"op": "write", "path": p, "bytes": len(data)})
	created, err := h.WriteFile(ctx, p, data, nil)
	sp.Done(err, nil)
	switch {
	case err == nil:
		return created, nil
	case errors.Is(err, nsholder.ErrNotDir):
		return false, catalog.Errorf(catalog.InvalidRequest, "a parent component is a file, not a directory: %s", p).With("path", p)
	case errors.Is(err, nsholder.ErrNotRegular):
		kind := "Other"
		if fi, lerr := h.Lstat(ctx, p); lerr == nil {
			kind = KindName(layers.EntryKind(fi.Kind))
		}
		return false, catalog.Errorf(catalog.InvalidRequest, "path is not a regular file (%s)", kind).With("path", p)
	}
	return false, fmt.Errorf("write %s: %w", p, err)
}

func LayerID(r layers.PublishResult) any {
	if r.NoOp {
		return nil
	}
	return r.LayerID
}

type edit struct {
	old, new   string
	replaceAll bool
}

func ParseEdits(raw []any) ([]edit, error) {
	if len(raw) == 0 {
		return nil, catalog.Errorf(catalog.InvalidRequest, "edits must contain at least one edit")
	}
	out := make([]edit, 0, len(raw))
	for i, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			return nil, catalog.Errorf(catalog.InvalidRequest, "edits[%d] must be an object {old_string, new_string, replace_all?}", i)
		}
		for k := range m {
			if k != "old_string" && k != "new_string" && k != "replace_all" {
				return nil, catalog.Errorf(catalog.InvalidRequest, "edits[%d] has an unknown field: %s", i, k)
			}
		}
		old, ok1 := m["old_string"].(string)
		nw, ok2 := m["new_string"].(string)
		if !ok1 || !ok2 {
			return nil, catalog.Errorf(catalog.InvalidRequest, "edits[%d].old_string and new_string must be strings", i)
		}
		var all bool
		if v, present := m["replace_all"]; present && v != nil {
			b, ok := v.(bool)
			if !ok {
				return nil, catalog.Errorf(catalog.InvalidRequest, "edits[%d].replace_all must be a boolean", i)
			}
			all = b
		}
		if old == "" {
			return nil, catalog.Errorf(catalog.InvalidRequest, "edits[%d].old_string must not be empty", i)
		}
		if old == nw {
			return nil, catalog.Errorf(catalog.InvalidRequest, "edits[%d].old_string and new_string are identical", i)
		}
		out = append(out, edit{old: strings.ReplaceAll(strings.ReplaceAll(old, "\r\n", "\n"), "\r", "\n"),
			new: strings.ReplaceAll(strings.ReplaceAll(nw, "\r\n", "\n"), "\r", "\n"), replaceAll: all})
	}
	return out, nil
}

func snippet(s string) string {
	r := []rune(s)
	if len(r) > 60 {
		return string(r[:57]) + "..."
	}
	return s
}

// applyEdits runs the edits in order on LF-normalized text.
func applyEdits(text string, edits []edit) (string, int, error) {
	replacements := 0
	for i, e := range edits {
		n := strings.Count(text, e.old)
		switch {
		case n == 0:
			return "", 0, catalog.Errorf(catalog.InvalidRequest, "edits[%d]: old_string not found: %q", i, snippet(e.old))
		case n > 1 && !e.replaceAll:
			return "", 0, catalog.Errorf(catalog.InvalidRequest,
				"edits[%d]: old_string is not unique (%d matches); add context or set replace_all", i, n).With("matches", n)
		}
		if e.replaceAll {
			text = strings.ReplaceAll(text, e.old, e.new)
			replacements += n
		} else {
			text = strings.Replace(text, e.old, e.new, 1)
			replacements++
		}
	}
	return text, replacements, nil
}

// dominantEnding is the file's first line break: LF, CRLF or CR.
func dominantEnding(b []byte) string {
	i := bytes.IndexAny(b, "\r\n")
	switch {
	case i < 0 || b[i] == '\n':
		return "\n"
	case i+1 < len(b) && b[i+1] == '\n':
		return "\r\n"
	}
	return "\r"
}

// EditText applies edits to raw file bytes (§7.3): matching on LF-normalized
// text without BOM, then the dominant line ending and BOM restored.
func EditText(raw []byte, edits []edit, p string) ([]byte, int, error) {
	text := NormalizeText(raw)
	out, n, err := applyEdits(text, edits)
	if err != nil {
		return nil, 0, err
	}
	if out == text {
		return nil, 0, catalog.Errorf(catalog.InvalidRequest, "edit made no changes").With("path", p)
	}
	if nl := dominantEnding(raw); nl != "\n" {
		out = strings.ReplaceAll(out, "\n", nl)
	}
	if bytes.HasPrefix(raw, []byte("\xef\xbb\xbf")) {
		out = "\xef\xbb\xbf" + out
	}
	return []byte(out), n, nil
}

// Read is file_read (§7.3) of p in v: limit lines from line offset (1 when
// 0), within cfg's file limits.
func Read(ctx context.Context, cfg *config.Config, v FileView, p string, offset, limit uint64) (map[string]any, error) {
	raw, _, err := ReadText(ctx, v, p, cfg.Runtime.File.MaxReadFileBytes)
	if err != nil {
		return nil, err
	}
	lines := SplitLines(NormalizeText(raw))
	if offset == 0 {
		offset = 1
	}
	if limit > uint64(cfg.Runtime.File.ReadLinesMax) {
		return nil, catalog.RangeError("limit", 1, uint64(cfg.Runtime.File.ReadLinesMax))
	}
	total := uint64(len(lines))
	var window []string
	if offset <= total {
		end := min(total, offset-1+limit)
		window = lines[offset-1 : end]
	}
	content := strings.Join(window, "\n")
	if len(content) > cfg.Runtime.File.MaxOutputBytes {
		return nil, catalog.Errorf(catalog.InvalidRequest, "selected read output exceeds the maximum of %d bytes", cfg.Runtime.File.MaxOutputBytes).
			With("path", p).With("max_output_bytes", cfg.Runtime.File.MaxOutputBytes)
	}
	next := offset + uint64(len(window))
	truncated := len(window) > 0 && next <= total
	var nextOffset any
	if truncated {
		nextOffset = next
	}
	return map[string]any{
		"path": p, "content": content, "start_line": offset, "num_lines": len(window), "total_lines": total,
		"bytes_read": len(content), "total_bytes": len(raw), "next_offset": nextOffset, "truncated": truncated,
	}, nil
}

// List is file_list (§7.3) of directory p in v: at most limit entries,
// capped by cfg.
func List(ctx context.Context, cfg *config.Config, v FileView, p string, limit uint64) (map[string]any, error) {
	e, err := v.Lstat(ctx, p)
	if Absent(err) {
		return nil, catalog.Errorf(catalog.NotFound, "directory not found: %s", p).With("path", p)
	}
	if err != nil {
		return nil, err
	}
	if e.Kind != layers.KindDir {
		return nil, catalog.Errorf(catalog.InvalidRequest, "path is not a directory (%s)", KindName(e.Kind)).With("path", p)
	}
	ents, err := v.ReadDir(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", p, err)
	}
	maxEntries := min(int(min(limit, 1<<31)), cfg.Runtime.File.MaxListEntries)
	type entry struct {
		Name string `json:"name"`
		Kind string `json:"kind"`
		Size any    `json:"size"`
	}
	out := []entry{}
	for _, e := range ents {
		if len(out) == maxEntries {
			break
		}
		en := entry{Name: e.Name}
		switch e.Kind {
		case layers.KindFile:
			en.Kind, en.Size = "file", e.Size
		case layers.KindDir:
			en.Kind = "directory"
		case layers.KindSymlink:
			en.Kind = "symlink"
		default:
			en.Kind = "other"
		}
		out = append(out, en)
	}
	return map[string]any{"path": p, "entries": out, "truncated": len(ents) > len(out)}, nil
}

// CheckProtected refuses a sessionless write of a protected path with the
// same rejection object a publish gives (§9.2, §9.8).
func CheckProtected(p string, protected *layers.Patterns) error {
	msg := ""
	if g := layers.ClassifyGit(p, false); g.Kind == layers.GitPrivate || g.Kind == layers.GitProtected {
		// Publication never carries these (contract A8): a sessionless
		// write would be dropped silently, so it is refused instead.
		msg = fmt.Sprintf("%s is git-%s state that publication never carries; write it in a workspace session", p, g.Kind)
	} else if layers.Protected(p, false, protected) {
		msg = p + " is a protected path"
	} else {
		return nil
	}
	rej := &layers.Rejection{Path: p, Reason: layers.RejectProtectedPath, Conflicts: []layers.RejectedPath{
		{Path: p, Reason: layers.RejectProtectedPath, Strategy: layers.StrategyMerge, Hunks: []layers.ConflictHunk{}}}}
	return catalog.Errorf(catalog.OperationFailed, "write rejected by publication rules: %s", msg).
		With("path", p).With("publish_rejection", RejectionBody(rej))
}
