package layers

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// Fingerprint is the identity of a path's content in a revision's merged
// view (§9.3). Its JSON is the contract's shape.
type Fingerprint struct {
	Kind       string `json:"kind"` // absent, file, symlink, directory (other kinds are "other")
	Digest     string `json:"digest,omitempty"`
	Executable *bool  `json:"executable,omitempty"`
	Target     string `json:"target,omitempty"`
}

// Equal reports whether two fingerprints identify the same content.
func (f Fingerprint) Equal(g Fingerprint) bool {
	if f.Kind != g.Kind || f.Digest != g.Digest || f.Target != g.Target {
		return false
	}
	return (f.Executable == nil) == (g.Executable == nil) && (f.Executable == nil || *f.Executable == *g.Executable)
}

// Fingerprint computes the fingerprint of path in the view. File content is
// hashed by streaming, so large files cost I/O but no memory.
func (v *View) Fingerprint(path string) (Fingerprint, error) {
	e, err := v.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Fingerprint{Kind: "absent"}, nil
	}
	if err != nil {
		return Fingerprint{}, err
	}
	switch e.Kind {
	case KindDir:
		return Fingerprint{Kind: "directory"}, nil
	case KindSymlink:
		return Fingerprint{Kind: "symlink", Target: e.Target}, nil
	case KindFile:
		f, _, err := v.OpenFile(path)
		if err != nil {
			return Fingerprint{}, err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return Fingerprint{}, fmt.Errorf("fingerprint %s: %w", path, err)
		}
		x := e.Mode&0o111 != 0
		return Fingerprint{Kind: "file", Digest: hex.EncodeToString(h.Sum(nil)), Executable: &x}, nil
	}
	return Fingerprint{Kind: "other"}, nil
}
