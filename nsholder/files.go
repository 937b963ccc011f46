package nsholder

// File operations of a session (§7.1 "Session"): every path is resolved
// relative to an open directory fd of /workspace without following a
// symlink in any component, so nothing can escape it. Resolution is
// internal/beneath: openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
// RESOLVE_NO_MAGICLINKS); where the kernel lacks openat2 (ENOSYS, < 5.6) it
// walks component by component with openat(O_PATH|O_NOFOLLOW). After resolution every operation is
// relative to the directory fd it got, so swapping a component for a
// symlink afterwards has no effect, and swapping it before makes the
// resolution fail.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/ephemeral-ai-lab/sandbox/internal/beneath"
	"golang.org/x/sys/unix"
)

// KindError reports that a path is not a regular file; it matches
// ErrNotRegular with errors.Is. Kind is "directory", "symlink" or "other".
type KindError struct{ Kind string }

func (e *KindError) Error() string {
	return "path is not a regular file (" + strings.ToUpper(e.Kind[:1]) + e.Kind[1:] + ")"
}

func (e *KindError) Is(target error) bool { return target == ErrNotRegular }

// lstatAt describes path; a final symlink is reported, not followed.
func lstatAt(root *os.File, path string) (FileInfo, error) {
	dir, name := splitPath(path)
	dfd, err := openDir(root, dir, unix.O_PATH)
	if err != nil {
		return FileInfo{}, resolveErr(root, "lstat", path, dir, err)
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := statAt(dfd, name, &st); err != nil {
		return FileInfo{}, pathErr("lstat", path, err)
	}
	return fileInfo(name, &st), nil
}

// readFileAt returns the content of the regular file path, at most max bytes.
func readFileAt(root *os.File, path string, max int64) ([]byte, FileInfo, error) {
	dir, name := splitPath(path)
	dfd, err := openDir(root, dir, unix.O_PATH)
	if err != nil {
		return nil, FileInfo{}, resolveErr(root, "read", path, dir, err)
	}
	defer unix.Close(dfd)
	// Classify before opening so FIFOs and devices are never opened; the
	// fstat of the opened fd below is what counts.
	var st unix.Stat_t
	if err := statAt(dfd, name, &st); err != nil {
		return nil, FileInfo{}, pathErr("read", path, err)
	}
	if k := kindOf(st.Mode); k != "file" {
		return nil, FileInfo{}, &KindError{k}
	}
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err == unix.ELOOP {
		return nil, FileInfo{}, &KindError{"symlink"}
	}
	if err != nil {
		return nil, FileInfo{}, pathErr("read", path, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, FileInfo{}, pathErr("read", path, err)
	}
	if k := kindOf(st.Mode); k != "file" {
		return nil, FileInfo{}, &KindError{k}
	}
	if st.Size > max {
		return nil, FileInfo{}, pathErr("read", path, ErrTooLarge)
	}
	var buf bytes.Buffer
	buf.Grow(int(st.Size) + bytes.MinRead)
	if _, err := buf.ReadFrom(io.LimitReader(f, max+1)); err != nil {
		return nil, FileInfo{}, pathErr("read", path, err)
	}
	if int64(buf.Len()) > max { // grew after the fstat
		return nil, FileInfo{}, pathErr("read", path, ErrTooLarge)
	}
	info := fileInfo(name, &st)
	info.Size = int64(buf.Len())
	return buf.Bytes(), info, nil
}

// readDirAt lists the directory path (one level), sorted by name bytes.
func readDirAt(root *os.File, path string) ([]FileInfo, error) {
	dfd, err := openDir(root, path, unix.O_RDONLY)
	if err != nil {
		return nil, resolveErr(root, "readdir", path, path, err)
	}
	f := os.NewFile(uintptr(dfd), path)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, pathErr("readdir", path, err)
	}
	infos := make([]FileInfo, 0, len(names))
	for _, name := range names {
		var st unix.Stat_t
		if err := statAt(dfd, name, &st); err == unix.ENOENT {
			continue // removed meanwhile
		} else if err != nil {
			return nil, pathErr("readdir", path, err)
		}
		infos = append(infos, fileInfo(name, &st))
	}
	slices.SortFunc(infos, func(a, b FileInfo) int { return strings.Compare(a.Name, b.Name) })
	return infos, nil
}

// writeFileAt atomically replaces path with data (temp file + rename in
// the target directory), creating missing parents with mode 0755. mode nil
// keeps an existing file's permission bits (0644 for a new file).
func writeFileAt(root *os.File, path string, data []byte, mode *fs.FileMode) (created bool, err error) {
	dir, name := splitPath(path)
	dfd, err := openDir(root, dir, unix.O_PATH)
	if errors.Is(err, ErrNotExist) {
		dfd, err = walkDir(root, dir, unix.O_PATH, true)
	}
	if err != nil {
		return false, resolveErr(root, "write", path, dir, err)
	}
	defer unix.Close(dfd)

	perm := uint32(0o644)
	var st unix.Stat_t
	switch err := statAt(dfd, name, &st); {
	case err == unix.ENOENT:
		created = true
	case err != nil:
		return false, pathErr("write", path, err)
	case kindOf(st.Mode) != "file":
		return false, &KindError{kindOf(st.Mode)}
	default:
		perm = st.Mode & 0o777
	}
	if mode != nil {
		perm = uint32(mode.Perm())
	}

	tmp, fd, err := createTemp(dfd)
	if err != nil {
		return false, pathErr("write", path, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(fs.FileMode(perm))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		if err == unix.EISDIR { // became a directory after the check
			return false, &KindError{"directory"}
		}
		return false, pathErr("write", path, err)
	}
	return created, nil
}

// createTemp creates a new temp file .esbx-tmp-<random> in dfd.
func createTemp(dfd int) (string, int, error) {
	for range 10 {
		var b [8]byte
		rand.Read(b[:])
		name := ".esbx-tmp-" + hex.EncodeToString(b[:])
		fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != unix.EEXIST {
			return name, fd, err
		}
	}
	return "", -1, unix.EEXIST
}

// openDir opens the directory path beneath root with flags (O_PATH or
// O_RDONLY); no component, including the last, may be a symlink. The
// resolution is the module's one resolver, internal/beneath (openat2, or a
// per-component walk where the kernel lacks it).
func openDir(root *os.File, path string, flags int) (int, error) {
	defer runtime.KeepAlive(root)
	return beneath.Open(int(root.Fd()), path, flags|unix.O_DIRECTORY)
}

// walkDir is openDir without openat2 (beneath's per-component walk). With
// create it makes missing directories (mode 0755, regardless of the
// umask) and returns an O_PATH descriptor.
func walkDir(root *os.File, path string, flags int, create bool) (int, error) {
	defer runtime.KeepAlive(root)
	if create {
		return beneath.MkdirAll(int(root.Fd()), path, 0o755)
	}
	return beneath.Walk(int(root.Fd()), path, flags|unix.O_DIRECTORY)
}

// resolveErr is pathErr for a failed resolution of dir (path's directory,
// or path itself for a listing). A symlink met on the way becomes a
// *SymlinkError naming the first symlink component: openat2 only says
// ELOOP, so the component is found by walking dir again without following
// anything.
func resolveErr(root *os.File, op, path, dir string, err error) error {
	if err != unix.ELOOP {
		return pathErr(op, path, err)
	}
	return &SymlinkError{Path: path, Component: firstSymlink(root, dir)}
}

// firstSymlink returns the shortest prefix of dir that is a symlink, or dir
// itself when the walk no longer meets one (the tree changed meanwhile).
func firstSymlink(root *os.File, dir string) string {
	defer runtime.KeepAlive(root)
	if c := beneath.FirstSymlink(int(root.Fd()), dir); c != "" {
		return c
	}
	return dir
}

// statAt is fstatat without following a final symlink; name "" is dfd itself.
func statAt(dfd int, name string, st *unix.Stat_t) error {
	if name == "" {
		return unix.Fstatat(dfd, "", st, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
	}
	return unix.Fstatat(dfd, name, st, unix.AT_SYMLINK_NOFOLLOW)
}

// splitPath splits a clean relative path into its directory and base name.
func splitPath(path string) (dir, name string) {
	i := strings.LastIndexByte(path, '/')
	if i < 0 {
		return "", path
	}
	return path[:i], path[i+1:]
}

func kindOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "other"
}

func fileInfo(name string, st *unix.Stat_t) FileInfo {
	return FileInfo{Name: name, Kind: kindOf(st.Mode), Mode: fs.FileMode(st.Mode & 0o777), Size: st.Size}
}

// pathErr maps resolution errnos to the package's errors.
func pathErr(op, path string, err error) error {
	switch err {
	case unix.ENOENT:
		err = ErrNotExist
	case unix.ENOTDIR:
		err = ErrNotDir
	case unix.ELOOP:
		err = ErrSymlink
	}
	return &fs.PathError{Op: op, Path: path, Err: err}
}
