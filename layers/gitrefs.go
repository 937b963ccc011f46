package layers

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

// Reading a git directory's refs from a view (head, base) or from a
// session (base plus its captured changes), parsed: loose refs override
// packed-refs, symbolic refs keep their "ref: " value, and a ref's value is
// compared as a value, never merged as text.

// gitFS reads files of one side of a publication.
type gitFS interface {
	// read returns the regular file at path; ok is false when it is absent.
	read(path string) (data []byte, ok bool, err error)
	// files lists the regular files below dir (recursively).
	files(dir string) ([]string, error)
}

// viewFS is a gitFS of a view.
type viewFS struct{ v *View }

func (f viewFS) read(p string) ([]byte, bool, error) {
	e, err := f.v.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if e.Kind != KindFile {
		return nil, false, nil
	}
	data, err := readHostFile(e.HostPath)
	return data, err == nil, err
}

func (f viewFS) files(dir string) ([]string, error) {
	e, err := f.v.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) || (err == nil && e.Kind != KindDir) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	var rec func(d string) error
	rec = func(d string) error {
		es, err := f.v.ReadDir(d)
		if err != nil {
			return err
		}
		for _, e := range es {
			switch e.Kind {
			case KindDir:
				if err := rec(e.Path); err != nil {
					return err
				}
			case KindFile:
				out = append(out, e.Path)
			}
		}
		return nil
	}
	return out, rec(dir)
}

// sessionFS is a gitFS of a session: its captured changes over its base.
type sessionFS struct {
	base viewFS
	ch   map[string]*Change
}

// hidden reports whether the base's entry at p is not the session's: p or
// an ancestor is changed by something other than a plain directory.
func (f sessionFS) hidden(p string) bool {
	if _, ok := f.ch[p]; ok {
		return true
	}
	for a := parentOf(p); a != ""; a = parentOf(a) {
		if c, ok := f.ch[a]; ok && c.Kind != ChangeDirectory {
			return true
		}
	}
	return false
}

func (f sessionFS) read(p string) ([]byte, bool, error) {
	if c, ok := f.ch[p]; ok {
		if c.Kind != ChangeWrite {
			return nil, false, nil
		}
		data, err := changeContent(*c)
		return data, err == nil, err
	}
	if f.hidden(p) {
		return nil, false, nil
	}
	return f.base.read(p)
}

func (f sessionFS) files(dir string) ([]string, error) {
	var out []string
	if !f.hidden(dir) {
		bs, err := f.base.files(dir)
		if err != nil {
			return nil, err
		}
		for _, p := range bs {
			if !f.hidden(p) {
				out = append(out, p)
			}
		}
	}
	for p, c := range f.ch {
		if c.Kind == ChangeWrite && isBelow(p, dir) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out, nil
}

// gitRefs are the refs of one git directory: refname → value (an object id
// or "ref: <target>").
type gitRefs map[string]string

// readGitRefs reads dir's packed-refs and loose refs (HEAD excluded).
func readGitRefs(f gitFS, dir string) (gitRefs, error) {
	refs := gitRefs{}
	if data, ok, err := f.read(dir + "/packed-refs"); err != nil {
		return nil, fmt.Errorf("git refs %s: %w", dir, err)
	} else if ok {
		for _, line := range strings.Split(string(data), "\n") {
			if line == "" || line[0] == '#' || line[0] == '^' {
				continue
			}
			id, name, ok := strings.Cut(line, " ")
			if ok && strings.HasPrefix(name, "refs/") {
				refs[name] = id
			}
		}
	}
	loose, err := f.files(dir + "/refs")
	if err != nil {
		return nil, fmt.Errorf("git refs %s: %w", dir, err)
	}
	for _, p := range loose {
		if strings.HasSuffix(p, ".lock") {
			continue
		}
		data, ok, err := f.read(p)
		if err != nil {
			return nil, fmt.Errorf("git refs %s: %w", dir, err)
		}
		if ok {
			refs[strings.TrimPrefix(p, dir+"/")] = strings.TrimSpace(string(data))
		}
	}
	return refs, nil
}

// readGitHEAD returns HEAD's value ("" when absent).
func readGitHEAD(f gitFS, dir string) (string, error) {
	data, ok, err := f.read(dir + "/HEAD")
	if err != nil || !ok {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

// privateRef: refs that belong to one repository's own work, never
// published (a stash is a session's scratch, bisect and rewritten state is
// an operation in progress).
func privateRef(name string) bool {
	return name == "refs/stash" || strings.HasPrefix(name, "refs/bisect/") || strings.HasPrefix(name, "refs/worktree/") ||
		strings.HasPrefix(name, "refs/rewritten/") || strings.HasPrefix(name, "refs/prefetch/")
}

// isObjectID: 40 or 64 lowercase hex digits.
func isObjectID(v string) bool { return (len(v) == 40 || len(v) == 64) && isHex(v) }

// packedRefsWithout returns packed-refs without the named refs (and their
// peeled lines); changed is false when none was there.
func packedRefsWithout(data []byte, drop map[string]bool) (out []byte, changed bool) {
	var b strings.Builder
	skipPeel := false
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if line == "" {
			continue
		}
		if line[0] == '^' {
			if !skipPeel {
				b.WriteString(line)
			}
			continue
		}
		skipPeel = false
		if line[0] != '#' {
			if _, name, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " "); ok && drop[name] {
				skipPeel, changed = true, true
				continue
			}
		}
		b.WriteString(line)
	}
	return []byte(b.String()), changed
}

// changeContent is the content of a write (in-memory Data or its source).
func changeContent(c Change) ([]byte, error) {
	if c.Source == "" && !c.loaded {
		return c.Data, nil
	}
	return readSource(c)
}
