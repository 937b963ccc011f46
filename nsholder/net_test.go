package nsholder

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestHelperArgs pins the options that keep the host's loopback and ports
// out of an isolated session; the e2e tests probe what they can without
// sending traffic off this machine (the gateway mapping is not among it:
// with --no-map-gw a connection to the gateway leaves the host).
func TestHelperArgs(t *testing.T) {
	for _, tc := range []struct {
		helper string
		want   [][]string // each a run of consecutive arguments
	}{
		{HelperPasta, [][]string{{"--no-map-gw"}, {"-T", "none"}, {"-U", "none"}, {"-t", "none"}, {"-u", "none"},
			{"-4"}, {"-f"}, {"--config-net"}, {"-a", NetSessionAddr}, {"-g", NetGateway}, {"--dns-forward", NetDNS}, {"-P", "/run/x/pid"}}},
		{HelperSlirp4netns, [][]string{{"--disable-host-loopback"}, {"--configure"}, {"--cidr=198.18.0.0/24"}, {"--ready-fd=3"},
			{"--userns-path=/proc/42/ns/user"}, {"--netns-type=path", "/proc/42/ns/net", "eth0"}}},
	} {
		t.Run(tc.helper, func(t *testing.T) {
			args := Egress{Helper: tc.helper}.HelperArgs(42, "/run/x/pid", 3)
			for _, w := range tc.want {
				i := slices.Index(args, w[0])
				if i < 0 || i+len(w) > len(args) || !slices.Equal(args[i:i+len(w)], w) {
					t.Errorf("%s args %q lack %q", tc.helper, args, w)
				}
			}
			if tc.helper == HelperPasta && args[len(args)-1] != "42" {
				t.Errorf("pasta must attach to the holder's PID last: %q", args)
			}
		})
	}
}

func helperUsable(t *testing.T, helper string) string {
	t.Helper()
	p, err := exec.LookPath(helper)
	if err != nil {
		requireOrSkip(t, "%s not installed (apt-get install passt slirp4netns)", helper)
	}
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		requireOrSkip(t, "/dev/net/tun: %v (needs mode 0666)", err)
	}
	f.Close()
	return p
}

func requireOrSkip(t *testing.T, format string, a ...any) {
	t.Helper()
	if os.Getenv("ESBX_REQUIRE_ALL") == "1" {
		t.Fatalf(format, a...)
	}
	t.Skipf(format, a...)
}

// TestEgress: with Config.Egress the holder's namespace gets eth0 with the
// session address, a default route and, with BlockPrivate, prohibit routes
// for the private ranges; the helper is a child of the caller and ends
// with the holder.
func TestEgress(t *testing.T) {
	for _, helper := range []string{HelperPasta, HelperSlirp4netns} {
		t.Run(helper, func(t *testing.T) {
			path := helperUsable(t, helper)
			f := newFixture(t)
			cfg := f.config("sess-egress")
			cfg.IsolatedNetwork, cfg.BlockPrivate, cfg.ResolvConf = true, true, ResolvConf
			cfg.Egress = &Egress{Helper: helper, Path: path, StateDir: t.TempDir()}
			s := startSession(t, cfg)
			hp := s.h.HelperPid()
			if hp == 0 {
				t.Fatal("no helper pid")
			}
			if got := s.ok("cat /etc/resolv.conf"); got != "nameserver "+NetDNS {
				t.Errorf("resolv.conf = %q", got)
			}
			routes := s.ok("cat /proc/net/route")
			// Destinations in /proc/net/route are little-endian hex: 0000000A is 10.0.0.0.
			for _, want := range []string{"eth0\t00000000", "0000000A", "0000FEA9"} {
				if !strings.Contains(routes, want) {
					t.Errorf("routes lack %q:\n%s", want, routes)
				}
			}
			if got := s.ok("grep -c " + NetSessionAddr + " /proc/net/fib_trie"); got == "0" {
				t.Errorf("session address missing")
			}
			if err := s.h.Close(time.Second); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for syscall.Kill(hp, 0) == nil && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if syscall.Kill(hp, 0) == nil {
				t.Errorf("helper %d outlives its holder", hp)
			}
		})
	}
}

// TestEgressFailureLeavesNothing: a helper that cannot start fails the
// setup at stage network and leaves no holder behind.
func TestEgressFailureLeavesNothing(t *testing.T) {
	f := newFixture(t)
	cfg := f.config("sess-egress-fail")
	cfg.IsolatedNetwork = true
	cfg.Egress = &Egress{Helper: HelperPasta, Path: "/bin/false", StateDir: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := Start(ctx, testSelf, cfg)
	var se *SetupError
	if err == nil {
		h.Close(0)
		t.Fatal("Start succeeded with a failing helper")
	}
	if !errors.As(err, &se) || se.Stage != "network" || !strings.Contains(se.Err, "exited before the namespace was configured") {
		t.Fatalf("err = %v", err)
	}
}

// TestDialLoopback: the holder connects inside its own namespace and hands
// the socket over; many dials at once do not hold up other requests, and
// a refused port is an error with ECONNREFUSED.
func TestDialLoopback(t *testing.T) {
	f := newFixture(t)
	cfg := f.config("sess-dial")
	cfg.IsolatedNetwork = true
	s := startSession(t, cfg)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no python3 for the server")
	}
	srv := s.spawn(`exec python3 -c '
import socket, threading
s = socket.socket(); s.bind(("127.0.0.1", 47400)); s.listen(64); print("up", flush=True)
def echo(c):
    f = c.makefile("rwb"); f.write(b"echo:" + f.readline()); f.flush(); c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=echo, args=(c,)).start()'`)
	defer srv.p.PTY.Close()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := s.h.DialLoopback(ctx, 47400, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Go(func() {
			c, err := s.h.DialLoopback(ctx, 47400, 5*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			fmt.Fprintf(c, "%d\n", i)
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || line != fmt.Sprintf("echo:%d\n", i) {
				errs <- fmt.Errorf("dial %d: %q %v", i, line, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, err := s.h.DialLoopback(ctx, 47401, time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("refused port: %v", err)
	}
	if _, err := s.h.DialLoopback(ctx, 0, time.Second); err == nil {
		t.Errorf("port 0 accepted")
	}
}
