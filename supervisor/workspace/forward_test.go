package workspace

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
)

// TestForwardRelaysAndCloses drives a forward over real loopback sockets:
// bytes go both ways with half-closes, and Close ends a live relay.
func TestForwardRelaysAndCloses(t *testing.T) {
	echo, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.(*net.TCPConn).CloseWrite() }()
		}
	}()
	target := echo.Addr().(*net.TCPAddr).Port
	f, err := ListenForward(target)
	if err != nil {
		t.Fatal(err)
	}
	var d net.Dialer
	dialed := make(chan int, 4)
	dial := func(ctx context.Context, port int) (net.Conn, error) {
		dialed <- port
		return d.DialContext(ctx, "tcp4", echo.Addr().String())
	}
	go f.Serve(context.Background(), dial, slog.New(slog.DiscardHandler))

	c, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(f.Port())))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "ping" {
		t.Fatalf("relayed %q, %v", got, err)
	}
	c.Close()
	if p := <-dialed; p != target {
		t.Errorf("dialed port %d, want %d", p, target)
	}

	// A relay still open when the forward closes is ended by Close.
	live, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(f.Port())))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if _, err := live.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(live, buf); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := live.Read(buf); err == nil {
		t.Error("relay survived Close")
	}
	if _, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(f.Port()))); err == nil {
		t.Error("listener survived Close")
	}
	if got := f.Object(); got["target_port"] != target {
		t.Errorf("object %v", got)
	}
}
