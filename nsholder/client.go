package nsholder

// The supervisor side: Start and the *Client it returns.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Start starts `self nsholder serve` in new user, mount, PID, IPC and UTS
// namespaces (and a new network namespace when cfg.IsolatedNetwork), with
// a single-ID map of the caller, sends it cfg and waits for its ready
// handshake. Setup failures are *SetupError; after one, no process of the
// holder is left. ctx bounds the setup only, not the holder's life. With
// cfg.IDMapping "subid" the caller's subordinate ranges are mapped too,
// through newuidmap/newgidmap (idmap.go).
func Start(ctx context.Context, self string, cfg Config) (*Client, error) {
	return start(ctx, self, cfg, defaultStartOptions)
}

func start(ctx context.Context, self string, cfg Config, opts startOptions) (*Client, error) {
	var plan *subIDPlan
	switch cfg.IDMapping {
	case "", IDMappingSingle:
	case IDMappingSubID:
		var err error
		if plan, err = planSubID(opts); err != nil {
			return nil, err
		}
	default:
		return nil, idMappingError("unknown id mapping %q (want %s or %s)", cfg.IDMapping, IDMappingSingle, IDMappingSubID)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, &SetupError{Stage: stageSpawn, Err: "control socketpair: " + err.Error()}
	}
	mine := os.NewFile(uintptr(pair[0]), "nsholder-control")
	theirs := os.NewFile(uintptr(pair[1]), "nsholder-control")

	flags := uintptr(unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS)
	if cfg.IsolatedNetwork {
		flags |= unix.CLONE_NEWNET
	}
	cmd := exec.Command(self, "nsholder", "serve")
	cmd.SysProcAttr = NamespaceAttr(flags)
	cmd.SysProcAttr.Setsid = true
	cmd.ExtraFiles = []*os.File{theirs} // fd 3
	cmd.Env = []string{}
	var syncR, release *os.File // the sync pipe (subid): the holder waits on syncR
	if plan != nil {
		subIDAttr(cmd.SysProcAttr)
		if syncR, release, err = os.Pipe(); err != nil {
			mine.Close()
			theirs.Close()
			return nil, &SetupError{Stage: stageSpawn, Err: "sync pipe: " + err.Error()}
		}
		defer release.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, syncR) // fd 4 = syncFD
		cmd.Env = []string{envSyncFD + "=" + strconv.Itoa(syncFD)}
	}
	stderr := &tailBuffer{max: 8 << 10}
	cmd.Stderr = stderr
	err = cmd.Start()
	theirs.Close()
	if syncR != nil {
		syncR.Close()
	}
	if err != nil {
		mine.Close()
		return nil, &SetupError{Stage: stageSpawn, Err: err.Error()}
	}
	if plan != nil {
		// The holder is blocked on the pipe: map it, then release it.
		err := plan.apply(ctx, cmd.Process.Pid)
		if err == nil {
			if _, werr := release.Write([]byte(syncMessage)); werr != nil {
				err = idMappingError("release the holder: %v", werr)
			}
		}
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			mine.Close()
			return nil, err
		}
	}
	conn, err := newCtlConn(mine)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, &SetupError{Stage: stageSpawn, Err: err.Error()}
	}
	c := &Client{
		cmd:     cmd,
		conn:    conn,
		pending: map[uint64]chan ctlReply{},
		done:    make(chan struct{}),
		stderr:  stderr,
		upper:   filepath.Clean(cfg.Upper),
	}
	c.events.init()
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	go c.readLoop()

	r, err := c.call(ctx, &ctlHeader{Op: opSetup, Config: &cfg}, nil)
	if err == nil && r.hdr.Err != nil {
		err = r.hdr.Err.decode()
	}
	if err != nil {
		c.kill()
		return nil, c.setupError(err)
	}
	if r.hdr.Ready == nil {
		c.kill()
		return nil, &SetupError{Stage: stageHandshake, Err: "holder answered setup without ready"}
	}
	c.ready = *r.hdr.Ready
	if cfg.Egress != nil {
		helper, err := startEgress(ctx, *cfg.Egress, cmd.Process.Pid)
		if err != nil {
			c.kill()
			return nil, &SetupError{Stage: stageNetwork, Err: err.Error()}
		}
		// The helper lives exactly as long as the holder (and, through
		// Pdeathsig, never longer than the supervisor).
		go func() {
			<-c.done
			_ = helper.Process.Kill()
		}()
		c.helper = helper
	}
	return c, nil
}

type ctlReply struct {
	hdr     *ctlHeader
	payload []byte
	fd      int
}

// Client is the supervisor's handle on one running holder process. All
// methods are safe for concurrent use. Callers declare the small interface
// they need (a session's command runner, its file operations) rather than
// nsholder declaring one for them.
type Client struct {
	cmd    *exec.Cmd
	conn   *ctlConn
	stderr *tailBuffer
	ready  readyState
	helper *exec.Cmd // the network helper (profile isolated), or nil
	upper  string    // Config.Upper, cleaned: the only upper a swap may name

	// freezeLimit replaces the holder's safety limit of a freeze (tests).
	freezeLimit time.Duration

	mu      sync.Mutex
	nextReq uint64
	pending map[uint64]chan ctlReply
	broken  bool // the reader saw EOF or an error

	events    eventPump
	done      chan struct{}
	closeOnce sync.Once
}

// OverlayMountTime is how long the holder took to mount the session's
// /workspace overlay during setup (0 when the holder did not report it).
func (c *Client) OverlayMountTime() time.Duration {
	return time.Duration(c.ready.OverlayUs) * time.Microsecond
}

// OverlayDriver is the driver the holder mounted /workspace with
// (OverlayKernel or OverlayFuse).
func (c *Client) OverlayDriver() string {
	if c.ready.Overlay != "" {
		return c.ready.Overlay
	}
	return OverlayKernel
}

// Pid is the host PID of the holder.
func (c *Client) Pid() int { return c.cmd.Process.Pid }

// Done is closed when the holder process has exited.
func (c *Client) Done() <-chan struct{} { return c.done }

// Events carries command events, in order per command; it is closed when
// the holder exits.
func (c *Client) Events() <-chan Event { return c.events.out }

func (c *Client) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
	c.conn.Close()
}

// setupError turns a failed handshake into a *SetupError, after the holder
// is gone (so its stderr is complete).
func (c *Client) setupError(err error) *SetupError {
	var re *remoteError
	if errors.As(err, &re) && re.stage != "" {
		return &SetupError{Stage: re.stage, Err: re.msg}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return &SetupError{Stage: stageReady, Err: "holder not ready: " + err.Error()}
	case errors.Is(err, ErrExited):
		msg := "holder exited during setup"
		if st := c.cmd.ProcessState; st != nil {
			msg += " (" + st.String() + ")"
		}
		if tail := strings.TrimSpace(c.stderr.String()); tail != "" {
			msg += ": " + tail
		}
		return &SetupError{Stage: stageHandshake, Err: msg}
	}
	return &SetupError{Stage: stageHandshake, Err: err.Error()}
}

func (c *Client) readLoop() {
	for {
		hdr, payload, fd, err := c.conn.readFrame()
		if err != nil {
			break
		}
		if hdr.Op == opEvent {
			if e := hdr.Event; e != nil {
				c.events.push(Event{ID: e.Cmd, Exited: e.Exited, Status: syscall.WaitStatus(e.Status), Done: e.Done, FS: e.FS})
			}
			continue
		}
		c.mu.Lock()
		ch := c.pending[hdr.ID]
		delete(c.pending, hdr.ID)
		if ch != nil {
			if hdr.Cmd != 0 && fd >= 0 {
				c.events.hold(hdr.Cmd) // no event of a command before Spawn returns it
			}
			ch <- ctlReply{hdr, payload, fd} // buffered; sent under c.mu (see call)
		} else if fd >= 0 {
			unix.Close(fd)
		}
		c.mu.Unlock()
	}
	// EOF or a broken channel: either way the holder is (made) gone, so
	// that a closed Events always means a dead holder.
	_ = c.cmd.Process.Kill()
	c.conn.dropFDs()
	c.mu.Lock()
	c.broken = true
	for id, ch := range c.pending {
		close(ch)
		delete(c.pending, id)
	}
	c.mu.Unlock()
	c.events.close()
}

// call sends a request and waits for its reply, the holder's exit or ctx.
func (c *Client) call(ctx context.Context, hdr *ctlHeader, payload []byte) (ctlReply, error) {
	return c.callFDs(ctx, hdr, payload, nil)
}

// callFDs is call for a request that carries descriptors (fds ≠ nil: a
// multi-descriptor frame, see proto.go); they are sent, not closed.
func (c *Client) callFDs(ctx context.Context, hdr *ctlHeader, payload []byte, fds []int) (ctlReply, error) {
	if err := ctx.Err(); err != nil {
		return ctlReply{}, err
	}
	ch := make(chan ctlReply, 1)
	c.mu.Lock()
	if c.broken {
		c.mu.Unlock()
		return ctlReply{}, ErrExited
	}
	c.nextReq++
	hdr.ID = c.nextReq
	c.pending[hdr.ID] = ch
	c.mu.Unlock()
	abandon := func() {
		c.mu.Lock()
		delete(c.pending, hdr.ID)
		c.mu.Unlock()
		// The reader sends under c.mu, so a reply that raced us is here now.
		select {
		case r, ok := <-ch:
			if ok {
				c.discard(r)
			}
		default:
		}
	}
	if err := c.conn.writeFrameFDs(ctx, hdr, payload, fds, fds != nil); err != nil {
		abandon()
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed) {
			return ctlReply{}, ErrExited
		}
		return ctlReply{}, err
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return ctlReply{}, ErrExited
		}
		return r, nil
	case <-ctx.Done():
		abandon()
		return ctlReply{}, ctx.Err()
	}
}

func (c *Client) discard(r ctlReply) {
	if r.fd >= 0 {
		unix.Close(r.fd)
	}
	if r.hdr != nil && r.hdr.Cmd != 0 {
		c.events.release(r.hdr.Cmd)
	}
}

// do is call plus the holder's error.
func (c *Client) do(ctx context.Context, hdr *ctlHeader, payload []byte) (ctlReply, error) {
	return c.doFDs(ctx, hdr, payload, nil)
}

// doFDs is do for a request that carries descriptors (see callFDs).
func (c *Client) doFDs(ctx context.Context, hdr *ctlHeader, payload []byte, fds []int) (ctlReply, error) {
	op := hdr.Op
	r, err := c.callFDs(ctx, hdr, payload, fds)
	if err != nil {
		if errors.Is(err, ErrExited) {
			return r, err
		}
		return r, fmt.Errorf("holder %s: %w", op, err)
	}
	if r.hdr.Err != nil {
		if r.fd >= 0 {
			unix.Close(r.fd)
		}
		return r, r.hdr.Err.decode()
	}
	return r, nil
}

func (c *Client) Spawn(ctx context.Context, req SpawnRequest) (*Process, error) {
	r, err := c.do(ctx, &ctlHeader{Op: opSpawn, Spawn: &req}, nil)
	if err != nil {
		return nil, err
	}
	if r.fd < 0 || r.hdr.Cmd == 0 {
		c.discard(r)
		return nil, errors.New("holder spawn: reply without a command or terminal")
	}
	// Non-blocking, so the caller gets a pollable *os.File (deadlines work).
	if err := unix.SetNonblock(r.fd, true); err != nil {
		c.discard(r)
		return nil, fmt.Errorf("holder spawn: pty: %w", err)
	}
	p := &Process{ID: r.hdr.Cmd, Pid: r.hdr.Pid, PTY: os.NewFile(uintptr(r.fd), "pty")}
	c.events.release(p.ID)
	return p, nil
}

// Signal sends sig to every process of command id (its process group and
// every descendant the holder tracked).
func (c *Client) Signal(ctx context.Context, id uint64, sig syscall.Signal) error {
	_, err := c.do(ctx, &ctlHeader{Op: opSignal, Cmd: id, Sig: int(sig)}, nil)
	return err
}

// Quiesce kills every process of the session except the holder and waits
// until they are reaped.
func (c *Client) Quiesce(ctx context.Context) error {
	_, err := c.do(ctx, &ctlHeader{Op: opQuiesce}, nil)
	return err
}

// Lstat, ReadFile, ReadDir and WriteFile resolve beneath /workspace without
// following any symlink (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS where
// available). Paths are clean and workspace-relative ("" is the root).
func (c *Client) Lstat(ctx context.Context, path string) (FileInfo, error) {
	r, err := c.do(ctx, &ctlHeader{Op: opLstat, Path: path}, nil)
	if err != nil {
		return FileInfo{}, err
	}
	if r.hdr.Info == nil {
		return FileInfo{}, errors.New("holder lstat: reply without info")
	}
	return *r.hdr.Info, nil
}

func (c *Client) ReadFile(ctx context.Context, path string, max int64) ([]byte, FileInfo, error) {
	r, err := c.do(ctx, &ctlHeader{Op: opReadFile, Path: path, Max: max}, nil)
	if err != nil {
		return nil, FileInfo{}, err
	}
	if r.hdr.Info == nil {
		return nil, FileInfo{}, errors.New("holder readfile: reply without info")
	}
	data := r.payload
	if data == nil {
		data = []byte{}
	}
	return data, *r.hdr.Info, nil
}

// ReadDir lists path sorted by name bytes.
func (c *Client) ReadDir(ctx context.Context, path string) ([]FileInfo, error) {
	r, err := c.do(ctx, &ctlHeader{Op: opReadDir, Path: path}, nil)
	if err != nil {
		return nil, err
	}
	if r.hdr.Infos == nil {
		return []FileInfo{}, nil
	}
	return r.hdr.Infos, nil
}

// WriteFile replaces path atomically (temp file + rename in the target
// directory), creating missing parents with mode 0755. mode nil keeps an
// existing file's mode (0644 for a new file). It reports whether the file
// was created.
func (c *Client) WriteFile(ctx context.Context, path string, data []byte, mode *fs.FileMode) (bool, error) {
	r, err := c.do(ctx, &ctlHeader{Op: opWrite, Path: path, Mode: mode}, data)
	if err != nil {
		return false, err
	}
	return r.hdr.Created, nil
}

// DialLoopback asks the holder for a socket connected to 127.0.0.1:port in
// the session's network namespace.
func (c *Client) DialLoopback(ctx context.Context, port int, timeout time.Duration) (net.Conn, error) {
	r, err := c.do(ctx, &ctlHeader{Op: opDial, Port: port, GraceMS: timeout.Milliseconds()}, nil)
	if err != nil {
		return nil, err
	}
	if r.fd < 0 {
		c.discard(r)
		return nil, errors.New("holder dial: reply without a socket")
	}
	f := os.NewFile(uintptr(r.fd), "session-conn")
	defer f.Close() // FileConn dups it
	conn, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("holder dial: %w", err)
	}
	return conn, nil
}

// HelperPid is the host PID of the session's network helper, 0 when it
// has none.
func (c *Client) HelperPid() int {
	if c.helper != nil {
		return c.helper.Process.Pid
	}
	return 0
}

// Close stops the holder and returns once it has exited. The first step
// is a shutdown request rather than SIGTERM: the holder swallows SIGTERM,
// which it cannot tell apart from one sent by a session process. On that
// request it SIGTERMs every session process and exits when they are gone
// or grace has passed; Close SIGKILLs it after grace. Either way the
// kernel kills what is left of the PID namespace, and the mount namespace
// (overlay included) goes with its last process.
func (c *Client) Close(grace time.Duration) error {
	c.closeOnce.Do(func() {
		select {
		case <-c.done:
		default:
			if grace <= 0 {
				// No grace to give: SIGKILL, and the whole PID namespace dies with the holder.
				_ = c.cmd.Process.Kill()
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), grace)
				go func() {
					defer cancel()
					_ = c.conn.writeFrame(ctx, &ctlHeader{Op: opShutdown, GraceMS: grace.Milliseconds()}, nil, -1)
				}()
				t := time.NewTimer(grace + 100*time.Millisecond)
				select {
				case <-c.done:
				case <-t.C:
					_ = c.cmd.Process.Kill()
				}
				t.Stop()
			}
			<-c.done
		}
		c.conn.Close()
	})
	<-c.done
	return nil
}

// eventPump delivers events in order through an unbounded queue so the
// reader never blocks on a slow consumer. Events of a command whose Spawn
// reply is being handed over are held until Spawn returns.
type eventPump struct {
	mu     sync.Mutex
	q      []Event
	held   map[uint64][]Event
	closed bool
	wake   chan struct{}
	out    chan Event
}

func (p *eventPump) init() {
	p.held = map[uint64][]Event{}
	p.wake = make(chan struct{}, 1)
	p.out = make(chan Event)
	go p.run()
}

func (p *eventPump) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *eventPump) push(e Event) {
	p.mu.Lock()
	if h, ok := p.held[e.ID]; ok {
		p.held[e.ID] = append(h, e)
	} else {
		p.q = append(p.q, e)
	}
	p.mu.Unlock()
	p.signal()
}

func (p *eventPump) hold(id uint64) {
	p.mu.Lock()
	if _, ok := p.held[id]; !ok {
		p.held[id] = nil
	}
	p.mu.Unlock()
}

func (p *eventPump) release(id uint64) {
	p.mu.Lock()
	h, ok := p.held[id]
	delete(p.held, id)
	p.q = append(p.q, h...)
	p.mu.Unlock()
	if ok {
		p.signal()
	}
}

func (p *eventPump) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.signal()
}

func (p *eventPump) run() {
	for {
		p.mu.Lock()
		if len(p.q) == 0 {
			if p.closed && len(p.held) == 0 {
				p.mu.Unlock()
				close(p.out)
				return
			}
			p.mu.Unlock()
			<-p.wake
			continue
		}
		e := p.q[0]
		p.q = p.q[1:]
		p.mu.Unlock()
		p.out <- e
	}
}

// tailBuffer keeps the last max bytes written to it (the holder's stderr).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
