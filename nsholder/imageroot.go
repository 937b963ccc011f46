package nsholder

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// imageMountPoints are the session paths steps 5-8 of setupRoot mount on.
var imageMountPoints = []string{"/proc", "/sys", "/dev", "/tmp", "/var/tmp", "/root", "/run", "/workspace"}

// mountImageRoot mounts the kernel overlay of an image rootfs at root, with
// its upper and work directories under scratch/.image, and makes sure every
// mount point is a plain directory of that overlay.
func mountImageRoot(root, scratch, rootfs string) error {
	if !filepath.IsAbs(rootfs) {
		return fmt.Errorf("image rootfs %q is not absolute", rootfs)
	}
	if st, err := os.Stat(rootfs); err != nil {
		return fmt.Errorf("image rootfs: %w", err)
	} else if !st.IsDir() {
		return fmt.Errorf("image rootfs %s is not a directory", rootfs)
	}
	upper := filepath.Join(scratch, ".image", "upper")
	work := filepath.Join(scratch, ".image", "work")
	if err := os.MkdirAll(upper, 0o755); err != nil {
		return fmt.Errorf("image upper: %w", err)
	}
	// The work directory must not hold a previous holder's leftovers.
	if err := os.RemoveAll(work); err != nil {
		return fmt.Errorf("image work directory: %w", err)
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return fmt.Errorf("image work directory: %w", err)
	}
	if _, err := MountOverlay(root, []string{rootfs}, upper, work); err != nil {
		return fmt.Errorf("image root overlay: %w", err)
	}
	for _, p := range imageMountPoints {
		if err := plainDirs(root, p); err != nil {
			return fmt.Errorf("image mount point %s: %w", p, err)
		}
	}
	return nil
}

// plainDirs makes every component of p below root a real directory,
// replacing symlinks and other non-directories (in the overlay's upper):
// nothing is ever followed out of root.
func plainDirs(root, p string) error {
	cur := root
	for _, part := range strings.Split(strings.Trim(p, "/"), "/") {
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		switch {
		case err == nil && fi.IsDir():
			continue
		case err == nil:
			if err := os.Remove(cur); err != nil {
				return err
			}
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
		if err := os.Mkdir(cur, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// writeImageFiles writes the supervisor-provided files after pivot_root,
// when every path resolves inside the session root. An existing entry (a
// symlink included) is replaced, never written through.
func writeImageFiles(files map[string]string) error {
	for p, content := range files {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("provided file %q is not absolute", p)
		}
		if err := plainDirs("/", filepath.Dir(p)); err != nil {
			return fmt.Errorf("provide %s: %w", p, err)
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("provide %s: %w", p, err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("provide %s: %w", p, err)
		}
	}
	return nil
}
