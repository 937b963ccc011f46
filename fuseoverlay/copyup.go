package fuseoverlay

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// Copy-up. All functions here run with ofs.mu held exclusively.
//
// A file is copied into a staging directory (Options.Work, or a hidden
// ".esbx-tmp" directory in the upper root that exists only for the duration
// of one copy-up) and then renamed into place, so the upper never holds a
// partial copy under the real name. The copy keeps holes (SEEK_DATA and
// SEEK_HOLE), mode, owner (when permitted), xattrs (except overlay.*) and
// times; the node keeps its inode number through ofs.origin.

// copyUp makes the node's entry exist in the upper.
func (n *node) copyUp() syscall.Errno {
	if n.layer == 0 {
		return 0
	}
	if n.isDir() {
		return n.copyUpDir()
	}
	parent := n.parentNode()
	if parent == nil {
		return syscall.EROFS // a lower file that was deleted while open
	}
	if errno := parent.copyUpDir(); errno != 0 {
		return errno
	}
	p, ok := n.path()
	if !ok {
		return syscall.ESTALE
	}
	upIno, errno := n.o.copyUpEntry(n.layer, p)
	if errno != 0 {
		return errno
	}
	n.o.originMu.Lock()
	n.o.origin[upIno] = n.StableAttr().Ino
	n.o.originMu.Unlock()
	n.layer = 0
	n.copiedUp.Store(true)
	n.dropShared()
	return 0
}

// copyUpDir makes the directory exist in the upper (not opaque: its lower
// directories keep merging into it).
func (n *node) copyUpDir() syscall.Errno {
	if len(n.dirLayers) > 0 && n.dirLayers[0] == 0 {
		return 0
	}
	if n.IsRoot() {
		return 0
	}
	parent := n.parentNode()
	if parent == nil {
		return syscall.ENOENT
	}
	if errno := parent.copyUpDir(); errno != 0 {
		return errno
	}
	p, ok := n.path()
	if !ok {
		return syscall.ESTALE
	}
	o := n.o
	src := o.fds[n.layer]
	var st unix.Stat_t
	if err := fstatat(src, p, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return errnoOf(err)
	}
	up := o.fds[0]
	if err := mkdirat(up, p, 0o700); err != nil {
		return errnoOf(err)
	}
	_ = fchownat(up, p, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
	if sfd, err := openat(src, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
		if dfd, err := openat(up, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			copyXattrs(sfd, dfd)
			unix.Close(dfd)
		}
		unix.Close(sfd)
	}
	if err := fchmodat(up, p, st.Mode&07777, 0); err != nil {
		return errnoOf(err)
	}
	_ = utimesNanoAt(up, p, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
	var nst unix.Stat_t
	if err := fstatat(up, p, &nst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return errnoOf(err)
	}
	o.originMu.Lock()
	o.origin[nst.Ino] = n.StableAttr().Ino
	o.originMu.Unlock()
	n.dirLayers = append([]int{0}, n.dirLayers...)
	n.layer = 0
	return 0
}

// stagingAcquire returns the staging directory fd. The hidden directory in
// the upper is created by the first concurrent copy-up and removed by the
// last (stagingRelease), so it exists only while copy-ups run.
// up is the current upper's descriptor, valid for the call.
func (o *ofs) stagingAcquire(up int) (int, syscall.Errno) {
	if o.work >= 0 {
		return o.work, 0
	}
	o.stageMu.Lock()
	defer o.stageMu.Unlock()
	if o.stageRefs == 0 {
		// The staging directory is removed from the upper it was made in,
		// even when an upper swap comes between: keep a descriptor of it.
		up, err := unix.FcntlInt(uintptr(up), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return -1, errnoOf(err)
		}
		if err := mkdirat(up, stagingName, 0o700); err != nil && err != unix.EEXIST {
			unix.Close(up)
			return -1, errnoOf(err)
		}
		fd, err := openat(up, stagingName, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			unix.Close(up)
			return -1, errnoOf(err)
		}
		o.stageFd, o.stageUp = fd, up
	}
	o.stageRefs++
	return o.stageFd, 0
}

func (o *ofs) stagingRelease() {
	if o.work >= 0 {
		return
	}
	o.stageMu.Lock()
	defer o.stageMu.Unlock()
	o.stageRefs--
	if o.stageRefs == 0 {
		unix.Close(o.stageFd)
		o.stageFd = -1
		_ = unlinkat(o.stageUp, stagingName, unix.AT_REMOVEDIR)
		unix.Close(o.stageUp)
		o.stageUp = -1
	}
}

// stageEntry copies the non-directory at p in the layer directory src into
// a new entry of the staging directory wd and returns its name. It reads
// only the lower, which never changes, so it needs no lock.
func (o *ofs) stageEntry(wd, src int, p string) (string, syscall.Errno) {
	var st unix.Stat_t
	if err := fstatat(src, p, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return "", errnoOf(err)
	}
	tmp := o.tmpName()
	times := []unix.Timespec{st.Atim, st.Mtim}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		sfd, err := openat(src, p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", errnoOf(err)
		}
		defer unix.Close(sfd)
		dfd, err := openat(wd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return "", errnoOf(err)
		}
		err = copyData(sfd, dfd, st.Size)
		if err == nil {
			_ = unix.Fchown(dfd, int(st.Uid), int(st.Gid))
			copyXattrs(sfd, dfd)
			err = unix.Fchmod(dfd, st.Mode&07777)
		}
		if err == nil {
			err = unix.UtimesNanoAt(dfd, "", times, unix.AT_EMPTY_PATH)
		}
		unix.Close(dfd)
		if err != nil {
			_ = unlinkat(wd, tmp, 0)
			return "", errnoOf(err)
		}
	case unix.S_IFLNK:
		buf := make([]byte, 4096)
		sz, err := readlinkat(src, p, buf)
		if err != nil {
			return "", errnoOf(err)
		}
		if err := symlinkat(string(buf[:sz]), wd, tmp); err != nil {
			return "", errnoOf(err)
		}
		_ = fchownat(wd, tmp, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
		_ = utimesNanoAt(wd, tmp, times, unix.AT_SYMLINK_NOFOLLOW)
	default:
		if err := mknodat(wd, tmp, st.Mode, int(st.Rdev)); err != nil {
			return "", errnoOf(err)
		}
		_ = fchownat(wd, tmp, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
		// mknod applied this process's umask; the copy keeps the lower's bits.
		if err := fchmodat(wd, tmp, st.Mode&07777, 0); err != nil {
			_ = unlinkat(wd, tmp, 0)
			return "", errnoOf(err)
		}
		_ = utimesNanoAt(wd, tmp, times, unix.AT_SYMLINK_NOFOLLOW)
	}
	return tmp, 0
}

// install renames the staged entry into the upper at p and returns the
// upper inode number (caller holds ofs.mu exclusively).
func (o *ofs) install(wd int, tmp, p string) (uint64, syscall.Errno) {
	if err := renameat(wd, tmp, o.fds[0], p); err != nil {
		_ = unlinkat(wd, tmp, 0)
		return 0, errnoOf(err)
	}
	var nst unix.Stat_t
	if err := fstatat(o.fds[0], p, &nst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return 0, errnoOf(err)
	}
	return nst.Ino, 0
}

// copyUpEntry copies the non-directory at p from layer into the upper and
// returns the upper inode number (caller holds ofs.mu exclusively).
func (o *ofs) copyUpEntry(layer int, p string) (uint64, syscall.Errno) {
	wd, errno := o.stagingAcquire(o.fds[0])
	if errno != 0 {
		return 0, errno
	}
	defer o.stagingRelease()
	tmp, errno := o.stageEntry(wd, o.fds[layer], p)
	if errno != 0 {
		return 0, errno
	}
	return o.install(wd, tmp, p)
}

// copyUpOpen is the copy-up of a file opened for writing, called with no
// lock held: the data is copied without ofs.mu (lowers never change), so a
// large copy-up does not stall the rest of the filesystem; only the final
// rename into the upper takes the exclusive lock. n.cuMu keeps concurrent
// opens of one file from copying it twice.
func (n *node) copyUpOpen() syscall.Errno {
	o := n.o
	n.cuMu.Lock()
	defer n.cuMu.Unlock()
	o.mu.RLock()
	layer := n.layer
	p, ok := n.path()
	// A duplicate of the layer's descriptor: SwapLower may replace the
	// chain (and its caller close the old descriptors) while this copies.
	// The upper's too: a swap may replace it as well.
	src, up := -1, -1
	var derr error
	if layer != 0 && ok {
		src, derr = unix.FcntlInt(uintptr(o.fds[layer]), unix.F_DUPFD_CLOEXEC, 0)
		if derr == nil {
			if up, derr = unix.FcntlInt(uintptr(o.fds[0]), unix.F_DUPFD_CLOEXEC, 0); derr != nil {
				unix.Close(src)
			}
		}
	}
	o.mu.RUnlock()
	if layer == 0 {
		return 0
	}
	if !ok {
		return syscall.ESTALE
	}
	if derr != nil {
		return errnoOf(derr)
	}
	defer unix.Close(src)
	defer unix.Close(up)
	wd, errno := o.stagingAcquire(up)
	if errno != 0 {
		return errno
	}
	defer o.stagingRelease()
	tmp, errno := o.stageEntry(wd, src, p)
	if errno != 0 {
		return errno
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if n.layer == 0 { // copied up meanwhile (rename, link, setattr)
		_ = unlinkat(wd, tmp, 0)
		return 0
	}
	parent := n.parentNode()
	p, ok = n.path()
	if parent == nil || !ok {
		_ = unlinkat(wd, tmp, 0)
		return syscall.ESTALE
	}
	if errno := parent.copyUpDir(); errno != 0 {
		_ = unlinkat(wd, tmp, 0)
		return errno
	}
	upIno, errno := o.install(wd, tmp, p)
	if errno != 0 {
		return errno
	}
	o.noteOrigin(upIno, n.StableAttr().Ino)
	n.layer = 0
	n.copiedUp.Store(true)
	n.dropShared()
	return 0
}

// copyData copies size bytes from src to dst, skipping holes.
func copyData(src, dst int, size int64) error {
	var off int64
	for off < size {
		data, err := unix.Seek(src, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break // only a hole is left
		}
		if err != nil {
			data = off // no hole support: copy everything
		}
		end, err := unix.Seek(src, data, unix.SEEK_HOLE)
		if err != nil || end > size {
			end = size
		}
		if err := copyRange(src, dst, data, end-data); err != nil {
			return err
		}
		off = end
	}
	return unix.Ftruncate(dst, size)
}

// copyRange copies n bytes at off, with copy_file_range where the
// filesystem allows it.
func copyRange(src, dst int, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		c, err := unix.CopyFileRange(src, &roff, dst, &woff, int(min(n, 1<<30)), 0)
		if err != nil || c == 0 {
			return copyRangeRW(src, dst, roff, n)
		}
		n -= int64(c)
	}
	return nil
}

func copyRangeRW(src, dst int, off, n int64) error {
	buf := make([]byte, 1<<20)
	for n > 0 {
		c, err := unix.Pread(src, buf[:min(int64(len(buf)), n)], off)
		if err != nil {
			return err
		}
		if c == 0 {
			return nil
		}
		if _, err := unix.Pwrite(dst, buf[:c], off); err != nil {
			return err
		}
		off += int64(c)
		n -= int64(c)
	}
	return nil
}

// copyXattrs copies the xattrs of src to dst, except the overlay's own;
// names the server may not set (trusted.*, security.*) are skipped.
func copyXattrs(src, dst int) {
	sz, err := unix.Flistxattr(src, nil)
	if err != nil || sz == 0 {
		return
	}
	buf := make([]byte, sz+64)
	sz, err = unix.Flistxattr(src, buf)
	if err != nil {
		return
	}
	for _, nm := range splitNul(buf[:sz]) {
		if isOverlayXattr(nm) {
			continue
		}
		v, err := fgetxattrAll(src, nm)
		if err != nil {
			continue
		}
		_ = unix.Fsetxattr(dst, nm, v, 0)
	}
}
