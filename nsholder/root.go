package nsholder

// Root assembly (§5.4, image "host"), run by the holder as root of its new
// user, mount and PID namespaces, before anything of the session runs.
//
// Order matters:
//  1. "/" is made private (MS_REC|MS_PRIVATE) so nothing propagates back.
//  2. The exec shim of every command later is opened: Config.Shim, else
//     /proc/self/exe (the holder's own binary).
//  3. A tmpfs at <scratch>/.rootfs becomes the new root. Host paths are
//     bind-mounted into it (recursively, then made read-only, nosuid and
//     nodev recursively with mount_setattr); top-level symlinks such as
//     /bin → usr/bin are recreated as symlinks.
//  4. Hidden paths are covered (mode-000 read-only tmpfs on directories, a
//     mode-000 empty file on files) wherever a bind made them visible.
//  5. /proc is a new procfs: it must be mounted while the host's /proc is
//     still visible in this mount namespace (the kernel refuses a procfs
//     mount in a user namespace unless a fully visible one exists), so
//     before pivot_root. /sys is the host's, read-only (isolated network:
//     a fresh sysfs of the new network namespace, so only lo shows).
//  6. /dev is a tmpfs with bind-mounted host device nodes (device nodes
//     created in a user namespace would not work), a new devpts instance
//     (newinstance, ptmxmode=0666, no gid= option: gid 5 is not mapped) and
//     a tmpfs /dev/shm.
//  7. /tmp, /var/tmp, /root and /run are binds of <scratch>/{tmp,var-tmp,
//     root,run}; /etc/resolv.conf's target is copied into <scratch>/run
//     when it is a symlink into /run.
//  8. /workspace is the kernel overlay (MountOverlay), or with Config.Overlay
//     "fuse" the FUSE overlay served by the holder itself (fuse.go), whose
//     layer, upper and work descriptors are opened here, before the pivot.
//  9. pivot_root(".", ".") then umount2(".", MNT_DETACH) drops the old
//     root; the root tmpfs is then made read-only.
//
// An image sandbox (Config.Image) differs in steps 3, 4 and 9 (§5.4 image
// rootfs): the new root is a kernel overlay (userxattr) of the cached image
// rootfs and a private upper at <scratch>/.image/upper, writable, with no
// host paths; every mount point of steps 5-8 that the image lacks or has
// as a non-directory (a symlink could point out of the root before
// pivot_root) is replaced by a directory in that upper; after pivot_root
// the root stays writable and Image.Files are written into it. Commands
// there use the static sandbox-exec-shim (Config.Shim; freestanding C, it
// needs nothing of the image), else the holder's own binary, which when it
// is dynamically linked starts through the host's loader and libraries
// opened before the pivot (Config.Loader, ShimLoader): an image need not
// have a compatible loader.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Setup stages reported in SetupError.Stage.
const (
	stageSpawn        = "spawn"
	stageHandshake    = "handshake"
	stageMountRoot    = "mount_root"
	stageMountOverlay = "mount_overlay"
	stagePivotRoot    = "pivot_root"
	stageReady        = "ready"
	stageNetwork      = "network"
)

// sessionRoot is what setup leaves for the server.
type sessionRoot struct {
	exe      *os.File // the exec shim: Config.Shim or the holder's own binary
	shimArgv []string // argv before "-- shell…" for the program at descriptor shimExec
	// loader is Config.Loader's interpreter then its libraries, descriptors
	// shimFD+1… of a command's shim (nil without Config.Loader).
	loader       []*os.File
	shimExec     int      // the descriptor a command execs: shimFD, or the loader's
	workspace    *os.File // directory fd of /workspace
	shell        string   // /bin/bash or /bin/sh, "" when neither exists
	lowerdirPlus bool
	overlayDur   time.Duration // how long mounting /workspace took (reported for the holder.mount_overlay span)
	fuse         *fuseMount    // the FUSE overlay when Config.Overlay is "fuse"
	// kswap is what a lower swap of the kernel driver needs, taken before
	// pivot_root (swap.go).
	kswap *kernelSwap
	// chain is what /workspace serves (Client.Chain); guarded by
	// server.wsMu once serving.
	chain ChainInfo
}

// bindTarget maps a session path to the host directory it shows.
type bindTarget struct{ session, host string }

// scratchDirs back the writable private directories of the session.
var scratchDirs = []struct {
	name string
	mode fs.FileMode
	at   string
}{
	{"tmp", 0o777 | fs.ModeSticky, "/tmp"},
	{"var-tmp", 0o777 | fs.ModeSticky, "/var/tmp"},
	{"root", 0o700, "/root"},
	{"run", 0o755, "/run"},
}

func validateConfig(cfg *Config) error {
	if cfg.SessionID == "" || len(cfg.SessionID) > 64 {
		return fmt.Errorf("session id %q must be 1 to 64 bytes (it is the hostname)", cfg.SessionID)
	}
	if len(cfg.Lowers) == 0 {
		return errors.New("no lower layers")
	}
	if cfg.Shim != "" && !filepath.IsAbs(cfg.Shim) {
		return fmt.Errorf("exec shim %q is not absolute", cfg.Shim)
	}
	if l := cfg.Loader; l != nil {
		for _, p := range append([]string{l.Interp}, l.Preload...) {
			if !filepath.IsAbs(p) {
				return fmt.Errorf("exec shim loader file %q is not absolute", p)
			}
		}
	}
	for _, p := range append([]string{cfg.Upper, cfg.Work, cfg.Scratch}, cfg.Lowers...) {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("path %q is not absolute", p)
		}
	}
	return nil
}

// setupRoot builds the session's root and pivots into it. Errors are
// *stageError.
func setupRoot(cfg *Config, own *owners, notify func(*FSNotice)) (*sessionRoot, error) {
	if err := validateConfig(cfg); err != nil {
		return nil, &stageError{stageHandshake, err}
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, atStage(stageMountRoot, "make / private: %w", err)
	}
	shimPath, shimArgv := "/proc/self/exe", []string{"sandbox-supervisor", "nsholder", "shim"}
	if cfg.Shim != "" {
		shimPath, shimArgv = cfg.Shim, []string{"sandbox-exec-shim"}
	}
	exe, err := os.OpenFile(shimPath, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, atStage(stageMountRoot, "open exec shim: %w", err)
	}
	if cfg.PidsMax > 0 {
		shimArgv = append(shimArgv, "-P", strconv.FormatInt(cfg.PidsMax, 10))
	}
	res := &sessionRoot{exe: exe, shimArgv: shimArgv, shimExec: shimFD}
	fail := func(err error) (*sessionRoot, error) {
		exe.Close()
		for _, f := range res.loader {
			f.Close()
		}
		res.kswap.close()
		if res.fuse != nil {
			_ = res.fuse.srv.Unmount() // best effort: the namespace dies with us anyway
			res.fuse.close()
		}
		return nil, err
	}

	if cfg.Shim == "" && cfg.Loader != nil {
		// The Go shim through the host's loader (ShimLoader): opened here,
		// while the host's files are still reachable.
		var pre []string
		for i, p := range append([]string{cfg.Loader.Interp}, cfg.Loader.Preload...) {
			f, err := os.OpenFile(p, os.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fail(atStage(stageMountRoot, "open exec shim loader: %w", err))
			}
			res.loader = append(res.loader, f)
			if i > 0 {
				pre = append(pre, "/proc/self/fd/"+strconv.Itoa(shimFD+1+i))
			}
		}
		res.shimExec = shimFD + 1
		res.shimArgv = append([]string{"ld.so", "--preload", strings.Join(pre, ":"), "/proc/self/fd/" + strconv.Itoa(shimFD)}, shimArgv[1:]...)
	}
	if err := os.MkdirAll(cfg.Scratch, 0o700); err != nil {
		return fail(atStage(stageMountRoot, "scratch directory: %w", err))
	}
	root := filepath.Join(cfg.Scratch, ".rootfs")
	if err := os.Mkdir(root, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fail(atStage(stageMountRoot, "root mount point: %w", err))
	}
	var binds []bindTarget
	if cfg.Image != nil {
		if err := mountImageRoot(root, cfg.Scratch, cfg.Image.Rootfs); err != nil {
			return fail(&stageError{stageMountRoot, err})
		}
	} else {
		if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755,size=4m"); err != nil {
			return fail(atStage(stageMountRoot, "mount root tmpfs: %w", err))
		}
		if binds, err = bindHostPaths(root, cfg.HostPaths); err != nil {
			return fail(&stageError{stageMountRoot, err})
		}
		if err := hidePaths(root, cfg.Scratch, cfg.HiddenPaths, binds); err != nil {
			return fail(&stageError{stageMountRoot, err})
		}
	}
	if err := mountSpecial(root, cfg.IsolatedNetwork); err != nil {
		return fail(&stageError{stageMountRoot, err})
	}
	if err := mountScratch(root, cfg.Scratch); err != nil {
		return fail(&stageError{stageMountRoot, err})
	}
	if err := copyResolvConf(root, "/", cfg.Scratch, binds); err != nil {
		return fail(&stageError{stageMountRoot, err})
	}
	if cfg.ResolvConf != "" && cfg.Image == nil {
		if err := replaceResolvConf(root, cfg.Scratch, cfg.ResolvConf); err != nil {
			return fail(&stageError{stageMountRoot, err})
		}
	}

	overlayStart := time.Now()
	ws := filepath.Join(root, "workspace")
	if err := os.Mkdir(ws, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fail(atStage(stageMountOverlay, "workspace mount point: %w", err))
	}
	for _, l := range cfg.Lowers {
		if st, err := os.Stat(l); err != nil {
			return fail(atStage(stageMountOverlay, "lower layer: %w", err))
		} else if !st.IsDir() {
			return fail(atStage(stageMountOverlay, "lower layer %s is not a directory", l))
		}
	}
	switch cfg.Overlay {
	case "", OverlayKernel:
		if res.lowerdirPlus, err = MountOverlay(ws, cfg.Lowers, cfg.Upper, cfg.Work); err != nil {
			return fail(atStage(stageMountOverlay, "kernel overlay: %w", err))
		}
		res.kswap = openKernelSwap(cfg)
	case OverlayFuse:
		if res.fuse, err = mountFuse(ws, cfg, own, notify); err != nil {
			return fail(atStage(stageMountOverlay, "fuse overlay: %w", err))
		}
	default:
		return fail(atStage(stageMountOverlay, "unknown overlay driver %q", cfg.Overlay))
	}

	res.overlayDur = time.Since(overlayStart)
	var ust unix.Stat_t
	if err := unix.Stat(cfg.Upper, &ust); err != nil {
		return fail(atStage(stageMountOverlay, "stat upper: %w", err))
	}
	res.chain = ChainInfo{Lowers: slices.Clone(cfg.Lowers), UpperDev: ust.Dev, UpperIno: ust.Ino}
	if err := pivotInto(root, cfg.Image == nil); err != nil {
		return fail(&stageError{stagePivotRoot, err})
	}
	if cfg.Image != nil {
		if err := writeImageFiles(cfg.Image.Files); err != nil {
			return fail(&stageError{stageReady, err})
		}
	}

	if err := unix.Sethostname([]byte(cfg.SessionID)); err != nil {
		return fail(atStage(stageReady, "sethostname: %w", err))
	}
	if cfg.IsolatedNetwork {
		if err := loopbackUp(); err != nil {
			return fail(atStage(stageReady, "bring lo up: %w", err))
		}
		if cfg.BlockPrivate {
			if err := blockPrivate(); err != nil {
				return fail(atStage(stageNetwork, "%w", err))
			}
		}
	}
	res.workspace, err = os.OpenFile("/workspace", os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fail(atStage(stageReady, "open /workspace: %w", err))
	}
	for _, sh := range []string{"/bin/bash", "/bin/sh"} {
		if st, err := os.Stat(sh); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			res.shell = sh
			break
		}
	}
	return res, nil
}

// bindHostPaths reproduces the host paths that exist inside root.
func bindHostPaths(root string, paths []string) ([]bindTarget, error) {
	var ps []string
	for _, p := range paths {
		if filepath.IsAbs(p) && filepath.Clean(p) != "/" {
			ps = append(ps, filepath.Clean(p))
		}
	}
	slices.Sort(ps) // parents before their children
	ps = slices.Compact(ps)
	var binds []bindTarget
	for _, p := range ps {
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("host path %s: %w", p, err)
		}
		if ok, err := plainParents(root, p); err != nil || !ok {
			if err != nil {
				return nil, err
			}
			continue // below a symlink or bind already reproduced: visible through it
		}
		target := filepath.Join(root, p)
		if fi.Mode()&fs.ModeSymlink != 0 {
			if filepath.Dir(p) == "/" {
				link, err := os.Readlink(p)
				if err != nil {
					return nil, fmt.Errorf("host path %s: %w", p, err)
				}
				if err := os.Symlink(link, target); err != nil && !errors.Is(err, fs.ErrExist) {
					return nil, fmt.Errorf("symlink %s: %w", p, err)
				}
				continue
			}
			if fi, err = os.Stat(p); err != nil {
				continue // dangling
			}
		}
		host, err := filepath.EvalSymlinks(p)
		if err != nil {
			continue
		}
		if err := makeMountPoint(target, fi.IsDir()); err != nil {
			return nil, fmt.Errorf("host path %s: %w", p, err)
		}
		if err := bindReadOnly(host, target); err != nil {
			return nil, fmt.Errorf("host path %s: %w", p, err)
		}
		binds = append(binds, bindTarget{session: p, host: host})
	}
	return binds, nil
}

// plainParents reports whether every parent of p below root is a plain
// directory of the root tmpfs (not a symlink, not inside a bind), creating
// missing ones. Anything else would let a path escape root before
// pivot_root.
func plainParents(root, p string) (bool, error) {
	cur := root
	parts := strings.Split(strings.Trim(filepath.Dir(p), "/"), "/")
	for _, part := range parts {
		if part == "" {
			continue
		}
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			if err := os.Mkdir(cur, 0o755); err != nil {
				return false, fmt.Errorf("mkdir %s: %w", cur, err)
			}
			continue
		}
		if err != nil {
			return false, err
		}
		if !fi.IsDir() || isMountPoint(cur) {
			return false, nil
		}
	}
	return true, nil
}

// isMountPoint reports whether dir is the root of a mount (different
// mount ID than its parent).
func isMountPoint(dir string) bool {
	id := func(p string) uint64 {
		var stx unix.Statx_t
		if unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &stx) != nil {
			return 0
		}
		return stx.Mnt_id
	}
	a, b := id(dir), id(filepath.Dir(dir))
	return a != 0 && a != b
}

func makeMountPoint(target string, dir bool) error {
	if dir {
		if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		return nil
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// bindReadOnly bind-mounts src (recursively) at target and makes the
// whole tree read-only, nosuid and nodev.
func bindReadOnly(src, target string) error {
	if err := unix.Mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(unix.AT_FDCWD, target, unix.AT_RECURSIVE|unix.AT_SYMLINK_NOFOLLOW, &attr); err != nil {
		if !errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("make %s read-only: %w", target, err)
		}
		// Kernels before 5.12: the top mount only.
		if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", target, err)
		}
	}
	return nil
}

// hidePaths covers every hidden path that a bind made visible.
func hidePaths(root, scratch string, hidden []string, binds []bindTarget) error {
	var rs []string
	for _, h := range hidden {
		if !filepath.IsAbs(h) {
			continue
		}
		r, err := filepath.EvalSymlinks(h)
		if err != nil {
			continue // does not exist: nothing to hide
		}
		rs = append(rs, r)
	}
	slices.Sort(rs)
	rs = slices.Compact(rs)
	var empty string
	for _, r := range rs {
		for _, b := range binds {
			var at string
			switch {
			case r == b.host || strings.HasPrefix(r, b.host+"/"):
				at = b.session + r[len(b.host):]
			case strings.HasPrefix(b.host, r+"/"):
				at = b.session
			default:
				continue
			}
			target := filepath.Join(root, at)
			fi, err := os.Lstat(target)
			if err != nil || fi.Mode()&fs.ModeSymlink != 0 {
				continue // under an earlier cover, or a link that shows nothing by itself
			}
			if fi.IsDir() {
				if err := unix.Mount("tmpfs", target, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=000,size=4k,nr_inodes=2"); err != nil {
					return fmt.Errorf("hide %s: %w", at, err)
				}
				continue
			}
			if empty == "" {
				empty = filepath.Join(scratch, ".hidden")
				f, err := os.OpenFile(empty, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0)
				if err != nil {
					return fmt.Errorf("hide %s: %w", at, err)
				}
				f.Close()
				if err := os.Chmod(empty, 0); err != nil {
					return fmt.Errorf("hide %s: %w", at, err)
				}
			}
			if err := bindReadOnly(empty, target); err != nil {
				return fmt.Errorf("hide %s: %w", at, err)
			}
		}
	}
	return nil
}

// mountSpecial mounts /proc, /sys and /dev.
func mountSpecial(root string, isolatedNet bool) error {
	proc := filepath.Join(root, "proc")
	if err := os.Mkdir(proc, 0o555); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w (the kernel allows a new procfs in a user namespace only when the host's /proc is not partly covered)", err)
	}

	sys := filepath.Join(root, "sys")
	if err := os.Mkdir(sys, 0o555); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	sysDone := false
	if isolatedNet {
		// A sysfs of our own network namespace: /sys/class/net shows lo only.
		sysDone = unix.Mount("sysfs", sys, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "") == nil
	}
	if !sysDone {
		if err := bindReadOnly("/sys", sys); err != nil {
			return fmt.Errorf("/sys: %w", err)
		}
	}

	dev := filepath.Join(root, "dev")
	if err := os.Mkdir(dev, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_STRICTATIME, "mode=755,size=64k,nr_inodes=1024"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		src := "/dev/" + n
		if _, err := os.Stat(src); err != nil {
			continue
		}
		t := filepath.Join(dev, n)
		if err := makeMountPoint(t, false); err != nil {
			return fmt.Errorf("/dev/%s: %w", n, err)
		}
		if err := unix.Mount(src, t, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", n, err)
		}
	}
	for name, link := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx",
	} {
		if err := os.Symlink(link, filepath.Join(dev, name)); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
	}
	pts := filepath.Join(dev, "pts")
	if err := os.Mkdir(pts, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	shm := filepath.Join(dev, "shm")
	if err := os.Mkdir(shm, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	return nil
}

// mountScratch binds the scratch subdirectories at /tmp, /var/tmp, /root, /run.
func mountScratch(root, scratch string) error {
	for _, d := range scratchDirs {
		src := filepath.Join(scratch, d.name)
		if err := os.Mkdir(src, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("scratch %s: %w", d.name, err)
		}
		if err := os.Chmod(src, d.mode); err != nil {
			return fmt.Errorf("scratch %s: %w", d.name, err)
		}
		target := filepath.Join(root, d.at)
		if ok, err := plainParents(root, d.at); err != nil {
			return fmt.Errorf("%s: %w", d.at, err)
		} else if !ok {
			// Inside a host bind (say /var is a host path): the directory
			// must exist there; a mount on it still works.
			if fi, err := os.Lstat(target); err != nil || !fi.IsDir() {
				return fmt.Errorf("%s: no directory to mount on inside a read-only host path", d.at)
			}
		} else if err := makeMountPoint(target, true); err != nil {
			return fmt.Errorf("%s: %w", d.at, err)
		}
		if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", d.at, err)
		}
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if err := unix.MountSetattr(unix.AT_FDCWD, target, unix.AT_SYMLINK_NOFOLLOW, &attr); err != nil && !errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("%s nosuid: %w", d.at, err)
		}
	}
	return nil
}

// copyResolvConf makes /etc/resolv.conf resolvable inside when it is a
// symlink into a scratch-backed directory (typically /run/systemd/resolve/
// stub-resolv.conf): the target's content is copied to the same path
// there. Targets elsewhere that the session cannot see stay dangling.
// hostRoot is "/" but for tests.
func copyResolvConf(root, hostRoot, scratch string, binds []bindTarget) error {
	const rc = "/etc/resolv.conf"
	visible := false
	for _, b := range binds {
		if b.session == "/etc" {
			visible = true
		}
	}
	if !visible {
		return nil
	}
	fi, err := os.Lstat(filepath.Join(root, rc))
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return nil
	}
	link, err := os.Readlink(filepath.Join(root, rc))
	if err != nil {
		return nil
	}
	if !filepath.IsAbs(link) {
		link = filepath.Join(filepath.Dir(rc), link)
	}
	link = filepath.Clean(link)
	for _, d := range scratchDirs {
		if !strings.HasPrefix(link, d.at+"/") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(hostRoot, rc)) // the host's view, following the link
		if err != nil {
			return nil // dangling on the host too
		}
		dst := filepath.Join(scratch, d.name, link[len(d.at):])
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("resolv.conf: %w", err)
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return fmt.Errorf("resolv.conf: %w", err)
		}
		return nil
	}
	return nil
}

// replaceResolvConf gives a host-image session its own resolver file: the
// host's /etc is a read-only bind, so a file in scratch is bound over
// /etc/resolv.conf (or written to its target when that is a symlink into a
// scratch-backed directory such as /run).
func replaceResolvConf(root, scratch, content string) error {
	const rc = "/etc/resolv.conf"
	at := filepath.Join(root, rc)
	fi, err := os.Lstat(at)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no /etc in the root: nothing resolves names anyway
	}
	if err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		link, err := os.Readlink(at)
		if err != nil {
			return fmt.Errorf("resolv.conf: %w", err)
		}
		if !filepath.IsAbs(link) {
			link = filepath.Join(filepath.Dir(rc), link)
		}
		link = filepath.Clean(link)
		for _, d := range scratchDirs {
			if strings.HasPrefix(link, d.at+"/") {
				dst := filepath.Join(scratch, d.name, link[len(d.at):])
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					return fmt.Errorf("resolv.conf: %w", err)
				}
				return os.WriteFile(dst, []byte(content), 0o644)
			}
		}
		return fmt.Errorf("resolv.conf: %s is a symlink to %s, outside the session's writable directories", rc, link)
	}
	src := filepath.Join(scratch, "resolv.conf")
	if err := os.WriteFile(src, []byte(content), 0o644); err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	if err := unix.Mount(src, at, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind resolv.conf: %w", err)
	}
	if err := unix.Mount("", at, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("resolv.conf read-only: %w", err)
	}
	return nil
}

// pivotInto makes root the new "/" and detaches the old root entirely.
func pivotInto(root string, readOnly bool) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir new root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	// The old root is now stacked on "."; detach it with everything below.
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	if !readOnly {
		return nil
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", 0, &attr); err != nil {
		if !errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("make / read-only: %w", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("make / read-only: %w", err)
		}
	}
	return nil
}

// loopbackUp sets IFF_UP on lo in the holder's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS: %w", err)
	}
	return nil
}

// ExecShimName is the exec shim's file name, installed next to
// sandbox-supervisor.
const ExecShimName = "sandbox-exec-shim"

// ExecShimNextTo returns the exec shim installed next to the supervisor
// binary self, or "" when there is no executable one: commands then start
// through `self nsholder shim` (the Go shim, slower to start), in an image
// root through the host's loader when self is dynamically linked
// (Config.Loader).
func ExecShimNextTo(self string) string {
	p := filepath.Join(filepath.Dir(self), ExecShimName)
	if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() || unix.Access(p, unix.R_OK|unix.X_OK) != nil {
		return ""
	}
	return p
}
