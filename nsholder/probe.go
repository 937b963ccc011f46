package nsholder

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/fuseoverlay"
	"github.com/ephemeral-ai-lab/sandbox/nsholder/shim"
	"golang.org/x/sys/unix"
)

// ProbeResult is what the overlay probe learned.
type ProbeResult struct {
	UserNamespaces bool   `json:"user_namespaces"`
	UserNSReason   string `json:"user_namespaces_reason,omitempty"`
	KernelOverlay  bool   `json:"kernel_overlay"`
	OverlayReason  string `json:"kernel_overlay_reason,omitempty"`
	LowerdirPlus   bool   `json:"lowerdir_plus"`
	// FuseOverlay: the FUSE overlay (package fuseoverlay) mounted in the
	// user namespace over a lower and an upper on the data directory's
	// filesystem, served a lower file and took a create.
	FuseOverlay bool   `json:"fuse_overlay"`
	FuseReason  string `json:"fuse_overlay_reason,omitempty"`
}

// NamespaceAttr is the SysProcAttr that starts a child as root of a new user
// and mount namespace with a single-ID map of the caller (§5.4 "single").
func NamespaceAttr(extra uintptr) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | extra,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
		Pdeathsig:                  syscall.SIGKILL,
	}
}

// Probe runs `self nsholder probe DIR` in a fresh user+mount namespace with a
// scratch directory below scratchParent (the data directory, so the probe
// tests the filesystem sessions will use) and returns its findings.
func Probe(ctx context.Context, self, scratchParent string) ProbeResult {
	dir, err := os.MkdirTemp(scratchParent, ".probe-")
	if err != nil {
		return ProbeResult{UserNSReason: "cannot create probe directory: " + err.Error(), OverlayReason: "probe not run", FuseReason: "probe not run"}
	}
	defer removeAll(dir)
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, "nsholder", "probe", dir)
	cmd.SysProcAttr = NamespaceAttr(0)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		reason := fmt.Sprintf("cannot start a process in a new user namespace: %v", err)
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.ENOSPC) {
			reason += " (unprivileged user namespaces are disabled: check sysctl kernel.unprivileged_userns_clone, user.max_user_namespaces and AppArmor's restrict_unprivileged_userns)"
		}
		if out.Len() == 0 {
			return ProbeResult{UserNSReason: reason, OverlayReason: "no user namespace", FuseReason: "no user namespace"}
		}
	}
	var r ProbeResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		why := "probe child gave no result: " + strings.TrimSpace(errb.String())
		return ProbeResult{UserNamespaces: true, OverlayReason: why, FuseReason: why}
	}
	r.UserNamespaces = true
	return r
}

// removeAll deletes a probe tree. The kernel leaves the overlay's work/work
// directory with mode 000, so directories are opened up first.
func removeAll(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	_ = os.RemoveAll(dir)
}

// runProbeChild is the child side: it is root in its own user and mount
// namespace and tries a real overlay mount with userxattr.
func runProbeChild(dir string) int {
	r := ProbeResult{UserNamespaces: true}
	r.KernelOverlay, r.LowerdirPlus, r.OverlayReason = probeOverlay(dir)
	r.FuseOverlay, r.FuseReason = probeFuse(dir)
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

func probeOverlay(dir string) (ok, lowerPlus bool, reason string) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return false, false, "make / private: " + err.Error()
	}
	d := func(n string) string { return filepath.Join(dir, n) }
	for _, n := range []string{"l1", "l2", "u", "w", "m"} {
		if err := os.Mkdir(d(n), 0o755); err != nil {
			return false, false, err.Error()
		}
	}
	if err := os.WriteFile(filepath.Join(d("l1"), "a"), []byte("a"), 0o644); err != nil {
		return false, false, err.Error()
	}
	if err := os.Mkdir(filepath.Join(d("l2"), "sub"), 0o755); err != nil {
		return false, false, err.Error()
	}
	lowers := []string{d("l1"), d("l2")}
	lowerPlus, err := MountOverlay(d("m"), lowers, d("u"), d("w"))
	if err != nil {
		return false, false, "mount overlay with userxattr: " + err.Error()
	}
	defer unix.Unmount(d("m"), unix.MNT_DETACH)
	// A delete must leave a whiteout in the upper dir and a recreated
	// directory must become opaque: both need unprivileged whiteouts and
	// user.overlay.* xattrs on this filesystem.
	if err := os.Remove(filepath.Join(d("m"), "a")); err != nil {
		return false, lowerPlus, "delete through the overlay: " + err.Error()
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(d("u"), "a"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return false, lowerPlus, "no whiteout in the upper directory after a delete"
	}
	if err := os.Remove(filepath.Join(d("m"), "sub")); err != nil {
		return false, lowerPlus, "rmdir through the overlay: " + err.Error()
	}
	if err := os.Mkdir(filepath.Join(d("m"), "sub"), 0o755); err != nil {
		return false, lowerPlus, "mkdir through the overlay: " + err.Error()
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(d("u"), "sub"), "user.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		return false, lowerPlus, "recreated directory is not marked user.overlay.opaque"
	}
	return true, lowerPlus, ""
}

// probeFuse mounts the FUSE overlay (served by this process) over a lower
// holding one file and an empty upper, reads the lower file through it and
// creates a file, which must land in the upper directory. Bounded by a
// timeout: a FUSE request this process cannot answer would hang it.
func probeFuse(dir string) (ok bool, reason string) {
	type result struct {
		ok     bool
		reason string
	}
	ch := make(chan result, 1)
	go func() {
		ok, reason := probeFuseMount(filepath.Join(dir, "fuse"))
		ch <- result{ok, reason}
	}()
	select {
	case r := <-ch:
		return r.ok, r.reason
	case <-time.After(10 * time.Second):
		return false, "the FUSE overlay probe did not finish within 10s"
	}
}

func probeFuseMount(dir string) (bool, string) {
	d := func(n string) string { return filepath.Join(dir, n) }
	for _, n := range []string{"", "l", "u", "w", "m"} {
		if err := os.Mkdir(d(n), 0o755); err != nil {
			return false, err.Error()
		}
	}
	if err := os.WriteFile(filepath.Join(d("l"), "a"), []byte("lower"), 0o644); err != nil {
		return false, err.Error()
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	open := func(p string) *os.File {
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		files = append(files, f)
		return f
	}
	lower, upper, work := open(d("l")), open(d("u")), open(d("w"))
	if lower == nil || upper == nil || work == nil {
		return false, "cannot open the probe directories"
	}
	if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		return false, "cannot open /dev/fuse: " + err.Error() + " (it must exist with mode 0666)"
	} else {
		f.Close()
	}
	srv, err := fuseoverlay.Mount(context.Background(), d("m"), fuseoverlay.Options{
		Lowers: []*os.File{lower}, Upper: upper, Work: work, Name: "esbx-probe",
	})
	if err != nil {
		return false, "mount the FUSE overlay in a user namespace: " + err.Error()
	}
	defer func() {
		_ = srv.Unmount()
		_ = unix.Unmount(d("m"), unix.MNT_DETACH)
	}()
	b, err := os.ReadFile(filepath.Join(d("m"), "a"))
	if err != nil || string(b) != "lower" {
		return false, fmt.Sprintf("read a lower file through the FUSE overlay: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(d("m"), "b"), []byte("upper"), 0o644); err != nil {
		return false, "create a file through the FUSE overlay: " + err.Error()
	}
	if b, err := os.ReadFile(filepath.Join(d("u"), "b")); err != nil || string(b) != "upper" {
		return false, "a file created through the FUSE overlay is not in the upper directory"
	}
	return true, ""
}

// MountOverlay mounts kernel OverlayFS at target with userxattr and one
// lower per layer (newest first), using the new mount API's lowerdir+ and
// falling back to the lowerdir= option string on kernels without it. It
// reports whether lowerdir+ was used.
func MountOverlay(target string, lowers []string, upper, work string) (lowerdirPlus bool, err error) {
	if err := checkKernelLowers(len(lowers)); err != nil {
		return false, err
	}
	ferr := mountOverlayFsconfig(target, lowers, upper, work)
	if ferr == nil {
		return true, nil
	}
	for _, l := range lowers {
		if strings.ContainsAny(l, ",:\\") {
			return false, fmt.Errorf("new mount API failed (%v) and lower %q cannot be written as an option string", ferr, l)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,userxattr", strings.Join(lowers, ":"), upper, work)
	if merr := unix.Mount("overlay", target, "overlay", 0, opts); merr != nil {
		return false, fmt.Errorf("fsconfig: %v; mount(2): %w", ferr, merr)
	}
	return false, nil
}

func mountOverlayFsconfig(target string, lowers []string, upper, work string) error {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fd)
	for _, l := range lowers {
		if err := unix.FsconfigSetString(fd, "lowerdir+", l); err != nil {
			return fmt.Errorf("fsconfig lowerdir+ %s: %w", l, err)
		}
	}
	if err := unix.FsconfigSetString(fd, "upperdir", upper); err != nil {
		return fmt.Errorf("fsconfig upperdir: %w", err)
	}
	if err := unix.FsconfigSetString(fd, "workdir", work); err != nil {
		return fmt.Errorf("fsconfig workdir: %w", err)
	}
	if err := unix.FsconfigSetFlag(fd, "userxattr"); err != nil {
		return fmt.Errorf("fsconfig userxattr: %w", err)
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("fsconfig create: %w", err)
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fsmount: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// Main runs the nsholder mode with its arguments (after "nsholder").
func Main(args []string) int {
	switch {
	case len(args) == 2 && args[0] == "probe":
		return runProbeChild(args[1])
	case len(args) == 1 && args[0] == "serve":
		return runServe()
	case len(args) == 2 && args[0] == "rmtree":
		return runRemoveTree(args[1])
	case len(args) >= 1 && args[0] == "shim":
		return shim.Run(args[1:]) // fallback when sandbox-exec-shim is not installed
	}
	fmt.Fprintln(os.Stderr, "nsholder: internal mode; usage: sandbox-supervisor nsholder probe DIR | serve | rmtree DIR | shim -- ARGV...")
	return 2
}
