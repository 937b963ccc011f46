package rpc

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// unixPair returns the two ends of a connected Unix stream socket.
func unixPair(t *testing.T) (ours, peer *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestWatchHangup: a peer's full close cancels the request context, a
// half-close (the peer still reads the answer) does not; the state before
// the watch starts is checked synchronously, so these cases need no waiting.
func TestWatchHangup(t *testing.T) {
	cases := []struct {
		name   string
		before func(peer *net.UnixConn)
		gone   bool
	}{
		{"peer open", func(*net.UnixConn) {}, false},
		{"peer half-closed", func(p *net.UnixConn) { _ = p.CloseWrite() }, false},
		{"peer closed", func(p *net.UnixConn) { _ = p.Close() }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ours, peer := unixPair(t)
			c.before(peer)
			ctx, stop := WatchHangup(t.Context(), ours)
			gone := errors.Is(context.Cause(ctx), ErrClientGone)
			stop()
			if gone != c.gone {
				t.Fatalf("cancelled for the client's hang-up: %v, want %v (cause %v)", gone, c.gone, context.Cause(ctx))
			}
			if ctx.Err() == nil {
				t.Fatal("stop left the context live")
			}
			// The connection itself is untouched by the watch.
			if !c.gone {
				if _, err := ours.Write([]byte("answer\n")); err != nil {
					t.Fatalf("write the answer after the watch: %v", err)
				}
			}
		})
	}
	t.Run("peer closes while the request runs", func(t *testing.T) {
		ours, peer := unixPair(t)
		ctx, stop := WatchHangup(t.Context(), ours)
		defer stop()
		peer.Close()
		<-ctx.Done() // the test's own timeout bounds a watch that never fires
		if !errors.Is(context.Cause(ctx), ErrClientGone) {
			t.Fatalf("cause %v", context.Cause(ctx))
		}
	})
}
