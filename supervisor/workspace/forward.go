package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Forward is one loopback listener relaying into a session (forward_port,
// §5.7): every connection accepted is relayed to the session's target port.
type Forward struct {
	Target int
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{} // both ends of every live relay
	closed bool
}

// ListenForward opens a forward's listener on an ephemeral loopback port;
// Serve then accepts on it until Close.
func ListenForward(target int) (*Forward, error) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen on loopback: %w", err)
	}
	f := &Forward{Target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1) // the accept loop, counted before Close can wait for it
	return f, nil
}

func (f *Forward) Port() int { return f.ln.Addr().(*net.TCPAddr).Port }

// Object is the forward as forward_port and the session views show it.
func (f *Forward) Object() map[string]any {
	return map[string]any{"target_port": f.Target, "host": "127.0.0.1", "port": f.Port()}
}

func (f *Forward) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forward) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	c.Close()
}

// Close stops accepting, ends every relay and waits for them.
func (f *Forward) Close() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.ln.Close()
	f.wg.Wait()
}

// Serve accepts until the listener is closed and relays each connection to
// dial(ctx, Target). ctx outlives the request that opened the forward: a
// relay ends with the forward, not with that request.
func (f *Forward) Serve(ctx context.Context, dial func(ctx context.Context, port int) (net.Conn, error), log *slog.Logger) {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			log.Warn("forward accept", "target_port", f.Target, "err", err)
			time.Sleep(50 * time.Millisecond) // EMFILE and the like: do not spin
			continue
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(c)
			inner, err := dial(ctx, f.Target)
			if err != nil {
				log.Debug("forward dial", "target_port", f.Target, "err", err)
				return
			}
			if !f.track(inner) {
				inner.Close()
				return
			}
			defer f.untrack(inner)
			Relay(c, inner)
		}()
	}
}

// Relay copies both ways; each direction's EOF half-closes the other side,
// and the function returns when both directions are done.
func Relay(a, b net.Conn) {
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		// Plain reads and writes through a buffer, not io.Copy's splice:
		// splice borrows pipes from a runtime pool that is only drained by
		// the garbage collector, so an idle supervisor would sit on two
		// descriptors per direction of every past concurrent connection.
		buf := make([]byte, 32<<10)
		_, _ = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
		done <- struct{}{}
	}
	go pipe(a, b)
	go pipe(b, a)
	<-done
	<-done
}
