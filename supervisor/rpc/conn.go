package rpc

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// ReadLine applies §2.4 steps 1-2.
func ReadLine(r *bufio.Reader, max int) ([]byte, *catalog.Error) {
	var buf []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(buf)+len(chunk) > max {
			return nil, catalog.Errorf(catalog.RequestTooLarge, "request exceeds %d bytes", max).With("limit", max)
		}
		buf = append(buf, chunk...)
		switch {
		case err == nil:
			return buf[:len(buf)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, catalog.Errorf(catalog.InvalidRequest, "request read timed out")
		default:
			return nil, catalog.Errorf(catalog.InvalidRequest, "request is missing its terminating newline")
		}
	}
}

// LineWriter serializes progress lines and the one final response line.
type LineWriter struct {
	mu   sync.Mutex
	conn net.Conn
	done bool
}

// NewLineWriter writes the responses of one request to conn.
func NewLineWriter(conn net.Conn) *LineWriter { return &LineWriter{conn: conn} }

// Progress sends one _stream_logs line.
func (w *LineWriter) Progress(msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	_ = w.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, _ = w.conn.Write(catalog.LogLine(msg)) // a vanished client must not fail the operation
}

// Final sends the response line (a result or a *catalog.Error); later
// calls do nothing.
func (w *LineWriter) Final(v any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	w.done = true
	var line []byte
	if e, ok := v.(*catalog.Error); ok {
		line = e.MarshalEnvelope()
	} else {
		line = catalog.CompactJSON(v)
		if len(line)+1 > catalog.MaxLineBytes {
			line = catalog.Errorf(catalog.InternalError, "response too large").MarshalEnvelope()
		}
	}
	_ = w.conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
	_, _ = w.conn.Write(append(line, '\n'))
}

// HangupOf is the connection context of an HTTP request: cancelled with
// cause ErrClientGone when reqCtx (the HTTP request's context) ends, which
// net/http does when the client goes away.
func HangupOf(reqCtx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(reqCtx))
	stop := context.AfterFunc(reqCtx, func() { cancel(ErrClientGone) })
	return ctx, func() { stop(); cancel(nil) }
}

// WatchHangup returns a context derived from parent that is cancelled
// (cause ErrClientGone) as soon as the peer has closed the connection for
// good, and a stop function that ends the watch; call stop before closing
// conn. Only a full close counts: the kernel then reports POLLHUP on our
// end. A peer that merely shut down its sending side after the request (a
// half-close) still waits for the answer, raises only POLLRDHUP, and is not
// cancelled. On TCP a peer's close is a FIN, indistinguishable from a
// half-close until we write, so there the watch catches only resets. The
// watch runs on a duplicate descriptor, so it never races the connection's
// own Close.
func WatchHangup(parent context.Context, conn net.Conn) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	noWatch := func() { cancel(nil) }
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return ctx, noWatch
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return ctx, noWatch
	}
	dup := -1
	var derr error
	if err := raw.Control(func(fd uintptr) { dup, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || derr != nil {
		return ctx, noWatch
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(dup)
		return ctx, noWatch
	}
	const gone = unix.POLLHUP | unix.POLLERR | unix.POLLNVAL
	fds := []unix.PollFd{{Fd: int32(dup)}, {Fd: int32(wake), Events: unix.POLLIN}}
	// A client that is gone before the handler starts is seen right away.
	if n, _ := unix.Poll(fds[:1], 0); n > 0 && fds[0].Revents&gone != 0 {
		unix.Close(dup)
		unix.Close(wake)
		cancel(ErrClientGone)
		return ctx, noWatch
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer unix.Close(dup) // wake is stop's to close: it writes to it
		for {
			_, err := unix.Poll(fds, -1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || fds[1].Revents != 0 {
				return
			}
			if fds[0].Revents&gone != 0 {
				cancel(ErrClientGone)
				return
			}
		}
	}()
	return ctx, func() {
		var one [8]byte
		one[0] = 1 // eventfd counters are host-endian uint64; any non-zero value wakes
		_, _ = unix.Write(wake, one[:])
		<-done
		unix.Close(wake)
		cancel(nil)
	}
}
