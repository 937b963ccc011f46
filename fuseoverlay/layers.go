package fuseoverlay

import (
	"errors"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The overlay format (contract §8.4) as this package reads and writes it,
// through descriptors: the twin of layers/upperfmt.go, which this package
// may not import. The table in internal/upperfmtcases/testdata/cases.json
// holds both to the same answers (TestUpperFormatConformance here and in
// layers). One difference is by design: this package reads its upper dir
// with the layer rule for opaque directories (an .wh..wh..opq entry
// counts), which only its own fallback writes where user xattrs are
// refused.

// On-disk names of the overlay format.
const (
	xUserWhiteout    = "user.overlay.whiteout"
	xTrustedWhiteout = "trusted.overlay.whiteout"
	xUserOpaque      = "user.overlay.opaque"
	xTrustedOpaque   = "trusted.overlay.opaque"
	whPrefix         = ".wh."
	opaqueMarker     = ".wh..wh..opq"
	// stagingName is the hidden copy-up staging directory inside Upper, used
	// only when Options.Work is nil. It exists only while a copy-up runs and
	// is hidden from lookup and readdir of the root.
	stagingName = ".esbx-tmp"
)

// rel turns a mount-relative path into an *at path ("" is the layer root).
func rel(p string) string {
	if p == "" {
		return "."
	}
	return p
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	if err == nil {
		return 0
	}
	return syscall.EIO
}

// Kinds of a directory entry's name in a lower layer (layers.NameKind).
const (
	namePlain        = iota // an ordinary entry
	nameOCIWhiteout         // ".wh.<target>": target is whited out
	nameOpaqueMarker        // ".wh..wh..opq": the directory is opaque
)

// parseName classifies a name as layers.ParseName does for a layer: any
// ".wh." name is a marker, never an entry; the upper applies none of them
// but hides them too.
func parseName(name string) (int, string) {
	if !strings.HasPrefix(name, whPrefix) {
		return namePlain, ""
	}
	if name == opaqueMarker {
		return nameOpaqueMarker, ""
	}
	return nameOCIWhiteout, name[len(whPrefix):]
}

// isOverlayXattr reports whether name belongs to the overlay format; such
// xattrs are never shown through or set through the mount.
func isOverlayXattr(name string) bool {
	return strings.HasPrefix(name, "user.overlay.") || strings.HasPrefix(name, "trusted.overlay.")
}

// openNoFollow opens the entry at p in dirfd for xattr access: regular files
// and directories can be opened without side effects; anything else (devices,
// fifos, sockets, symlinks) is reported as unsupported.
func openForXattr(dirfd int, p string) (int, error) {
	var st unix.Stat_t
	if err := fstatat(dirfd, rel(p), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return -1, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFDIR:
	default:
		return -1, unix.ENOTSUP
	}
	return openat(dirfd, rel(p), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
}

// fgetxattrAll reads a whole xattr value from fd.
func fgetxattrAll(fd int, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Fgetxattr(fd, name, buf)
		if err == unix.ERANGE && len(buf) < 1<<20 {
			sz, serr := unix.Fgetxattr(fd, name, nil)
			if serr != nil {
				return nil, serr
			}
			buf = make([]byte, sz+64)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// isWhiteout reports whether the entry at p (already lstat'ed into st) is a
// whiteout: a 0:0 character device, or an empty regular file carrying an
// overlay whiteout xattr.
func isWhiteout(dirfd int, p string, st *unix.Stat_t) bool {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		return st.Rdev == 0
	case unix.S_IFREG:
		if st.Size != 0 {
			return false
		}
		fd, err := openForXattr(dirfd, p)
		if err != nil {
			return false
		}
		defer unix.Close(fd)
		if _, err := unix.Fgetxattr(fd, xUserWhiteout, nil); err == nil {
			return true
		}
		_, err = unix.Fgetxattr(fd, xTrustedWhiteout, nil)
		return err == nil
	}
	return false
}

// isOpaque reports whether the directory at p is opaque: an overlay opaque
// xattr "y" (user or trusted) or an OCI .wh..wh..opq entry inside.
func isOpaque(dirfd int, p string) bool {
	fd, err := openat(dirfd, rel(p), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	for _, x := range []string{xUserOpaque, xTrustedOpaque} {
		if v, err := fgetxattrAll(fd, x); err == nil && string(v) == "y" {
			return true
		}
	}
	var st unix.Stat_t
	return fstatat(fd, opaqueMarker, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// makeWhiteout writes a whiteout for p in the upper: a 0:0 character device
// (allowed for the root of a user namespace since Linux 5.8), else an empty
// file with user.overlay.whiteout=y — the two forms the kernel reads.
func makeWhiteout(upper int, p string) error {
	err := mknodat(upper, p, unix.S_IFCHR, 0)
	if err == nil || err == unix.EEXIST {
		return err
	}
	fd, ferr := openat(upper, p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o000)
	if ferr != nil {
		return ferr
	}
	defer unix.Close(fd)
	if xerr := unix.Fsetxattr(fd, xUserWhiteout, []byte("y"), 0); xerr != nil {
		_ = unlinkat(upper, p, 0)
		return xerr
	}
	return nil
}

// setOpaque marks the upper directory at p opaque the way the kernel does in
// userxattr mode (user.overlay.opaque=y); only where user xattrs are refused
// does it fall back to the OCI marker entry.
func setOpaque(upper int, p string) error {
	fd, err := openat(upper, rel(p), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fsetxattr(fd, xUserOpaque, []byte("y"), 0); err == nil {
		return nil
	}
	return makeWhiteout(upper, join(p, opaqueMarker))
}

// stableIno derives the inode number shown for an entry. Entries on the
// upper's device keep their own number (numbers are unique per device, and
// a copied-up file is mapped back to its lower number by the caller); other
// devices are folded in the way go-fuse's loopback does.
func stableIno(st *unix.Stat_t, upperDev uint64) uint64 {
	if st.Dev == upperDev {
		return st.Ino
	}
	sw := func(d uint64) uint64 { return d<<32 | d>>32 }
	return st.Ino ^ sw(st.Dev) ^ sw(upperDev)
}
