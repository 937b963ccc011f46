package layers

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// sides returns the base and head state of path.
func (p *planner) sides(path string) (b, h side, err error) {
	if b, err = p.stat(p.bv, path, true); err != nil {
		return
	}
	if !p.headChanged {
		return b, b, nil
	}
	if h, err = p.stat(p.hv, path, false); err != nil {
		return
	}
	if h.exists && b.exists && h.e.Kind == b.e.Kind && h.e.HostPath == b.e.HostPath {
		h.fp = b.fp
		return
	}
	h.fp, err = fingerprintOf(h)
	return
}

// stat reads one path of a view; paths no layer can hold are absent.
func (p *planner) stat(v *View, path string, withFP bool) (side, error) {
	e, err := v.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid):
		return side{fp: Fingerprint{Kind: "absent"}}, nil
	case err != nil:
		return side{}, fmt.Errorf("publish: %w", err)
	}
	sd := side{exists: true, e: e}
	if withFP {
		if sd.fp, err = fingerprintOf(sd); err != nil {
			return side{}, err
		}
	}
	return sd, nil
}

func fingerprintOf(sd side) (Fingerprint, error) {
	if !sd.exists {
		return Fingerprint{Kind: "absent"}, nil
	}
	switch sd.e.Kind {
	case KindDir:
		return Fingerprint{Kind: "directory"}, nil
	case KindSymlink:
		return Fingerprint{Kind: "symlink", Target: sd.e.Target}, nil
	case KindFile:
		d, err := hashHostFile(sd.e.HostPath)
		if err != nil {
			return Fingerprint{}, fmt.Errorf("publish: fingerprint %s: %w", sd.e.Path, err)
		}
		x := sd.e.Mode&0o111 != 0
		return Fingerprint{Kind: "file", Digest: d, Executable: &x}, nil
	}
	return Fingerprint{Kind: "other"}, nil
}

// Limits of the session file contents the planner keeps in memory: a file
// up to maxLoadedFile bytes is read once, fingerprinted, staged and
// attributed from the same bytes, until loadBudget bytes are held; larger
// files are streamed from the source at each step as before.
const (
	maxLoadedFile = 1 << 20
	loadBudget    = 64 << 20
)

// sessionFingerprint is the fingerprint of the session's result at the
// path. A small enough write's source is read into c (Change.content)
// while budget (bytes still allowed in memory) lasts.
func sessionFingerprint(c *Change, budget *int64) (Fingerprint, error) {
	switch c.Kind {
	case ChangeWrite:
		var d string
		if c.Source != "" {
			var err error
			if d, err = hashOrLoadSource(c, budget); err != nil {
				return Fingerprint{}, fmt.Errorf("publish %s: session file: %w", c.Path, err)
			}
		} else {
			sum := sha256.Sum256(c.Data)
			d = hex.EncodeToString(sum[:])
		}
		x := c.Mode&0o111 != 0
		return Fingerprint{Kind: "file", Digest: d, Executable: &x}, nil
	case ChangeSymlink:
		return Fingerprint{Kind: "symlink", Target: c.Target}, nil
	case ChangeDirectory, ChangeOpaqueDir:
		return Fingerprint{Kind: "directory"}, nil
	case ChangeDelete:
		return Fingerprint{Kind: "absent"}, nil
	}
	return Fingerprint{}, fmt.Errorf("publish %s: unknown change kind %q", c.Path, c.Kind)
}

// openHostFile opens the regular file p of a published layer (written by
// the supervisor, not by a session: only the last component is not
// followed). Files of a session's upper dir are opened with
// Change.OpenSource, beneath their Root.
func openHostFile(p string) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", p, ErrNotRegular)
	}
	return f, fi, nil
}

func hashHostFile(p string) (string, error) { return hashSource(Change{Source: p}) }

func readHostFile(p string) ([]byte, error) { return readSource(Change{Source: p}) }

// hashSource is the SHA-256 of a write's source file.
func hashSource(c Change) (string, error) {
	f, _, err := c.OpenSource()
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashOrLoadSource hashes a write's source, keeping its bytes in c when
// it fits the per-file limit and the remaining budget.
func hashOrLoadSource(c *Change, budget *int64) (string, error) {
	f, fi, err := c.OpenSource()
	if err != nil {
		return "", err
	}
	defer f.Close()
	if size := fi.Size(); size > maxLoadedFile || size > *budget {
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return "", err
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	// Read at most maxLoadedFile+1: a file growing past the limit meanwhile
	// is streamed like a large one (its whole content is hashed).
	data, err := io.ReadAll(io.LimitReader(f, maxLoadedFile+1))
	if err != nil {
		return "", err
	}
	if len(data) > maxLoadedFile {
		h := sha256.New()
		h.Write(data)
		if _, err := io.Copy(h, f); err != nil {
			return "", err
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	*budget -= int64(len(data))
	c.loaded, c.content = true, data
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// readSource is the content of a write's source file.
func readSource(c Change) ([]byte, error) {
	if c.loaded {
		return c.content, nil
	}
	f, _, err := c.OpenSource()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
