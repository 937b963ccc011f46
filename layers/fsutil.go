package layers

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Marker names and xattrs of the overlay on-disk format (§8.4).
const (
	whPrefix        = ".wh."
	opaqueMarker    = ".wh..wh..opq"
	xattrUserWh     = "user.overlay.whiteout"
	xattrTrustedWh  = "trusted.overlay.whiteout"
	xattrUserOpq    = "user.overlay.opaque"
	xattrTrustedOpq = "trusted.overlay.opaque"
)

// Seams for tests that force the whiteout fallbacks.
var (
	mknod     = unix.Mknod
	fsetxattr = unix.Fsetxattr
	lsetxattr = unix.Lsetxattr
)

// errSimulatedCrash is returned by the test hook to simulate a crash: the
// publish returns at once without any cleanup.
var errSimulatedCrash = errors.New("simulated crash (test hook)")

func randHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// fsyncDir fsyncs the directory at path.
func fsyncDir(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return &fs.PathError{Op: "fsync", Path: path, Err: err}
	}
	return nil
}

// chmodSyncDir sets the mode of the directory at path through a descriptor
// (so a final mode without u+rwx does not get in the way) and fsyncs it.
func chmodSyncDir(path string, mode uint32) error { return chmodDirFD(path, mode, true) }

// chmodDir is chmodSyncDir without the fsync; the caller syncs.
func chmodDir(path string, mode uint32) error { return chmodDirFD(path, mode, false) }

func chmodDirFD(path string, mode uint32, sync bool) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, mode); err != nil {
		return &fs.PathError{Op: "chmod", Path: path, Err: err}
	}
	if sync {
		if err := unix.Fsync(fd); err != nil {
			return &fs.PathError{Op: "fsync", Path: path, Err: err}
		}
	}
	return nil
}

// syncFS flushes the whole filesystem holding path (one syncfs).
func syncFS(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return &fs.PathError{Op: "syncfs", Path: path, Err: err}
	}
	return nil
}

func isTempName(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, tmpInfix)
}

// writeFileAtomic writes dir/name through a temp file in dir: write, fsync,
// beforeRename (optional), rename, fsync dir. The temp file is removed on
// failure unless beforeRename reports a simulated crash.
func writeFileAtomic(dir, name string, data []byte, perm os.FileMode, beforeRename func() error) (err error) {
	suffix, err := randHex(6)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+name+tmpInfix+suffix)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, perm)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && !errors.Is(err, errSimulatedCrash) {
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if beforeRename != nil {
		if err = beforeRename(); err != nil {
			return err
		}
	}
	if err = os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return fsyncDir(dir)
}

// RemoveAll removes path and everything below it like os.RemoveAll, but
// descriptor-relative and without following a symlink in any component
// below path: the trees it removes (session uppers, recovery artifacts,
// layers) may hold entries a session made, and a chmod or unlink by joined
// path could be led out of the tree by a directory swapped for a symlink.
// Directories the owner cannot write or search are granted rwx first
// (layers keep the workspace's modes, which may be read-only). A missing
// path is not an error.
func RemoveAll(path string) error {
	path = filepath.Clean(path)
	parent, name := filepath.Split(path)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("remove %s: not a removable path", path)
	}
	if parent == "" {
		parent = "."
	}
	pfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	defer unix.Close(pfd)
	if err := removeAllAt(pfd, name); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// forceRemoveAll is RemoveAll under the name the package's callers know.
func forceRemoveAll(path string) error { return RemoveAll(path) }

// getxattr returns the value of a (no-follow) xattr and whether it exists.
func getxattr(path, name string) (string, bool) {
	buf := make([]byte, 64)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < 1<<16 {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return "", false
		}
		return string(buf[:n]), true
	}
}

// isWhiteoutFile reports whether an entry is a whiteout in one of the two
// overlay encodings: a 0:0 character device, or an empty regular file with a
// (user|trusted).overlay.whiteout xattr.
func isWhiteoutFile(path string, fi fs.FileInfo) bool {
	m := fi.Mode()
	if m&fs.ModeCharDevice != 0 {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Rdev == 0 {
			return true
		}
		return false
	}
	if m.IsRegular() && fi.Size() == 0 {
		if _, ok := getxattr(path, xattrUserWh); ok {
			return true
		}
		if _, ok := getxattr(path, xattrTrustedWh); ok {
			return true
		}
	}
	return false
}

// isOpaqueDir reports whether the directory at path is opaque: an overlay
// opaque xattr set to "y" or an OCI .wh..wh..opq entry inside.
func isOpaqueDir(path string) bool {
	if v, ok := getxattr(path, xattrUserOpq); ok && v == "y" {
		return true
	}
	if v, ok := getxattr(path, xattrTrustedOpq); ok && v == "y" {
		return true
	}
	_, err := os.Lstat(filepath.Join(path, opaqueMarker))
	return err == nil
}

// makeOpaque marks the directory at p opaque: user.overlay.opaque=y, or,
// where user xattrs are refused, the OCI marker .wh..wh..opq — never both.
// The contract (§8.4) asks for both and assumes the kernel hides the marker,
// but Linux 6.18 lists it in a directory that only one layer has (such a
// directory is not merged, so overlayfs passes its entries through), and a
// kernel session would show it to every command.
func makeOpaque(p string) error {
	err := lsetxattr(p, xattrUserOpq, []byte("y"), 0)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOTSUP) && !errors.Is(err, unix.EPERM) {
		return &fs.PathError{Op: "setxattr", Path: p, Err: err}
	}
	return makeWhiteout(p, opaqueMarker)
}

// makeWhiteout creates a whiteout named name in dir: a 0:0 character device,
// else an empty file with user.overlay.whiteout=y, else (no user xattrs) an
// OCI ".wh.<name>" file.
func makeWhiteout(dir, name string) error {
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
