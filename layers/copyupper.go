package layers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CopyUpper copies the upper dir src to dst (which must not exist; its
// parent must) exactly, for fork_workspace_session: every entry kind
// (regular files, directories, symlinks, 0:0 whiteout devices, FIFOs,
// sockets), the 0o7777 mode bits, every xattr that can be read and set
// (user.overlay.opaque/whiteout/origin…; trusted.* and security.* are
// skipped where the kernel refuses them), access and modification times,
// and hard links within src. File content is cloned (FICLONE) where the
// filesystem shares extents, else copied with copy_file_range, so a copy
// costs little. src is read beneath an openat2 Root and no symlink is
// followed; device nodes other than whiteouts are refused (an
// unprivileged user cannot make them). The copy shares nothing with src.
// On error dst is removed. The source session should not write its upper
// during the copy (freeze it): the copy is of each entry as it is read.
func CopyUpper(ctx context.Context, src, dst string) error {
	root, err := OpenRoot(src)
	if err != nil {
		return fmt.Errorf("copy upper: %w", err)
	}
	defer root.Close()
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("copy upper: %w", err)
	}
	c := &upperCopier{ctx: ctx, links: map[[2]uint64]string{}}
	top, err := root.OpenDir("")
	if err == nil {
		err = c.dir(top, dst)
		top.Close()
	}
	if err == nil {
		err = syncFS(dst)
	}
	if err != nil {
		_ = forceRemoveAll(dst)
		return fmt.Errorf("copy upper %s: %w", src, err)
	}
	return nil
}

type upperCopier struct {
	ctx   context.Context
	links map[[2]uint64]string // (dev, ino) of a multiply linked file → its copy
}

// dir copies the content, xattrs, mode and times of the open directory d
// onto the existing directory to (times last, after the children).
func (c *upperCopier) dir(d *Dir, to string) error {
	names, err := d.Names()
	if err != nil {
		return err
	}
	for _, n := range names {
		if c.ctx != nil {
			if err := c.ctx.Err(); err != nil {
				return err
			}
		}
		if err := c.entry(d, n, filepath.Join(to, n)); err != nil {
			return err
		}
	}
	fi, err := d.stat()
	if err != nil {
		return err
	}
	st := fi.Sys().(*unix.Stat_t)
	if err := copyXattrs(d, ".", to); err != nil {
		return err
	}
	if err := chmodDir(to, st.Mode&0o7777); err != nil {
		return err
	}
	return setTimes(to, st)
}

// entry copies the entry name of d to the host path to.
func (c *upperCopier) entry(d *Dir, name, to string) error {
	fi, err := d.Lstat(name)
	if err != nil {
		return err
	}
	st := fi.Sys().(*unix.Stat_t)
	perm := st.Mode & 0o7777
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := os.Mkdir(to, 0o700); err != nil {
			return err
		}
		sub, err := d.OpenDir(name)
		if err != nil {
			return err
		}
		defer sub.Close()
		return c.dir(sub, to)
	case unix.S_IFLNK:
		target, err := d.Readlink(name)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, to); err != nil {
			return err
		}
		return setTimes(to, st)
	case unix.S_IFREG:
		if st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := c.links[key]; ok {
				return os.Link(first, to)
			}
			c.links[key] = to
		}
		return c.file(d, name, to, st)
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return fmt.Errorf("%s: a device node other than a whiteout: %w", d.join(name), fs.ErrInvalid)
		}
	case unix.S_IFIFO, unix.S_IFSOCK:
	default:
		return fmt.Errorf("%s: unsupported file type %#o: %w", d.join(name), st.Mode&unix.S_IFMT, fs.ErrInvalid)
	}
	if err := unix.Mknod(to, st.Mode&unix.S_IFMT|perm, int(st.Rdev)); err != nil {
		return &fs.PathError{Op: "mknod", Path: to, Err: err}
	}
	if err := copyXattrs(d, name, to); err != nil {
		return err
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, to, perm, 0); err != nil {
		return &fs.PathError{Op: "chmod", Path: to, Err: err}
	}
	return setTimes(to, st)
}

func (c *upperCopier) file(d *Dir, name, to string, st *unix.Stat_t) error {
	in, err := d.Open(name)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) != nil {
		// *os.File's ReadFrom uses copy_file_range between files.
		if _, err := io.Copy(out, in); err != nil {
			return fmt.Errorf("copy %s: %w", d.join(name), err)
		}
	}
	if err := copyXattrs(d, name, to); err != nil {
		return err
	}
	if err := out.Chmod(fs.FileMode(st.Mode & 0o777)); err != nil {
		return err
	}
	if st.Mode&0o7000 != 0 {
		if err := unix.Fchmod(int(out.Fd()), st.Mode&0o7777); err != nil {
			return &fs.PathError{Op: "chmod", Path: to, Err: err}
		}
	}
	if err := setTimes(to, st); err != nil {
		return err
	}
	return out.Close()
}

// copyXattrs copies the xattrs of d's entry name ("." for d) onto the
// host path to (not followed). Names the kernel refuses to set for an
// unprivileged user outside the user.* namespace are skipped.
func copyXattrs(d *Dir, name, to string) error {
	var names []string
	err := d.control(func(fd int) error {
		p, list := "/proc/self/fd/"+strconv.Itoa(fd), unix.Listxattr
		if name != "." {
			p, list = p+"/"+name, unix.Llistxattr
		}
		buf := make([]byte, 1024)
		for {
			n, err := list(p, buf)
			if errors.Is(err, unix.ERANGE) && len(buf) < 1<<20 {
				buf = make([]byte, len(buf)*4)
				continue
			}
			if errors.Is(err, unix.ENOTSUP) {
				return nil
			}
			if err != nil {
				return &fs.PathError{Op: "listxattr", Path: d.join(name), Err: err}
			}
			for _, a := range strings.Split(string(buf[:n]), "\x00") {
				if a != "" {
					names = append(names, a)
				}
			}
			return nil
		}
	})
	if err != nil {
		return err
	}
	for _, a := range names {
		v, ok := d.getxattr(name, a)
		if !ok {
			if strings.HasPrefix(a, "user.") {
				return fmt.Errorf("%s: read xattr %s: %w", d.join(name), a, fs.ErrPermission)
			}
			continue
		}
		if err := lsetxattr(to, a, []byte(v), 0); err != nil {
			if !strings.HasPrefix(a, "user.") && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTSUP)) {
				continue
			}
			return &fs.PathError{Op: "setxattr " + a, Path: to, Err: err}
		}
	}
	return nil
}

func setTimes(p string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "utimes", Path: p, Err: err}
	}
	return nil
}
