package supervisor

// Descriptor exhaustion (issue 36 item 3). At RLIMIT_NOFILE, accept(2)
// fails with EMFILE and leaves the connection in the backlog: clients
// waited with no answer (health included) while the accept loop spun on
// the error. The supervisor keeps a small reserve of descriptors instead:
//
//   - on EMFILE it closes the reserve, accepts the waiting connection with
//     one of the freed descriptors, and reopens what it can;
//   - a connection accepted with a descriptor number within fdMargin of
//     the limit (descriptors are allocated lowest first, so every lower
//     one is in use) is served the same way;
//   - such a connection gets a short time to send its request (an idle
//     client must not keep the last descriptors), and any operation but
//     health is refused with server_busy, details.max_open_files.
//
// New work (sessions, commands, publishes) needs descriptors of its own
// and would fail half-way; refusing it at the door is the clear answer.

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"golang.org/x/sys/unix"
)

const (
	fdReserve         = 8               // descriptors held back for answering under exhaustion
	fdPressureTimeout = 2 * time.Second // request-line read timeout of a connection under pressure
)

type fdGuard struct {
	limit   int // RLIMIT_NOFILE soft limit (Go raises it to the hard limit at start)
	margin  int // pressure when a new connection's descriptor is ≥ limit-margin
	mu      sync.Mutex
	reserve []*os.File
	warned  time.Time
}

func newFDGuard() *fdGuard {
	g := &fdGuard{}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < 1<<30 {
		g.limit = int(rl.Cur)
		g.margin = min(max(g.limit/8, 2*fdReserve), 256)
	}
	g.refill()
	return g
}

// refill reopens the reserve up to fdReserve descriptors, as far as the
// limit allows.
func (g *fdGuard) refill() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.reserve) < fdReserve {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return
		}
		g.reserve = append(g.reserve, f)
	}
}

// release closes the reserve; false when it was empty.
func (g *fdGuard) release() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, f := range g.reserve {
		f.Close()
	}
	n := len(g.reserve)
	g.reserve = nil
	return n > 0
}

// pressured reports whether conn's descriptor is within the margin of the
// limit.
func (g *fdGuard) pressured(conn net.Conn) bool {
	if g.limit == 0 {
		return false
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	fd := -1
	_ = raw.Control(func(f uintptr) { fd = int(f) })
	return fd >= g.limit-g.margin
}

// warnDue rate-limits the exhaustion warning to one every 10 s.
func (g *fdGuard) warnDue() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if time.Since(g.warned) < 10*time.Second {
		return false
	}
	g.warned = time.Now()
	return true
}

func fdExhausted(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE)
}

// busyError is the refusal of new work under descriptor pressure.
func (g *fdGuard) busyError() *catalog.Error {
	return catalog.Errorf(catalog.ServerBusy, "the supervisor is out of file descriptors (RLIMIT_NOFILE %d): new work is refused until some are released; health is still served", g.limit).
		With("max_open_files", g.limit)
}

// servedUnderPressure are the operations still served at the limit.
var servedUnderPressure = map[string]bool{"health": true}

// pressureOp is the op of a request line ("" when it does not parse).
func pressureOp(line []byte) string {
	var r struct {
		Op string `json:"op"`
	}
	_ = json.Unmarshal(line, &r)
	return r.Op
}
