package catalog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Client sends one request per connection to a supervisor.
type Client struct {
	Endpoint Endpoint
	// Token is sent as the gateway token on TCP endpoints only.
	Token string
	// Autostart starts `sandbox-supervisor serve` when nobody answers on the
	// Unix socket (set only when the client resolved the endpoint itself).
	Autostart bool
	// Log receives progress messages (§2.5) when the request asked for them.
	Log func(msg string)
}

// Call sends req and returns the decoded response object. A supervisor error
// envelope is returned as the response (callers use ErrorFromResponse); the
// *Error result is only for transport failures: connection_error and
// protocol_error, or config_error when a Unix endpoint is not the user's
// (CheckPrivateDir on its directory, then SO_PEERCRED of the listener, both
// before anything is sent).
func (c *Client) Call(ctx context.Context, req *Request) (map[string]any, *Error) {
	if c.Endpoint.Network == "unix" {
		// A missing directory is fine here: nobody answers, and autostart
		// creates it (and checks it again) before using it.
		if err := CheckPrivateDir("socket directory", filepath.Dir(c.Endpoint.Address)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, asConfigError(err)
		}
	}
	conn, err := c.dial(ctx)
	if err != nil && c.Autostart && c.Endpoint.Network == "unix" && os.Getenv("SANDBOX_NO_AUTOSTART") != "1" && notListening(err) {
		if serr := StartSupervisor(ctx, c.Endpoint.Address); serr != nil {
			return nil, startFailure(serr, c.Endpoint)
		}
		conn, err = c.dial(ctx)
	}
	if err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			return nil, ce
		}
		return nil, Errorf(ConnectionError, "cannot connect to %s: %v", c.Endpoint, err).With("endpoint", c.Endpoint.String())
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	// A supervisor that stops answering ends the wait (watchdog.go).
	wd := c.watch(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	resp, e := c.exchange(conn, req)
	if reason := wd.done(); reason != nil && e != nil {
		return nil, reason
	}
	return resp, e
}

// exchange writes req on conn and reads its response.
func (c *Client) exchange(conn net.Conn, req *Request) (map[string]any, *Error) {
	line, err := json.Marshal(c.wireRequest(req))
	if err != nil {
		return nil, Errorf(ProtocolError, "cannot encode request: %v", err)
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	if _, err := conn.Write(append(line, '\n')); err != nil {
		// The supervisor may have answered and closed before reading
		// (unauthorized, server_busy): that answer is the response.
		if resp, rerr := c.readResponse(r); rerr == nil {
			return resp, nil
		}
		return nil, Errorf(ConnectionError, "cannot send request: %v", err)
	}
	return c.readResponse(r)
}

func (c *Client) wireRequest(req *Request) map[string]any {
	scope := map[string]any{"kind": req.Scope.Kind}
	if req.Scope.Kind == "sandbox" {
		scope["sandbox_id"] = req.Scope.SandboxID
	}
	args := req.Args
	if args == nil {
		args = map[string]any{}
	}
	m := map[string]any{"op": req.Op, "scope": scope, "args": args, "_stream_logs": req.StreamLogs}
	if req.RequestID != "" {
		m["request_id"] = req.RequestID
	}
	if c.Endpoint.Network == "tcp" && c.Token != "" {
		m[TokenField] = c.Token
	}
	return m
}

func (c *Client) readResponse(r *bufio.Reader) (map[string]any, *Error) {
	for {
		line, err := readLine(r, MaxLineBytes)
		if err != nil {
			if errors.Is(err, errLineTooLong) {
				return nil, Errorf(ProtocolError, "response line exceeds %d bytes", MaxLineBytes)
			}
			return nil, Errorf(ConnectionError, "connection closed before a response: %v", err)
		}
		if rest, ok := bytes.CutPrefix(line, []byte("cli_log(")); ok {
			var msg string
			if json.Unmarshal(bytes.TrimSuffix(rest, []byte(")")), &msg) == nil && c.Log != nil {
				c.Log(msg)
			}
			continue
		}
		d := json.NewDecoder(bytes.NewReader(line))
		d.UseNumber()
		var m map[string]any
		if err := d.Decode(&m); err != nil || m == nil || d.More() {
			return nil, Errorf(ProtocolError, "response is not one JSON object line")
		}
		return m, nil
	}
}

var errLineTooLong = errors.New("line too long")

// readLine reads one '\n'-terminated line of at most max bytes (newline
// included) and returns it without the newline.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(buf)+len(chunk) > max {
			return nil, errLineTooLong
		}
		buf = append(buf, chunk...)
		switch {
		case err == nil:
			return buf[:len(buf)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

// dial connects and, on a Unix socket, checks who is listening before the
// caller may write anything (a mismatch is a config_error).
func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, c.Endpoint.Network, c.Endpoint.Address)
	if err != nil {
		return nil, err
	}
	if err := checkPeer(conn, c.Endpoint.String()); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// asConfigError keeps a *Error as is and makes anything else a config_error.
func asConfigError(err error) *Error {
	var ce *Error
	if errors.As(err, &ce) {
		return ce
	}
	return Errorf(ConfigError, "%v", err)
}

// startFailure is the envelope of a failed autostart: a config_error when
// the runtime directory or the log refused (nothing was started), else a
// connection_error carrying the supervisor's own reason and its log (§2.7).
func startFailure(err error, ep Endpoint) *Error {
	var ce *Error
	if errors.As(err, &ce) {
		return ce.With("endpoint", ep.String())
	}
	e := Errorf(ConnectionError, "cannot start the supervisor: %v", err).With("endpoint", ep.String())
	var se *StartError
	if errors.As(err, &se) {
		e.With("log", se.Log)
		if se.Reason != "" {
			e.With("reason", se.Reason)
		}
	}
	return e
}

func notListening(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// StartError is an autostarted supervisor that did not come up: Reason is
// its own last word about this start (from its log), Log where to read more.
type StartError struct {
	Log    string
	Reason string
	Err    error
}

func (e *StartError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%v: %s; see %s", e.Err, e.Reason, e.Log)
	}
	return fmt.Sprintf("%v; see %s", e.Err, e.Log)
}

func (e *StartError) Unwrap() error { return e.Err }

// StartSupervisor starts `sandbox-supervisor serve` detached (own session,
// same environment, output appended to supervisor.log beside the socket) and
// waits up to 10 s for the socket to answer. The socket's directory is
// created 0700 or must pass CheckPrivateDir, and the log is opened below a
// descriptor of that verified directory without following a symlink, so a
// planted directory or log cannot redirect the supervisor's output: those
// refusals are config_error and start nothing. A supervisor that exits is
// a *StartError.
func StartSupervisor(ctx context.Context, socket string) error {
	bin, err := supervisorBinary()
	if err != nil {
		return err
	}
	logf, err := openStartLog(filepath.Dir(socket))
	if err != nil {
		return err
	}
	defer logf.Close()
	// Only what this start writes explains this start: the log is shared
	// with earlier ones.
	var from int64
	if st, err := logf.Stat(); err == nil {
		from = st.Size()
	}
	cmd := exec.Command(bin, "serve")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var d net.Dialer
		if conn, err := d.DialContext(ctx, "unix", socket); err == nil {
			conn.Close()
			return nil
		}
		select {
		case err := <-exited:
			// Another client may have won the race to start one.
			if conn, derr := net.Dial("unix", socket); derr == nil {
				conn.Close()
				return nil
			}
			return &StartError{Log: logf.Name(), Reason: startReason(logf, from),
				Err: fmt.Errorf("sandbox-supervisor serve exited (%w)", err)}
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return &StartError{Log: logf.Name(), Err: fmt.Errorf("the supervisor did not answer on %s within 10s", socket)}
}

// openStartLog creates the socket directory if needed, verifies it through
// a descriptor (so it cannot be swapped between check and use) and opens
// supervisor.log in it for appending, refusing a symlink or anything but a
// regular file of ours.
func openStartLog(dir string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, Errorf(ConfigError, "create %s: %v", filepath.Dir(dir), err).With("path", filepath.Dir(dir))
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, Errorf(ConfigError, "create socket directory %s: %v", dir, err).With("path", dir)
	}
	if err := CheckPrivateDir("socket directory", dir); err != nil {
		return nil, asConfigError(err)
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, Errorf(ConfigError, "open socket directory %s: %v", dir, err).With("path", dir)
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return nil, Errorf(ConfigError, "socket directory %s: %v", dir, err).With("path", dir)
	}
	if err := checkPrivateStat("socket directory", dir, &st); err != nil {
		return nil, err
	}
	p := filepath.Join(dir, "supervisor.log")
	// Read as well as append: the reason for a failed start is read back.
	fd, err := unix.Openat(dfd, "supervisor.log", unix.O_RDWR|unix.O_CREAT|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.ELOOP) {
		return nil, Errorf(ConfigError, "%s is a symlink; the supervisor's log is never written through one (remove it)", p).With("path", p)
	}
	if err != nil {
		return nil, Errorf(ConfigError, "open %s: %v", p, err).With("path", p)
	}
	f := os.NewFile(uintptr(fd), p)
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() {
		f.Close()
		return nil, Errorf(ConfigError, "%s must be a regular file owned by you (uid %d)", p, os.Geteuid()).With("path", p)
	}
	return f, nil
}

// startReason finds the supervisor's explanation among the lines it wrote
// after offset from: its error envelope (start refusals are printed as
// one), else the last ERROR log line or panic, else the last line.
func startReason(f *os.File, from int64) string {
	const window = 64 << 10
	st, err := f.Stat()
	if err != nil || st.Size() <= from {
		return ""
	}
	start := max(from, st.Size()-window)
	buf := make([]byte, st.Size()-start)
	n, _ := f.ReadAt(buf, start)
	lines := strings.Split(strings.TrimSpace(string(buf[:n])), "\n")
	var errLine, panicLine, last string
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" {
			continue
		}
		if last == "" {
			last = l
		}
		var env struct {
			Error *Error `json:"error"`
		}
		if strings.HasPrefix(l, "{") && json.Unmarshal([]byte(l), &env) == nil && env.Error != nil && env.Error.Message != "" {
			return clip(env.Error.Message)
		}
		if errLine == "" && strings.Contains(l, "level=ERROR") {
			errLine = l
		}
		if panicLine == "" && strings.HasPrefix(l, "panic: ") {
			panicLine = l
		}
	}
	for _, l := range []string{errLine, panicLine, last} {
		if l != "" {
			return clip(l)
		}
	}
	return ""
}

func clip(s string) string {
	const limit = 2000
	if len(s) > limit {
		return s[:limit] + "…"
	}
	return s
}

func supervisorBinary() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "sandbox-supervisor")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath("sandbox-supervisor")
	if err != nil {
		return "", fmt.Errorf("sandbox-supervisor is neither next to this binary nor on PATH")
	}
	return p, nil
}
