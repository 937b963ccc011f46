package nsholder

// The FUSE overlay driver inside the holder (§5.6 fuse): the holder mounts
// fuseoverlay on <root>/workspace before pivot_root (every layer, the upper
// and the work directory are opened as descriptors first, since their host
// paths vanish with the pivot) and serves it in-process for the session's
// life. Provenance records and released-handle notices travel to the
// supervisor as Event.FS notices through the same FIFO as the command
// events, so a command's records always precede its Exited and Done.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/fuseoverlay"
)

// holderOwner is the owner the holder's own file operations get: their
// records are dropped here because the supervisor records each file
// operation itself, with its request_id, and checkpoints it.
const holderOwner = "\x00holder"

// maxNoticeRecords bounds one notice frame; a larger batch is split.
const maxNoticeRecords = 4096

// owners maps processes of the session to the command that owns them.
// Every command root is a session leader (Setsid), so a process's session
// ID names its command; processes that called setsid themselves are found
// by walking their parent chain up to a command's session.
type owners struct {
	mu    sync.Mutex
	roots map[int]string // command root pid (= its session ID) → owner
	cache map[int]ownerCache
}

type ownerCache struct {
	start uint64 // the process's start time: a reused pid misses the cache
	owner string
}

func newOwners() *owners {
	return &owners{roots: map[int]string{}, cache: map[int]ownerCache{}}
}

func (o *owners) add(root int, owner string) {
	o.mu.Lock()
	o.roots[root] = owner
	o.mu.Unlock()
}

// remove forgets a command once it is Done (its session is empty then, and
// the pid may be reused).
func (o *owners) remove(root int) {
	o.mu.Lock()
	delete(o.roots, root)
	o.mu.Unlock()
}

// statFields reads ppid, session and start time of pid from /proc.
func statFields(pid int) (ppid, sid int, start uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	i := strings.LastIndexByte(string(b), ')') // comm may hold anything
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
	// cmajflt utime stime cutime cstime priority nice num_threads
	// itrealvalue starttime
	if len(f) < 20 {
		return 0, 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	sid, _ = strconv.Atoi(f[3])
	start, _ = strconv.ParseUint(f[19], 10, 64)
	return ppid, sid, start, true
}

// owner resolves the pid of a FUSE request (in the session's PID
// namespace, where the holder is 1) to its command. The kernel sends the
// calling thread's ID, which /proc resolves like a pid (the stat of a
// thread carries its process's parent and session). pid 0 (kernel context:
// mmap write-back) and unknown processes are "". The holder's own threads
// are in session 1 (it is PID 1 and a session leader; every command root
// starts a session of its own), so they are recognized by that.
func (o *owners) owner(pid uint32) string {
	switch pid {
	case 0:
		return ""
	case 1:
		return holderOwner
	}
	p := int(pid)
	_, sid, start, ok := statFields(p)
	if !ok {
		return ""
	}
	if sid == 1 {
		return holderOwner
	}
	o.mu.Lock()
	if c, hit := o.cache[p]; hit && c.start == start {
		o.mu.Unlock()
		return c.owner
	}
	o.mu.Unlock()
	owner := ""
	cur := p
	for range 64 {
		ppid, sid, _, ok := statFields(cur)
		if !ok {
			break
		}
		o.mu.Lock()
		r, found := o.roots[sid]
		if !found {
			r, found = o.roots[cur]
		}
		o.mu.Unlock()
		if found {
			owner = r
			break
		}
		if ppid <= 1 {
			break
		}
		cur = ppid
	}
	o.mu.Lock()
	if len(o.cache) >= 4096 { // bounded: start over rather than track ages
		o.cache = map[int]ownerCache{}
	}
	o.cache[p] = ownerCache{start: start, owner: owner}
	o.mu.Unlock()
	return owner
}

// fuseMount is the mounted FUSE overlay of a holder.
type fuseMount struct {
	srv    *fuseoverlay.Server
	files  []*os.File // the work directory's descriptor, kept open while serving
	upper  *os.File   // the current upper's descriptor
	lowers []*os.File // the current lower chain's descriptors
	// sessDir is the directory holding the upper and the work directory,
	// opened in the holder's mount namespace (nil without a work
	// directory); upperName is the upper's name in it. See swap.
	sessDir   *os.File
	upperName string
}

// swap moves the overlay onto lowers and, when not nil, upper, which it
// owns from then on, and closes the previous ones' descriptors (open
// handles hold their own). An upper swap is refused while a handle is
// open for writing (*fuseoverlay.WriteHandlesError).
func (fm *fuseMount) swap(upper *os.File, lowers []*os.File) error {
	err := fm.srv.Swap(context.Background(), fuseoverlay.Chain{Upper: upper, Lowers: lowers})
	if err != nil && !errors.Is(err, fuseoverlay.ErrSwapInvalidate) {
		return fmt.Errorf("swaplower: %w", err)
	}
	for _, f := range fm.lowers {
		f.Close()
	}
	fm.lowers = lowers
	if upper != nil {
		fm.upper.Close()
		fm.upper = upper
	}
	if err != nil {
		return fmt.Errorf("swaplower: %w", err)
	}
	return nil
}

// ownMount returns a descriptor of the new upper opened through this
// namespace's mounts (upper itself without a work directory). The supervisor opens the new upper in
// its own mount namespace, whose mounts are other vfsmounts than the
// holder's copies of them: a copy-up renames from the work directory
// (opened here) into the upper, and rename(2) across two vfsmounts fails
// with EXDEV even on one filesystem — every write to a lower file after a
// publish keep:true or a sync failed so (issue #27). The name is opened
// again below the session directory opened at mount time, and must be the
// directory the supervisor sent.
func (fm *fuseMount) ownMount(upper *os.File) (*os.File, error) {
	if fm.sessDir == nil {
		return upper, nil
	}
	fd, err := unix.Openat(int(fm.sessDir.Fd()), fm.upperName, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("reopen upper %s: %w", fm.upperName, err)
	}
	own := os.NewFile(uintptr(fd), fm.upperName)
	var a, b unix.Stat_t
	if err := unix.Fstat(int(upper.Fd()), &a); err != nil {
		own.Close()
		return nil, fmt.Errorf("stat upper: %w", err)
	}
	if err := unix.Fstat(fd, &b); err != nil {
		own.Close()
		return nil, fmt.Errorf("stat upper: %w", err)
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		own.Close()
		return nil, fmt.Errorf("%w: upper %s was replaced again meanwhile", fs.ErrInvalid, fm.upperName)
	}
	return own, nil
}

// mountFuse opens the layers, upper and work directory and mounts the FUSE
// overlay at ws. notify receives every notice in order.
func mountFuse(ws string, cfg *Config, own *owners, notify func(*FSNotice)) (*fuseMount, error) {
	fm := &fuseMount{}
	open := func(p string) (*os.File, error) {
		f, err := os.OpenFile(p, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		fm.files = append(fm.files, f)
		return f, nil
	}
	fail := func(err error) (*fuseMount, error) {
		fm.close()
		return nil, err
	}
	opts := fuseoverlay.Options{
		Owner:            own.owner,
		Name:             "esbx-" + cfg.SessionID,
		CoalesceInterval: time.Duration(cfg.CoalesceMs) * time.Millisecond,
	}
	for _, l := range cfg.Lowers {
		f, err := os.OpenFile(l, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("open lower layer: %w", err))
		}
		fm.lowers = append(fm.lowers, f)
		opts.Lowers = append(opts.Lowers, f)
	}
	var err error
	if fm.upper, err = os.OpenFile(cfg.Upper, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return fail(fmt.Errorf("open upper: %w", err))
	}
	opts.Upper = fm.upper
	if cfg.Work != "" {
		if opts.Work, err = open(cfg.Work); err != nil {
			return fail(fmt.Errorf("open work: %w", err))
		}
		if filepath.Dir(cfg.Upper) == filepath.Dir(cfg.Work) {
			if fm.sessDir, err = open(filepath.Dir(cfg.Upper)); err != nil {
				return fail(fmt.Errorf("open session directory: %w", err))
			}
			fm.upperName = filepath.Base(cfg.Upper)
		}
	}
	if !cfg.NoActivity {
		opts.Sink = func(recs []fuseoverlay.Record) {
			out := make([]FileRecord, 0, len(recs))
			for _, r := range recs {
				if r.Command == holderOwner {
					continue
				}
				out = append(out, FileRecord{TimeUnixNs: r.Time.UnixNano(), Command: r.Command, Op: r.Op, Path: r.Path,
					NewPath: r.NewPath, Offset: r.Offset, Length: r.Length})
			}
			for len(out) > 0 {
				n := min(len(out), maxNoticeRecords)
				notify(&FSNotice{Records: out[:n:n]})
				out = out[n:]
			}
		}
	}
	opts.Released = func(path, command string) {
		if command != holderOwner {
			notify(&FSNotice{Released: []ReleasedFile{{Path: path, Command: command}}})
		}
	}
	// The holder's own work is light; serving FUSE requests is what its
	// runtime is for from here on (see fuseoverlay.ServerProcs).
	runtime.GOMAXPROCS(fuseoverlay.ServerProcs)
	// Background: the context may bound the server's life, not just the mount.
	if fm.srv, err = fuseoverlay.Mount(context.Background(), ws, opts); err != nil {
		return fail(err)
	}
	return fm, nil
}

func (fm *fuseMount) flush() {
	if fm != nil && fm.srv != nil {
		fm.srv.Flush()
	}
}

// stop flushes, detaches /workspace (the path the server knows is the
// pre-pivot one, so the detach goes by the current path) and stops serving.
func (fm *fuseMount) stop() {
	if fm == nil || fm.srv == nil {
		return
	}
	fm.srv.Flush()
	_ = unix.Unmount("/workspace", unix.MNT_DETACH)
	done := make(chan struct{})
	go func() {
		_ = fm.srv.Unmount()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
	}
	fm.close()
}

func (fm *fuseMount) close() {
	for _, f := range append(fm.files, fm.lowers...) {
		f.Close()
	}
	if fm.upper != nil {
		fm.upper.Close()
	}
	fm.files, fm.lowers, fm.upper = nil, nil, nil
}
