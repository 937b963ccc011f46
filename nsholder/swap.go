package nsholder

// Lower-chain swap of a live session (§8.6 remount sweep; issue 19): the
// supervisor opens the new chain's layer directories (host paths are gone
// inside the holder after pivot_root) and sends them as descriptors with a
// swaplower request.
//
//   - fuse: the holder's own overlay swaps in place (fuseoverlay
//     SwapLower); nothing of the session stops, open files keep reading
//     what they opened, and the old layer descriptors are closed at once.
//   - kernel: a new OverlayFS over the new lowers, the same upper and a
//     fresh work directory is mounted beneath the current /workspace
//     (move_mount MOVE_MOUNT_BENEATH, Linux ≥ 6.5) and the old one is
//     detached from above it, so a path lookup sees the old or the new
//     overlay, never neither. Two overlays over one upper are "undefined
//     behaviour" for the kernel whenever both are used: a process still in
//     the old one sees stale lowers, misses what the new one writes and can
//     fail or clobber copy-ups. So the session is frozen first (SIGSTOP of
//     every session process, bounded by SwapRequest.FreezeBudget), and any process
//     whose cwd, root, open descriptor or mapping is in the old overlay
//     makes the swap fail with *PinnedError naming it; nothing changes then.
//     A caller that froze the session (Freeze) keeps it frozen across the
//     swap.
//   - with SwapRequest.Upper, the session's replaced upper comes along in
//     the same swap (see the package doc).
//     See /work/briefs/swap-findings.md and the package doc.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/fuseoverlay"
)

// SwapRequest moves a live session onto another lower chain.
type SwapRequest struct {
	// Lowers are host paths of the new chain's layer directories, newest
	// first; the client opens them and passes descriptors. (The kernel
	// driver's new overlay gets a fresh work directory that the holder
	// makes inside Config.Work: overlayfs wants upper and work on one
	// mount, and only the holder's own descriptors of the two are.)
	Lowers []string
	// Upper, when set, is the host path of the session's upper directory
	// (Config.Upper) after its directory was replaced there (a sync or a
	// publish with keep renamed a new one into place): the session moves
	// onto it with the new lowers in the same swap. The client opens it
	// and sends its descriptor; the kernel driver opens the upper again by
	// name and refuses (fs.ErrInvalid) unless it is that directory. Any
	// other path is fs.ErrInvalid. "" keeps the upper the session has.
	Upper string
	// FreezeBudget bounds how long the kernel driver waits for the
	// session's processes to stop (runtime.layerstack.freeze_budget_s);
	// 0 means 0.5 s.
	FreezeBudget time.Duration
}

// swapHeader is the wire form: the frame's descriptors are the Lowers
// layer directories; Paths are their host paths (the kernel driver opens
// them again through its own clone of their directory, see kernelSwap).
type swapHeader struct {
	Lowers   int      `json:"lowers"`
	Paths    []string `json:"paths,omitempty"`
	FreezeMS int64    `json:"freeze_ms,omitempty"`
	// Upper: one more descriptor follows the lowers, the new upper.
	Upper bool `json:"upper,omitempty"`
}

// Lower swap failures, matched with errors.Is.
var (
	// ErrSwapUnsupported: this driver or kernel cannot swap a live
	// session's lowers; the error says why.
	ErrSwapUnsupported = &opError{"lower swap unsupported"}
	// ErrSwapPinned: a session process uses the old kernel overlay (see
	// PinnedError).
	ErrSwapPinned = &opError{"workspace pinned by a session process"}
	// ErrFreezeTimeout: the session's processes did not all stop within
	// the freeze budget.
	ErrFreezeTimeout = &opError{"freeze timeout"}
	// ErrTooManyLowers: a kernel overlay over more lowers than the kernel
	// stacks (KernelMaxLowers); the remedy is a squash, not another kernel.
	ErrTooManyLowers = &opError{"layer chain too deep for the kernel overlay"}
	// ErrSwapInvalidate: a FUSE swap happened but the kernel refused a
	// cache invalidation (stale caches for at most their timeout). It is
	// fuseoverlay's error, named here so callers need not import the
	// overlay to recognise it.
	ErrSwapInvalidate = fuseoverlay.ErrSwapInvalidate
)

// KernelMaxLowers is the kernel overlay's stacking limit (OVL_MAX_STACK,
// 500 since Linux 2.6.39's overlayfs and unchanged since): a mount over
// more lowers fails with a bare EINVAL, which must not be reported as a
// kernel feature missing (issue 36).
const KernelMaxLowers = 500

// checkKernelLowers refuses n lowers beyond KernelMaxLowers, naming the
// limit and the cure.
func checkKernelLowers(n int) error {
	if n > KernelMaxLowers {
		return fmt.Errorf("%w: %d lower layers, the kernel overlay stacks at most %d; squash the layer stack (squash_layerstacks)", ErrTooManyLowers, n, KernelMaxLowers)
	}
	return nil
}

// Pin is one use of the old kernel overlay that blocks a swap.
type Pin struct {
	Pid     int    `json:"pid"`               // in the session's PID namespace
	Command uint64 `json:"command,omitempty"` // the holder's command ID, 0 when not one of them
	Owner   string `json:"owner,omitempty"`   // SpawnRequest.Owner of that command
	Kind    string `json:"kind"`              // "cwd", "root", "fd", "mapping", or "unreadable" (/proc refused)
	Path    string `json:"path"`              // as the session sees it
}

// PinnedError lists the processes that keep the old overlay in use; it
// matches ErrSwapPinned.
type PinnedError struct{ Pins []Pin }

func (e *PinnedError) Error() string {
	var b strings.Builder
	b.WriteString("lower swap refused: /workspace is in use by")
	for i, p := range e.Pins {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " pid %d", p.Pid)
		if p.Owner != "" {
			fmt.Fprintf(&b, " (command %s)", p.Owner)
		} else if p.Command != 0 {
			fmt.Fprintf(&b, " (command %d)", p.Command)
		}
		fmt.Fprintf(&b, " %s %s", p.Kind, p.Path)
	}
	return b.String()
}

func (e *PinnedError) Is(target error) bool { return target == ErrSwapPinned }

// swapFreezeBudget is the default of SwapRequest.FreezeBudget.
const swapFreezeBudget = 500 * time.Millisecond

// moveMountBeneath is MOVE_MOUNT_BENEATH (Linux 6.5), not in x/sys yet.
const moveMountBeneath = 0x200

func (c *Client) SwapLower(ctx context.Context, req SwapRequest) error {
	if len(req.Lowers) == 0 {
		return fmt.Errorf("holder swaplower: %w: no lower layers", fs.ErrInvalid)
	}
	if req.Upper != "" && filepath.Clean(req.Upper) != c.upper {
		return fmt.Errorf("holder swaplower: %w: upper %s is not the session's upper %s", fs.ErrInvalid, req.Upper, c.upper)
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	fds := make([]int, 0, len(req.Lowers))
	for _, p := range req.Lowers {
		f, err := os.OpenFile(p, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("holder swaplower: open layer: %w", err)
		}
		files = append(files, f)
		fds = append(fds, int(f.Fd()))
	}
	if req.Upper != "" {
		f, err := os.OpenFile(req.Upper, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("holder swaplower: open upper: %w", err)
		}
		files = append(files, f)
		fds = append(fds, int(f.Fd()))
	}
	hdr := &ctlHeader{Op: opSwap, Swap: &swapHeader{Lowers: len(req.Lowers), Paths: req.Lowers, FreezeMS: req.FreezeBudget.Milliseconds(), Upper: req.Upper != ""}}
	_, err := c.doFDs(ctx, hdr, nil, fds)
	return err
}

// swapLower serves a swaplower request; it owns fds.
func (s *server) swapLower(req *swapHeader, fds []int) error {
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "layer")
	}
	keep := 0 // files[:keep] are handed over to the overlay
	defer func() {
		for _, f := range files[keep:] {
			f.Close()
		}
	}()
	want := 0
	if req != nil {
		want = req.Lowers
		if req.Upper {
			want++
		}
	}
	if req == nil || req.Lowers <= 0 || len(files) != want {
		return fmt.Errorf("swaplower: %w: descriptors do not match the request", fs.ErrInvalid)
	}
	lowers := files[:req.Lowers]
	var upper *os.File
	if req.Upper {
		upper = files[req.Lowers]
	}
	// No command starts and no file operation runs while the chain changes.
	s.gate.Lock()
	defer s.gate.Unlock()
	s.wsMu.Lock()
	defer s.wsMu.Unlock()
	if s.stopping {
		return errors.New("swaplower: holder is shutting down")
	}
	if fm := s.root.fuse; fm != nil {
		if upper != nil {
			own, err := fm.ownMount(upper)
			if err != nil {
				return fmt.Errorf("swaplower: %w", err)
			}
			if own != upper {
				upper.Close()
				files[req.Lowers], upper = own, own
			}
		}
		if err := fm.swap(upper, lowers); err != nil {
			var wh *fuseoverlay.WriteHandlesError
			if errors.As(err, &wh) {
				return s.writerPins(wh)
			}
			if !errors.Is(err, fuseoverlay.ErrSwapInvalidate) {
				return err
			}
			keep = len(files)
			s.root.chain.set(req.Paths, upper)
			return err
		}
		keep = len(files)
		s.root.chain.set(req.Paths, upper)
		return nil
	}
	budget := time.Duration(req.FreezeMS) * time.Millisecond
	if budget <= 0 {
		budget = swapFreezeBudget
	}
	if err := s.swapKernel(lowers, req.Paths, upper, budget); err != nil {
		return err
	}
	s.root.chain.set(req.Paths, upper)
	return nil
}

// writerPins turns the FUSE overlay's refusal of an upper swap into the
// PinnedError a kernel swap gives: Kind "fd" per handle open for writing,
// with the process that has it open where /proc shows one (a handle kept
// only by a mapping, or released by a process that is gone, has pid 0).
func (s *server) writerPins(wh *fuseoverlay.WriteHandlesError) error {
	ws, _ := mountID("/workspace")
	held := map[string]Pin{}
	for _, p := range listProcs() {
		dir := "/proc/" + strconv.Itoa(p.pid)
		ents, err := os.ReadDir(dir + "/fdinfo")
		if err != nil {
			continue
		}
		for _, e := range ents {
			b, err := os.ReadFile(dir + "/fdinfo/" + e.Name())
			if err != nil {
				continue
			}
			var mnt, flags uint64
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "mnt_id:"); ok {
					mnt, _ = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				}
				if v, ok := strings.CutPrefix(line, "flags:"); ok {
					flags, _ = strconv.ParseUint(strings.TrimSpace(v), 8, 64)
				}
			}
			if mnt != ws || flags&unix.O_ACCMODE == unix.O_RDONLY {
				continue
			}
			target, _ := os.Readlink(dir + "/fd/" + e.Name())
			if _, dup := held[target]; !dup {
				held[target] = Pin{Pid: p.pid, Kind: "fd", Path: target}
			}
		}
	}
	pe := &PinnedError{}
	for _, h := range wh.Handles {
		path := "/workspace/" + h.Path
		pin, ok := held[path]
		if !ok {
			pin = Pin{Kind: "fd", Path: path}
		}
		pin.Owner = h.Command
		s.mu.Lock()
		for _, c := range s.running {
			if c.owner == h.Command && h.Command != "" {
				pin.Command = c.id
			}
		}
		s.mu.Unlock()
		pe.Pins = append(pe.Pins, pin)
	}
	return pe
}

// swapKernel mounts the new overlay beneath /workspace and detaches the
// old one, with every session process stopped and none of them in the old
// overlay. upper, when not nil, is the descriptor the supervisor sent of
// the session's (replaced) upper; the directory at the upper's name must
// be it. Without one it must still be the upper the session has.
func (s *server) swapKernel(lowers []*os.File, paths []string, upper *os.File, budget time.Duration) error {
	ks := s.root.kswap
	if ks == nil || ks.why != "" {
		why := "no kernel overlay"
		if ks != nil {
			why = ks.why
		}
		return fmt.Errorf("swaplower: %w: %s", ErrSwapUnsupported, why)
	}
	if len(paths) != len(lowers) {
		return fmt.Errorf("swaplower: %w: %d paths for %d layers", fs.ErrInvalid, len(paths), len(lowers))
	}
	var lowerPaths []string
	for i, p := range paths {
		lp, err := ks.layerPath(p, lowers[i])
		if err != nil {
			return fmt.Errorf("swaplower: %w", err)
		}
		lowerPaths = append(lowerPaths, lp)
	}
	var named unix.Stat_t
	if err := unix.Fstatat(int(ks.tree.Fd()), ks.upper, &named, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("swaplower: upper: %w", err)
	}
	wantDev, wantIno := s.root.chain.UpperDev, s.root.chain.UpperIno
	if upper != nil {
		var st unix.Stat_t
		if err := unix.Fstat(int(upper.Fd()), &st); err != nil {
			return fmt.Errorf("swaplower: stat the upper sent: %w", err)
		}
		wantDev, wantIno = st.Dev, st.Ino
	}
	if named.Dev != wantDev || named.Ino != wantIno || named.Mode&unix.S_IFMT != unix.S_IFDIR {
		if upper != nil {
			return fmt.Errorf("swaplower: %w: the directory at the session's upper is not the one that was sent", fs.ErrInvalid)
		}
		return fmt.Errorf("swaplower: %w: the session's upper was replaced; the swap must name it (SwapRequest.Upper)", fs.ErrInvalid)
	}
	oldMnt, err := mountID("/workspace")
	if err != nil {
		return fmt.Errorf("swaplower: %w", err)
	}
	// Frozen by the caller (Freeze): stop what runs again (a command
	// spawned since) and leave everything stopped for its Thaw.
	release, err := s.freezeForSwap(budget)
	defer release()
	if err != nil {
		return fmt.Errorf("swaplower: %w", err)
	}
	if pins := s.pins(oldMnt); len(pins) > 0 {
		return &PinnedError{Pins: pins}
	}
	// A fresh work directory: the old overlay keeps using its own until it
	// is gone (a work directory below one in use is allowed with index=off,
	// the default, as the mount of two overlays over one upper is).
	work := ks.work + "/swap-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := unix.Mkdirat(int(ks.tree.Fd()), work, 0o700); err != nil {
		return fmt.Errorf("swaplower: make a work directory: %w", err)
	}
	mfd, err := newOverlayFD(lowerPaths, ks.path(ks.tree, ks.upper), ks.path(ks.tree, work))
	if err != nil {
		if errors.Is(err, ErrTooManyLowers) {
			return fmt.Errorf("swaplower: %w", err)
		}
		if errors.Is(err, unix.EINVAL) {
			// Typically "failed to clone upperpath/lowerpath" in dmesg:
			// overlayfs takes layers on detached trees from Linux 6.15.
			return fmt.Errorf("swaplower: %w: the kernel refused an overlay over the holder's detached clones (%v; it needs Linux 6.15, dmesg names the reason)", ErrSwapUnsupported, err)
		}
		return fmt.Errorf("swaplower: mount the new overlay: %w", err)
	}
	defer unix.Close(mfd)
	// The overlay took the upper by name: make sure that was still the
	// directory checked above (nothing renames it while the supervisor
	// holds the session, but a mismatch must not go unnoticed).
	var mounted unix.Stat_t
	if err := unix.Fstatat(int(ks.tree.Fd()), ks.upper, &mounted, unix.AT_SYMLINK_NOFOLLOW); err != nil || mounted.Dev != wantDev || mounted.Ino != wantIno {
		return fmt.Errorf("swaplower: %w: the session's upper changed during the swap", fs.ErrInvalid)
	}
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, "/workspace", unix.MOVE_MOUNT_F_EMPTY_PATH|moveMountBeneath); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("swaplower: %w: move_mount(MOVE_MOUNT_BENEATH) refused (%v): it needs Linux 6.5", ErrSwapUnsupported, err)
		}
		return fmt.Errorf("swaplower: mount the new overlay beneath /workspace: %w", err)
	}
	// From here the new overlay is in place below the old one; detaching
	// the old one reveals it. The holder's own /workspace descriptor is the
	// only user left of the old overlay, and it is replaced.
	if err := unix.Unmount("/workspace", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("swaplower: detach the old overlay: %w", err)
	}
	ws, err := os.OpenFile("/workspace", os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("swaplower: open the new /workspace: %w", err)
	}
	s.root.workspace.Close()
	s.root.workspace = ws
	return nil
}

// newOverlayFD creates a detached kernel overlay (userxattr), lowerdir+ per
// layer or the option-string fallback, and returns its mount descriptor.
func newOverlayFD(lowers []string, upper, work string) (int, error) {
	if err := checkKernelLowers(len(lowers)); err != nil {
		return -1, err
	}
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fd)
	set := func() error {
		for _, l := range lowers {
			if err := unix.FsconfigSetString(fd, "lowerdir+", l); err != nil {
				return fmt.Errorf("fsconfig lowerdir+: %w", err)
			}
		}
		return nil
	}
	if err := set(); err != nil {
		// Kernels before 6.7: one option string (the /proc/self/fd paths
		// hold no separators).
		if err2 := unix.FsconfigSetString(fd, "lowerdir", strings.Join(lowers, ":")); err2 != nil {
			return -1, fmt.Errorf("%v; fsconfig lowerdir: %w", err, err2)
		}
	}
	if err := unix.FsconfigSetString(fd, "upperdir", upper); err != nil {
		return -1, fmt.Errorf("fsconfig upperdir: %w", err)
	}
	if err := unix.FsconfigSetString(fd, "workdir", work); err != nil {
		return -1, fmt.Errorf("fsconfig workdir: %w", err)
	}
	if err := unix.FsconfigSetFlag(fd, "userxattr"); err != nil {
		return -1, fmt.Errorf("fsconfig userxattr: %w", err)
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return -1, fmt.Errorf("fsconfig create: %w", err)
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("fsmount: %w", err)
	}
	return mfd, nil
}

// mountID is the mount ID of the mount p is on (following a final link,
// so /proc/<pid>/cwd names the process's cwd).
func mountID(p string) (uint64, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, 0, unix.STATX_MNT_ID, &stx); err != nil {
		return 0, fmt.Errorf("statx %s: %w", p, err)
	}
	return stx.Mnt_id, nil
}

// freezeSession stops every session process (all but the holder) with
// SIGSTOP and waits until each is stopped or gone; it returns the ones it
// stopped (those already stopped stay so after the thaw). Processes forked
// meanwhile are caught by the repeated sweep.
func freezeSession(budget time.Duration) ([]int, error) {
	var stopped []int
	mine := map[int]bool{}
	before := map[int]bool{}
	for _, p := range listProcs() {
		if st := procState(p.pid); st == 'T' || st == 't' {
			before[p.pid] = true
		}
	}
	deadline := time.Now().Add(budget)
	for {
		running := 0
		for _, p := range listProcs() {
			switch procState(p.pid) {
			case 'T', 't', 'Z', 'X', 0:
				continue
			}
			running++
			if !mine[p.pid] && !before[p.pid] {
				mine[p.pid] = true
				stopped = append(stopped, p.pid)
			}
			_ = unix.Kill(p.pid, unix.SIGSTOP)
		}
		if running == 0 {
			return stopped, nil
		}
		if time.Now().After(deadline) {
			return stopped, fmt.Errorf("%w: %d session processes did not stop within %v", ErrFreezeTimeout, running, budget)
		}
		time.Sleep(time.Millisecond)
	}
}

func thaw(pids []int) {
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGCONT)
	}
}

// procState is the state letter of /proc/<pid>/stat, 0 when gone.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// pins lists every use of the mount oldMnt by a session process: cwd,
// root, open descriptors (fdinfo's mnt_id) and file mappings below
// /workspace (maps shows the overlay's path).
func (s *server) pins(oldMnt uint64) []Pin {
	var pins []Pin
	for _, p := range listProcs() {
		dir := "/proc/" + strconv.Itoa(p.pid)
		add := func(kind, path string) {
			pin := Pin{Pid: p.pid, Kind: kind, Path: path}
			s.mu.Lock()
			for _, c := range s.running {
				if c.pid == p.session || c.pid == p.pgrp || c.pid == p.pid {
					pin.Command, pin.Owner = c.id, c.owner
				}
			}
			s.mu.Unlock()
			pins = append(pins, pin)
		}
		for _, k := range []string{"cwd", "root"} {
			id, err := mountID(dir + "/" + k)
			switch {
			case err == nil && id == oldMnt:
				target, _ := os.Readlink(dir + "/" + k)
				add(k, target)
			case err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ESRCH):
				// A process the holder cannot inspect might be anywhere:
				// it blocks the swap rather than risk the upper.
				add("unreadable", err.Error())
			}
		}
		if ents, err := os.ReadDir(dir + "/fdinfo"); err != nil && errors.Is(err, fs.ErrPermission) {
			add("unreadable", err.Error())
		} else if err == nil {
			for _, e := range ents {
				b, err := os.ReadFile(dir + "/fdinfo/" + e.Name())
				if err != nil {
					continue
				}
				for _, line := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(line, "mnt_id:"); ok {
						if id, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64); id == oldMnt {
							target, _ := os.Readlink(dir + "/fd/" + e.Name())
							add("fd", target)
						}
					}
				}
			}
		}
		if b, err := os.ReadFile(dir + "/maps"); err == nil {
			seen := map[string]bool{}
			for _, line := range strings.Split(string(b), "\n") {
				f := strings.Fields(line)
				if len(f) < 6 {
					continue
				}
				path := strings.Join(f[5:], " ")
				if (path == "/workspace" || strings.HasPrefix(path, "/workspace/")) && !seen[path] {
					seen[path] = true
					add("mapping", path)
				}
			}
		}
	}
	sort.Slice(pins, func(i, j int) bool {
		if pins[i].Pid != pins[j].Pid {
			return pins[i].Pid < pins[j].Pid
		}
		return pins[i].Kind < pins[j].Kind
	})
	return pins
}

// kernelSwap holds what the kernel driver's swap needs after pivot_root.
// OverlayFS clones every layer's mount (clone_private_mount), which it
// allows only for mounts of the caller's mount namespace or of a detached
// tree the caller made (Linux 6.15); the holder's view of the host's mounts
// is gone after the pivot, and the supervisor's mounts belong to another
// namespace. So before the pivot the holder clones (open_tree
// OPEN_TREE_CLONE) the directory holding the upper and work directories,
// and the directory holding the layers (read-only), and keeps both
// detached trees, reachable only through its own descriptors.
type kernelSwap struct {
	tree        *os.File // detached clone of the directory holding upper and work
	upper, work string   // their names in it
	layers      *os.File // detached, read-only clone of the layers' directory
	layersDir   string   // its host path
	why         string   // why a swap cannot work here ("" when it can)
}

func openKernelSwap(cfg *Config) *kernelSwap {
	ks := &kernelSwap{}
	dir := filepath.Dir(cfg.Upper)
	if filepath.Dir(cfg.Work) != dir {
		ks.why = "the upper and work directories are not in one directory"
		return ks
	}
	ks.upper, ks.work = filepath.Base(cfg.Upper), filepath.Base(cfg.Work)
	ks.layersDir = filepath.Dir(cfg.Lowers[0])
	for _, l := range cfg.Lowers {
		if filepath.Dir(l) != ks.layersDir {
			ks.why = "the layers are not in one directory"
			return ks
		}
	}
	var err error
	if ks.tree, err = openTree(dir, false); err != nil {
		ks.why = err.Error()
		return ks
	}
	if ks.layers, err = openTree(ks.layersDir, true); err != nil {
		ks.why = err.Error()
	}
	return ks
}

// openTree clones the mount at dir into a detached tree (read-only when
// asked) and returns its descriptor.
func openTree(dir string, readOnly bool) (*os.File, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("open_tree(OPEN_TREE_CLONE) %s: %w", dir, err)
	}
	if readOnly {
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("make the clone of %s read-only: %w", dir, err)
		}
	}
	return os.NewFile(uintptr(fd), dir), nil
}

func (ks *kernelSwap) path(tree *os.File, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(int(tree.Fd())) + "/" + name
}

// layerPath is the path of the layer at host path p through the holder's
// clone of the layers' directory; it must be the directory f (the
// descriptor the supervisor sent), not just a name that matches.
func (ks *kernelSwap) layerPath(p string, f *os.File) (string, error) {
	name := filepath.Base(p)
	if filepath.Dir(p) != ks.layersDir || name == "." || name == ".." {
		return "", fmt.Errorf("%w: layer %s is not in %s, the directory of the session's layers", ErrSwapUnsupported, p, ks.layersDir)
	}
	var a, b unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &a); err != nil {
		return "", fmt.Errorf("stat layer %s: %w", p, err)
	}
	if err := unix.Fstatat(int(ks.layers.Fd()), name, &b, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return "", fmt.Errorf("layer %s: %w", p, err)
	}
	if a.Dev != b.Dev || a.Ino != b.Ino || b.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", fmt.Errorf("%w: layer %s is not the directory that was sent", fs.ErrInvalid, p)
	}
	return ks.path(ks.layers, name), nil
}

func (ks *kernelSwap) close() {
	if ks == nil {
		return
	}
	for _, f := range []*os.File{ks.tree, ks.layers} {
		if f != nil {
			f.Close()
		}
	}
}
