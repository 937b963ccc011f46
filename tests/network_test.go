package tests

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Network tests keep their traffic on this machine: "the outside" is a
// server bound to the host's own non-loopback address, which an isolated
// session reaches only through its helper's host sockets (its own
// namespace has a different address, 198.18.0.100).

// hostAddr is the first non-loopback IPv4 address of this host.
func hostAddr(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.To4()
		}
	}
	skipOrFail(t, "no non-loopback IPv4 address on this host to stand in for the outside")
	return nil
}

// needHelper skips (fails under ESBX_REQUIRE_ALL) when the helper or a
// usable /dev/net/tun is missing.
func needHelper(t *testing.T, helper string) {
	t.Helper()
	if _, err := exec.LookPath(helper); err != nil {
		skipOrFail(t, "%s is not installed (apt-get install passt slirp4netns)", helper)
	}
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		skipOrFail(t, "/dev/net/tun: %v (needs mode 0666)", err)
	}
	f.Close()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		skipOrFail(t, "python3 is needed for the session side of the network tests")
	}
}

// netEnv starts a supervisor with a loopback TCP listener and the given
// network.isolated settings, and creates a sandbox.
func netEnv(t *testing.T, isolated string) (*env, string) {
	t.Helper()
	e := newEnv(t)
	writeConfig(t, e, "network:\n  isolated:\n"+isolated)
	e.start("--listen", "tcp://127.0.0.1:0")
	return e, e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
}

// echoServers runs a TCP and a UDP echo server on ip and returns their ports.
func echoServers(t *testing.T, ip net.IP) (tcpPort, udpPort int) {
	t.Helper()
	ln, err := net.Listen("tcp4", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	pc, err := net.ListenPacket("udp4", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	echo(ln, pc)
	return ln.Addr().(*net.TCPAddr).Port, pc.LocalAddr().(*net.UDPAddr).Port
}

// echo answers one line per TCP connection with "tcp-echo:<line>" and each
// UDP datagram with "udp-echo:<datagram>" until the sockets are closed.
func echo(ln net.Listener, pc net.PacketConn) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				l, _ := bufio.NewReader(c).ReadString('\n')
				fmt.Fprintf(c, "tcp-echo:%s", l)
			}()
		}
	}()
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(append([]byte("udp-echo:"), buf[:n]...), from)
		}
	}()
}

// probeScript prints one line per target: "<name> ok <reply>" or
// "<name> err <errno name>".
const probeScript = `
import socket, sys, errno
def tcp(name, host, port):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        s.sendall(b"hello\n")
        print(name, "ok", s.recv(100).decode().strip())
    except OSError as e:
        print(name, "err", errno.errorcode.get(e.errno, str(e)))
def udp(name, host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(b"hello", (host, int(port)))
        print(name, "ok", s.recv(100).decode().strip())
    except OSError as e:
        print(name, "err", errno.errorcode.get(e.errno, str(e)))
def route(name, host, port):
    # connect() on a UDP socket only looks the route up: no packet is sent.
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((host, int(port)))
        print(name, "ok routed")
    except OSError as e:
        print(name, "err", errno.errorcode.get(e.errno, str(e)))
args = sys.argv[1:]
for i in range(0, len(args), 4):
    kind, name, host, port = args[i:i+4]
    {"tcp": tcp, "udp": udp, "route": route}[kind](name, host, port)
`

// probe runs probeScript in a session with (kind name host port)… targets
// and returns name → "ok <reply>" / "err <ERRNO>".
func (e *env) probe(id, ws string, targets ...string) map[string]string {
	e.t.Helper()
	var q []string
	for _, a := range targets {
		q = append(q, "'"+a+"'")
	}
	cmd := "cat > /tmp/probe.py <<'EOF'\n" + probeScript + "\nEOF\npython3 /tmp/probe.py " + strings.Join(q, " ")
	out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "60000", cmd)
	got := map[string]string{}
	for _, l := range strings.Split(out["output"].(string), "\n") {
		if name, rest, ok := strings.Cut(strings.TrimSpace(l), " "); ok {
			got[name] = rest
		}
	}
	return got
}

// helperPids lists the supervisor's children running a network helper.
func helperPids(t *testing.T, supervisor int) []int {
	t.Helper()
	return childPids(supervisor, func(argv []string) bool {
		name := filepath.Base(argv[0])
		return name == "pasta" || name == "slirp4netns"
	})
}

// childPids lists the children of parent whose command line match accepts.
func childPids(parent int, match func(argv []string) bool) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(parent) {
			continue
		}
		argv, _ := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if match(strings.Split(strings.TrimSuffix(string(argv), "\x00"), "\x00")) {
			out = append(out, pid)
		}
	}
	return out
}

// TestIsolatedNetwork: an isolated session reaches TCP and UDP services
// outside (the host's non-loopback address) through its helper, gets the
// helper's DNS forwarder as resolver (TestDNSIsolated resolves a name
// through it), and reaches neither the host's loopback (a test server, the
// supervisor's TCP listener), nor another isolated session, nor (by
// default) private ranges; its helper ends with it. Run for both helpers.
func TestIsolatedNetwork(t *testing.T) {
	for _, helper := range []string{"pasta", "slirp4netns"} {
		t.Run(helper, func(t *testing.T) {
			needHelper(t, helper)
			ip := hostAddr(t)
			allowPrivate := ip.IsPrivate()
			e, id := netEnv(t, fmt.Sprintf("    helper: %s\n    allow_private: %v\n", helper, allowPrivate))
			tcpPort, udpPort := echoServers(t, ip)
			lo, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer lo.Close()
			loPort := strconv.Itoa(lo.Addr().(*net.TCPAddr).Port)
			_, supPort, _ := net.SplitHostPort(strings.TrimPrefix(e.tcpAddr(), "tcp://"))

			a := e.session(id, "--network-profile", "isolated")
			b := e.session(id, "--network-profile", "isolated")
			h := e.ok("sandbox-observability-cli", "health")["network"].(map[string]any)["isolated"].(map[string]any)
			if h["available"] != true || h["helper"] != helper {
				t.Errorf("health network.isolated = %v", h)
			}
			got := e.probe(id, a,
				"tcp", "out_tcp", ip.String(), strconv.Itoa(tcpPort),
				"udp", "out_udp", ip.String(), strconv.Itoa(udpPort),
				"tcp", "host_lo", "127.0.0.1", loPort,
				"tcp", "supervisor", "127.0.0.1", supPort)
			if got["out_tcp"] != "ok tcp-echo:hello" || got["out_udp"] != "ok udp-echo:hello" {
				t.Errorf("outside not reached: %v", got)
			}
			for _, k := range []string{"host_lo", "supervisor"} {
				if !strings.HasPrefix(got[k], "err ") {
					t.Errorf("%s reachable from an isolated session: %v", k, got)
				}
			}
			if rc := e.exec(id, "--workspace-session-id", a, "cat /etc/resolv.conf")["output"]; rc != "nameserver 198.18.0.3" {
				t.Errorf("resolv.conf = %q", rc)
			}
			if !allowPrivate {
				// Route lookups only: a prohibit route refuses inside the
				// namespace, and without one no packet would be sent either.
				p := e.probe(id, a, "route", "rfc1918", "10.255.255.1", "9", "route", "metadata", "169.254.169.254", "80",
					"route", "cgnat", "100.64.0.1", "53", "route", "public", "203.0.113.9", "80")
				if p["rfc1918"] != "err EACCES" || p["metadata"] != "err EACCES" || p["cgnat"] != "err EACCES" || p["public"] != "ok routed" {
					t.Errorf("routes with allow_private false: %v", p)
				}
			}

			// Session b's server is not reachable from a, nor from the host.
			srv := "setsid python3 -c 'import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"0.0.0.0\", 18932)); s.listen(); time.sleep(60)' >/dev/null 2>&1 & sleep 0.5; echo started"
			e.exec(id, "--workspace-session-id", b, "--yield-time-ms", "5000", srv)
			got = e.probe(id, a, "tcp", "peer_addr", "198.18.0.100", "18932", "tcp", "peer_lo", "127.0.0.1", "18932")
			for _, k := range []string{"peer_addr", "peer_lo"} {
				if got[k] != "err ECONNREFUSED" {
					t.Errorf("%s: another isolated session's port must be unreachable: %v", k, got)
				}
			}
			if c, err := net.DialTimeout("tcp", "127.0.0.1:18932", time.Second); err == nil {
				c.Close()
				t.Errorf("an isolated session's port is published on the host")
			}

			if n := len(helperPids(t, e.sup.Process.Pid)); n != 2 {
				out, _ := exec.Command("ps", "-ef", "--forest").Output()
				t.Errorf("%d %s processes for two isolated sessions (supervisor %d)\n%s", n, helper, e.sup.Process.Pid, out)
			}
			e.exec(id, "--workspace-session-id", b, "pkill -f 18932; true")
			for _, ws := range []string{a, b} {
				e.rt(id, "destroy_workspace_session", "--workspace-session-id", ws)
			}
			deadline := time.Now().Add(5 * time.Second)
			for len(helperPids(t, e.sup.Process.Pid)) > 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if left := helperPids(t, e.sup.Process.Pid); len(left) > 0 {
				t.Errorf("helper processes outlive their sessions: %v", left)
			}
		})
	}
}

// TestOfflineReachesNothing: an offline session has lo only: no route to
// the outside and no resolver of its own.
func TestOfflineReachesNothing(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		skipOrFail(t, "python3 is needed")
	}
	ip := hostAddr(t)
	e, id := netEnv(t, "    allow_private: true\n")
	tcpPort, udpPort := echoServers(t, ip)
	ws := e.session(id, "--network-profile", "offline")
	got := e.probe(id, ws, "tcp", "out_tcp", ip.String(), strconv.Itoa(tcpPort), "udp", "out_udp", ip.String(), strconv.Itoa(udpPort))
	if got["out_tcp"] != "err ENETUNREACH" || got["out_udp"] != "err ENETUNREACH" {
		t.Errorf("offline session reached out: %v", got)
	}
}

// TestIsolatedNetworkMissingHelper: without pasta and slirp4netns on the
// supervisor's PATH an isolated session is refused with the package to
// install, and nothing is left behind (no session, no fallback to shared).
func TestIsolatedNetworkMissingHelper(t *testing.T) {
	for _, tc := range []struct{ helper, want string }{
		{"auto", "install the Debian package passt"},
		{"slirp4netns", "install the Debian package slirp4netns"},
	} {
		t.Run(tc.helper, func(t *testing.T) {
			e := newEnv(t)
			e.supEnv = []string{"PATH=" + t.TempDir()}
			writeConfig(t, e, "network:\n  isolated:\n    helper: "+tc.helper+"\n")
			e.start()
			id := e.createSandbox(e.project(map[string]string{"a": "a"}))
			body := e.rtFail(id, 1, "operation_failed", "create_workspace_session", "--network-profile", "isolated")
			if msg, _ := body["message"].(string); !strings.Contains(msg, tc.want) || body["details"].(map[string]any)["stage"] != "network" {
				t.Errorf("error = %v", body)
			}
			if l := e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any); len(l) != 0 {
				t.Errorf("sessions after the refusal: %v", l)
			}
		})
	}
}

// TestForwardPort: forward_port serves an HTTP server inside an isolated
// and an offline session to host clients through one loopback listener,
// for many sequential and concurrent connections without leaking the
// supervisor's descriptors; the same call returns the same forward; the
// 17th is server_busy; shared sessions and none get the port as is; the
// forward is listed and ends with its session.
func TestForwardPort(t *testing.T) {
	needHelper(t, "pasta")
	e, id := netEnv(t, "    helper: pasta\n")
	for _, profile := range []string{"isolated", "offline"} {
		t.Run(profile, func(t *testing.T) {
			ws := e.session(id, "--network-profile", profile)
			start := "mkdir -p /tmp/www && echo hello-" + profile + " > /tmp/www/index.html && cd /tmp/www && " +
				"setsid python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 & " +
				"for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))' 2>/dev/null && break; sleep 0.1; done; echo up"
			if out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "30000", start); !strings.Contains(out["output"].(string), "up") {
				t.Fatalf("http.server: %v", out)
			}
			fw := e.rt(id, "forward_port", "--port", "8000", "--workspace-session-id", ws)
			port := num(t, fw["port"])
			if fw["host"] != "127.0.0.1" || num(t, fw["target_port"]) != 8000 || port == 8000 || fw["network_profile"] != profile {
				t.Fatalf("forward = %v", fw)
			}
			if again := e.rt(id, "forward_port", "--port", "8000", "--workspace-session-id", ws); num(t, again["port"]) != port {
				t.Errorf("second call made a new forward: %v vs %v", again, fw)
			}
			url := fmt.Sprintf("http://127.0.0.1:%d/index.html", port)
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
			get := func() error {
				r, err := client.Get(url)
				if err != nil {
					return err
				}
				defer r.Body.Close()
				b, _ := io.ReadAll(r.Body)
				if r.StatusCode != 200 || strings.TrimSpace(string(b)) != "hello-"+profile {
					return fmt.Errorf("status %d body %q", r.StatusCode, b)
				}
				return nil
			}
			if err := get(); err != nil { // warm-up: lazily created runtime descriptors
				t.Fatal(err)
			}
			before := fdCount(t, e.sup.Process.Pid)
			for i := 0; i < 200; i++ {
				if err := get(); err != nil {
					t.Fatalf("sequential %d: %v", i, err)
				}
			}
			var wg sync.WaitGroup
			errs := make(chan error, 20)
			for i := 0; i < 20; i++ {
				wg.Go(func() { errs <- get() })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Errorf("concurrent: %v", err)
				}
			}
			after := fdCount(t, e.sup.Process.Pid)
			for i := 0; i < 50 && after > before; i++ { // relays close just after the response
				time.Sleep(20 * time.Millisecond)
				after = fdCount(t, e.sup.Process.Pid)
			}
			if after > before {
				t.Errorf("supervisor descriptors %d before, %d after 220 connections: %v", before, after, fdLinks(e.sup.Process.Pid))
			}

			listed := false
			for _, s := range e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any) {
				s := s.(map[string]any)
				if s["workspace_session_id"] != ws {
					continue
				}
				for _, f := range s["forwards"].([]any) {
					f := f.(map[string]any)
					listed = listed || (num(t, f["target_port"]) == 8000 && num(t, f["port"]) == port)
				}
			}
			if !listed {
				t.Errorf("forward not listed in list_workspace_sessions")
			}
			for p := 8001; p < 8016; p++ {
				e.rt(id, "forward_port", "--port", strconv.Itoa(p), "--workspace-session-id", ws)
			}
			busy := e.rtFail(id, 1, "server_busy", "forward_port", "--port", "9000", "--workspace-session-id", ws)
			if num(t, busy["details"].(map[string]any)["max_forwards"]) != 16 {
				t.Errorf("17th forward: %v", busy)
			}

			e.exec(id, "--workspace-session-id", ws, "pkill -f http.server; true")
			e.rt(id, "destroy_workspace_session", "--workspace-session-id", ws)
			if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
				c.Close()
				t.Errorf("forward listener outlives its session")
			}
		})
	}
	t.Run("shared", func(t *testing.T) {
		ws := e.session(id)
		fw := e.rt(id, "forward_port", "--port", "8123", "--workspace-session-id", ws)
		if num(t, fw["port"]) != 8123 || fw["network_profile"] != "shared" || fw["url"] != nil {
			t.Errorf("shared forward = %v", fw)
		}
		fw = e.rt(id, "forward_port", "--port", "8123")
		if num(t, fw["port"]) != 8123 || fw["workspace_session_id"] != nil {
			t.Errorf("sessionless forward = %v", fw)
		}
		e.rtFail(id, 2, "invalid_request", "forward_port", "--port", "0")
		e.rtFail(id, 1, "not_found", "forward_port", "--port", "80", "--workspace-session-id", "ws-nope")
	})
}

func fdCount(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func fdLinks(pid int) []string {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	var out []string
	for _, d := range ents {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, d.Name()))
		out = append(out, d.Name()+"="+l)
	}
	return out
}
