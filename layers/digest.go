package layers

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// ChangeKind is the kind of one change of a changeset (§9.1).
type ChangeKind string

// The change kinds; their string values are hashed by the layer digest.
const (
	ChangeWrite     ChangeKind = "write"
	ChangeDelete    ChangeKind = "delete"
	ChangeSymlink   ChangeKind = "symlink"
	ChangeDirectory ChangeKind = "directory"
	ChangeOpaqueDir ChangeKind = "opaque_dir"
)

// Change is one entry of a changeset. Path is clean and workspace-relative.
//
//   - write: the file gets Data, or the content of the file Source when
//     Source is set; Mode (permission bits) and MTime (when non-zero) are kept.
//     With Root set (a capture of a session's upper dir, which the session
//     controls) Source is relative to Root and opened beneath it without
//     following any symlink; without, Source is a host path of a file the
//     supervisor wrote (a published layer's) and only its last component
//     is not followed. Read it with OpenSource.
//   - symlink: a symbolic link to Target (never validated).
//   - delete: a whiteout.
//   - directory / opaque_dir: a directory with Mode (0o777 and sticky); an
//     opaque one hides everything lower layers have below it.
type Change struct {
	Kind   ChangeKind
	Path   string
	Mode   fs.FileMode
	Data   []byte
	Source string
	Root   *Root
	Target string
	MTime  time.Time

	// loaded: content holds Source's bytes, read once by the publication
	// planner while fingerprinting, so staging and attribution reuse them
	// instead of opening the session's file again (one read per file).
	loaded  bool
	content []byte
}

// OpenSource opens the regular file a write's content comes from (Source,
// beneath Root when set); anything but a regular file is ErrNotRegular.
func (c Change) OpenSource() (*os.File, fs.FileInfo, error) {
	if c.Root != nil {
		return c.Root.OpenFile(c.Source)
	}
	return openHostFile(c.Source)
}

// aggregateChanges keeps the last change per path and sorts by path bytes.
func aggregateChanges(changes []Change) []Change {
	last := make(map[string]int, len(changes))
	for i, c := range changes {
		last[c.Path] = i
	}
	out := make([]Change, 0, len(last))
	for i, c := range changes {
		if last[c.Path] == i {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b Change) int {
		switch {
		case a.Path < b.Path:
			return -1
		case a.Path > b.Path:
			return 1
		}
		return 0
	})
	return out
}

var nul = []byte{0}

// ComputeLayerDigest is the layer digest of §8.3: the changeset is aggregated
// (last change per path wins) and sorted by path bytes, then SHA-256 runs over
// kind NUL path NUL payload NUL for every change. Write payloads come from
// Data or, when Source is set, from the file Source (read without following a
// final symlink).
func ComputeLayerDigest(changes []Change) (string, error) {
	h := sha256.New()
	for _, c := range aggregateChanges(changes) {
		if err := digestChange(h, c); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// LayerDigest is ComputeLayerDigest for changesets whose payloads are in
// memory; it returns "" when a Source file cannot be read or a kind is unknown.
func LayerDigest(changes []Change) string {
	d, err := ComputeLayerDigest(changes)
	if err != nil {
		return ""
	}
	return d
}

func digestChange(h hash.Hash, c Change) error {
	digestHeader(h, c)
	switch c.Kind {
	case ChangeWrite:
		if c.Source != "" {
			f, _, err := c.OpenSource()
			if err != nil {
				return fmt.Errorf("digest %s: %w", c.Path, err)
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("digest %s: read %s: %w", c.Path, f.Name(), err)
			}
		} else {
			h.Write(c.Data)
		}
	case ChangeSymlink:
		h.Write([]byte(c.Target))
	case ChangeDelete, ChangeDirectory, ChangeOpaqueDir:
	default:
		return fmt.Errorf("digest %s: unknown change kind %q", c.Path, c.Kind)
	}
	h.Write(nul)
	return nil
}

func digestHeader(h hash.Hash, c Change) {
	h.Write([]byte(c.Kind))
	h.Write(nul)
	h.Write([]byte(c.Path))
	h.Write(nul)
}

// baseEntry is one entry of the base root hash.
type baseEntry struct {
	path   string
	kind   string // "file", "symlink", "directory"
	size   int64
	sum    string // lowercase hex SHA-256 of a file
	target string
}

// hashBaseEntries is the base root hash of §8.3 over entries (sorted here).
func hashBaseEntries(entries []baseEntry) string {
	slices.SortFunc(entries, func(a, b baseEntry) int {
		switch {
		case a.path < b.path:
			return -1
		case a.path > b.path:
			return 1
		}
		return 0
	})
	h := sha256.New()
	for _, e := range entries {
		h.Write([]byte(e.kind))
		h.Write(nul)
		h.Write([]byte(e.path))
		h.Write(nul)
		switch e.kind {
		case "file":
			h.Write([]byte(strconv.FormatInt(e.size, 10)))
			h.Write(nul)
			h.Write([]byte(e.sum))
		case "symlink":
			h.Write([]byte(e.target))
		}
		h.Write(nul)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// BaseRootHash is the base root hash (§8.3) of the tree at root: every entry
// below root (root excluded), descriptor-relative, symlinks never followed.
// Entries other than regular files, directories and symlinks are an error.
func BaseRootHash(root string) (string, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("base root hash %s: %w", root, &fs.PathError{Op: "open", Path: root, Err: err})
	}
	var entries []baseEntry
	if err := hashWalk(fd, root, "", &entries); err != nil {
		return "", fmt.Errorf("base root hash %s: %w", root, err)
	}
	return hashBaseEntries(entries), nil
}

// hashWalk consumes dirfd (it is closed).
func hashWalk(dirfd int, hostDir, rel string, out *[]baseEntry) error {
	d := os.NewFile(uintptr(dirfd), hostDir)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read dir %q: %w", rel, err)
	}
	slices.Sort(names)
	for _, name := range names {
		childRel := joinRel(rel, name)
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("lstat %q: %w", childRel, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			*out = append(*out, baseEntry{path: childRel, kind: "directory"})
			cfd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open dir %q: %w", childRel, err)
			}
			if err := hashWalk(cfd, filepath.Join(hostDir, name), childRel, out); err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := readlinkat(dirfd, name)
			if err != nil {
				return fmt.Errorf("readlink %q: %w", childRel, err)
			}
			*out = append(*out, baseEntry{path: childRel, kind: "symlink", target: target})
		case unix.S_IFREG:
			ffd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
			if err != nil {
				return fmt.Errorf("open %q: %w", childRel, err)
			}
			f := os.NewFile(uintptr(ffd), name)
			h := sha256.New()
			n, err := io.Copy(h, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("read %q: %w", childRel, err)
			}
			*out = append(*out, baseEntry{path: childRel, kind: "file", size: n, sum: hex.EncodeToString(h.Sum(nil))})
		default:
			return fmt.Errorf("%q: unsupported file type %#o", childRel, st.Mode&unix.S_IFMT)
		}
	}
	return nil
}

func joinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}
