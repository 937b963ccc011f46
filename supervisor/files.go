package supervisor

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
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// File operations (§7). Without workspace_session_id they work on the
// published head: reads see its merged view, writes are a read-modify-write
// under the LayerStack's writer lock that publishes exactly one layer.

// fileSession returns the session a file operation names, admitted and
// with its gate held (release with the returned func), or nil for a
// sessionless operation.
func (s *Supervisor) fileSession(c *call) (*session, func(), error) {
	if !c.args.Has("workspace_session_id") {
		return nil, func() {}, nil
	}
	ss, e := workspace.LookupSession(c.sb, c.args.String("workspace_session_id"))
	if e != nil {
		return nil, nil, e
	}
	ss.Gate.Lock()
	if e := ss.Admit(); e != nil {
		ss.Gate.Unlock()
		return nil, nil, e
	}
	ss.Mu.Lock()
	h := ss.Holder
	ss.Mu.Unlock()
	if h == nil {
		ss.Gate.Unlock()
		return nil, nil, catalog.Errorf(catalog.OperationFailed, "holder exited").With("workspace_session_id", ss.ID())
	}
	return ss, ss.Gate.Unlock, nil
}

// fileEntry is one entry of whichever view a file operation reads.
type fileEntry struct {
	name string
	kind layers.EntryKind
	mode fs.FileMode
	size int64
}

// fileView is the read side of a file operation: the head's merged view
// (sessionless) or a session's view through its holder.
type fileView interface {
	lstat(ctx context.Context, p string) (fileEntry, error)
	readFile(ctx context.Context, p string, max int64) ([]byte, error)
	readDir(ctx context.Context, p string) ([]fileEntry, error)
}

type headFiles struct{ v *layers.View }

func toEntry(e layers.Entry) fileEntry {
	return fileEntry{name: path.Base(e.Path), kind: e.Kind, mode: e.Mode, size: e.Size}
}

func (h headFiles) lstat(_ context.Context, p string) (fileEntry, error) {
	e, err := h.v.Lstat(p)
	return toEntry(e), err
}

func (h headFiles) readFile(_ context.Context, p string, _ int64) ([]byte, error) {
	return h.v.ReadFile(p)
}

func (h headFiles) readDir(_ context.Context, p string) ([]fileEntry, error) {
	ents, err := h.v.ReadDir(p)
	out := make([]fileEntry, len(ents))
	for i, e := range ents {
		out[i] = toEntry(e)
	}
	return out, err
}

// sessionFiles reads through the holder. A file as a parent component
// makes the path absent, exactly as in the merged head view; a symlink is
// reported (symlinkComponentError).
type sessionFiles struct{ h fileHolder }

func holderEntry(fi nsholder.FileInfo) fileEntry {
	return fileEntry{name: fi.Name, kind: layers.EntryKind(fi.Kind), mode: fi.Mode, size: fi.Size}
}

func holderReadErr(err error) error {
	if errors.Is(err, nsholder.ErrNotDir) {
		return fs.ErrNotExist
	}
	return err
}

func (f sessionFiles) lstat(ctx context.Context, p string) (fileEntry, error) {
	fi, err := f.h.Lstat(ctx, p)
	return holderEntry(fi), holderReadErr(err)
}

func (f sessionFiles) readFile(ctx context.Context, p string, max int64) ([]byte, error) {
	sp := spanFrom(ctx).child("holder.file_op", map[string]any{"op": "read", "path": p})
	b, _, err := f.h.ReadFile(ctx, p, max)
	sp.done(err, nil)
	return b, holderReadErr(err)
}

func (f sessionFiles) readDir(ctx context.Context, p string) ([]fileEntry, error) {
	sp := spanFrom(ctx).child("holder.file_op", map[string]any{"op": "read_dir", "path": p})
	fis, err := f.h.ReadDir(ctx, p)
	sp.done(err, nil)
	out := make([]fileEntry, len(fis))
	for i, fi := range fis {
		out[i] = holderEntry(fi)
	}
	return out, holderReadErr(err)
}

// viewFor returns the read view of a file operation and a release func.
func (s *Supervisor) viewFor(c *call) (fileView, *session, func(), error) {
	ss, release, err := s.fileSession(c)
	if err != nil {
		return nil, nil, nil, err
	}
	if ss != nil {
		ss.Mu.Lock()
		h := ss.Holder
		ss.Mu.Unlock()
		return sessionFiles{h}, ss, release, nil
	}
	// A lease, not a bare read of head: a squash may replace head's layers
	// and collect them while this read still walks them.
	lease, err := c.sb.Stack.Acquire("read")
	if err != nil {
		release()
		return nil, nil, nil, err
	}
	return headFiles{c.sb.Stack.View(lease.Manifest())}, nil, func() {
		if _, err := lease.Release(); err != nil {
			s.log.Warn("release read lease", "err", err)
		}
		release()
	}, nil
}

// symlinkComponentError is the one rule for a path that leads through a
// symlink (§7.3: file operations never follow one): every file operation,
// with or without a session and on either overlay driver, refuses it with
// invalid_request naming the symlink component. The resolvers (layers'
// merged view, the holder's descriptor walk) decide; this only words it.
// It returns nil for any other error. A symlink as the last component is
// not this case: each operation keeps the contract's message for the
// target's kind ("path is not a regular file (Symlink)", "path is not a
// directory (Symlink)").
func symlinkComponentError(err error) *catalog.Error {
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

// absent reports whether err means that the path is not in the view. A
// path behind a symlink is absent from the view too, but is reported as
// such (symlinkComponentError), never as "not found".
func absent(err error) bool {
	return errors.Is(err, fs.ErrNotExist) && symlinkComponentError(err) == nil
}

func fileNotFound(p string) *catalog.Error {
	return catalog.Errorf(catalog.NotFound, "file not found: %s", p).With("path", p)
}

func kindName(k layers.EntryKind) string {
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

// lstatFile resolves p in the view and insists on a regular file.
func lstatFile(ctx context.Context, v fileView, p string) (fileEntry, error) {
	e, err := v.lstat(ctx, p)
	if absent(err) {
		return e, fileNotFound(p)
	}
	if err != nil {
		return e, err
	}
	if e.kind != layers.KindFile {
		return e, catalog.Errorf(catalog.InvalidRequest, "path is not a regular file (%s)", kindName(e.kind)).With("path", p)
	}
	return e, nil
}

// readText reads a regular UTF-8 file of at most max bytes.
func readText(ctx context.Context, v fileView, p string, max int64) ([]byte, fileEntry, error) {
	e, err := lstatFile(ctx, v, p)
	if err != nil {
		return nil, e, err
	}
	if e.size > max {
		return nil, e, catalog.Errorf(catalog.InvalidRequest, "file is too large").With("path", p).With("size", e.size)
	}
	raw, err := v.readFile(ctx, p, max)
	if absent(err) {
		return nil, e, fileNotFound(p)
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

// normalizeText drops a BOM and turns CRLF and lone CR into LF.
func normalizeText(b []byte) string {
	b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
	s := strings.ReplaceAll(string(b), "\r\n", "\n")
	return strings.ReplaceAll(s, "\r", "\n")
}

// splitLines splits normalized text into lines; one trailing newline does not
// start another line.
func splitLines(t string) []string {
	if t == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(t, "\n"), "\n")
}

func (s *Supervisor) fileRead(c *call) (any, error) {
	p, perr := catalog.WorkspacePath(c.args.String("path"), false)
	if perr != nil {
		return nil, perr
	}
	v, _, release, err := s.viewFor(c)
	if err != nil {
		return nil, err
	}
	defer release()
	raw, _, err := readText(c.ctx, v, p, s.cfg.Runtime.File.MaxReadFileBytes)
	if err != nil {
		return nil, err
	}
	lines := splitLines(normalizeText(raw))
	offset := c.args.Uint("offset")
	if offset == 0 {
		offset = 1
	}
	limit := c.args.Uint("limit")
	if limit > uint64(s.cfg.Runtime.File.ReadLinesMax) {
		return nil, catalog.RangeError("limit", 1, uint64(s.cfg.Runtime.File.ReadLinesMax))
	}
	total := uint64(len(lines))
	var window []string
	if offset <= total {
		end := min(total, offset-1+limit)
		window = lines[offset-1 : end]
	}
	content := strings.Join(window, "\n")
	if len(content) > s.cfg.Runtime.File.MaxOutputBytes {
		return nil, catalog.Errorf(catalog.InvalidRequest, "selected read output exceeds the maximum of %d bytes", s.cfg.Runtime.File.MaxOutputBytes).
			With("path", p).With("max_output_bytes", s.cfg.Runtime.File.MaxOutputBytes)
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

func (s *Supervisor) fileList(c *call) (any, error) {
	p, perr := catalog.WorkspacePath(c.args.String("path"), true)
	if perr != nil {
		return nil, perr
	}
	v, _, release, err := s.viewFor(c)
	if err != nil {
		return nil, err
	}
	defer release()
	e, err := v.lstat(c.ctx, p)
	if absent(err) {
		return nil, catalog.Errorf(catalog.NotFound, "directory not found: %s", p).With("path", p)
	}
	if err != nil {
		return nil, err
	}
	if e.kind != layers.KindDir {
		return nil, catalog.Errorf(catalog.InvalidRequest, "path is not a directory (%s)", kindName(e.kind)).With("path", p)
	}
	ents, err := v.readDir(c.ctx, p)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", p, err)
	}
	limit := min(int(min(c.args.Uint("limit"), 1<<31)), s.cfg.Runtime.File.MaxListEntries)
	type entry struct {
		Name string `json:"name"`
		Kind string `json:"kind"`
		Size any    `json:"size"`
	}
	out := []entry{}
	for _, e := range ents {
		if len(out) == limit {
			break
		}
		en := entry{Name: e.name}
		switch e.kind {
		case layers.KindFile:
			en.Kind, en.Size = "file", e.size
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

// writeTarget checks that p can be written as a regular file in the view:
// every ancestor is a directory (or absent) and p itself is absent or a
// regular file. It returns the existing entry, if any.
func writeTarget(v *layers.View, p string) (*layers.Entry, error) {
	e, err := v.Lstat(p)
	switch {
	case err == nil:
		if e.Kind != layers.KindFile {
			return nil, catalog.Errorf(catalog.InvalidRequest, "path is not a regular file (%s)", kindName(e.Kind)).With("path", p)
		}
		return &e, nil
	case !absent(err): // including a symlink parent, which the view names
		return nil, err
	}
	parts := strings.Split(p, "/")
	for i := 1; i < len(parts); i++ {
		anc := strings.Join(parts[:i], "/")
		e, err := v.Lstat(anc)
		if absent(err) {
			break
		}
		if err != nil {
			return nil, err
		}
		if e.Kind != layers.KindDir {
			return nil, catalog.Errorf(catalog.InvalidRequest, "a parent component is a %s, not a directory: %s", strings.ToLower(kindName(e.Kind)), anc).With("path", p)
		}
	}
	return nil, nil
}

// checkProtected refuses a sessionless write of a protected path with the
// same rejection object a publish gives (§9.2, §9.8).
func (s *Supervisor) checkProtected(p string) error {
	if !layers.Protected(p, false, s.protected) {
		return nil
	}
	rej := &layers.Rejection{Path: p, Reason: layers.RejectProtectedPath, Conflicts: []layers.RejectedPath{
		{Path: p, Reason: layers.RejectProtectedPath, Strategy: layers.StrategyMerge, Hunks: []layers.ConflictHunk{}}}}
	return catalog.Errorf(catalog.OperationFailed, "write rejected by publication rules: %s is a protected path", p).
		With("path", p).With("publish_rejection", rejectionBody(rej))
}

func (s *Supervisor) fileWrite(c *call) (any, error) {
	p, perr := catalog.WorkspacePath(c.args.String("path"), false)
	if perr != nil {
		return nil, perr
	}
	content := []byte(c.args.String("content"))
	ss, release, err := s.fileSession(c)
	if err != nil {
		return nil, err
	}
	defer release()
	if ss != nil {
		created, err := s.sessionWrite(c.ctx, ss, p, content)
		if err != nil {
			return nil, err
		}
		s.checkpointSession(c.ctx, c.sb, ss, "", false, p)
		s.fileOpActivity(c.ctx, c.sb, ss, c.req.RequestID, p, created, len(content))
		s.bump(c.ctx, c.sb)
		return map[string]any{"type": writeType(created), "path": p, "bytes_written": len(content)}, nil
	}
	if err := s.checkProtected(p); err != nil {
		return nil, err
	}
	created := false
	var prev layers.Manifest // the head this write is based on, for line attribution
	res, err := c.sb.Stack.Update(c.ctx, func(v *layers.View) ([]layers.Change, error) {
		prev = v.Manifest()
		old, err := writeTarget(v, p)
		if err != nil {
			return nil, err
		}
		mode := fs.FileMode(0o644)
		if created = old == nil; !created {
			mode = old.Mode.Perm()
		}
		return []layers.Change{{Kind: layers.ChangeWrite, Path: p, Mode: mode, Data: content}}, nil
	})
	if err != nil {
		return nil, err
	}
	s.auditSessionless(c.ctx, c.sb, prev, res, p, c.req.RequestID)
	s.bump(c.ctx, c.sb)
	if !res.NoOp {
		s.notifyAutosquash(c.sb, "layer_committed")
	}
	return map[string]any{"type": writeType(created), "path": p, "bytes_written": len(content), "revision": res.Revision, "layer_id": layerID(res)}, nil
}

func writeType(created bool) string {
	if created {
		return "create"
	}
	return "update"
}

// sessionWrite writes through the holder, keeping an existing file's mode.
func (s *Supervisor) sessionWrite(ctx context.Context, ss *session, p string, data []byte) (bool, error) {
	ss.Mu.Lock()
	h := ss.Holder
	ss.Mu.Unlock()
	sp := spanFrom(ctx).child("holder.file_op", map[string]any{"op": "write", "path": p, "bytes": len(data)})
	created, err := h.WriteFile(ctx, p, data, nil)
	sp.done(err, nil)
	switch {
	case err == nil:
		return created, nil
	case errors.Is(err, nsholder.ErrNotDir):
		return false, catalog.Errorf(catalog.InvalidRequest, "a parent component is a file, not a directory: %s", p).With("path", p)
	case errors.Is(err, nsholder.ErrNotRegular):
		kind := "Other"
		if fi, lerr := h.Lstat(ctx, p); lerr == nil {
			kind = kindName(layers.EntryKind(fi.Kind))
		}
		return false, catalog.Errorf(catalog.InvalidRequest, "path is not a regular file (%s)", kind).With("path", p)
	}
	return false, fmt.Errorf("write %s: %w", p, err)
}

func layerID(r layers.PublishResult) any {
	if r.NoOp {
		return nil
	}
	return r.LayerID
}

type edit struct {
	old, new   string
	replaceAll bool
}

func parseEdits(raw []any) ([]edit, error) {
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

// editText applies edits to raw file bytes (§7.3): matching on LF-normalized
// text without BOM, then the dominant line ending and BOM restored.
func editText(raw []byte, edits []edit, p string) ([]byte, int, error) {
	text := normalizeText(raw)
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

func (s *Supervisor) fileEdit(c *call) (any, error) {
	p, perr := catalog.WorkspacePath(c.args.String("path"), false)
	if perr != nil {
		return nil, perr
	}
	edits, err := parseEdits(c.args.Array("edits"))
	if err != nil {
		return nil, err
	}
	v, ss, release, err := s.viewFor(c)
	if err != nil {
		return nil, err
	}
	defer release()
	result := func(written, replacements int) map[string]any {
		return map[string]any{"type": "edit", "path": p, "edits_applied": len(edits), "replacements": replacements, "bytes_written": written}
	}
	if ss != nil {
		raw, _, err := readText(c.ctx, v, p, s.cfg.Runtime.File.MaxEditBytes)
		if err != nil {
			return nil, err
		}
		out, n, err := editText(raw, edits, p)
		if err != nil {
			return nil, err
		}
		created, err := s.sessionWrite(c.ctx, ss, p, out)
		if err != nil {
			return nil, err
		}
		s.checkpointSession(c.ctx, c.sb, ss, "", false, p)
		s.fileOpActivity(c.ctx, c.sb, ss, c.req.RequestID, p, created, len(out))
		s.bump(c.ctx, c.sb)
		return result(len(out), n), nil
	}
	if err := s.checkProtected(p); err != nil {
		return nil, err
	}
	var written, replacements int
	var prev layers.Manifest
	res, err := c.sb.Stack.Update(c.ctx, func(head *layers.View) ([]layers.Change, error) {
		prev = head.Manifest()
		raw, e, err := readText(c.ctx, headFiles{head}, p, s.cfg.Runtime.File.MaxEditBytes)
		if err != nil {
			return nil, err
		}
		out, n, err := editText(raw, edits, p)
		if err != nil {
			return nil, err
		}
		written, replacements = len(out), n
		return []layers.Change{{Kind: layers.ChangeWrite, Path: p, Mode: e.mode.Perm(), Data: out}}, nil
	})
	if err != nil {
		return nil, err
	}
	s.auditSessionless(c.ctx, c.sb, prev, res, p, c.req.RequestID)
	s.bump(c.ctx, c.sb)
	if !res.NoOp {
		s.notifyAutosquash(c.sb, "layer_committed")
	}
	r := result(written, replacements)
	r["revision"], r["layer_id"] = res.Revision, layerID(res)
	return r, nil
}
