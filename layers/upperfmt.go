package layers

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The upper-directory format (design rule 4, contract §8.4), decided here
// and nowhere else in this module: what a whiteout is, what an opaque
// directory is, which names are markers, what a carrier directory is, and
// how a whiteout and an opaque directory are written. Every reader in
// layers (capture, view, squash, update, export) and in the supervisor
// asks these functions; fuseoverlay, which may not import layers, keeps an
// fd-based twin (fuseoverlay/layers.go), and the table of cases in
// testdata/upperfmt.json holds both to the same answers.
//
// Two formats are read:
//   - UpperFormat, a session's upper dir as kernel overlayfs writes it in
//     userxattr mode and the FUSE overlay mirrors: a whiteout is a 0:0
//     character device or an empty regular file with an overlay whiteout
//     xattr (user. or trusted., any value); an opaque directory has an
//     overlay opaque xattr "y". Names are never markers: a session may
//     name a file ".wh.x" (publication refuses such paths, capture reports
//     them as they are).
//   - LayerFormat, a published or imported layer: UpperFormat plus the OCI
//     names: ".wh.<name>" whites out name, ".wh..wh..opq" (any type) makes
//     its directory opaque, and no ".wh." name is ever an entry.

// Marker names and xattrs of the overlay on-disk format (§8.4).
const (
	WhiteoutPrefix       = ".wh."
	OpaqueMarker         = ".wh..wh..opq"
	XattrUserWhiteout    = "user.overlay.whiteout"
	XattrTrustedWhiteout = "trusted.overlay.whiteout"
	XattrUserOpaque      = "user.overlay.opaque"
	XattrTrustedOpaque   = "trusted.overlay.opaque"
)

// The package's own short names for the format's constants.
const (
	whPrefix        = WhiteoutPrefix
	opaqueMarker    = OpaqueMarker
	xattrUserWh     = XattrUserWhiteout
	xattrTrustedWh  = XattrTrustedWhiteout
	xattrUserOpq    = XattrUserOpaque
	xattrTrustedOpq = XattrTrustedOpaque
)

// Format is which of the two encodings a reader accepts.
type Format uint8

const (
	UpperFormat Format = iota // a session's upper dir: xattrs and 0:0 devices only
	LayerFormat               // a layer: UpperFormat plus the OCI .wh. names
)

// NameKind is what a directory entry's name means in a Format.
type NameKind uint8

const (
	NamePlain        NameKind = iota // an ordinary entry
	NameOCIWhiteout                  // ".wh.<target>": target is whited out
	NameOpaqueMarker                 // ".wh..wh..opq": the directory is opaque
)

// ParseName classifies the entry name in format f; for NameOCIWhiteout it
// also returns the name it whites out (unchecked: a caller that must
// refuse a hostile layer validates it). In UpperFormat every name is
// NamePlain.
func ParseName(f Format, name string) (NameKind, string) {
	if f != LayerFormat || !strings.HasPrefix(name, WhiteoutPrefix) {
		return NamePlain, ""
	}
	if name == OpaqueMarker {
		return NameOpaqueMarker, ""
	}
	return NameOCIWhiteout, name[len(WhiteoutPrefix):]
}

// hiddenName reports whether a path component is reserved for the format
// (never an entry of a layer, never publishable).
func hiddenName(c string) bool { return strings.HasPrefix(c, WhiteoutPrefix) }

// XattrFunc reads one xattr of an entry without following a symlink: its
// value and whether it could be read.
type XattrFunc func(attr string) (string, bool)

// IsWhiteout decides whether an entry, described by its lstat st, is a
// whiteout by its own encoding (both formats): a 0:0 character device, or
// an empty regular file carrying an overlay whiteout xattr. xattr reads
// the entry's xattrs; it is called only for an empty regular file.
func IsWhiteout(st *unix.Stat_t, xattr XattrFunc) bool {
	return isWhiteout(st.Mode, st.Rdev, st.Size, xattr)
}

func isWhiteout(mode uint32, rdev uint64, size int64, xattr XattrFunc) bool {
	switch mode & unix.S_IFMT {
	case unix.S_IFCHR:
		return rdev == 0
	case unix.S_IFREG:
		if size != 0 || xattr == nil {
			return false
		}
		for _, x := range []string{XattrUserWhiteout, XattrTrustedWhiteout} {
			if _, ok := xattr(x); ok {
				return true
			}
		}
	}
	return false
}

// IsOpaqueXattr reports whether a directory's overlay opaque xattr (user.
// or trusted.) is "y": the whole opaque rule of UpperFormat.
func IsOpaqueXattr(xattr XattrFunc) bool {
	for _, x := range []string{XattrUserOpaque, XattrTrustedOpaque} {
		if v, ok := xattr(x); ok && v == "y" {
			return true
		}
	}
	return false
}

// IsOpaque decides whether a directory is opaque in format f: its opaque
// xattr, or in LayerFormat also an OpaqueMarker entry inside, which
// hasMarker looks up (an error other than absence is returned).
func IsOpaque(f Format, xattr XattrFunc, hasMarker func() (bool, error)) (bool, error) {
	if IsOpaqueXattr(xattr) {
		return true, nil
	}
	if f != LayerFormat || hasMarker == nil {
		return false, nil
	}
	return hasMarker()
}

// IsOpaqueCompanion reports whether an UpperFormat entry is the marker
// half of an opaque directory encoded both ways (xattr and a whiteout
// named .wh..wh..opq): it belongs to the directory, not to its entries.
func IsOpaqueCompanion(name string, whiteout, dirOpaque bool) bool {
	return dirOpaque && whiteout && name == OpaqueMarker
}

// IsCarrier decides whether a non-opaque upper directory with mode only
// carries its children: the base has a directory at its path with exactly
// that mode, so publishing it changes nothing by itself.
func IsCarrier(opaque bool, mode fs.FileMode, base *Entry) bool {
	return !opaque && base != nil && base.Kind == KindDir && base.Mode == mode
}

// CarrierMode is the mode of a directory written only to carry its
// children (a parent no change names): the base's mode when the base has a
// directory there, so that it is a carrier and changes nothing by itself,
// else 0755.
func CarrierMode(base *Entry) fs.FileMode {
	if base != nil && base.Kind == KindDir {
		return dirMode(base.Mode)
	}
	return 0o755
}

// PathXattr reads xattrs by host path (not following a final symlink):
// for trees nobody else controls (layers, a staging directory). Trees a
// session controls are read through a Root (Root.Xattr, Dir.Xattr).
func PathXattr(path string) XattrFunc {
	return func(attr string) (string, bool) { return getxattr(path, attr) }
}

// Xattr reads the xattrs of rel beneath the root ("" is the root itself).
func (r *Root) Xattr(rel string) XattrFunc {
	return func(attr string) (string, bool) { return r.Getxattr(rel, attr) }
}

// Xattr reads the xattrs of the entry name of d ("." is d itself).
func (d *Dir) Xattr(name string) XattrFunc {
	if name == "." {
		return func(attr string) (string, bool) { return d.getxattr(".", attr) }
	}
	return func(attr string) (string, bool) { return d.Getxattr(name, attr) }
}

// IsUpperWhiteout is IsWhiteout for the upper-dir entry rel beneath root,
// st being its lstat.
func IsUpperWhiteout(root *Root, rel string, st *unix.Stat_t) bool {
	return IsWhiteout(st, root.Xattr(rel))
}

// IsUpperOpaque reports whether the upper-dir directory rel beneath root
// is opaque (UpperFormat).
func IsUpperOpaque(root *Root, rel string) bool { return IsOpaqueXattr(root.Xattr(rel)) }

// IsLayerWhiteout is IsWhiteout for the entry at host path p of a layer,
// fi being its lstat.
func IsLayerWhiteout(p string, fi fs.FileInfo) bool {
	switch st := fi.Sys().(type) {
	case *syscall.Stat_t: // os.Lstat
		return isWhiteout(st.Mode, st.Rdev, st.Size, PathXattr(p))
	case *unix.Stat_t: // Root and Dir
		return IsWhiteout(st, PathXattr(p))
	}
	return false
}

// IsLayerOpaque reports whether the layer directory at host path p is
// opaque (LayerFormat); an unreadable marker counts as absent.
func IsLayerOpaque(p string) bool {
	op, _ := IsOpaque(LayerFormat, PathXattr(p), func() (bool, error) {
		_, err := os.Lstat(filepath.Join(p, OpaqueMarker))
		return err == nil, nil
	})
	return op
}

// isWhiteoutFile and isOpaqueDir are the layer readers' short names.
func isWhiteoutFile(path string, fi fs.FileInfo) bool { return IsLayerWhiteout(path, fi) }
func isOpaqueDir(path string) bool                    { return IsLayerOpaque(path) }

// fdOpaque reports whether the layer directory open at fd is opaque
// (LayerFormat), reading through the descriptor.
func fdOpaque(fd int) (bool, error) {
	xattr := func(attr string) (string, bool) {
		v, err := readXattr(func(buf []byte) (int, error) { return unix.Fgetxattr(fd, attr, buf) })
		return v, err == nil
	}
	return IsOpaque(LayerFormat, xattr, func() (bool, error) {
		var st unix.Stat_t
		err := unix.Fstatat(fd, OpaqueMarker, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil {
			return true, nil
		}
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, &fs.PathError{Op: "lstat", Path: OpaqueMarker, Err: err}
	})
}

// getxattr returns the value of a (no-follow) xattr and whether it exists.
func getxattr(path, name string) (string, bool) {
	v, err := readXattr(func(buf []byte) (int, error) { return unix.Lgetxattr(path, name, buf) })
	return v, err == nil
}

// Seams for tests that force the whiteout fallbacks.
var (
	mknod     = unix.Mknod
	fsetxattr = unix.Fsetxattr
	lsetxattr = unix.Lsetxattr
)

// MakeOpaque marks the directory at p opaque: user.overlay.opaque=y, or,
// where user xattrs are refused, the OCI marker .wh..wh..opq — never both.
// The contract (§8.4) asks for both and assumes the kernel hides the marker,
// but Linux 6.18 lists it in a directory that only one layer has (such a
// directory is not merged, so overlayfs passes its entries through), and a
// kernel session would show it to every command.
func MakeOpaque(p string) error {
	err := lsetxattr(p, xattrUserOpq, []byte("y"), 0)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOTSUP) && !errors.Is(err, unix.EPERM) {
		return &fs.PathError{Op: "setxattr", Path: p, Err: err}
	}
	return MakeWhiteout(p, opaqueMarker)
}

// MakeWhiteout creates a whiteout named name in dir: a 0:0 character device,
// else an empty file with user.overlay.whiteout=y, else (no user xattrs) an
// OCI ".wh.<name>" file (LayerFormat only: the kernel reads neither name).
func MakeWhiteout(dir, name string) error {
	p := filepath.Join(dir, name)
	err := mknod(p, unix.S_IFCHR, 0)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EEXIST) {
		return &fs.PathError{Op: "mknod", Path: p, Err: err}
	}
	f, ferr := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if ferr != nil {
		return ferr
	}
	xerr := fsetxattr(int(f.Fd()), xattrUserWh, []byte("y"), 0)
	if xerr == nil {
		xerr = f.Sync()
		f.Close()
		return xerr
	}
	f.Close()
	if strings.HasPrefix(name, whPrefix) {
		// The name itself is an OCI marker (".wh..wh..opq"); the plain file is enough.
		return nil
	}
	if err := os.Remove(p); err != nil {
		return err
	}
	f, ferr = os.OpenFile(filepath.Join(dir, whPrefix+name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if ferr != nil {
		return ferr
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// makeWhiteout and makeOpaque are the writers' short names.
func makeWhiteout(dir, name string) error { return MakeWhiteout(dir, name) }
func makeOpaque(p string) error           { return MakeOpaque(p) }
