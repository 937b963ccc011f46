package layers

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Reasons of a protected drop (§9.1, §9.2).
const (
	DropUnsupportedSpecialFile = "unsupported_special_file"
	DropInvalidLayerPath       = "invalid_layer_path"
)

// InvalidLayerPathPrefix prefixes the reported path of an invalid_layer_path
// drop: ".invalid-layer-path/<lowercase hex of the raw relative path bytes>".
const InvalidLayerPathPrefix = ".invalid-layer-path/"

// Overlay xattrs capture must not ignore: a metacopy upper file has its data
// in a lower layer (the kernel never writes one with userxattr).
const (
	xattrUserMetacopy    = "user.overlay.metacopy"
	xattrTrustedMetacopy = "trusted.overlay.metacopy"
)

// Drop is an upper-dir entry that capture cannot turn into a change (a
// protected drop of §9.2). Path is workspace-relative and valid UTF-8.
type Drop struct {
	Path   string
	Reason string // DropUnsupportedSpecialFile or DropInvalidLayerPath
}

// Changeset is the result of Capture. Every slice is sorted by path bytes.
//
//   - Changes are the counted changes (routed, validated, planned). Writes
//     carry Source = the upper file's absolute host path (its content is read
//     at publish), Mode and MTime; symlinks carry Target (and MTime).
//   - Carriers are directory changes whose path is a directory with the same
//     mode in the base view: written to the layer, never counted, validated,
//     planned or diffed.
//   - Drops are the protected drops.
type Changeset struct {
	Changes  []Change
	Carriers []Change
	Drops    []Drop
}

// All returns Changes and Carriers merged in path-byte order: what a layer
// of this changeset contains.
func (cs *Changeset) All() []Change {
	out := make([]Change, 0, len(cs.Changes)+len(cs.Carriers))
	out = append(out, cs.Changes...)
	out = append(out, cs.Carriers...)
	sortChanges(out)
	return out
}

// Capture walks a session's upper directory (kernel overlay or FUSE overlay,
// both in the kernel's userxattr on-disk format, §8.4) and returns its
// changeset against base, the session's leased view (§9.1). base may be nil:
// then no directory is a carrier.
//
// Each directory is read in sorted order, its non-directories first, then its
// subdirectories are recursed into. Symlinks are never followed. Whiteouts (a
// 0:0 character device, or an empty regular file with an overlay whiteout
// xattr) become deletes; a directory with user.overlay.opaque=y (or
// trusted.overlay.opaque=y where readable) an opaque_dir, any other directory
// a directory change or a carrier; names are never interpreted as markers,
// except that the .wh..wh..opq whiteout inside an opaque directory (the FUSE
// driver's second opaque encoding) is skipped. Regular files become writes
// (hardlinks independent ones), symlinks symlinks; FIFOs, sockets and devices
// are dropped as unsupported_special_file, entries with a non-UTF-8 name as
// invalid_layer_path (never descended into). Files keep the 0o777 bits,
// directories 0o777 and the sticky bit; ownership, xattrs and the kernel's
// origin/impure/redirect/uuid xattrs are ignored. The upper dir must not
// change during the walk (the session is frozen or quiesced).
func Capture(ctx context.Context, upper string, base *View) (*Changeset, error) {
	abs, err := filepath.Abs(upper)
	if err != nil {
		return nil, fmt.Errorf("capture %s: %w", upper, err)
	}
	fi, err := os.Lstat(abs)
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("capture %s: upper is not a directory", abs)
	}
	w := &captureWalker{ctx: ctx, base: base, cs: &Changeset{}}
	if err := w.walkDir(abs, "", false); err != nil {
		return nil, fmt.Errorf("capture %s: %w", abs, err)
	}
	sortChanges(w.cs.Changes)
	sortChanges(w.cs.Carriers)
	slices.SortFunc(w.cs.Drops, func(a, b Drop) int { return strings.Compare(a.Path, b.Path) })
	return w.cs, nil
}

type captureWalker struct {
	ctx  context.Context
	base *View
	cs   *Changeset
}

func sortChanges(cs []Change) {
	slices.SortStableFunc(cs, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
}

// invalidLayerPath is the reported path of an entry whose relative path
// (raw bytes) is not valid UTF-8.
func invalidLayerPath(rawRel string) string {
	return InvalidLayerPathPrefix + hex.EncodeToString([]byte(rawRel))
}

// hasOpaqueXattr reports whether the directory at path carries an overlay
// opaque xattr set to "y" (the name-based .wh..wh..opq marker is not
// consulted: capture never interprets names).
func hasOpaqueXattr(path string) bool {
	if v, ok := getxattr(path, xattrUserOpq); ok && v == "y" {
		return true
	}
	v, ok := getxattr(path, xattrTrustedOpq)
	return ok && v == "y"
}

// readDirNamesNoFollow lists the directory at path (opened with O_NOFOLLOW),
// sorted by name bytes.
func readDirNamesNoFollow(path string) ([]string, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	d := os.NewFile(uintptr(fd), path)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("read dir %s: %w", path, err)
	}
	slices.Sort(names)
	return names, nil
}

type captureSubdir struct {
	host, rel string
	fi        fs.FileInfo
}

// walkDir captures the entries of the upper directory host (workspace path
// rel, "" for the root). opaque tells whether host itself is opaque.
func (w *captureWalker) walkDir(host, rel string, opaque bool) error {
	names, err := readDirNamesNoFollow(host)
	if err != nil {
		return err
	}
	var subdirs []captureSubdir
	for _, name := range names {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		p := filepath.Join(host, name)
		childRel := joinRel(rel, name)
		if !utf8.ValidString(childRel) {
			w.cs.Drops = append(w.cs.Drops, Drop{Path: invalidLayerPath(childRel), Reason: DropInvalidLayerPath})
			continue
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		m := fi.Mode()
		switch {
		case m.IsDir():
			subdirs = append(subdirs, captureSubdir{host: p, rel: childRel, fi: fi})
		case isWhiteoutFile(p, fi):
			if opaque && name == opaqueMarker {
				continue // the second half of the opaque encoding of host
			}
			w.cs.Changes = append(w.cs.Changes, Change{Kind: ChangeDelete, Path: childRel})
		case m&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			w.cs.Changes = append(w.cs.Changes, Change{Kind: ChangeSymlink, Path: childRel, Target: target, MTime: fi.ModTime()})
		case m.IsRegular():
			if _, ok := getxattr(p, xattrUserMetacopy); ok {
				return fmt.Errorf("%s: metacopy upper files are not supported", childRel)
			}
			if _, ok := getxattr(p, xattrTrustedMetacopy); ok {
				return fmt.Errorf("%s: metacopy upper files are not supported", childRel)
			}
			w.cs.Changes = append(w.cs.Changes, Change{Kind: ChangeWrite, Path: childRel, Source: p, Mode: m.Perm(), MTime: fi.ModTime()})
		default: // FIFO, socket, device other than the 0:0 whiteout
			w.cs.Drops = append(w.cs.Drops, Drop{Path: childRel, Reason: DropUnsupportedSpecialFile})
		}
	}
	for _, sd := range subdirs {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		mode := dirMode(sd.fi.Mode())
		subOpaque := hasOpaqueXattr(sd.host)
		switch {
		case subOpaque:
			w.cs.Changes = append(w.cs.Changes, Change{Kind: ChangeOpaqueDir, Path: sd.rel, Mode: mode})
		default:
			carrier, err := w.isCarrier(sd.rel, mode)
			if err != nil {
				return err
			}
			c := Change{Kind: ChangeDirectory, Path: sd.rel, Mode: mode}
			if carrier {
				w.cs.Carriers = append(w.cs.Carriers, c)
			} else {
				w.cs.Changes = append(w.cs.Changes, c)
			}
		}
		if err := w.walkDir(sd.host, sd.rel, subOpaque); err != nil {
			return err
		}
	}
	return nil
}

// isCarrier reports whether base has a directory with exactly mode at rel.
func (w *captureWalker) isCarrier(rel string, mode fs.FileMode) (bool, error) {
	if w.base == nil {
		return false, nil
	}
	e, err := w.base.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) {
		return false, nil // absent, or a path no layer can hold
	}
	if err != nil {
		return false, fmt.Errorf("base view: %w", err)
	}
	return e.Kind == KindDir && e.Mode == mode, nil
}
