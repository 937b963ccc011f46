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
