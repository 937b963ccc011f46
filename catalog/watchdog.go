package catalog

// The response watchdog (issue 36 item 3). A request may rightly take
// minutes (a long exec yield, a squash, a publish gate), so the client sets
// no deadline of its own on the response; but a supervisor that is stopped
// (SIGSTOP, a debugger, a frozen cgroup) or wedged never answers, and
// every client waited forever. While a response is outstanding the client
// asks the supervisor for health on a second connection every
// ProbeInterval; a supervisor that answers it is alive and the wait goes
// on; one that does not answer within ProbeInterval ends the request with
// connection_error saying so — its outcome unknown, since the request may
// still run once the supervisor resumes. SANDBOX_CLIENT_PROBE_S overrides
// the interval (seconds; 0 disables the watchdog).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultProbeInterval is how long a response may be silent before the
// supervisor is probed, and how long the probe may take.
const DefaultProbeInterval = 15 * time.Second

func probeInterval() time.Duration {
	if v, err := strconv.ParseFloat(os.Getenv("SANDBOX_CLIENT_PROBE_S"), 64); err == nil && v >= 0 {
		return time.Duration(v * float64(time.Second))
	}
	return DefaultProbeInterval
}

// watchdog probes the supervisor while the response to a request is
// outstanding; abort is called (once) when a probe goes unanswered.
type watchdog struct {
	stop   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	reason *Error
}

func (c *Client) watch(ctx context.Context, abort func()) *watchdog {
	w := &watchdog{stop: make(chan struct{})}
	every := probeInterval()
	if every <= 0 {
		return w
	}
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		waited := time.Now()
		for {
			select {
			case <-w.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := c.probe(ctx, every); err != nil {
				w.mu.Lock()
				w.reason = c.unanswered(time.Since(waited), err)
				w.mu.Unlock()
				abort()
				return
			}
		}
	}()
	return w
}

// done ends the watch; it returns the error that aborted the request, if
// the watchdog did.
func (w *watchdog) done() *Error {
	w.once.Do(func() { close(w.stop) })
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reason
}

// probe sends health on a new connection and waits up to d for any answer
// line (server_busy is an answer too: the supervisor is alive).
func (c *Client) probe(ctx context.Context, d time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	conn, err := c.dial(pctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(d))
	line, err := json.Marshal(c.wireRequest(&Request{Op: "health", Scope: RequestScope{Kind: "system"}}))
	if err != nil {
		return err
	}
	if _, err := conn.Write(append(line, '\n')); err != nil {
		return err
	}
	_, err = bufio.NewReader(conn).ReadBytes('\n')
	return err
}

// unanswered is the connection_error of a request whose supervisor did not
// answer a probe: with the supervisor's pid and, from /proc, whether it is
// stopped.
func (c *Client) unanswered(waited time.Duration, probeErr error) *Error {
	e := Errorf(ConnectionError, "no response from the supervisor at %s after %s, and it did not answer a health probe either (%v)",
		c.Endpoint, waited.Round(time.Second), probeErr).With("endpoint", c.Endpoint.String()).With("waited_ms", waited.Milliseconds()).
		With("outcome", "unknown")
	if c.Endpoint.Network != "unix" {
		e.Message += "; the request's outcome is unknown: it may still complete"
		return e
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(c.Endpoint.Address), "supervisor.pid"))
	pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || perr != nil {
		e.Message += "; the request's outcome is unknown: it may still complete"
		return e
	}
	e.With("supervisor_pid", pid)
	state := procState(pid)
	if state != "" {
		e.With("supervisor_state", state)
	}
	if state == "stopped" {
		e.Message += fmt.Sprintf("; supervisor pid %d is stopped (SIGSTOP or job control; kill -CONT %d resumes it)", pid, pid)
	} else {
		e.Message += fmt.Sprintf("; supervisor pid %d is %s", pid, orUnknown(state))
	}
	e.Message += "; the request's outcome is unknown: it may still complete once the supervisor runs again"
	return e
}

func orUnknown(s string) string {
	if s == "" {
		return "in an unknown state"
	}
	return s
}

// procState is the state letter of /proc/PID/stat in words ("" when
// unreadable).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "gone"
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	switch s[i+2] {
	case 'T', 't':
		return "stopped"
	case 'Z', 'X':
		return "gone"
	case 'D':
		return "in uninterruptible sleep"
	default:
		return "running but not answering"
	}
}
