// Package clitest is a fake supervisor for the client packages' unit tests:
// it accepts connections, records each request line and answers with canned
// lines. It checks only what a client sends; the real supervisor is tested
// end to end in tests/.
//
// It must never stand in for the supervisor in an end-to-end test.
package clitest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Reply returns the lines (without newlines) answering one request.
type Reply func(req map[string]any) []string

// Supervisor is a fake supervisor listening on a Unix socket or TCP.
type Supervisor struct {
	// Endpoint is the address to pass to --endpoint.
	Endpoint string
	// Path is the socket path (Unix only).
	Path  string
	ln    net.Listener
	reply Reply
	mu    sync.Mutex
	reqs  []map[string]any
	raw   []string
	wg    sync.WaitGroup
}

// Echo answers every request with {"ok":true,"op":<op>}.
func Echo(req map[string]any) []string {
	b, _ := json.Marshal(map[string]any{"ok": true, "op": req["op"]})
	return []string{string(b)}
}

// Lines answers every request with the given lines.
func Lines(lines ...string) Reply { return func(map[string]any) []string { return lines } }

// NewUnix starts a fake supervisor on a fresh Unix socket.
func NewUnix(t testing.TB, reply Reply) *Supervisor {
	t.Helper()
	dir, err := os.MkdirTemp("", "esbx-fake-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "supervisor.sock")
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	s := &Supervisor{Endpoint: p, Path: p, ln: ln, reply: reply}
	s.start(t)
	return s
}

// NewTCP starts a fake supervisor on 127.0.0.1.
func NewTCP(t testing.TB, reply Reply) *Supervisor {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Supervisor{Endpoint: "tcp://" + ln.Addr().String(), ln: ln, reply: reply}
	s.start(t)
	return s
}

func (s *Supervisor) start(t testing.TB) {
	t.Cleanup(func() { s.ln.Close(); s.wg.Wait() })
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				line, err := bufio.NewReader(c).ReadBytes('\n')
				if err != nil {
					return
				}
				d := json.NewDecoder(bytes.NewReader(line))
				d.UseNumber()
				var req map[string]any
				_ = d.Decode(&req)
				s.mu.Lock()
				s.reqs = append(s.reqs, req)
				s.raw = append(s.raw, string(line))
				s.mu.Unlock()
				for _, l := range s.reply(req) {
					if _, err := c.Write([]byte(l + "\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// Requests returns the decoded requests received so far.
func (s *Supervisor) Requests() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]any(nil), s.reqs...)
}

// RawLines returns the request lines received so far, newline included.
func (s *Supervisor) RawLines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.raw...)
}
