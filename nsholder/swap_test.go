package nsholder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// spawnIn is session.spawn with a working directory and an owner.
func (s *session) spawnIn(dir, owner, cmd string) *cmdRun {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := s.h.Spawn(ctx, SpawnRequest{Cmd: cmd, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TERM=dumb"},
		Dir: dir, Owner: owner})
	if err != nil {
		s.t.Fatalf("Spawn %q: %v", cmd, err)
	}
	r := &cmdRun{p: p, events: make(chan Event, 16), outDone: make(chan struct{})}
	s.mu.Lock()
	s.chans[p.ID] = r.events
	for _, e := range s.early[p.ID] {
		r.events <- e
	}
	delete(s.early, p.ID)
	s.mu.Unlock()
	go func() {
		defer close(r.outDone)
		_, _ = io.Copy(&r.out, p.PTY)
	}()
	return r
}

// waitFile waits until p exists (a command's signal that it is ready).
func waitFile(t *testing.T, p string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Lstat(p); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear", p)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSwapLowerHolder drives a real holder of each driver through lower
// swaps: a command running across the swap (cwd outside /workspace) goes
// on and then sees the new chain, new commands and the holder's own file
// operations see it, the upper's files stay. The fuse driver swaps under a
// command whose cwd and an open file are in /workspace (the file keeps its
// old content); the kernel driver refuses that, naming the command, and
// changes nothing, until the command is gone.
func TestSwapLowerHolder(t *testing.T) {
	for _, driver := range []string{OverlayKernel, OverlayFuse} {
		t.Run(driver, func(t *testing.T) {
			f := newFixture(t)
			cfg := f.config("sess-swap-" + driver)
			cfg.Overlay = driver
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if driver == OverlayFuse {
				if _, err := os.Stat("/dev/fuse"); err != nil {
					t.Skipf("no FUSE here: %v", err)
				}
			}
			s := startSession(t, cfg)
			s.ok("echo mine > mine.txt")
			head := filepath.Join(f.dir, "head")
			must(t, os.MkdirAll(filepath.Join(head, "sub"), 0o755))
			must(t, os.WriteFile(filepath.Join(head, "hello.txt"), []byte("hello from head\n"), 0o644))
			must(t, os.WriteFile(filepath.Join(head, "sub", "b"), []byte("b\n"), 0o644))
			chain := []string{head, f.lower, f.lower2}

			// Runs across the swap, cwd "/": waits for "go", then reads.
			across := s.spawnIn("/", "cmd-across", "touch /workspace/across-ready; while [ ! -e /workspace/go ]; do sleep 0.02; done; cat /workspace/hello.txt")
			waitFile(t, filepath.Join(f.upper, "across-ready"))

			var inside *cmdRun
			switch driver {
			case OverlayKernel:
				pin := s.spawnIn("/workspace", "cmd-pin", "touch pin-ready; exec sleep 60")
				waitFile(t, filepath.Join(f.upper, "pin-ready"))
				err := s.h.SwapLower(ctx, SwapRequest{Lowers: chain})
				var pe *PinnedError
				if !errors.Is(err, ErrSwapPinned) || !errors.As(err, &pe) {
					t.Fatalf("swap with a cwd in /workspace: %v, want a PinnedError", err)
				}
				found := false
				for _, p := range pe.Pins {
					if p.Pid == pin.p.Pid && p.Kind == "cwd" && p.Owner == "cmd-pin" && p.Path == "/workspace" {
						found = true
					}
				}
				if !found || !strings.Contains(err.Error(), "cmd-pin") {
					t.Errorf("pins %+v (%v) do not name cmd-pin's cwd", pe.Pins, err)
				}
				if got := s.ok("cat hello.txt"); got != "hello from lower" {
					t.Fatalf("after a refused swap: %q", got)
				}
				must(t, s.h.Signal(ctx, pin.p.ID, 9))
				pin.wait(t, 20*time.Second)
				// An open descriptor pins as well.
				fdPin := s.spawnIn("/", "cmd-fd", "exec 3</workspace/hello.txt; touch /workspace/fd-ready; exec sleep 60")
				waitFile(t, filepath.Join(f.upper, "fd-ready"))
				err = s.h.SwapLower(ctx, SwapRequest{Lowers: chain})
				if !errors.As(err, &pe) || len(pe.Pins) == 0 || pe.Pins[0].Kind != "fd" || pe.Pins[0].Path != "/workspace/hello.txt" {
					t.Fatalf("swap with a descriptor in /workspace: %v", err)
				}
				must(t, s.h.Signal(ctx, fdPin.p.ID, 9))
				fdPin.wait(t, 20*time.Second)
			case OverlayFuse:
				inside = s.spawnIn("/workspace/sub", "cmd-inside", "exec 3<../hello.txt; touch ../inside-ready; while [ ! -e ../go ]; do sleep 0.02; done; cat <&3; ls -1")
				waitFile(t, filepath.Join(f.upper, "inside-ready"))
			}

			before, err := s.h.Chain(ctx)
			must(t, err)
			if err := s.h.SwapLower(ctx, SwapRequest{Lowers: chain}); err != nil {
				t.Fatalf("SwapLower: %v", err)
			}
			// Chain reports the new lowers and the same upper.
			if ci, err := s.h.Chain(ctx); err != nil || strings.Join(ci.Lowers, ",") != strings.Join(chain, ",") ||
				ci.UpperDev != before.UpperDev || ci.UpperIno != before.UpperIno {
				t.Errorf("Chain after a lower swap: %+v %v, want %v over the upper of %+v", ci, err, chain, before)
			}
			if _, err := s.h.WriteFile(ctx, "go", nil, nil); err != nil {
				t.Fatal(err)
			}
			if out := strings.TrimSpace(across.wait(t, 20*time.Second)); out != "hello from head" || across.status.ExitStatus() != 0 {
				t.Errorf("command across the swap: %q, exit %d", out, across.status.ExitStatus())
			}
			if inside != nil {
				out := strings.ReplaceAll(strings.TrimSpace(inside.wait(t, 20*time.Second)), "\r", "")
				if want := "hello from lower\na\nb"; out != want {
					t.Errorf("command inside /workspace across the swap: %q, want %q", out, want)
				}
			}
			if got := s.ok("cat hello.txt mine.txt; ls -1 sub"); got != "hello from head\nmine\na\nb" {
				t.Errorf("a new command after the swap: %q", got)
			}
			data, _, err := s.h.ReadFile(ctx, "sub/b", 1<<20)
			if err != nil || string(data) != "b\n" {
				t.Errorf("holder ReadFile after the swap: %q %v", data, err)
			}
			s.ok("echo more >> sub/b")
			if b, err := os.ReadFile(filepath.Join(f.upper, "sub", "b")); err != nil || string(b) != "b\nmore\n" {
				t.Errorf("upper sub/b after a write: %q %v", b, err)
			}
		})
	}
}

// TestSwapLowerBadRequest: no layers, or a layer that is not a directory,
// fails on the client side; the session is unchanged.
func TestSwapLowerBadRequest(t *testing.T) {
	f := newFixture(t)
	s := startSession(t, f.config("sess-swap-bad"))
	ctx := context.Background()
	if err := s.h.SwapLower(ctx, SwapRequest{}); err == nil {
		t.Error("a swap without layers succeeded")
	}
	file := filepath.Join(f.dir, "file")
	must(t, os.WriteFile(file, nil, 0o644))
	if err := s.h.SwapLower(ctx, SwapRequest{Lowers: []string{file}}); err == nil {
		t.Error("a swap onto a file succeeded")
	}
	if got := s.ok("cat hello.txt"); got != "hello from lower" {
		t.Errorf("after refused swaps: %q", got)
	}
}

// oldViewEnv makes the test binary run oldViewChild (in a new user and
// mount namespace) and exit.
const oldViewEnv = "NSHOLDER_TEST_OLD_VIEW"

func init() {
	if dir := os.Getenv(oldViewEnv); dir != "" {
		os.Exit(oldViewChild(dir))
	}
}

// oldViewChild mounts a kernel overlay at dir/ws, keeps a cwd-like
// directory descriptor and an open file in it, mounts a second overlay
// over the same upper (newer lowers, fresh work directory) beneath it and
// detaches the first: the swap the holder does. It prints what each view
// shows, one "key=value" per line.
func oldViewChild(dir string) int {
	p := func(n string) string { return filepath.Join(dir, n) }
	out := func(k, v string) { fmt.Printf("%s=%s\n", k, v) }
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 1 }
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fail(err)
	}
	for _, n := range []string{"l1/sub", "l2", "u", "w/w1", "w/w2", "ws"} {
		if err := os.MkdirAll(p(n), 0o755); err != nil {
			return fail(err)
		}
	}
	for n, c := range map[string]string{"l1/a": "old", "l1/b": "lower-b", "l2/a": "new"} {
		if err := os.WriteFile(p(n), []byte(c), 0o644); err != nil {
			return fail(err)
		}
	}
	if _, err := MountOverlay(p("ws"), []string{p("l1")}, p("u"), p("w/w1")); err != nil {
		return fail(err)
	}
	cwd, err := unix.Open(p("ws/sub"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fail(err)
	}
	opened, err := os.Open(p("ws/a"))
	if err != nil {
		return fail(err)
	}
	var st unix.Stat_t
	_ = unix.Fstatat(cwd, "../b", &st, 0) // cache b in the old view
	mfd, err := newOverlayFD([]string{p("l2"), p("l1")}, p("u"), p("w/w2"))
	if err != nil {
		return fail(fmt.Errorf("second overlay over the same upper: %w", err))
	}
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, p("ws"), unix.MOVE_MOUNT_F_EMPTY_PATH|moveMountBeneath); err != nil {
		return fail(fmt.Errorf("move_mount beneath: %w", err))
	}
	if err := unix.Unmount(p("ws"), unix.MNT_DETACH); err != nil {
		return fail(err)
	}
	b, _ := os.ReadFile(p("ws/a"))
	out("new_path_a", string(b))
	b, _ = io.ReadAll(opened)
	out("opened_before_a", string(b))
	readAtOld := func(name string) string {
		fd, err := unix.Openat(cwd, name, unix.O_RDONLY, 0)
		if err != nil {
			return "error:" + err.Error()
		}
		defer unix.Close(fd)
		f := os.NewFile(uintptr(fd), name)
		b, _ := io.ReadAll(f)
		return string(b)
	}
	out("old_cwd_a", readAtOld("../a"))
	_ = os.WriteFile(p("ws/sub/fromnew"), []byte("x"), 0o644)
	out("old_cwd_sees_new_create", fmt.Sprint(unix.Fstatat(cwd, "fromnew", &st, 0) == nil))
	_ = os.WriteFile(p("ws/b"), []byte("new-view"), 0o644)
	if fd, err := unix.Openat(cwd, "../b", unix.O_WRONLY|unix.O_APPEND, 0); err != nil {
		out("old_cwd_write_b", "error:"+err.Error())
	} else {
		_, werr := unix.Write(fd, []byte("+old-view"))
		unix.Close(fd)
		out("old_cwd_write_b", fmt.Sprint(werr))
	}
	b, _ = os.ReadFile(p("u/b"))
	out("upper_b", string(b))
	return 0
}

// TestSwapKernelOldView is the finding behind the kernel swap's pin check
// (swap-findings.md): two overlays over one upper coexist (index=off) and
// a new one can replace the old at /workspace with MOVE_MOUNT_BENEATH, on
// this kernel, rootless. New lookups see the new chain and a file opened
// before keeps its content, but a process left in the old overlay (a cwd)
// resolves names in the old chain and the kernel calls using both
// "undefined": the old view misses the new view's writes, and its own
// writes fail or race the new view's copy-ups. The holder therefore
// refuses the swap while anything is in the old overlay.
func TestSwapKernelOldView(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { openUp(dir) })
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), oldViewEnv+"="+dir)
	cmd.SysProcAttr = NamespaceAttr(0)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("old-view child: %v: %s", err, stderr.String())
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(outb)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		got[k] = v
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	t.Logf("kernel %s: %v", unix.ByteSliceToString(uts.Release[:]), got)
	for k, want := range map[string]string{"new_path_a": "new", "opened_before_a": "old", "old_cwd_a": "old"} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	if got["old_cwd_sees_new_create"] != "false" {
		t.Logf("this kernel keeps the old view coherent with the new one's creates; the pin check is still needed for copy-ups")
	}
}

// TestSwapFrameManyDescriptors: a frame carries more descriptors than one
// SCM_RIGHTS message may (a chain near the depth limit); all arrive, in
// order, with the frame, and the next frame is intact.
func TestSwapFrameManyDescriptors(t *testing.T) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	must(t, err)
	a, err := newCtlConn(os.NewFile(uintptr(pair[0]), "a"))
	must(t, err)
	defer a.Close()
	b, err := newCtlConn(os.NewFile(uintptr(pair[1]), "b"))
	must(t, err)
	defer b.Close()
	dirs := make([]string, 520)
	fds := make([]int, len(dirs))
	base := t.TempDir()
	for i := range dirs {
		dirs[i] = filepath.Join(base, fmt.Sprint(i))
		must(t, os.Mkdir(dirs[i], 0o755))
		fd, err := unix.Open(dirs[i], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		must(t, err)
		defer unix.Close(fd)
		fds[i] = fd
	}
	go func() {
		ctx := context.Background()
		_ = a.writeFrameFDs(ctx, &ctlHeader{Op: opSwap, Swap: &swapHeader{Lowers: len(fds)}}, nil, fds, true)
		_ = a.writeFrame(ctx, &ctlHeader{Op: opReply, ID: 7}, []byte("next"), -1)
	}()
	hdr, _, fd, err := b.readFrame()
	must(t, err)
	if fd != -1 || len(hdr.fds) != len(dirs) {
		t.Fatalf("fd %d, %d descriptors, want %d", fd, len(hdr.fds), len(dirs))
	}
	for i, got := range hdr.fds {
		var x, y unix.Stat_t
		must(t, unix.Fstat(got, &x))
		must(t, unix.Stat(dirs[i], &y))
		if x.Ino != y.Ino {
			t.Errorf("descriptor %d is not %s", i, dirs[i])
		}
		unix.Close(got)
	}
	hdr, payload, _, err := b.readFrame()
	if err != nil || hdr.ID != 7 || string(payload) != "next" {
		t.Fatalf("next frame: %+v %q %v", hdr, payload, err)
	}
}

// TestKernelLowerLimit: the kernel overlay stacks at most KernelMaxLowers
// lowers. A holder started over more, or a swap onto more, fails naming
// that limit and the squash that cures it — not a kernel version (issue
// 36: a sync onto a 501-layer head said "it needs Linux 6.15"). A swap onto
// exactly the limit works, which pins the constant to this kernel's.
func TestKernelLowerLimit(t *testing.T) {
	f := newFixture(t)
	chain := func(n int) []string {
		out := []string{}
		for i := range n - 2 {
			d := filepath.Join(f.dir, fmt.Sprintf("l%03d", i))
			must(t, os.MkdirAll(d, 0o755))
			out = append(out, d)
		}
		return append(out, f.lower, f.lower2)
	}
	tooDeep := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrTooManyLowers) || !strings.Contains(err.Error(), "at most 500") ||
			!strings.Contains(err.Error(), "squash") || strings.Contains(err.Error(), "Linux") {
			t.Errorf("%s over %d lowers: %v, want ErrTooManyLowers naming the limit", what, KernelMaxLowers+1, err)
		}
	}
	cfg := f.config("sess-deep-start")
	cfg.Overlay = OverlayKernel
	cfg.Lowers = chain(KernelMaxLowers + 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if h, err := Start(ctx, testSelf, cfg); err == nil {
		h.Close(time.Second)
		t.Errorf("a holder started over %d lowers", len(cfg.Lowers))
	} else if !strings.Contains(err.Error(), "at most 500") || strings.Contains(err.Error(), "Linux") {
		t.Errorf("start over %d lowers: %v, want the limit named", len(cfg.Lowers), err)
	}

	cfg = f.config("sess-deep-swap")
	cfg.Overlay = OverlayKernel
	s := startSession(t, cfg)
	tooDeep("swap", s.h.SwapLower(ctx, SwapRequest{Lowers: chain(KernelMaxLowers + 1)}))
	if got := s.ok("cat hello.txt"); got != "hello from lower" {
		t.Fatalf("after a refused swap: %q", got)
	}
	if err := s.h.SwapLower(ctx, SwapRequest{Lowers: chain(KernelMaxLowers)}); err != nil {
		t.Fatalf("swap onto exactly %d lowers: %v", KernelMaxLowers, err)
	}
	if got := s.ok("cat hello.txt"); got != "hello from lower" {
		t.Fatalf("after a swap onto %d lowers: %q", KernelMaxLowers, got)
	}
}
