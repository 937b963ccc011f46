package catalog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
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
// protocol_error.
func (c *Client) Call(ctx context.Context, req *Request) (map[string]any, *Error) {
	conn, err := c.dial(ctx)
	if err != nil && c.Autostart && c.Endpoint.Network == "unix" && os.Getenv("SANDBOX_NO_AUTOSTART") != "1" && notListening(err) {
		if serr := StartSupervisor(ctx, c.Endpoint.Address); serr != nil {
			return nil, Errorf(ConnectionError, "cannot start the supervisor: %v", serr).With("endpoint", c.Endpoint.String())
		}
		conn, err = c.dial(ctx)
	}
	if err != nil {
		return nil, Errorf(ConnectionError, "cannot connect to %s: %v", c.Endpoint, err).With("endpoint", c.Endpoint.String())
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

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

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, c.Endpoint.Network, c.Endpoint.Address)
}

func notListening(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// StartSupervisor starts `sandbox-supervisor serve` detached (own session,
// same environment, output appended to supervisor.log beside the socket) and
// waits up to 10 s for the socket to answer.
func StartSupervisor(ctx context.Context, socket string) error {
	bin, err := supervisorBinary()
	if err != nil {
		return err
	}
	dir := filepath.Dir(socket)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "supervisor.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "serve")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
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
			return fmt.Errorf("sandbox-supervisor serve exited (%v); see %s", err, logf.Name())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("the supervisor did not answer on %s within 10s; see %s", socket, logf.Name())
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
