package fuseoverlay

import (
	"context"
	"encoding/binary"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// merged lists the merged directory p built from layers (topmost first):
// the first layer with a name decides it, whiteouts hide it, .wh.* names
// are never listed. The caller holds ofs.mu (shared is enough).
func (o *ofs) merged(layers []int, p string, root bool) ([]fuse.DirEntry, syscall.Errno) {
	seen := map[string]bool{}
	upperIdx := map[string]int{}
	var out []fuse.DirEntry
	buf := make([]byte, 64<<10)
	for _, l := range layers {
		lfd := o.fds[l]
		fd, err := openat(lfd, rel(p), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, errnoOf(err)
		}
		var ociWh []string
		for {
			nb, err := unix.Getdents(fd, buf)
			if err != nil {
				unix.Close(fd)
				return nil, errnoOf(err)
			}
			if nb <= 0 {
				break
			}
			for b := buf[:nb]; len(b) >= 19; {
				ino := binary.NativeEndian.Uint64(b[0:8])
				reclen := int(binary.NativeEndian.Uint16(b[16:18]))
				typ := b[18]
				nameb := b[19:reclen]
				if i := indexNul(nameb); i >= 0 {
					nameb = nameb[:i]
				}
				name := string(nameb)
				b = b[reclen:]
				if name == "." || name == ".." {
					continue
				}
				if kind, target := parseName(name); kind != namePlain {
					if l > 0 && kind == nameOCIWhiteout {
						ociWh = append(ociWh, target)
					}
					continue
				}
				if seen[name] {
					// An upper entry over a lower one of the same kind shows
					// the lower's number (copy-up before a remount).
					if i, ok := upperIdx[name]; ok && (typ == unix.DT_DIR) == (out[i].Mode == unix.S_IFDIR) && typ != unix.DT_CHR {
						st := unix.Stat_t{Ino: ino, Dev: o.devs[l]}
						out[i].Ino = stableIno(&st, o.upperDev)
						delete(upperIdx, name)
					}
					continue
				}
				seen[name] = true
				if root && o.hideTmp && name == stagingName {
					continue
				}
				var mode uint32
				switch typ {
				case unix.DT_DIR:
					mode = unix.S_IFDIR
				case unix.DT_LNK:
					mode = unix.S_IFLNK
				case unix.DT_FIFO:
					mode = unix.S_IFIFO
				case unix.DT_SOCK:
					mode = unix.S_IFSOCK
				case unix.DT_BLK:
					mode = unix.S_IFBLK
				default: // DT_REG, DT_CHR, DT_UNKNOWN: may be whiteouts
					// Relative to the open directory: one short name, however
					// deep the directory is.
					var st unix.Stat_t
					if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
						continue
					}
					if isWhiteout(fd, name, &st) {
						continue
					}
					mode = st.Mode & unix.S_IFMT
					ino = st.Ino
				}
				st := unix.Stat_t{Ino: ino, Dev: o.devs[l]}
				if l == 0 && len(layers) > 1 && !o.hasOrigin(ino) {
					upperIdx[name] = len(out)
				}
				out = append(out, fuse.DirEntry{Name: name, Mode: mode, Ino: o.inoFor(l, &st)})
			}
		}
		unix.Close(fd)
		for _, x := range ociWh {
			seen[x] = true
		}
	}
	return out, 0
}

func indexNul(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

// mergedNames is merged for an emptiness check.
func (o *ofs) mergedNames(layers []int, p string, root bool) ([]fuse.DirEntry, syscall.Errno) {
	return o.merged(layers, p, root)
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	// The listing is built at the first READDIR, not here: with the
	// kernel's directory cache warm, an opendir is never followed by one.
	h := &dirHandle{n: n}
	// The kernel may cache listings: lowers never change and the upper
	// changes only through this mount, which invalidates the cache itself.
	return h, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
}

// dirHandle is an open directory: a snapshot taken at opendir (and at
// rewinddir), so a listing is consistent under concurrent creates.
type dirHandle struct {
	n       *node
	entries []fuse.DirEntry
	pos     int
	loaded  bool
}

var (
	_ fs.FileReaddirenter   = (*dirHandle)(nil)
	_ fs.FileSeekdirer      = (*dirHandle)(nil)
	_ fs.FileReleasedirer   = (*dirHandle)(nil)
	_ fs.FileFsyncdirer     = (*dirHandle)(nil)
	_ fs.FileHandle         = (*dirHandle)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
)

func (h *dirHandle) load() syscall.Errno {
	n := h.n
	n.o.mu.RLock()
	defer n.o.mu.RUnlock()
	p, ok := n.path()
	if !ok {
		return syscall.ENOENT
	}
	ents, errno := n.o.merged(n.dirLayers, p, n.IsRoot())
	if errno != 0 {
		return errno
	}
	parentIno := n.StableAttr().Ino
	if pn := n.parentNode(); pn != nil {
		parentIno = pn.StableAttr().Ino
	}
	// A known node shows its own number: a directory kept across a lower
	// swap keeps the one it had (see swap.go), and stat and readdir agree.
	for i := range ents {
		if ch := n.GetChild(ents[i].Name); ch != nil && ch.StableAttr().Mode == ents[i].Mode {
			ents[i].Ino = ch.StableAttr().Ino
		}
	}
	h.entries = append([]fuse.DirEntry{
		{Name: ".", Mode: unix.S_IFDIR, Ino: n.StableAttr().Ino},
		{Name: "..", Mode: unix.S_IFDIR, Ino: parentIno},
	}, ents...)
	h.pos = 0
	h.loaded = true
	return 0
}

func (h *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if !h.loaded {
		if errno := h.load(); errno != 0 {
			return nil, errno
		}
	}
	if h.pos >= len(h.entries) {
		return nil, 0
	}
	e := h.entries[h.pos]
	h.pos++
	e.Off = uint64(h.pos)
	return &e, 0
}

func (h *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if off == 0 {
		h.loaded = false // rewinddir: a fresh snapshot
		h.pos = 0
		return 0
	}
	if !h.loaded {
		if errno := h.load(); errno != 0 {
			return errno
		}
	}
	h.pos = int(off)
	return 0
}

func (h *dirHandle) Releasedir(ctx context.Context, releaseFlags uint32) {}

func (h *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	h.n.o.mu.RLock()
	defer h.n.o.mu.RUnlock()
	p, ok := h.n.path()
	if !ok {
		return 0
	}
	fd, err := openat(h.n.o.fds[h.n.layer], rel(p), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return errnoOf(err)
	}
	defer unix.Close(fd)
	if h.n.layer != 0 {
		return 0
	}
	return errnoOf(unix.Fsync(fd))
}
