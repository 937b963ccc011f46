package layers

// Git's index caches each tracked file's stat data (ctime, mtime, dev, ino,
// uid, gid, size); `git status` re-hashes every file whose lstat differs
// from it. An index written on the host never matches what a session sees,
// so without the rewrite below a session's first (and, with optional locks
// off, every) `git status` re-hashes the whole repository. Measured with
// git 2.39 on Debian 12, for a file of the base layer, host index vs
// session lstat (kernel overlay and FUSE overlay alike):
//
//   - ino: the session sees the layer file's inode (the kernel overlay
//     reports the real lower inode when all layers share the upper's
//     filesystem; fuseoverlay keeps the inode number of entries on the
//     upper's device), not the host file's;
//   - ctime: the layer file's (set when the snapshot copied it);
//   - uid, gid: 0 inside every session (both id mappings map the
//     namespace's root to the supervisor's uid and gid), not the host's;
//   - dev: the overlay's anonymous device, allocated per mount; git on
//     Linux does not compare st_dev (it is built without USE_STDEV), so the
//     value written is 0;
//   - mtime and size: equal (the snapshot keeps mtimes).
//
// So one index fits both drivers: RestatGitIndex writes, for every entry
// whose file is known to match, the stat data of the layer file as a
// session sees it. Decisions:
//
//   - "Known to match" is the caller's test on the recorded stat data (the
//     snapshot: the host file's lstat equals the recorded one in every
//     field git compares and the entry is not racily clean; a publish: its
//     own), else the file is hashed as a raw blob and compared with the
//     entry's object name. An entry that fails both keeps its stat data:
//     git then finds it changed and compares content itself, as on the
//     host.
//   - Entries git compares differently (unmerged stages, gitlinks,
//     assume-unchanged, skip-worktree, intent-to-add, sparse directories)
//     and split indexes are left alone.
//   - Hard links change an inode's ctime: CreateSibling (create_sandbox
//     count > 1) and squash hard-link layer files, so recorded ctimes go
//     stale for every session of the first stack. Sessions therefore run
//     git with core.trustCtime=false (supervisor/workspace), which makes
//     the recorded ino, mtime, size and owner (all kept by a hard link)
//     decide; the ctime is still written so that git without that setting
//     is fast where nothing was linked.
//   - When a session's upper is on another filesystem than the layers,
//     inode numbers are not predictable (the kernel overlay then uses
//     xino or per-layer numbers): git re-hashes, correct but slow.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/ephemeral-ai-lab/sandbox/layers/gitindex"
	"golang.org/x/sys/unix"
)

// overflowID is how a session sees an owner its namespace does not map.
const overflowID = 65534

// SessionOwner is how a session sees a host file owned by uid:gid: the
// supervisor's own ids are root inside every session's user namespace
// (nsholder maps 0 to them under both id mappings); anything else is
// unmapped.
func SessionOwner(uid, gid uint32) (uint32, uint32) {
	u, g := uint32(overflowID), uint32(overflowID)
	if int(uid) == os.Geteuid() {
		u = 0
	}
	if int(gid) == os.Getegid() {
		g = 0
	}
	return u, g
}

// RestatOptions says where the files of an index's work tree are and which
// recorded stat data can be trusted.
type RestatOptions struct {
	// Lookup returns the host path of the file a session sees at the
	// work-tree path p (slash-separated, as the index names it), with no
	// symlink in any component below the trusted root, or ok=false.
	Lookup func(p string) (host string, ok bool)
	// Known reports whether the entry's recorded stat data describe the
	// file whose lstat is st without reading it. Nil: every entry is
	// hashed.
	Known func(e *gitindex.Entry, st *unix.Stat_t) bool
}

// RestatStats counts what RestatGitIndex did.
type RestatStats struct {
	Entries int // entries in the index
	Set     int // entries whose stat data now match a session's view
	Hashed  int // of them, verified by hashing
	Left    int // entries left as they were (changed, missing, special)
}

// RestatGitIndex rewrites the cached stat data of a git index (data, not
// modified) to what a session sees of the files Lookup names, for every
// entry whose file matches it. An index it cannot rewrite (split index,
// unknown format) comes back unchanged with its reason.
func RestatGitIndex(ctx context.Context, data []byte, opt RestatOptions) ([]byte, RestatStats, error) {
	x, err := gitindex.Parse(bytes.Clone(data))
	if err != nil {
		return data, RestatStats{}, err
	}
	st := RestatStats{Entries: len(x.Entries)}
	if x.Split {
		st.Left = st.Entries
		return data, st, errors.New("split index (core.splitIndex): left as it is")
	}
	for i := range x.Entries {
		if err := ctx.Err(); err != nil {
			return data, RestatStats{}, err
		}
		e := &x.Entries[i]
		ok, hashed, s := restatEntry(e, x.HashSize, opt)
		if !ok {
			st.Left++
			continue
		}
		x.SetStat(i, s)
		st.Set++
		if hashed {
			st.Hashed++
		}
	}
	return x.Bytes(), st, nil
}

func restatEntry(e *gitindex.Entry, hashSize int, opt RestatOptions) (ok, hashed bool, s gitindex.Stat) {
	if !e.Regular() {
		return false, false, s
	}
	host, found := opt.Lookup(e.Path)
	if !found {
		return false, false, s
	}
	var st unix.Stat_t
	if err := unix.Lstat(host, &st); err != nil {
		return false, false, s
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		// git reports a changed executable bit as a change: never hide it.
		if e.Mode == 0o120000 || (e.Mode&0o100 != 0) != (st.Mode&0o100 != 0) {
			return false, false, s
		}
	case unix.S_IFLNK:
		if e.Mode != 0o120000 {
			return false, false, s
		}
	default:
		return false, false, s
	}
	if opt.Known == nil || !opt.Known(e, &st) {
		oid, err := hostBlobOID(host, &st, hashSize)
		if err != nil || !bytes.Equal(oid, e.OID) {
			return false, false, s
		}
		hashed = true
	}
	uid, gid := SessionOwner(st.Uid, st.Gid)
	s = gitindex.Stat{
		CtimeSec: uint32(st.Ctim.Sec), CtimeNsec: uint32(st.Ctim.Nsec),
		MtimeSec: uint32(st.Mtim.Sec), MtimeNsec: uint32(st.Mtim.Nsec),
		Ino: uint32(st.Ino), UID: uid, GID: gid, Size: uint32(st.Size),
	}
	return true, hashed, s
}

func hostBlobOID(host string, st *unix.Stat_t, hashSize int) ([]byte, error) {
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		t, err := os.Readlink(host)
		if err != nil {
			return nil, err
		}
		return gitindex.BlobOID(strings.NewReader(t), int64(len(t)), hashSize)
	}
	f, err := os.OpenFile(host, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return gitindex.BlobOID(f, st.Size, hashSize)
}

// SameStat reports whether recorded stat data equal an lstat in every field
// git compares with core.checkStat=default (dev excluded, as git on Linux
// does).
func SameStat(s gitindex.Stat, st *unix.Stat_t) bool {
	return s.CtimeSec == uint32(st.Ctim.Sec) && s.CtimeNsec == uint32(st.Ctim.Nsec) &&
		s.MtimeSec == uint32(st.Mtim.Sec) && s.MtimeNsec == uint32(st.Mtim.Nsec) &&
		s.Ino == uint32(st.Ino) && s.UID == st.Uid && s.GID == st.Gid && s.Size == uint32(st.Size)
}

// RacilyClean reports whether an entry's recorded mtime is not older than
// the index file's own (git then cannot trust the stat data and compares
// content).
func RacilyClean(s gitindex.Stat, index unix.Timespec) bool {
	return int64(s.MtimeSec) > index.Sec || int64(s.MtimeSec) == index.Sec && int64(s.MtimeNsec) >= index.Nsec
}

// gitIndexOf is one index in a tree: its path and its work tree's.
type gitIndexOf struct{ index, workTree string }

// findGitIndexes lists the indexes of the repositories in a snapshot's
// entries: every ".git" directory (work tree: its parent) and every ".git"
// file (a gitlink: a submodule's or a linked worktree's) whose "gitdir:"
// names a directory inside the tree (work tree: the gitlink's parent).
func findGitIndexes(root string, entries []baseEntry) []gitIndexOf {
	files := map[string]bool{}
	for _, e := range entries {
		if e.kind == "file" {
			files[e.path] = true
		}
	}
	var out []gitIndexOf
	for _, e := range entries {
		if path.Base(e.path) != ".git" {
			continue
		}
		wt := path.Dir(e.path)
		if wt == "." {
			wt = ""
		}
		switch e.kind {
		case "directory":
			if files[e.path+"/index"] {
				out = append(out, gitIndexOf{index: e.path + "/index", workTree: wt})
			}
		case "file":
			dir, ok := gitlinkTarget(filepath.Join(root, filepath.FromSlash(e.path)), wt)
			if ok && files[joinRel(dir, "index")] {
				out = append(out, gitIndexOf{index: joinRel(dir, "index"), workTree: wt})
			}
		}
	}
	return out
}

// gitlinkTarget reads a ".git" file ("gitdir: DIR") at host and returns DIR
// relative to the tree when it is a relative path that stays inside it.
func gitlinkTarget(host, workTree string) (string, bool) {
	b, err := readSmall(host, 4096)
	if err != nil {
		return "", false
	}
	dir, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir: ")
	if !ok || dir == "" || strings.HasPrefix(dir, "/") {
		return "", false
	}
	rel := path.Clean(path.Join(workTree, dir))
	if rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return rel, true
}

func readSmall(p string, max int64) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > max {
		return nil, fmt.Errorf("%s: not a small regular file", p)
	}
	b := make([]byte, fi.Size())
	_, err = f.ReadAt(b, 0)
	return b, err
}

// treeLookup resolves work-tree paths inside a plain directory tree (a
// layer being built), refusing any path with a symlink component.
func treeLookup(rootFd int, root, workTree string) func(p string) (string, bool) {
	return func(p string) (string, bool) {
		rel := joinRel(workTree, p)
		fd, err := openBeneath(rootFd, rel, unix.O_PATH)
		if err != nil {
			return "", false
		}
		unix.Close(fd)
		return filepath.Join(root, filepath.FromSlash(rel)), true
	}
}

// restatSnapshotIndexes rewrites, in a base layer being built at staging,
// every git index copied from the workspace at hostRoot (see the top of
// this file). An index it cannot rewrite stays as copied. It returns the
// rewritten indexes' new entries (size, content digest).
func restatSnapshotIndexes(ctx context.Context, staging, hostRoot string, entries []baseEntry) (map[string]baseEntry, error) {
	idx := findGitIndexes(staging, entries)
	if len(idx) == 0 {
		return nil, nil
	}
	rootFd, err := unix.Open(staging, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootFd)
	out := map[string]baseEntry{}
	for _, g := range idx {
		p := filepath.Join(staging, filepath.FromSlash(g.index))
		var ist unix.Stat_t
		if err := unix.Lstat(p, &ist); err != nil {
			return nil, err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		hostWT := filepath.Join(hostRoot, filepath.FromSlash(g.workTree))
		known := func(e *gitindex.Entry, layer *unix.Stat_t) bool {
			var hst unix.Stat_t
			if unix.Lstat(filepath.Join(hostWT, filepath.FromSlash(e.Path)), &hst) != nil {
				return false
			}
			// The layer file is the copy of the host file as it is now
			// (mtime and size kept), and git on the host would call it
			// clean without reading it.
			return hst.Mtim == layer.Mtim && hst.Size == layer.Size &&
				SameStat(e.Stat, &hst) && !RacilyClean(e.Stat, ist.Mtim)
		}
		nd, _, err := RestatGitIndex(ctx, data, RestatOptions{Lookup: treeLookup(rootFd, staging, g.workTree), Known: known})
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			continue // not an index we can rewrite: git refreshes it
		}
		// Written in place, so the index is newer than every file it
		// describes: none of them is racily clean in a session.
		if err := os.WriteFile(p, nd, 0); err != nil {
			return nil, err
		}
		sum := sha256.Sum256(nd)
		out[g.index] = baseEntry{path: g.index, kind: "file", size: int64(len(nd)), sum: hex.EncodeToString(sum[:])}
	}
	return out, nil
}

// RestatGitIndexInView rewrites a git index (data) whose work tree is
// workTree ("" for the workspace root) in the merged view v, for the
// sessions that will see v: the call a publish makes when it writes a new
// head index (build the layer in staging, make a Manifest whose newest
// LayerRef points at the staged directory, View it, restat, write the
// result into the staged layer, then commit). An entry is trusted without
// reading when the view's file has the recorded size and mtime and the
// entry was not racily clean when git wrote the index (indexMtime: the
// index file's mtime where git wrote it; the zero value hashes every
// entry); otherwise it is hashed.
func RestatGitIndexInView(ctx context.Context, data []byte, v *View, workTree string, indexMtime unix.Timespec) ([]byte, RestatStats, error) {
	lookup := func(p string) (string, bool) {
		e, err := v.Lstat(joinRel(workTree, p))
		if err != nil || (e.Kind != KindFile && e.Kind != KindSymlink) {
			return "", false
		}
		return e.HostPath, true
	}
	known := func(e *gitindex.Entry, st *unix.Stat_t) bool {
		if indexMtime == (unix.Timespec{}) {
			return false
		}
		return e.Stat.Size == uint32(st.Size) && e.Stat.MtimeSec == uint32(st.Mtim.Sec) &&
			e.Stat.MtimeNsec == uint32(st.Mtim.Nsec) && !RacilyClean(e.Stat, indexMtime)
	}
	return RestatGitIndex(ctx, data, RestatOptions{Lookup: lookup, Known: known})
}
