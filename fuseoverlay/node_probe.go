package fuseoverlay

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// probe is the result of a merged lookup of one name.
type probe struct {
	found     bool
	st        unix.Stat_t
	layer     int
	dirLayers []int
	// origin is, for an upper entry that a lower also has at the same path
	// (a copy-up from before a remount), the lower's inode number.
	origin uint64
}

// probe resolves name in the directory dp whose merged layers are layers,
// honouring whiteouts (both encodings, and OCI .wh.<name> in lowers) and
// opaque directories (contract §8.4).
func (o *ofs) probe(layers []int, dp, name string) (probe, syscall.Errno) {
	var res probe
	p := join(dp, name)
	for _, l := range layers {
		fd := o.fds[l]
		var st unix.Stat_t
		err := fstatat(fd, p, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == unix.ENOENT || err == unix.ENOTDIR {
			if l > 0 {
				var wst unix.Stat_t
				if fstatat(fd, join(dp, whPrefix+name), &wst, unix.AT_SYMLINK_NOFOLLOW) == nil {
					break
				}
			}
			continue
		}
		if err != nil {
			return res, errnoOf(err)
		}
		if isWhiteout(fd, p, &st) {
			break
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if !res.found {
			res.found, res.st, res.layer = true, st, l
			if !isDir {
				if l == 0 && len(layers) > 1 && !o.hasOrigin(st.Ino) {
					res.origin = o.lowerOrigin(layers[1:], dp, name)
				}
				break
			}
			res.dirLayers = []int{l}
			if isOpaque(fd, p) {
				break
			}
			continue
		}
		if !isDir {
			break // a non-directory below a directory is hidden, and so is all below it
		}
		if len(res.dirLayers) == 1 && res.layer == 0 {
			res.origin = stableIno(&st, o.upperDev)
		}
		res.dirLayers = append(res.dirLayers, l)
		if isOpaque(fd, p) {
			break
		}
	}
	return res, 0
}

// lowerHas reports whether a lower layer of the parent dp would show name
// if the upper had nothing there: then deleting it needs a whiteout.
func (o *ofs) lowerHas(parentLayers []int, dp, name string) bool {
	var lowers []int
	for _, l := range parentLayers {
		if l > 0 {
			lowers = append(lowers, l)
		}
	}
	if len(lowers) == 0 {
		return false
	}
	pr, errno := o.probe(lowers, dp, name)
	return errno != 0 || pr.found
}

// lowerOrigin finds the inode number of the non-directory that the lower
// layers hold at dp/name, ignoring whatever the upper has there; 0 if none.
func (o *ofs) lowerOrigin(lowers []int, dp, name string) uint64 {
	p := join(dp, name)
	for _, l := range lowers {
		var st unix.Stat_t
		err := fstatat(o.fds[l], p, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			var wst unix.Stat_t
			if fstatat(o.fds[l], join(dp, whPrefix+name), &wst, unix.AT_SYMLINK_NOFOLLOW) == nil {
				return 0
			}
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR || isWhiteout(o.fds[l], p, &st) {
			return 0
		}
		return stableIno(&st, o.upperDev)
	}
	return 0
}

func (o *ofs) hasOrigin(upperIno uint64) bool {
	o.originMu.Lock()
	_, ok := o.origin[upperIno]
	o.originMu.Unlock()
	return ok
}

// noteOrigin remembers the number an upper entry shows (its lower's).
func (o *ofs) noteOrigin(upperIno, origin uint64) {
	o.originMu.Lock()
	o.origin[upperIno] = origin
	o.originMu.Unlock()
}

func (o *ofs) inoFor(layer int, st *unix.Stat_t) uint64 {
	if layer == 0 {
		o.originMu.Lock()
		v, ok := o.origin[st.Ino]
		o.originMu.Unlock()
		if ok {
			return v
		}
	}
	return stableIno(st, o.upperDev)
}

func (o *ofs) forgetOrigin(upperIno uint64) {
	o.originMu.Lock()
	delete(o.origin, upperIno)
	o.originMu.Unlock()
}
