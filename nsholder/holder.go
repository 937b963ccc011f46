package nsholder

// The holder side: `sandbox-supervisor nsholder serve`, PID 1 of the
// session's PID namespace, with the control channel as fd 3.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// Default PTY size (runtime.command.pty_rows × pty_cols) when a request
// gives none.
const (
	defaultRows = 50
	defaultCols = 200
)

// quiesceTimeout bounds a quiesce on the holder side (the supervisor's ctx
// bounds its wait); a process stuck in uninterruptible sleep can exceed it.
const quiesceTimeout = 60 * time.Second

// shimFD is the descriptor number of the exec shim (sandbox-exec-shim, or
// the holder's own binary) in a command child; the child execs
// /proc/self/fd/3.
const shimFD = 3

type command struct {
	id     uint64
	pid    int // root process; also its process group and session ID
	exited bool
	owner  string // SpawnRequest.Owner
}

type server struct {
	conn     *ctlConn
	root     *sessionRoot
	out      outbox
	setupErr error // a failure before setup (id mapping), the setup reply

	// gate: spawns hold it shared; quiesce and shutdown exclusively.
	gate     sync.RWMutex
	stopping bool

	mu      sync.Mutex // guards the maps; held across fork+register and reaping
	nextID  uint64
	running map[uint64]*command // not yet Done
	byPid   map[int]*command    // root not yet reaped

	owners *owners // command of a FUSE request's pid (fuse driver)

	// wsMu: file operations hold it shared while they use root.workspace;
	// a lower swap holds it exclusively (the kernel swap replaces it), and
	// so does a freeze (no holder write in flight when it flushes). It
	// also guards root.chain.
	wsMu sync.RWMutex

	frz freezer // lock order: gate, wsMu, frz.mu
}

// runServe is the holder's main.
func runServe() int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "nsholder serve: "+format+"\n", a...)
		return 1
	}
	if os.Getpid() != 1 {
		return fail("must be PID 1 of a new PID namespace (started by the supervisor), not PID %d", os.Getpid())
	}
	// subid: wait until the supervisor has mapped us, then re-exec (idmap.go).
	mapErr := awaitIDMapping()
	closeInherited(3)
	f := os.NewFile(3, "control")
	if f == nil {
		return fail("no control channel on fd 3")
	}
	conn, err := newCtlConn(f)
	if err != nil {
		return fail("%v", err)
	}
	// Non-dumpable: session processes (same uid) cannot ptrace the holder
	// or read its /proc/1/mem, environ or fds.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fail("PR_SET_DUMPABLE: %v", err)
	}
	swallowSignals()
	sigchld := make(chan os.Signal, 8)
	signal.Notify(sigchld, unix.SIGCHLD)
	s := &server{conn: conn, running: map[uint64]*command{}, byPid: map[int]*command{}, setupErr: mapErr, owners: newOwners()}
	s.out.wake = make(chan struct{}, 1)
	return s.run(sigchld)
}

// closeInherited closes descriptors ≥ 3 except keep that the holder
// inherited by accident (any descriptor of the supervisor without
// close-on-exec, such as a socket-activation listener). The Go runtime's
// own descriptors are close-on-exec, which tells them apart.
func closeInherited(keep int) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 || fd == keep {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}

// swallowSignals installs a handler that discards every catchable signal.
// As PID 1 of its namespace, the holder gets a signal from a session
// process only when it has a handler for it; the Go runtime has handlers
// that would exit (SIGTERM, SIGINT, SIGHUP) or crash (SIGQUIT, SIGSEGV sent
// with kill) the holder. A notified signal is just delivered to the channel
// and dropped. Notify rather than Ignore, because SIG_IGN would be
// inherited by the commands. The supervisor, which cannot be told apart
// by the signal alone, stops the holder with a shutdown request or by
// closing the channel, and with SIGKILL.
func swallowSignals() {
	var sigs []os.Signal
	for i := 1; i <= 31; i++ {
		switch sig := syscall.Signal(i); sig {
		case unix.SIGKILL, unix.SIGSTOP, unix.SIGCHLD, unix.SIGURG, unix.SIGPROF:
		default:
			sigs = append(sigs, sig)
		}
	}
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, sigs...)
	go func() {
		for range ch {
		}
	}()
}

func (s *server) run(sigchld chan os.Signal) int {
	hdr, _, fd, err := s.conn.readFrame()
	if fd >= 0 {
		unix.Close(fd)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nsholder serve: no setup request: %v\n", err)
		return 1
	}
	if hdr.Op != opSetup || hdr.Config == nil {
		s.replyNow(hdr.ID, &stageError{stageHandshake, fmt.Errorf("first request is %q, want setup", hdr.Op)})
		return 1
	}
	if s.setupErr != nil {
		s.replyNow(hdr.ID, s.setupErr)
		return 1
	}
	root, err := setupRoot(hdr.Config, s.owners, s.fsNotice)
	if err != nil {
		s.replyNow(hdr.ID, err)
		return 1
	}
	s.root = root
	driver := OverlayKernel
	if root.fuse != nil {
		driver = OverlayFuse
	}
	rep := &ctlHeader{ID: hdr.ID, Op: opReply, Ready: &readyState{LowerdirPlus: root.lowerdirPlus, Shell: root.shell,
		OverlayUs: root.overlayDur.Microseconds(), Overlay: driver}}
	if err := s.conn.writeFrame(context.Background(), rep, nil, -1); err != nil {
		return 1
	}
	go s.writer()
	go s.reaper(sigchld)
	for {
		hdr, payload, fd, err := s.conn.readFrame()
		if err != nil {
			// EOF: the supervisor closed the channel (or died). Exiting as
			// PID 1 makes the kernel kill every process of the namespace.
			s.root.fuse.stop()
			return 0
		}
		go s.handle(hdr, payload, fd)
	}
}

func (s *server) replyNow(id uint64, err error) {
	_ = s.conn.writeFrame(context.Background(), &ctlHeader{ID: id, Op: opReply, Err: encodeError(err)}, nil, -1)
}

func (s *server) reply(hdr *ctlHeader, payload []byte, fd *os.File) {
	hdr.Op = opReply
	s.out.push(outFrame{hdr: hdr, payload: payload, fd: fd})
}

func (s *server) replyErr(id uint64, err error) {
	s.reply(&ctlHeader{ID: id, Err: encodeError(err)}, nil, nil)
}

func (s *server) handle(hdr *ctlHeader, payload []byte, fd int) {
	if fd >= 0 {
		unix.Close(fd) // no request carries a single one
	}
	if hdr.Op != opSwap {
		for _, fd := range hdr.fds {
			unix.Close(fd)
		}
	}
	defer func() {
		if r := recover(); r != nil {
			s.replyErr(hdr.ID, fmt.Errorf("holder: internal error in %s: %v", hdr.Op, r))
		}
	}()
	switch hdr.Op {
	case opSpawn:
		if hdr.Spawn == nil {
			s.replyErr(hdr.ID, errors.New("spawn without a request"))
			return
		}
		s.spawn(hdr.ID, hdr.Spawn)
	case opSignal:
		s.replyErr(hdr.ID, s.signal(hdr.Cmd, syscall.Signal(hdr.Sig)))
	case opQuiesce:
		s.replyErr(hdr.ID, s.quiesce())
	case opShutdown:
		s.shutdown(time.Duration(hdr.GraceMS) * time.Millisecond)
	case opDial:
		f, err := dialLoopback(hdr.Port, time.Duration(hdr.GraceMS)*time.Millisecond)
		if err != nil {
			s.replyErr(hdr.ID, err)
			return
		}
		s.reply(&ctlHeader{ID: hdr.ID}, nil, f)
	case opSwap:
		s.replyErr(hdr.ID, s.swapLower(hdr.Swap, hdr.fds))
	case opFreeze:
		s.replyErr(hdr.ID, s.freeze(hdr.Freeze))
	case opThaw:
		s.replyErr(hdr.ID, s.thawSession())
	case opChain:
		ci := s.chainInfo()
		s.reply(&ctlHeader{ID: hdr.ID, Chain: &ci}, nil, nil)
	case opLstat, opReadFile, opReadDir, opWrite:
		if err := checkPath(hdr.Op, hdr.Path); err != nil {
			s.replyErr(hdr.ID, err)
			return
		}
		s.wsMu.RLock()
		defer s.wsMu.RUnlock()
		ws := s.root.workspace
		switch hdr.Op {
		case opLstat:
			info, err := lstatAt(ws, hdr.Path)
			s.reply(&ctlHeader{ID: hdr.ID, Info: &info, Err: encodeError(err)}, nil, nil)
		case opReadFile:
			data, info, err := readFileAt(ws, hdr.Path, hdr.Max)
			s.reply(&ctlHeader{ID: hdr.ID, Info: &info, Err: encodeError(err)}, data, nil)
		case opReadDir:
			infos, err := readDirAt(ws, hdr.Path)
			s.reply(&ctlHeader{ID: hdr.ID, Infos: infos, Err: encodeError(err)}, nil, nil)
		case opWrite:
			created, err := writeFileAt(ws, hdr.Path, payload, hdr.Mode)
			s.reply(&ctlHeader{ID: hdr.ID, Created: created, Err: encodeError(err)}, nil, nil)
		}
	default:
		s.replyErr(hdr.ID, fmt.Errorf("holder: unknown request %q", hdr.Op))
	}
}

// checkPath accepts clean workspace-relative paths ("" is the root).
func checkPath(op, p string) error {
	if p == "" {
		return nil
	}
	if path.IsAbs(p) || path.Clean(p) != p || p == "." || p == ".." || strings.HasPrefix(p, "../") {
		return &fs.PathError{Op: op, Path: p, Err: fs.ErrInvalid}
	}
	return nil
}

// spawn starts one command in a new PTY and replies with its master.
func (s *server) spawn(reqID uint64, req *SpawnRequest) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if s.stopping {
		s.replyErr(reqID, errors.New("holder is shutting down"))
		return
	}
	if s.root.shell == "" {
		s.replyErr(reqID, ErrNoShell)
		return
	}
	master, slave, err := pty.Open()
	if err != nil {
		s.replyErr(reqID, fmt.Errorf("open pty: %w", err))
		return
	}
	rows, cols := req.Rows, req.Cols
	if rows == 0 {
		rows = defaultRows
	}
	if cols == 0 {
		cols = defaultCols
	}
	if err := pty.Setsize(master, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
		master.Close()
		slave.Close()
		s.replyErr(reqID, fmt.Errorf("set pty size: %w", err))
		return
	}
	dir := req.Dir
	if dir == "" {
		dir = "/workspace"
	}
	argv := append([]string{}, s.root.shimArgv...)
	forkDir := dir
	if s.root.fuse != nil {
		// The forked child must not touch the FUSE mount this process
		// serves before it execs (see the shim's -C): it starts in "/" and
		// the shim changes to dir.
		argv = append(argv, "-C", dir)
		forkDir = "/"
	}
	argv = append(argv, "--", s.root.shell)
	if path.Base(s.root.shell) == "bash" {
		argv = append(argv, "--noprofile", "--norc")
	}
	argv = append(argv, "-c", req.Cmd)
	sfd := slave.Fd() // also makes the slave blocking, as a command's stdin must be
	attr := &syscall.ProcAttr{
		Dir:   forkDir,
		Env:   req.Env,
		Files: append([]uintptr{sfd, sfd, sfd, s.root.exe.Fd()}, s.root.loaderFds()...),
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0},
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pid, err := syscall.ForkExec("/proc/self/fd/"+strconv.Itoa(s.root.shimExec), argv, attr)
	slave.Close()
	if err != nil {
		master.Close()
		s.replyErr(reqID, fmt.Errorf("start command in %s: %w", dir, err))
		return
	}
	s.nextID++
	c := &command{id: s.nextID, pid: pid, owner: req.Owner}
	s.running[c.id] = c
	s.byPid[pid] = c
	if req.Owner != "" {
		// Registered before the child can open anything that matters: it
		// is still in the exec shim. The window until here is only the
		// shim's own exec, which opens nothing below /workspace.
		s.owners.add(pid, req.Owner)
	}
	// Queued under s.mu, so no event of this command can precede it.
	s.reply(&ctlHeader{ID: reqID, Cmd: c.id, Pid: pid}, nil, master)
}

func (s *server) event(e wireEvent) {
	s.out.push(outFrame{hdr: &ctlHeader{Op: opEvent, Event: &e}})
}

// fsNotice queues a notice of the FUSE overlay in the same FIFO as the
// command events.
func (s *server) fsNotice(n *FSNotice) {
	s.event(wireEvent{FS: n})
}

// reaper reaps on SIGCHLD, and polls while a command's root has exited but
// its group has not (a group member reaped by its own parent sends us no
// SIGCHLD).
func (s *server) reaper(sigchld chan os.Signal) {
	t := time.NewTimer(time.Second)
	for {
		select {
		case <-sigchld:
		case <-t.C:
		}
		d := time.Second
		if s.reap() {
			d = 50 * time.Millisecond
		}
		t.Reset(d)
	}
}

// reap collects every exited child (commands and re-parented orphans) and
// reports Exited and Done. It reports whether a command is waiting for
// its group to empty.
func (s *server) reap() (pending bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			break
		}
		if c := s.byPid[pid]; c != nil {
			delete(s.byPid, pid)
			c.exited = true
			s.root.fuse.flush() // the command's records precede its exit
			s.event(wireEvent{Cmd: c.id, Exited: true, Status: uint32(ws)})
		}
	}
	for id, c := range s.running {
		if !c.exited {
			continue
		}
		if unix.Kill(-c.pid, 0) == unix.ESRCH {
			delete(s.running, id)
			s.root.fuse.flush() // everything the command wrote precedes Done
			s.owners.remove(c.pid)
			s.event(wireEvent{Cmd: c.id, Done: true})
		} else {
			pending = true
		}
	}
	return pending
}

// signal sends sig to every process of command cid: its process group,
// every process still in its session (children that only changed their
// process group) and every descendant of those.
func (s *server) signal(cid uint64, sig syscall.Signal) error {
	if sig <= 0 || sig > 64 {
		return fmt.Errorf("bad signal %d", int(sig))
	}
	s.mu.Lock()
	c := s.running[cid]
	known := cid > 0 && cid <= s.nextID
	s.mu.Unlock()
	if c == nil {
		if known {
			return nil // already complete
		}
		return fmt.Errorf("unknown command %d", cid)
	}
	if err := unix.Kill(-c.pid, sig); err != nil && err != unix.ESRCH {
		return fmt.Errorf("signal command %d: %w", cid, err)
	}
	for _, pid := range commandProcesses(c.pid) {
		_ = unix.Kill(pid, sig)
	}
	return nil
}

type procStat struct{ pid, ppid, pgrp, session int }

// listProcs reads /proc of the session (every process but the holder).
func listProcs() []procStat {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	var out []procStat
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == 1 {
			continue
		}
		b, err := os.ReadFile("/proc/" + n + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session ...; comm may hold anything.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 4 {
			continue
		}
		p := procStat{pid: pid}
		p.ppid, _ = strconv.Atoi(f[1])
		p.pgrp, _ = strconv.Atoi(f[2])
		p.session, _ = strconv.Atoi(f[3])
		out = append(out, p)
	}
	return out
}

func commandProcesses(leader int) []int {
	procs := listProcs()
	in := map[int]bool{}
	children := map[int][]int{}
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
		if p.pgrp == leader || p.session == leader {
			in[p.pid] = true
		}
	}
	queue := make([]int, 0, len(in))
	for pid := range in {
		queue = append(queue, pid)
	}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, ch := range children[pid] {
			if !in[ch] {
				in[ch] = true
				queue = append(queue, ch)
			}
		}
	}
	out := make([]int, 0, len(in))
	for pid := range in {
		out = append(out, pid)
	}
	return out
}

// quiesce SIGKILLs every process of the session but the holder and
// returns once all are reaped; their Exited/Done events are queued first.
func (s *server) quiesce() error {
	s.gate.Lock()
	defer s.gate.Unlock()
	s.endFreeze() // what it stopped is killed now
	deadline := time.Now().Add(quiesceTimeout)
	for {
		_ = unix.Kill(-1, unix.SIGKILL) // from PID 1: everything in the namespace but itself
		s.reap()
		left := listProcs()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("quiesce: %d processes still alive after %v (first: pid %d)", len(left), quiesceTimeout, left[0].pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.reap()
	return nil
}

// shutdown is the graceful stop: SIGTERM to every session process, wait
// until they are gone or grace passes, exit (the kernel kills the rest).
func (s *server) shutdown(grace time.Duration) {
	s.gate.Lock()
	s.stopping = true
	_ = unix.Kill(-1, unix.SIGTERM)
	s.endFreeze() // a stopped process acts on SIGTERM once continued
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		s.reap()
		if len(listProcs()) == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.root.fuse.stop()
	os.Exit(0)
}

// outbox is the holder's single FIFO of outgoing frames (replies and
// events), drained by one writer so that order is what was queued.
type outFrame struct {
	hdr     *ctlHeader
	payload []byte
	fd      *os.File // closed once sent
}

type outbox struct {
	mu   sync.Mutex
	q    []outFrame
	wake chan struct{}
}

func (o *outbox) push(f outFrame) {
	o.mu.Lock()
	o.q = append(o.q, f)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (s *server) writer() {
	for {
		s.out.mu.Lock()
		if len(s.out.q) == 0 {
			s.out.mu.Unlock()
			<-s.out.wake
			continue
		}
		f := s.out.q[0]
		s.out.q[0] = outFrame{}
		s.out.q = s.out.q[1:]
		s.out.mu.Unlock()
		fd := -1
		if f.fd != nil {
			fd = int(f.fd.Fd())
		}
		err := s.conn.writeFrame(context.Background(), f.hdr, f.payload, fd)
		if f.fd != nil {
			f.fd.Close()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "nsholder serve: %v\n", err)
			os.Exit(1)
		}
	}
}
