package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// File operations (§7). Without workspace_session_id they work on the
// published head: reads see its merged view, writes are a read-modify-write
// under the LayerStack's writer lock that publishes exactly one layer.

func (s *Supervisor) fileSession(c *call) error {
	if c.args.Has("workspace_session_id") {
		id := c.args.String("workspace_session_id")
		return catalog.Errorf(catalog.NotFound, "workspace session not found: %s", id).With("workspace_session_id", id)
	}
	return nil
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
func lstatFile(v *layers.View, p string) (layers.Entry, error) {
	e, err := v.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return e, fileNotFound(p)
	}
	if err != nil {
		return e, err
	}
	if e.Kind != layers.KindFile {
		return e, catalog.Errorf(catalog.InvalidRequest, "path is not a regular file (%s)", kindName(e.Kind)).With("path", p)
	}
	return e, nil
}

func (s *Supervisor) headView(sb *sandbox) (*layers.View, layers.Manifest, error) {
	m, err := sb.stack.Head()
	if err != nil {
		return nil, m, err
	}
	return sb.stack.View(m), m, nil
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
	if err := s.fileSession(c); err != nil {
		return nil, err
	}
	p, perr := catalog.WorkspacePath(c.args.String("path"), false)
	if perr != nil {
		return nil, perr
	}
	v, _, err := s.headView(c.sb)
	if err != nil {
		return nil, err
	}
	e, err := lstatFile(v, p)
	if err != nil {
		return nil, err
	}
	if e.Size > s.cfg.Runtime.File.MaxReadFileBytes {
		return nil, catalog.Errorf(catalog.InvalidRequest, "file is too large").With("path", p).With("size", e.Size)
	}
	raw, err := v.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if !utf8.Valid(raw) {
		return nil, catalog.Errorf(catalog.InvalidRequest, "file is not valid UTF-8: %s", p).With("path", p)
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
	if err := s.fileSession(c); err != nil {
		return nil, err
	}
	p, perr := catalog.WorkspacePath(c.args.String("path"), true)
	if perr != nil {
		return nil, perr
	}
	v, _, err := s.headView(c.sb)
	if err != nil {
		return nil, err
	}
	e, err := v.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, catalog.Errorf(catalog.NotFound, "directory not found: %s", p).With("path", p)
	}
	if err != nil {
		return nil, err
	}
	if e.Kind != layers.KindDir {
		return nil, catalog.Errorf(catalog.InvalidRequest, "path is not a directory (%s)", kindName(e.Kind)).With("path", p)
	}
	ents, err := v.ReadDir(p)
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
		en := entry{Name: path.Base(e.Path)}
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

// writeTarget checks that p can be written as a regular file in the view:
// every ancestor is a directory (or absent) and p itself is absent or a
// regular file. It returns the existing entry, if any.
func writeTarget(v *layers.View, p string) (*layers.Entry, error) {
	parts := strings.Split(p, "/")
	for i := 1; i < len(parts); i++ {
		anc := strings.Join(parts[:i], "/")
		e, err := v.Lstat(anc)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return nil, err
		}
		if e.Kind != layers.KindDir {
			return nil, catalog.Errorf(catalog.InvalidRequest, "a parent component is a %s, not a directory: %s", strings.ToLower(kindName(e.Kind)), anc).With("path", p)
		}
	}
	e, err := v.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if e.Kind != layers.KindFile {
		return nil, catalog.Errorf(catalog.InvalidRequest, "path is not a regular file (%s)", kindName(e.Kind)).With("path", p)
	}
	return &e, nil
}

// protectedError is the sessionless form of a protected_path publish rejection (§9.2, §9.8).
func (s *Supervisor) checkProtected(p string) error {
	reason := ""
	for _, seg := range strings.Split(p, "/") {
		if strings.HasPrefix(seg, ".wh.") {
			reason = "protected_path"
		}
	}
	if reason == "" && matchesAny(s.cfg.Runtime.Publish.ProtectedPaths, p) {
		reason = "protected_path"
	}
	if reason == "" {
		return nil
	}
	rej := map[string]any{
		"path": p, "reason": reason, "source_conflict": nil, "protected_drop": nil, "message": nil,
		"conflicts": []any{map[string]any{"path": p, "reason": reason, "strategy": "merge", "hunks": []any{}}},
	}
	return catalog.Errorf(catalog.OperationFailed, "write rejected by publication rules: %s is a protected path", p).
		With("path", p).With("publish_rejection", rej)
}

func (s *Supervisor) fileWrite(c *call) (any, error) {
	if err := s.fileSession(c); err != nil {
		return nil, err
	}
	p, perr := catalog.WorkspacePath(c.args.String("path"), false)
	if perr != nil {
		return nil, perr
	}
	if err := s.checkProtected(p); err != nil {
		return nil, err
	}
	content := c.args.String("content")
	typ := "update"
	res, err := c.sb.stack.Update(c.ctx, func(v *layers.View) ([]layers.Change, error) {
		old, err := writeTarget(v, p)
		if err != nil {
			return nil, err
		}
		mode := fs.FileMode(0o644)
		if old == nil {
			typ = "create"
		} else {
			mode = old.Mode.Perm()
		}
		return []layers.Change{{Kind: layers.ChangeWrite, Path: p, Mode: mode, Data: []byte(content)}}, nil
	})
	if err != nil {
		return nil, err
	}
	s.bump(c.ctx, c.sb)
	return map[string]any{"type": typ, "path": p, "bytes_written": len(content), "revision": res.Revision, "layer_id": layerID(res)}, nil
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

func (s *Supervisor) fileEdit(c *call) (any, error) {
	if err := s.fileSession(c); err != nil {
		return nil, err
	}
	p, perr := catalog.WorkspacePath(c.args.String("path"), false)
	if perr != nil {
		return nil, perr
	}
	edits, err := parseEdits(c.args.Array("edits"))
	if err != nil {
		return nil, err
	}
	if err := s.checkProtected(p); err != nil {
		return nil, err
	}
	var written, replacements int
	res, err := c.sb.stack.Update(c.ctx, func(v *layers.View) ([]layers.Change, error) {
		e, err := lstatFile(v, p)
		if err != nil {
			return nil, err
		}
		if e.Size > s.cfg.Runtime.File.MaxEditBytes {
			return nil, catalog.Errorf(catalog.InvalidRequest, "file is too large").With("path", p)
		}
		raw, err := v.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		if !utf8.Valid(raw) {
			return nil, catalog.Errorf(catalog.InvalidRequest, "file is not valid UTF-8: %s", p).With("path", p)
		}
		text := normalizeText(raw)
		out, n, err := applyEdits(text, edits)
		if err != nil {
			return nil, err
		}
		if out == text {
			return nil, catalog.Errorf(catalog.InvalidRequest, "edit made no changes").With("path", p)
		}
		replacements = n
		if nl := dominantEnding(raw); nl != "\n" {
			out = strings.ReplaceAll(out, "\n", nl)
		}
		if bytes.HasPrefix(raw, []byte("\xef\xbb\xbf")) {
			out = "\xef\xbb\xbf" + out
		}
		written = len(out)
		return []layers.Change{{Kind: layers.ChangeWrite, Path: p, Mode: e.Mode.Perm(), Data: []byte(out)}}, nil
	})
	if err != nil {
		return nil, err
	}
	s.bump(c.ctx, c.sb)
	return map[string]any{"type": "edit", "path": p, "edits_applied": len(edits), "replacements": replacements,
		"bytes_written": written, "revision": res.Revision, "layer_id": layerID(res)}, nil
}
