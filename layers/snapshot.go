package layers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// SnapshotError reasons.
const (
	ReasonSpecialFile    = "special_file"
	ReasonInvalidName    = "invalid_name"
	ReasonTooManyEntries = "too_many_entries"
	ReasonChanged        = "changed"
)

// DefaultMaxEntries bounds a workspace snapshot when SnapshotOptions.MaxEntries is 0.
const DefaultMaxEntries = 1_000_000

// SnapshotError is a workspace the snapshot refuses. Path is
// workspace-relative (for invalid_name it holds the raw, non-UTF-8 name).
type SnapshotError struct {
	Path   string
	Reason string // ReasonSpecialFile, ReasonInvalidName, ReasonTooManyEntries, ReasonChanged
}

func (e *SnapshotError) Error() string {
	switch e.Reason {
	case ReasonSpecialFile:
		return fmt.Sprintf("unsupported special file in workspace (FIFO, socket or device): %s", e.Path)
	case ReasonInvalidName:
		return fmt.Sprintf("workspace file name is not valid UTF-8: %q", e.Path)
	case ReasonTooManyEntries:
		return fmt.Sprintf("workspace has too many entries (at %s)", e.Path)
	case ReasonChanged:
		return fmt.Sprintf("workspace changed during snapshot: %s", e.Path)
	}
	return fmt.Sprintf("snapshot %s: %s", e.Path, e.Reason)
}

// SnapshotOptions tunes Create.
type SnapshotOptions struct {
	// MaxEntries bounds the entries below the workspace root (0 = 1,000,000).
	MaxEntries int
	// Progress, when set, is called with running counts at most every 250 ms
	// and once at the end.
	Progress func(files, dirs int)

	afterCopy func(rel string, attempt int) // test hook: runs after each copy attempt
}

// SnapshotStats summarizes a snapshot.
type SnapshotStats struct {
	Files, Dirs, Symlinks int
	Bytes                 int64
	BaseRootHash          string
}

const maxCopyRetries = 3

// prepareNewDir creates dir (and its parents); an existing dir must be empty.
func prepareNewDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, fs.ErrExist) {
		names, rerr := readNames(dir)
		if rerr != nil {
			return rerr
		}
		if len(names) > 0 {
			return fmt.Errorf("%s already exists and is not empty", dir)
		}
		return nil
	}
	return err
}

// initStackDirs creates the layerstack subdirectories.
func initStackDirs(dir string) error {
	for _, d := range []string{layersDirName, stagingDirName, metaDirName} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// Create snapshots workspaceRoot into the base layer of a new LayerStack at dir
// (contract §4.2 step 3, §8.2) and writes the base .digest, workspace.json and
// manifest.json (version 1, one layer). dir must not exist or be empty; on any
// failure it is removed completely.
func Create(ctx context.Context, dir, workspaceRoot string, opt SnapshotOptions) (st *Stack, stats SnapshotStats, err error) {
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return nil, SnapshotStats{}, fmt.Errorf("create layer stack %s: %w", dir, err)
	}
	absRoot, err := filepath.Abs(workspaceRoot)
	if err != nil {
		return nil, SnapshotStats{}, fmt.Errorf("create layer stack: workspace %s: %w", workspaceRoot, err)
	}
	if err := prepareNewDir(absDir); err != nil {
		return nil, SnapshotStats{}, fmt.Errorf("create layer stack: %w", err)
	}
	defer func() {
		if err != nil {
			_ = forceRemoveAll(absDir)
			st, stats = nil, SnapshotStats{}
		}
	}()
	wrap := func(err error) error {
		var se *SnapshotError
		if errors.As(err, &se) {
			return err
		}
		return fmt.Errorf("snapshot %s: %w", absRoot, err)
	}

	rootFd, err := unix.Open(absRoot, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, SnapshotStats{}, wrap(&fs.PathError{Op: "open", Path: absRoot, Err: err})
	}
	var rootSt unix.Stat_t
	if err := unix.Fstat(rootFd, &rootSt); err != nil {
		unix.Close(rootFd)
		return nil, SnapshotStats{}, wrap(err)
	}
	var selfSt unix.Stat_t
	if err := unix.Stat(absDir, &selfSt); err != nil {
		unix.Close(rootFd)
		return nil, SnapshotStats{}, wrap(err)
	}
	if err := initStackDirs(absDir); err != nil {
		unix.Close(rootFd)
		return nil, SnapshotStats{}, wrap(err)
	}
	stagingRoot := filepath.Join(absDir, stagingDirName, BaseLayerID+stagingSuffix)
	if err := os.Mkdir(stagingRoot, 0o700); err != nil {
		unix.Close(rootFd)
		return nil, SnapshotStats{}, wrap(err)
	}
	sn := &snapshotter{ctx: ctx, opt: opt, max: opt.MaxEntries, selfDev: selfSt.Dev, selfIno: selfSt.Ino}
	if sn.max <= 0 {
		sn.max = DefaultMaxEntries
	}
	if err := sn.copyDir(rootFd, absRoot, "", stagingRoot); err != nil {
		return nil, SnapshotStats{}, wrap(err)
	}
	sn.progress(true)
	// After every copy, so the layer files' ctimes are final.
	restated, err := restatSnapshotIndexes(ctx, stagingRoot, absRoot, sn.entries)
	if err != nil {
		return nil, SnapshotStats{}, wrap(fmt.Errorf("git index: %w", err))
	}
	for i := range sn.entries {
		if e, ok := restated[sn.entries[i].path]; ok {
			sn.stats.Bytes += e.size - sn.entries[i].size
			sn.entries[i] = e
		}
	}
	hash := hashBaseEntries(sn.entries)
	sn.stats.BaseRootHash = hash

	if err := commitBase(absDir, stagingRoot, rootSt.Mode&0o7777&^(unix.S_ISUID|unix.S_ISGID), hash,
		WorkspaceInfo{WorkspaceRoot: absRoot, LayerStackRoot: absDir, BaseRootHash: hash}); err != nil {
		return nil, SnapshotStats{}, wrap(err)
	}
	return newStack(absDir), sn.stats, nil
}

// commitBase makes a finished base staging tree durable and writes the
// stack's metadata: syncfs, rename into layers/, root mode, sidecar,
// workspace.json, manifest.json.
func commitBase(dir, stagingRoot string, rootMode uint32, hash string, w WorkspaceInfo) error {
	if err := syncFS(stagingRoot); err != nil {
		return err
	}
	layerDir := filepath.Join(dir, layersDirName, BaseLayerID)
	if err := os.Rename(stagingRoot, layerDir); err != nil {
		return err
	}
	if err := chmodSyncDir(layerDir, rootMode); err != nil {
		return err
	}
	for _, d := range []string{filepath.Join(dir, layersDirName), filepath.Join(dir, stagingDirName)} {
		if err := fsyncDir(d); err != nil {
			return err
		}
	}
	if err := writeFileAtomic(filepath.Join(dir, metaDirName), BaseLayerID+digestSuffix, []byte(hash), 0o644, nil); err != nil {
		return fmt.Errorf("write base digest: %w", err)
	}
	if err := writeWorkspaceInfo(dir, w); err != nil {
		return err
	}
	m := Manifest{SchemaVersion: SchemaVersion, Version: 1,
		Layers: []LayerRef{{LayerID: BaseLayerID, Path: layersDirName + "/" + BaseLayerID}}}
	if err := writeManifest(dir, m, nil); err != nil {
		return err
	}
	return fsyncDir(filepath.Dir(dir))
}

type snapshotter struct {
	ctx          context.Context
	opt          SnapshotOptions
	max          int
	count        int
	selfDev      uint64
	selfIno      uint64
	stats        SnapshotStats
	entries      []baseEntry
	lastProgress time.Time
}

func (sn *snapshotter) progress(final bool) {
	if sn.opt.Progress == nil {
		return
	}
	now := time.Now()
	if final || now.Sub(sn.lastProgress) >= 250*time.Millisecond {
		sn.lastProgress = now
		sn.opt.Progress(sn.stats.Files, sn.stats.Dirs)
	}
}

func vanished(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

// copyDir copies the directory open at dirfd (consumed) into dst.
func (sn *snapshotter) copyDir(dirfd int, hostDir, rel, dst string) error {
	d := os.NewFile(uintptr(dirfd), hostDir)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read dir %q: %w", rel, err)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := sn.ctx.Err(); err != nil {
			return err
		}
		childRel := joinRel(rel, name)
		if !utf8.ValidString(name) {
			return &SnapshotError{Path: childRel, Reason: ReasonInvalidName}
		}
		sn.count++
		if sn.count > sn.max {
			return &SnapshotError{Path: childRel, Reason: ReasonTooManyEntries}
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if vanished(err) {
				return &SnapshotError{Path: childRel, Reason: ReasonChanged}
			}
			return fmt.Errorf("lstat %q: %w", childRel, err)
		}
		childDst := filepath.Join(dst, name)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if st.Dev == sn.selfDev && st.Ino == sn.selfIno {
				return fmt.Errorf("the layer stack directory is inside the workspace (%s)", childRel)
			}
			cfd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				if vanished(err) {
					return &SnapshotError{Path: childRel, Reason: ReasonChanged}
				}
				return fmt.Errorf("open dir %q: %w", childRel, err)
			}
			if err := os.Mkdir(childDst, 0o700); err != nil {
				unix.Close(cfd)
				return err
			}
			if err := sn.copyDir(cfd, filepath.Join(hostDir, name), childRel, childDst); err != nil {
				return err
			}
			if err := unix.Chmod(childDst, st.Mode&(0o777|unix.S_ISVTX)); err != nil {
				return &fs.PathError{Op: "chmod", Path: childDst, Err: err}
			}
			sn.entries = append(sn.entries, baseEntry{path: childRel, kind: "directory"})
			sn.stats.Dirs++
		case unix.S_IFLNK:
			target, err := readlinkat(dirfd, name)
			if err != nil {
				if vanished(err) || errors.Is(err, unix.EINVAL) {
					return &SnapshotError{Path: childRel, Reason: ReasonChanged}
				}
				return fmt.Errorf("readlink %q: %w", childRel, err)
			}
			if err := os.Symlink(target, childDst); err != nil {
				return err
			}
			ts := []unix.Timespec{st.Atim, st.Mtim}
			_ = unix.UtimesNanoAt(unix.AT_FDCWD, childDst, ts, unix.AT_SYMLINK_NOFOLLOW)
			sn.entries = append(sn.entries, baseEntry{path: childRel, kind: "symlink", target: target})
			sn.stats.Symlinks++
		case unix.S_IFREG:
			if err := sn.copyFile(dirfd, name, childRel, childDst); err != nil {
				return err
			}
			sn.stats.Files++
		default:
			return &SnapshotError{Path: childRel, Reason: ReasonSpecialFile}
		}
		sn.progress(false)
	}
	return nil
}

func sameStat(a, b *unix.Stat_t) bool {
	return a.Size == b.Size && a.Mtim == b.Mtim && a.Ctim == b.Ctim && a.Ino == b.Ino
}

// copyFile copies one regular file (reflink, else bytes), re-copying up to 3
// times when its size, mtime or ctime moved during the copy.
func (sn *snapshotter) copyFile(dirfd int, name, rel, dst string) error {
	for attempt := 0; ; attempt++ {
		done, err := sn.copyFileOnce(dirfd, name, rel, dst, attempt)
		if err != nil || done {
			return err
		}
		if attempt >= maxCopyRetries {
			return &SnapshotError{Path: rel, Reason: ReasonChanged}
		}
	}
}

func (sn *snapshotter) copyFileOnce(dirfd int, name, rel, dst string, attempt int) (done bool, err error) {
	sfd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if vanished(err) {
			return false, &SnapshotError{Path: rel, Reason: ReasonChanged}
		}
		return false, fmt.Errorf("open %q: %w", rel, err)
	}
	src := os.NewFile(uintptr(sfd), rel)
	defer src.Close()
	var before unix.Stat_t
	if err := unix.Fstat(sfd, &before); err != nil {
		return false, fmt.Errorf("fstat %q: %w", rel, err)
	}
	switch before.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR, unix.S_IFLNK:
		return false, &SnapshotError{Path: rel, Reason: ReasonChanged}
	default:
		return false, &SnapshotError{Path: rel, Reason: ReasonSpecialFile}
	}
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return false, err
	}
	defer out.Close()
	h := sha256.New()
	var n int64
	if unix.IoctlFileClone(int(out.Fd()), sfd) == nil {
		n, err = io.Copy(h, &ctxReader{ctx: sn.ctx, r: io.NewSectionReader(out, 0, 1<<62)})
	} else {
		n, err = io.Copy(io.MultiWriter(out, h), &ctxReader{ctx: sn.ctx, r: src})
	}
	if err != nil {
		return false, fmt.Errorf("copy %q: %w", rel, err)
	}
	if sn.opt.afterCopy != nil {
		sn.opt.afterCopy(rel, attempt)
	}
	var after unix.Stat_t
	if err := unix.Fstat(sfd, &after); err != nil {
		return false, fmt.Errorf("fstat %q: %w", rel, err)
	}
	if !sameStat(&before, &after) || n != after.Size {
		return false, nil
	}
	if err := out.Chmod(fs.FileMode(before.Mode & 0o777)); err != nil {
		return false, err
	}
	ts := []unix.Timespec{before.Atim, before.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, &fs.PathError{Op: "utimes", Path: dst, Err: err}
	}
	if err := out.Close(); err != nil {
		return false, err
	}
	sn.entries = append(sn.entries, baseEntry{path: rel, kind: "file", size: n, sum: hex.EncodeToString(h.Sum(nil))})
	sn.stats.Bytes += n
	return true, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// CreateSibling creates a new LayerStack at dir with the same base as from:
// the files and symlinks of from's finished base are hardlinked (copied
// where a hardlink is refused), directories recreated. On any failure dir is
// removed completely.
func CreateSibling(ctx context.Context, dir string, from *Stack) (st *Stack, err error) {
	if from == nil {
		return nil, errors.New("create sibling layer stack: no source stack")
	}
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("create sibling layer stack %s: %w", dir, err)
	}
	wrap := func(err error) error {
		return fmt.Errorf("create sibling layer stack %s from %s: %w", absDir, from.dir, err)
	}
	hash, err := from.StoredDigest(BaseLayerID)
	if err != nil {
		return nil, wrap(err)
	}
	w, err := from.Workspace()
	if err != nil {
		return nil, wrap(err)
	}
	srcBase := filepath.Join(from.dir, layersDirName, BaseLayerID)
	rootFi, err := os.Lstat(srcBase)
	if err != nil {
		return nil, wrap(err)
	}
	if !rootFi.IsDir() {
		return nil, wrap(fmt.Errorf("%s is not a directory", srcBase))
	}
	if err := prepareNewDir(absDir); err != nil {
		return nil, wrap(err)
	}
	defer func() {
		if err != nil {
			_ = forceRemoveAll(absDir)
			st = nil
		}
	}()
	if err := initStackDirs(absDir); err != nil {
		return nil, wrap(err)
	}
	stagingRoot := filepath.Join(absDir, stagingDirName, BaseLayerID+stagingSuffix)
	if err := os.Mkdir(stagingRoot, 0o700); err != nil {
		return nil, wrap(err)
	}
	if err := linkTree(ctx, srcBase, stagingRoot); err != nil {
		return nil, wrap(err)
	}
	w.LayerStackRoot = absDir
	w.BaseRootHash = hash
	if err := commitBase(absDir, stagingRoot, unixMode(rootFi.Mode()), hash, w); err != nil {
		return nil, wrap(err)
	}
	return newStack(absDir), nil
}

// linkTree recreates the tree src (an immutable base layer) at dst with
// hardlinked files.
func linkTree(ctx context.Context, src, dst string) error {
	names, err := readNames(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		s, d := filepath.Join(src, name), filepath.Join(dst, name)
		fi, err := os.Lstat(s)
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			if err := os.Mkdir(d, 0o700); err != nil {
				return err
			}
			if err := linkTree(ctx, s, d); err != nil {
				return err
			}
			if err := unix.Chmod(d, unixMode(fi.Mode())); err != nil {
				return &fs.PathError{Op: "chmod", Path: d, Err: err}
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			// A hard link of the symlink itself (link(2) does not follow
			// it) keeps its inode number, which the base's git index
			// records (gitrestat.go); a copy is the fallback.
			if os.Link(s, d) == nil {
				continue
			}
			t, err := os.Readlink(s)
			if err != nil {
				return err
			}
			if err := os.Symlink(t, d); err != nil {
				return err
			}
			mt := unix.NsecToTimespec(fi.ModTime().UnixNano())
			_ = unix.UtimesNanoAt(unix.AT_FDCWD, d, []unix.Timespec{mt, mt}, unix.AT_SYMLINK_NOFOLLOW)
		case fi.Mode().IsRegular():
			if err := os.Link(s, d); err != nil {
				if err := copyRegular(s, d, fi); err != nil {
					return err
				}
			}
		default:
			return fmt.Errorf("%s: unexpected file type in base layer", strings.TrimPrefix(s, src))
		}
	}
	return nil
}

// copyRegular copies a regular file keeping mode and mtime.
func copyRegular(src, dst string, fi fs.FileInfo) error {
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) != nil {
		if _, err := io.Copy(out, in); err != nil {
			return err
		}
	}
	if err := out.Chmod(fi.Mode().Perm()); err != nil {
		return err
	}
	mt := unix.NsecToTimespec(fi.ModTime().UnixNano())
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, []unix.Timespec{mt, mt}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "utimes", Path: dst, Err: err}
	}
	return out.Close()
}
