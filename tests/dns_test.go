package tests

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// DNS through an isolated session's helper, end to end, within this
// machine's rules: the host's resolver is out of reach and an unprivileged
// test cannot bind port 53 in the host's namespace. So the supervisor (and
// with it the helper) runs in a user+net+mount namespace the test makes to
// stand in for "the outside" (startOutside): an interface of its own with
// outsideAddr, a resolv.conf naming the resolver bind-mounted over
// /etc/resolv.conf, and a DNS server of the test's on <resolver>:53. Both
// helpers forward the session's queries to 198.18.0.3 to the first
// nameserver of their own /etc/resolv.conf (pasta --dns-forward; libslirp's
// virtual nameserver), which is the test's server.

// outsideAddr is the address of the test namespace's interface
// (TEST-NET-1: no real network uses it).
const outsideAddr = "192.0.2.53"

// dnsAnswer is what the test's server answers for every A query under
// dnsZone (TEST-NET-3).
const (
	dnsZone   = ".esbx.test."
	dnsAnswer = "203.0.113.77"
)

// The test binary doubles as the DNS server: run with dnsServerEnv set to
// a directory and dnsAddrEnv to an address, it serves <address>:53 (it
// must already be in the test's namespace), logs each question to
// <dir>/queries, and writes its PID to <dir>/dns.pid once it listens.
const (
	dnsServerEnv = "ESBX_TEST_DNS_SERVER_DIR"
	dnsAddrEnv   = "ESBX_TEST_DNS_SERVER_ADDR"
)

func init() {
	if dir := os.Getenv(dnsServerEnv); dir != "" {
		if err := serveDNS(dir, os.Getenv(dnsAddrEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "dns server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// serveDNS answers A queries under dnsZone with dnsAnswer, AAAA queries
// there with no data, and everything else with NXDOMAIN, until killed.
func serveDNS(dir, addr string) error {
	// It lives as long as the supervisor it was started beside (the shell
	// that started it execs into the supervisor).
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("pdeathsig: %w", err)
	}
	pc, err := net.ListenPacket("udp4", net.JoinHostPort(addr, "53"))
	if err != nil {
		return err
	}
	if err := serveEcho(outsideAddr); err != nil {
		return err
	}
	log, err := os.OpenFile(filepath.Join(dir, "queries"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "dns.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		reply, name, qtype, err := dnsReply(buf[:n])
		if err != nil {
			fmt.Fprintf(log, "bad query from %s: %v\n", from, err)
			continue
		}
		fmt.Fprintf(log, "%d %s\n", qtype, name)
		_, _ = pc.WriteTo(reply, from)
	}
}

// outsideEchoPort is where the test's namespace also runs a TCP and a UDP
// echo service: the "outside" services an isolated session must reach.
const outsideEchoPort = "7007"

// serveEcho runs echo on addr:outsideEchoPort.
func serveEcho(addr string) error {
	ln, err := net.Listen("tcp4", net.JoinHostPort(addr, outsideEchoPort))
	if err != nil {
		return err
	}
	pc, err := net.ListenPacket("udp4", net.JoinHostPort(addr, outsideEchoPort))
	if err != nil {
		return err
	}
	echo(ln, pc)
	return nil
}

// dnsReply builds the answer to a one-question query (RFC 1035 §4.1).
func dnsReply(q []byte) (reply []byte, name string, qtype uint16, err error) {
	be := binary.BigEndian
	if len(q) < 12 || be.Uint16(q[4:]) != 1 {
		return nil, "", 0, errors.New("not a one-question query")
	}
	i := 12
	var labels []string
	for {
		if i >= len(q) {
			return nil, "", 0, errors.New("truncated name")
		}
		l := int(q[i])
		i++
		if l == 0 {
			break
		}
		if l > 63 || i+l > len(q) {
			return nil, "", 0, errors.New("bad label")
		}
		labels = append(labels, string(q[i:i+l]))
		i += l
	}
	if i+4 > len(q) {
		return nil, "", 0, errors.New("truncated question")
	}
	qtype = be.Uint16(q[i:])
	question := q[12 : i+4]
	name = strings.ToLower(strings.Join(labels, ".") + ".")

	const typeA = 1
	hdr := make([]byte, 12)
	copy(hdr, q[:2])                   // ID
	flags := uint16(0x8000 | 0x0400)   // QR, AA
	flags |= be.Uint16(q[2:]) & 0x0100 // RD as asked
	inZone := strings.HasSuffix(name, dnsZone)
	if !inZone {
		flags |= 3 // NXDOMAIN
	}
	be.PutUint16(hdr[2:], flags)
	be.PutUint16(hdr[4:], 1) // QDCOUNT
	reply = append(hdr, question...)
	if inZone && qtype == typeA {
		be.PutUint16(reply[6:], 1) // ANCOUNT
		rr := []byte{0xc0, 12, 0, typeA, 0, 1, 0, 0, 0, 60, 0, 4}
		reply = append(append(reply, rr...), net.ParseIP(dnsAnswer).To4()...)
	}
	// In the zone but not A (AAAA): NOERROR without answers.
	return reply, name, qtype, nil
}

// startOutside starts the supervisor in a new user+net+mount namespace that
// stands in for the outside (see the top of this file), with the test's DNS
// server running there on resolver, and returns the server's directory.
func (e *env) startOutside(resolver string) string {
	e.t.Helper()
	if out, err := exec.Command("unshare", "-Urnm", "sh", "-c",
		"ip link add esbx0 type veth peer name esbx1").CombinedOutput(); err != nil {
		skipOrFail(e.t, "a user+net+mount namespace with a veth pair (unshare -Urnm, ip link add … type veth): %v %s", err, out)
	}
	self, err := os.Executable()
	if err != nil {
		e.t.Fatal(err)
	}
	dir := filepath.Join(e.root, "outside")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+resolver+"\n"), 0o644); err != nil {
		e.t.Fatal(err)
	}
	// The helpers want an interface with a default route to take their
	// template from (pasta: "External interface not usable" with lo only),
	// hence the veth pair; the route leads nowhere.
	script := `set -e
ip link set lo up
ip link add esbx0 type veth peer name esbx1
ip addr add "$0/24" dev esbx0
ip link set esbx0 up
ip link set esbx1 up
ip route add default via 192.0.2.1 dev esbx0 onlink
mount --bind "$1/resolv.conf" /etc/resolv.conf
` + dnsServerEnv + `="$1" ` + dnsAddrEnv + `="$3" "$2" &
i=0
while [ ! -s "$1/dns.pid" ]; do
  i=$((i+1)); [ $i -lt 200 ] || { echo "dns server did not start" >&2; exit 1; }
  sleep 0.05
done
shift 3
exec "$@"`
	e.supPrefix = []string{"unshare", "-Urnm", "sh", "-c", script, outsideAddr, dir, self, resolver}
	e.start()
	return dir
}

// resolveScript prints one line per name: "<name> ok <addresses>" or
// "<name> err <EAI_…>".
const resolveScript = `
import socket, sys
codes = {getattr(socket, n): n for n in dir(socket) if n.startswith("EAI_")}
for name in sys.argv[1:]:
    try:
        addrs = sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)})
        print(name, "ok", ",".join(addrs))
    except socket.gaierror as e:
        print(name, "err", codes.get(e.errno, str(e.errno)))
`

// resolve runs resolveScript in a session with the given environment
// prefix and returns name → "ok <addrs>" / "err <EAI_…>", failing when the
// command does not finish within a generous yield (a hang).
func (e *env) resolve(id, ws, envPrefix string, names ...string) map[string]string {
	e.t.Helper()
	cmd := "cat > /tmp/resolve.py <<'EOF'\n" + resolveScript + "\nEOF\n" + envPrefix + " python3 /tmp/resolve.py " + strings.Join(names, " ")
	out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "30000", cmd)
	if out["status"] == "running" {
		e.t.Fatalf("name resolution still running after 30 s: %v", out)
	}
	got := map[string]string{}
	for _, l := range strings.Split(out["output"].(string), "\n") {
		if name, rest, ok := strings.Cut(strings.TrimSpace(l), " "); ok {
			got[name] = rest
		}
	}
	return got
}

// TestDNSIsolated: a process in an isolated session reaches a TCP and a UDP
// service in the namespace the test made to stand in for the outside, and
// resolves a name
// through the helper's DNS forwarder (198.18.0.3) to the resolver the
// supervisor's side uses, which is the test's own server: it gets that
// server's address, the server saw the question, and its NXDOMAIN comes
// back as such. With the server gone, resolution fails with EAI_AGAIN
// within the resolver's timeout instead of hanging. Run for both helpers,
// with the supervisor's resolver on an interface address and on loopback
// (a host with systemd-resolved lists 127.0.0.53; pasta treats loopback
// resolvers specially with --no-map-gw).
func TestDNSIsolated(t *testing.T) {
	for _, tc := range []struct{ helper, name, resolver string }{
		{"pasta", "interface", outsideAddr}, {"pasta", "loopback", "127.0.0.53"},
		{"slirp4netns", "interface", outsideAddr}, {"slirp4netns", "loopback", "127.0.0.53"},
	} {
		helper := tc.helper
		t.Run(helper+"/"+tc.name, func(t *testing.T) {
			needHelper(t, helper)
			e := newEnv(t)
			writeConfig(t, e, "network:\n  isolated:\n    helper: "+helper+"\n")
			dir := e.startOutside(tc.resolver)
			id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
			ws := e.session(id, "--network-profile", "isolated")

			// A name only this test knows: it reaches the server only as
			// the session's query.
			probe := fmt.Sprintf("probe-%d%s", time.Now().UnixNano(), strings.TrimSuffix(dnsZone, "."))
			got := e.resolve(id, ws, "", probe, "nosuch.esbx.invalid")
			if got[probe] != "ok "+dnsAnswer {
				t.Errorf("%s in the session: %v\nserver log:\n%s", probe, got, readFile(t, filepath.Join(dir, "queries")))
			}
			if got["nosuch.esbx.invalid"] != "err EAI_NONAME" {
				t.Errorf("NXDOMAIN in the session: %v", got)
			}
			if log := readFile(t, filepath.Join(dir, "queries")); !strings.Contains(log, "1 "+probe+".\n") {
				t.Errorf("the test's server did not see the A query for %s:\n%s", probe, log)
			}
			// The TCP and UDP services of the test's "outside" namespace.
			p := e.probe(id, ws, "tcp", "out_tcp", outsideAddr, outsideEchoPort, "udp", "out_udp", outsideAddr, outsideEchoPort)
			if p["out_tcp"] != "ok tcp-echo:hello" || p["out_udp"] != "ok udp-echo:hello" {
				t.Errorf("the outside namespace's services not reached: %v", p)
			}

			// Upstream down: the forwarder's resolver no longer answers.
			// The resolver's own timeout (one try of one second) bounds
			// the failure; resolve fails the test on a hang.
			pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(dir, "dns.pid"))))
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("stop the DNS server: %v", err)
			}
			down := "down" + probe
			got = e.resolve(id, ws, "RES_OPTIONS='timeout:1 attempts:1'", down)
			if got[down] != "err EAI_AGAIN" {
				t.Errorf("with the upstream resolver down: %v", got)
			}
		})
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
