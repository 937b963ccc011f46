package nsholder

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// hostPid finds the host pid of the session process nsPid, a child of the
// holder (a command's root), through the host's /proc.
func hostPid(t *testing.T, holder, nsPid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	must(t, err)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		var ppid int
		var nspid []string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				ppid, _ = strconv.Atoi(strings.TrimSpace(v))
			}
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				nspid = strings.Fields(v)
			}
		}
		if ppid == holder && len(nspid) == 2 && nspid[1] == strconv.Itoa(nsPid) {
			return pid
		}
	}
	t.Fatalf("session pid %d not found under holder %d", nsPid, holder)
	return 0
}

// stopped reports whether the host process pid is stopped (false when gone).
func stopped(pid int) bool {
	st := procState(pid)
	return st == 'T' || st == 't'
}

// waitFor polls cond until it holds (a state the holder reaches on its own).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mmapWriter stores "mmap-data" into /workspace/mm.txt through a shared
// mapping and keeps it (no msync, no munmap): dirty pages of the mount.
const mmapWriter = `printf mmap-data > /tmp/src; exec perl -e 'open(my $f, "+<", "/workspace/mm.txt") or die "open: $!"; ` +
	`my $a = syscall(9, 0, 4096, 3, 1, fileno($f), 0); die "mmap: $!" if $a == -1; ` +
	`open(my $s, "<", "/tmp/src") or die "src: $!"; syscall(0, fileno($s), $a, 9) == 9 or die "read: $!"; ` +
	`open(my $r, ">", "/workspace/mm-ready") or die; close($r); sleep 600'`

// TestFreezeThaw drives Freeze and Thaw on a real holder of each driver:
// Freeze stops every session process and flushes what a process stored
// through a shared mapping of a /workspace file, so the host reads it in
// the upper (fuse: those are dirty pages of the FUSE mount until
// writeback); a second Freeze is accepted; Thaw continues them. A
// process that does not stop within the budget fails the freeze with
// ErrFreezeTimeout and nothing stays stopped; a freeze nobody thaws ends
// at the safety limit and the next Thaw says so; a freeze ends with the
// holder when the supervisor's end of the channel closes.
func TestFreezeThaw(t *testing.T) {
	if _, err := os.Stat("/usr/bin/perl"); err != nil {
		t.Skipf("no perl for the mapping writer: %v", err)
	}
	for _, driver := range []string{OverlayKernel, OverlayFuse} {
		t.Run(driver, func(t *testing.T) {
			if driver == OverlayFuse {
				if _, err := os.Stat("/dev/fuse"); err != nil {
					t.Skipf("no FUSE here: %v", err)
				}
			}
			f := newFixture(t)
			must(t, os.WriteFile(filepath.Join(f.upper, "mm.txt"), []byte(strings.Repeat("x", 4096)), 0o644))
			cfg := f.config("sess-freeze-" + driver)
			cfg.Overlay = driver
			s := startSession(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			holder := s.h.Pid()

			sleeper := s.spawnIn("/", "cmd-sleep", "touch /workspace/sleep-ready; exec sleep 600")
			writer := s.spawnIn("/", "cmd-mmap", mmapWriter)
			waitFile(t, filepath.Join(f.upper, "sleep-ready"))
			waitFile(t, filepath.Join(f.upper, "mm-ready"))
			pids := []int{hostPid(t, holder, sleeper.p.Pid), hostPid(t, holder, writer.p.Pid)}
			allStopped := func(want bool) {
				t.Helper()
				for _, pid := range pids {
					if got := stopped(pid); got != want {
						t.Errorf("pid %d stopped = %v, want %v", pid, got, want)
					}
				}
			}

			if err := s.h.Freeze(ctx, 0); err != nil {
				t.Fatalf("Freeze: %v", err)
			}
			allStopped(true)
			if b, err := os.ReadFile(filepath.Join(f.upper, "mm.txt")); err != nil || !strings.HasPrefix(string(b), "mmap-data") {
				t.Errorf("upper mm.txt after Freeze: %.16q… %v, want the mapped store flushed", b, err)
			}
			if err := s.h.Freeze(ctx, 0); err != nil {
				t.Errorf("Freeze while frozen: %v", err)
			}
			allStopped(true)
			must(t, s.h.Thaw(ctx))
			allStopped(false)
			if err := s.h.Thaw(ctx); err != nil {
				t.Errorf("Thaw when not frozen: %v", err)
			}

			// Nothing stops within 1 ns: a timeout, and nothing left stopped.
			if err := s.h.Freeze(ctx, time.Nanosecond); !errors.Is(err, ErrFreezeTimeout) {
				t.Errorf("Freeze with a 1 ns budget: %v, want ErrFreezeTimeout", err)
			}
			allStopped(false)

			// A freeze nobody thaws ends at the safety limit.
			s.h.freezeLimit = 100 * time.Millisecond
			must(t, s.h.Freeze(ctx, 0))
			waitFor(t, "thaw at the safety limit", func() bool { return !stopped(pids[0]) && !stopped(pids[1]) })
			if err := s.h.Thaw(ctx); !errors.Is(err, ErrFreezeExpired) {
				t.Errorf("Thaw after the safety limit: %v, want ErrFreezeExpired", err)
			}
			if err := s.h.Thaw(ctx); err != nil {
				t.Errorf("second Thaw after the safety limit: %v", err)
			}
			s.h.freezeLimit = 0

			// The supervisor's end of the channel closes while frozen: the
			// holder ends, and the session with it.
			must(t, s.h.Freeze(ctx, 0))
			allStopped(true)
			s.h.conn.Close()
			select {
			case <-s.h.Done():
			case <-time.After(20 * time.Second):
				t.Fatal("the holder outlived its channel")
			}
			waitFor(t, "session processes gone", func() bool { return procState(pids[0]) == 0 && procState(pids[1]) == 0 })
		})
	}
}

// exchangeDirs swaps two directory names (RENAME_EXCHANGE), as
// layers.SyncUpper puts a rewritten upper in place.
func exchangeDirs(t *testing.T, a, b string) {
	t.Helper()
	must(t, unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE))
}

// TestSwapUpperHolder moves a live session of each driver onto a new
// upper and a new chain at once, the way a sync does: the upper is copied
// (layers.CopyUpper), edited and exchanged into place, the session is
// frozen, swapped and thawed. Before that, a command with a file open for
// writing in /workspace makes the swap fail with a PinnedError naming it
// (fd) and nothing changes; a bad upper is refused and nothing changes.
// Afterwards every view of the session (a command that ran across the
// swap, one whose cwd is inside /workspace on fuse, new commands, the
// holder's file operations) shows the new upper over the new chain, new
// writes land in the new upper, and Chain reports the new chain.
func TestSwapUpperHolder(t *testing.T) {
	for _, driver := range []string{OverlayKernel, OverlayFuse} {
		t.Run(driver, func(t *testing.T) {
			if driver == OverlayFuse {
				if _, err := os.Stat("/dev/fuse"); err != nil {
					t.Skipf("no FUSE here: %v", err)
				}
			}
			f := newFixture(t)
			cfg := f.config("sess-swapup-" + driver)
			cfg.Overlay = driver
			s := startSession(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			s.ok("echo mine > mine.txt; echo edited > hello.txt; echo keep > keep.txt")
			if got := s.ok("cat mine.txt hello.txt keep.txt; ls"); got != "mine\nedited\nkeep\nhello.txt\tkeep.txt  mine.txt\tsub" && !strings.Contains(got, "mine\nedited\nkeep") {
				t.Fatalf("before: %q", got)
			}
			var oldSt unix.Stat_t
			must(t, unix.Stat(f.upper, &oldSt))
			ci, err := s.h.Chain(ctx)
			if err != nil || strings.Join(ci.Lowers, ",") != strings.Join(cfg.Lowers, ",") || ci.UpperIno != oldSt.Ino || ci.UpperDev != oldSt.Dev {
				t.Fatalf("Chain at start: %+v %v, want %v and the upper's inode %d", ci, err, cfg.Lowers, oldSt.Ino)
			}

			head := filepath.Join(f.dir, "head")
			must(t, os.MkdirAll(head, 0o755))
			must(t, os.WriteFile(filepath.Join(head, "hello.txt"), []byte("hello from head\n"), 0o644))
			must(t, os.WriteFile(filepath.Join(head, "h.txt"), []byte("head only\n"), 0o644))
			chain := []string{head, f.lower, f.lower2}

			across := s.spawnIn("/", "cmd-across", "touch /workspace/across-ready; while [ ! -e /workspace/go ]; do sleep 0.02; done; cat /workspace/mine.txt /workspace/synced.txt")
			waitFile(t, filepath.Join(f.upper, "across-ready"))
			var inside *cmdRun
			if driver == OverlayFuse {
				inside = s.spawnIn("/workspace/sub", "cmd-inside", "touch ../inside-ready; while [ ! -e ../go ]; do sleep 0.02; done; cat ../mine.txt ../hello.txt; ls -1 ..")
				waitFile(t, filepath.Join(f.upper, "inside-ready"))
			}
			writer := s.spawnIn("/", "cmd-writer", "exec 3>>/workspace/keep.txt; touch /workspace/w-ready; exec sleep 600")
			waitFile(t, filepath.Join(f.upper, "w-ready"))

			// The sync's new upper: a copy of the session's, edited, put in
			// place with RENAME_EXCHANGE (the old one stays at next).
			next := filepath.Join(f.dir, "upper.next")
			must(t, layers.CopyUpper(ctx, f.upper, next))
			must(t, os.WriteFile(filepath.Join(next, "mine.txt"), []byte("MINE\n"), 0o644))
			must(t, os.WriteFile(filepath.Join(next, "synced.txt"), []byte("synced\n"), 0o644))
			must(t, os.Remove(filepath.Join(next, "hello.txt")))
			exchangeDirs(t, next, f.upper)
			var newSt unix.Stat_t
			must(t, unix.Stat(f.upper, &newSt))

			unchanged := func(what string) {
				t.Helper()
				if got := s.ok("cat mine.txt hello.txt"); got != "mine\nedited" {
					t.Errorf("%s: the session shows %q, want its old view", what, got)
				}
				if ci, err := s.h.Chain(ctx); err != nil || ci.UpperIno != oldSt.Ino || len(ci.Lowers) != len(cfg.Lowers) {
					t.Errorf("%s: Chain %+v %v, want the old chain", what, ci, err)
				}
			}
			// A file open for writing in /workspace: refused, naming it.
			err = s.h.SwapLower(ctx, SwapRequest{Lowers: chain, Upper: f.upper})
			var pe *PinnedError
			if !errors.Is(err, ErrSwapPinned) || !errors.As(err, &pe) {
				t.Fatalf("swap with a file open for writing: %v, want a PinnedError", err)
			}
			found := false
			for _, p := range pe.Pins {
				if p.Kind == "fd" && p.Path == "/workspace/keep.txt" && p.Pid == writer.p.Pid && p.Owner == "cmd-writer" {
					found = true
				}
			}
			if !found {
				t.Errorf("pins %+v do not name cmd-writer's keep.txt", pe.Pins)
			}
			unchanged("write handle")
			must(t, s.h.Signal(ctx, writer.p.ID, 9))
			writer.wait(t, 20*time.Second)

			// Bad uppers.
			if err := s.h.SwapLower(ctx, SwapRequest{Lowers: chain, Upper: next}); !errors.Is(err, fs.ErrInvalid) {
				t.Errorf("swap onto another directory than the session's upper: %v, want fs.ErrInvalid", err)
			}
			unchanged("other path")
			if driver == OverlayKernel {
				// The name holds another directory than the one sent.
				lf, err := os.Open(f.lower)
				must(t, err)
				hf, err := os.Open(head)
				must(t, err)
				uf, err := os.Open(next)
				must(t, err)
				fds := []int{int(hf.Fd()), int(lf.Fd()), int(uf.Fd())}
				_, err = s.h.doFDs(ctx, &ctlHeader{Op: opSwap, Swap: &swapHeader{Lowers: 2, Paths: chain[:2], Upper: true}}, nil, fds)
				lf.Close()
				hf.Close()
				uf.Close()
				if !errors.Is(err, fs.ErrInvalid) {
					t.Errorf("swap with another directory's descriptor as the upper: %v, want fs.ErrInvalid", err)
				}
				unchanged("descriptor not at the name")
				// The upper was replaced: a swap that keeps it is refused.
				if err := s.h.SwapLower(ctx, SwapRequest{Lowers: chain}); !errors.Is(err, fs.ErrInvalid) {
					t.Errorf("lower-only swap after the upper was replaced: %v, want fs.ErrInvalid", err)
				}
				unchanged("upper replaced, not named")
			}

			must(t, s.h.Freeze(ctx, 0))
			if err := s.h.SwapLower(ctx, SwapRequest{Lowers: chain, Upper: f.upper}); err != nil {
				t.Fatalf("SwapLower with the new upper: %v", err)
			}
			if !stopped(hostPid(t, s.h.Pid(), across.p.Pid)) {
				t.Errorf("SwapLower continued a frozen session")
			}
			must(t, s.h.Thaw(ctx))
			ci, err = s.h.Chain(ctx)
			if err != nil || strings.Join(ci.Lowers, ",") != strings.Join(chain, ",") || ci.UpperIno != newSt.Ino || ci.UpperDev != newSt.Dev {
				t.Errorf("Chain after the swap: %+v %v, want %v and inode %d", ci, err, chain, newSt.Ino)
			}

			if _, err := s.h.WriteFile(ctx, "go", nil, nil); err != nil {
				t.Fatal(err)
			}
			if out := strings.ReplaceAll(strings.TrimSpace(across.wait(t, 20*time.Second)), "\r", ""); out != "MINE\nsynced" {
				t.Errorf("command across the swap: %q", out)
			}
			if inside != nil {
				out := strings.ReplaceAll(strings.TrimSpace(inside.wait(t, 20*time.Second)), "\r", "")
				if !strings.HasPrefix(out, "MINE\nhello from head\n") || !strings.Contains(out, "synced.txt") || !strings.Contains(out, "h.txt") {
					t.Errorf("command inside /workspace across the swap: %q", out)
				}
			}
			if got := s.ok("cat mine.txt synced.txt hello.txt h.txt keep.txt"); got != "MINE\nsynced\nhello from head\nhead only\nkeep" {
				t.Errorf("a new command after the swap: %q", got)
			}
			if data, _, err := s.h.ReadFile(ctx, "mine.txt", 1<<20); err != nil || string(data) != "MINE\n" {
				t.Errorf("holder ReadFile after the swap: %q %v", data, err)
			}
			s.ok("echo w > w.txt; echo more >> keep.txt")
			for p, want := range map[string]string{"w.txt": "w\n", "keep.txt": "keep\nmore\n"} {
				if b, err := os.ReadFile(filepath.Join(f.upper, p)); err != nil || string(b) != want {
					t.Errorf("new upper %s: %q %v, want %q", p, b, err, want)
				}
			}
			if _, err := os.Lstat(filepath.Join(next, "w.txt")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("old upper w.txt: %v, want absent", err)
			}
			if b, _ := os.ReadFile(filepath.Join(next, "keep.txt")); string(b) != "keep\n" {
				t.Errorf("old upper keep.txt: %q, want unchanged", b)
			}
		})
	}
}

// writebackRacer keeps storing into every page of /workspace/mw.bin through
// a shared mapping, all 'a' then all 'b' and so on, while a child process
// keeps starting the writeback of those pages (sync_file_range
// SYNC_FILE_RANGE_WRITE, as the kernel's flusher does when dirty pages
// pile up on the host). syncfs(2) does not wait for FUSE writeback that
// someone else started (the kernel skips FUSE inodes in sync's wait; newer
// kernels do not wait for FUSE writeback at all), so at any moment some
// of the newest stores may be on their way to the server only.
const writebackRacer = `case $(uname -m) in aarch64) sfr=84;; *) sfr=277;; esac; ` +
	`exec perl -e 'open(my $f, "+<", "/workspace/mw.bin") or die "open: $!"; my $n = -s $f; ` +
	`my $a = syscall(9, 0, $n, 3, 1, fileno($f), 0); die "mmap: $!" if $a == -1; ` +
	`for my $c ("a", "b") { open(my $s, ">", "/tmp/$c") or die "src: $!"; print $s ($c x $n); close($s) } ` +
	`if (fork() == 0) { while (1) { syscall($ARGV[0], fileno($f), 0, 0, 2) } } ` +
	`open(my $r, ">", "/workspace/mw-ready") or die; close($r); ` +
	`for (my $i = 0; ; $i++) { open(my $s, "<", "/tmp/" . ("a", "b")[$i % 2]) or die "src: $!"; my $got = 0; ` +
	`while ($got < $n) { my $r = syscall(0, fileno($s), $a + $got, $n - $got); die "read: $!" if $r <= 0; $got += $r } close($s) }' $sfr`

// TestFreezeWaitsForWriteback: after Freeze returns, the FUSE session's
// upper holds exactly what its processes see in /workspace, also when
// the writeback of their mapped stores was started by someone else and
// is still under way at the freeze. Several freezes are taken while the
// racer runs; each compares the upper file on the host with the file read
// through the session's mount.
func TestFreezeWaitsForWriteback(t *testing.T) {
	if _, err := os.Stat("/usr/bin/perl"); err != nil {
		t.Skipf("no perl for the mapping writer: %v", err)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	const size = 4 << 20
	f := newFixture(t)
	must(t, os.WriteFile(filepath.Join(f.upper, "mw.bin"), make([]byte, size), 0o644))
	cfg := f.config("sess-writeback")
	cfg.Overlay = OverlayFuse
	s := startSession(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s.spawnIn("/", "cmd-racer", writebackRacer)
	waitFile(t, filepath.Join(f.upper, "mw-ready"))
	for i := range 20 {
		time.Sleep(20 * time.Millisecond)
		must(t, s.h.Freeze(ctx, 0))
		upper, err := os.ReadFile(filepath.Join(f.upper, "mw.bin"))
		must(t, err)
		view, _, err := s.h.ReadFile(ctx, "mw.bin", size+1)
		must(t, err)
		if n := diffBytes(string(upper), string(view)); n != 0 {
			t.Fatalf("freeze %d: the upper differs from the session's view in %d of %d bytes: the freeze returned before the writeback", i, n, len(view))
		}
		must(t, s.h.Thaw(ctx))
	}
}

// diffBytes counts the positions where a and b differ, and the length
// difference.
func diffBytes(a, b string) int {
	n := max(len(a), len(b)) - min(len(a), len(b))
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}
