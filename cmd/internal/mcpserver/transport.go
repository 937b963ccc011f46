package mcpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"sync"

	"github.com/mark3labs/mcp-go/server"
)

// Serve runs the server over newline-delimited JSON-RPC on in/out until in
// ends or ctx is cancelled. When in ends, Serve first waits for the answers
// to the requests already read (mcp-go would otherwise cancel them), so
// `printf '…' | sandbox-mcp --set …` gets every response.
func Serve(ctx context.Context, s *server.MCPServer, in io.Reader, out, errLog io.Writer) error {
	t := &tracker{pending: map[string]int{}, cancelled: map[string]bool{}, idle: make(chan struct{}, 1)}
	stdio := server.NewStdioServer(s)
	stdio.SetErrorLogger(log.New(errLog, Name+": ", log.LstdFlags))
	err := stdio.Listen(ctx, &drainReader{ctx: ctx, r: bufio.NewReaderSize(in, 64<<10), t: t}, &trackingWriter{w: out, t: t})
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// tracker counts the requests read and not yet answered, by JSON-RPC id,
// and remembers the ones the client cancelled: the MCP specification says a
// cancelled request gets no response, while mcp-go writes the handler's
// answer anyway.
type tracker struct {
	mu        sync.Mutex
	pending   map[string]int
	cancelled map[string]bool
	idle      chan struct{}
}

type wireMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		RequestID json.RawMessage `json:"requestId"`
	} `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// idKey normalizes a JSON-RPC id (1 and 1.0 are the same id).
func idKey(raw json.RawMessage) (string, bool) {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil || v == nil {
		return "", false
	}
	b, _ := json.Marshal(v)
	return string(b), true
}

func (t *tracker) add(key string, delta int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := t.pending[key] + delta; n > 0 {
		t.pending[key] = n
	} else {
		delete(t.pending, key)
	}
	if len(t.pending) == 0 {
		select {
		case t.idle <- struct{}{}:
		default:
		}
	}
}

func (t *tracker) empty() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending) == 0
}

// sawInput records a client request (and forgets one the client cancelled).
func (t *tracker) sawInput(line []byte) {
	var m wireMessage
	if json.Unmarshal(line, &m) != nil {
		return
	}
	if m.Method == "notifications/cancelled" {
		if k, ok := idKey(m.Params.RequestID); ok {
			t.mu.Lock()
			live := t.pending[k] > 0
			if live {
				t.cancelled[k] = true
			}
			t.mu.Unlock()
			if live {
				t.add(k, -1)
			}
		}
		return
	}
	if k, ok := idKey(m.ID); ok && m.Method != "" {
		t.add(k, 1)
	}
}

// sawOutput records the server's answer to a request and reports whether
// it must be dropped (its request was cancelled).
func (t *tracker) sawOutput(line []byte) (drop bool) {
	var m wireMessage
	if json.Unmarshal(line, &m) != nil || m.Method != "" || (m.Result == nil && m.Error == nil) {
		return false
	}
	k, ok := idKey(m.ID)
	if !ok {
		return false
	}
	t.mu.Lock()
	drop = t.cancelled[k]
	delete(t.cancelled, k)
	t.mu.Unlock()
	if !drop {
		t.add(k, -1)
	}
	return drop
}

// drainReader hands mcp-go whole input lines; at the end of input it waits
// until every request read has been answered before reporting io.EOF.
type drainReader struct {
	ctx context.Context
	r   *bufio.Reader
	t   *tracker
	buf []byte
	eof bool
}

func (d *drainReader) Read(p []byte) (int, error) {
	for len(d.buf) == 0 {
		if d.eof {
			for !d.t.empty() {
				select {
				case <-d.t.idle:
				case <-d.ctx.Done():
					return 0, io.EOF
				}
			}
			return 0, io.EOF
		}
		line, err := d.r.ReadBytes('\n')
		if len(line) > 0 {
			d.t.sawInput(line)
			if line[len(line)-1] != '\n' {
				line = append(line, '\n')
			}
			d.buf = line
		}
		if err != nil {
			d.eof = true
		}
	}
	n := copy(p, d.buf)
	d.buf = d.buf[n:]
	return n, nil
}

// trackingWriter passes output through, except answers to cancelled
// requests; mcp-go writes one message per Write.
type trackingWriter struct {
	w io.Writer
	t *tracker
}

func (w *trackingWriter) Write(p []byte) (int, error) {
	if w.t.sawOutput(p) {
		return len(p), nil
	}
	return w.w.Write(p)
}
