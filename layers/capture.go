package layers

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
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
//     carry Root = the upper dir and Source = the file's path beneath it
//     (its content is read at publish, through the Root), Mode and MTime;
//     symlinks carry Target (and MTime).
//   - Carriers are directory changes whose path is a directory with the same
//     mode in the base view: written to the layer, never counted, validated,
//     planned or diffed.
//   - Drops are the protected drops.
//
// Close releases Root once the changes' content is no longer needed.
type Changeset struct {
	Changes  []Change
	Carriers []Change
	Drops    []Drop
	Root     *Root
}

// Close releases the changeset's Root (nil-safe).
func (cs *Changeset) Close() error {
	if cs == nil || cs.Root == nil {
		return nil
	}
	return cs.Root.Close()
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
// then no directory is a carrier. The caller closes the changeset.
//
// Each directory is read in sorted order, its non-directories first, then its
// subdirectories are recursed into. The walk is descriptor-relative (each
// directory is opened from its parent's descriptor) and symlinks are never
// followed (see Root): a directory that turns into a symlink during the
// walk is ErrChanged, never a way out of the upper dir. Whiteouts (a
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
// origin/impure/redirect/uuid xattrs are ignored. The upper dir should not
// change during the walk (the session is frozen or quiesced); when it does,
// the result may mix states but holds nothing from outside it.
func Capture(ctx context.Context, upper string, base *View) (*Changeset, error) {
	abs, err := filepath.Abs(upper)
	if err != nil {
		return nil, fmt.Errorf("capture %s: %w", upper, err)
	}
	root, err := OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	cs, err := CaptureRoot(ctx, root, base)
	if err != nil {
		root.Close()
		return nil, err
	}
	return cs, nil
}

// CaptureRoot is Capture of an upper dir already open as root; the
// changeset's Root is root (closing the changeset closes it).
func CaptureRoot(ctx context.Context, root *Root, base *View) (*Changeset, error) {
	top, err := root.OpenDir("")
	if err != nil {
		return nil, fmt.Errorf("capture %s: %w", root.Name(), err)
	}
	w := &captureWalker{ctx: ctx, base: base, root: root, cs: &Changeset{Root: root}}
	if err := w.walkDir(top, false); err != nil {
		return nil, fmt.Errorf("capture %s: %w", root.Name(), err)
	}
	sortChanges(w.cs.Changes)
	sortChanges(w.cs.Carriers)
	slices.SortFunc(w.cs.Drops, func(a, b Drop) int { return strings.Compare(a.Path, b.Path) })
	return w.cs, nil
}

type captureWalker struct {
	ctx  context.Context
	base *View
	root *Root
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

// hasOpaqueXattr reports whether the directory d is opaque in UpperFormat
// (the name-based .wh..wh..opq marker is not consulted: capture never
// interprets names).
func hasOpaqueXattr(d *Dir) bool { return IsOpaqueXattr(d.Xattr(".")) }

// isWhiteoutAt is IsWhiteout for the entry name of d.
func isWhiteoutAt(d *Dir, name string, fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*unix.Stat_t)
	return ok && IsWhiteout(st, d.Xattr(name))
}

// changed maps what a raced walk meets (an entry gone, a directory replaced
// by a symlink or a file) to ErrChanged.
func changed(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrSymlink) || errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("%w: %w", ErrChanged, err)
	}
	return err
}

type captureSubdir struct {
	name string
}

// walkDir captures the entries of the upper directory d (closed on
// return). opaque tells whether d itself is opaque.
func (w *captureWalker) walkDir(d *Dir, opaque bool) error {
	defer d.Close()
	names, err := d.Names()
	if err != nil {
		return changed(err)
	}
	rel := d.Rel()
	var subdirs []captureSubdir
	for _, name := range names {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		childRel := joinRel(rel, name)
		if !utf8.ValidString(childRel) {
			w.cs.Drops = append(w.cs.Drops, Drop{Path: invalidLayerPath(childRel), Reason: DropInvalidLayerPath})
			continue
		}
		fi, err := d.Lstat(name)
		if err != nil {
			return changed(err)
		}
		m := fi.Mode()
		switch {
		case m.IsDir():
			subdirs = append(subdirs, captureSubdir{name: name})
		case isWhiteoutAt(d, name, fi):
			if IsOpaqueCompanion(name, true, opaque) {
				continue // the second half of the opaque encoding of d
			}
			w.cs.Changes = append(w.cs.Changes, Change{Kind: ChangeDelete, Path: childRel})
		case m&fs.ModeSymlink != 0:
			target, err := d.Readlink(name)
			if err != nil {
				return changed(err)
			}
			w.cs.Changes = append(w.cs.Changes, Change{Kind: ChangeSymlink, Path: childRel, Target: target, MTime: fi.ModTime()})
		case m.IsRegular():
			if _, ok := d.Getxattr(name, xattrUserMetacopy); ok {
				return fmt.Errorf("%s: metacopy upper files are not supported", childRel)
			}
			if _, ok := d.Getxattr(name, xattrTrustedMetacopy); ok {
				return fmt.Errorf("%s: metacopy upper files are not supported", childRel)
			}
			w.cs.Changes = append(w.cs.Changes, Change{Kind: ChangeWrite, Path: childRel, Root: w.root, Source: childRel, Mode: m.Perm(), MTime: fi.ModTime()})
		default: // FIFO, socket, device other than the 0:0 whiteout
			w.cs.Drops = append(w.cs.Drops, Drop{Path: childRel, Reason: DropUnsupportedSpecialFile})
		}
	}
	for _, sd := range subdirs {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		sub, err := d.OpenDir(sd.name)
		if err != nil {
			return changed(err)
		}
		// The mode and opaque xattr of the directory opened, which is the
		// one walked even if the name was swapped meanwhile.
		fi, err := sub.stat()
		if err != nil {
			sub.Close()
			return err
		}
		childRel := sub.Rel()
		mode := dirMode(fi.Mode())
		subOpaque := hasOpaqueXattr(sub)
		switch {
		case subOpaque:
			w.cs.Changes = append(w.cs.Changes, Change{Kind: ChangeOpaqueDir, Path: childRel, Mode: mode})
		default:
			carrier, err := w.isCarrier(childRel, mode)
			if err != nil {
				sub.Close()
				return err
			}
			c := Change{Kind: ChangeDirectory, Path: childRel, Mode: mode}
			if carrier {
				w.cs.Carriers = append(w.cs.Carriers, c)
			} else {
				w.cs.Changes = append(w.cs.Changes, c)
			}
		}
		if err := w.walkDir(sub, subOpaque); err != nil {
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
	return IsCarrier(false, mode, &e), nil
}
