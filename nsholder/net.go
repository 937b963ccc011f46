package nsholder

// Session networking (§5.6, contract amendment A3).
//
// A holder with Config.IsolatedNetwork lives in its own network namespace,
// created by the clone flags, with only lo up: that is the "offline"
// profile. The "isolated" profile adds egress: once the holder is ready,
// the supervisor side starts a rootless user-mode network helper for the
// holder's PID (Config.Egress) — pasta (Debian package passt) or
// slirp4netns — which creates a tap device eth0 in the namespace and
// carries its TCP/UDP flows out through ordinary sockets of the
// supervisor's user. The namespace gets 198.18.0.100/24 with gateway
// 198.18.0.2 and a DNS forwarder at 198.18.0.3 for both helpers (RFC 2544
// benchmarking space: no real network uses it, so neither the gateway nor
// the rest of the /24 leads anywhere, and the session's address never
// shadows or equals a host address).
//
// What keeps the host's loopback services (the supervisor's TCP and HTTP
// listeners included) and other sessions out of reach:
//   - pasta runs with --no-map-gw (the gateway is not mapped to the host's
//     loopback) and -T none -U none (no port of the host's namespace is
//     forwarded into the session) and -t none -u none (nothing of the
//     session is published on the host); slirp4netns with
//     --disable-host-loopback. 127.0.0.1 inside is the session's own lo.
//   - every session has its own namespace; the only way in is a forward
//     (forward_port), which dials through the holder.
//   - with Config.BlockPrivate the holder installs "prohibit" routes for
//     the private and link-local ranges (privateRanges) before any command
//     runs: a connect there fails with EACCES inside the namespace, before
//     a packet reaches the helper. Commands lack CAP_NET_ADMIN, so they
//     cannot remove the routes. Not covered: a command may still open a
//     raw packet socket (CAP_NET_RAW is kept for ping) and write frames to
//     eth0 by hand, which the helper would carry; and IPv6 is off (pasta
//     -4; slirp4netns without --enable-ipv6).
//
// The helper is the holder's: it is started after the ready handshake,
// waited for (pasta's --pid file, slirp4netns's --ready-fd), killed when
// the holder exits or is closed, and gets Pdeathsig SIGKILL so it never
// outlives the supervisor.
//
// Port relays: opDial asks the holder to connect to 127.0.0.1:<port> in its
// namespace; the connected socket comes back with SCM_RIGHTS (as PTY
// masters do) and the supervisor copies bytes. Each dial runs in its own
// goroutine of the holder, so a slow or refused connect never holds up
// other requests, and no bytes pass through the holder.

import (
	"context"
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
	"time"

	"golang.org/x/sys/unix"
)

// Network helpers (Egress.Helper).
const (
	HelperPasta       = "pasta"
	HelperSlirp4netns = "slirp4netns"
)

// Addresses inside an isolated session's namespace.
const (
	NetSessionAddr = "198.18.0.100"
	NetGateway     = "198.18.0.2"
	NetDNS         = "198.18.0.3"
	netCIDR        = "198.18.0.0/24"
)

// ResolvConf is the /etc/resolv.conf of an isolated session: the helper's
// DNS forwarder, which sends queries on to the host's resolver.
const ResolvConf = "nameserver " + NetDNS + "\n"

// privateRanges are refused inside isolated sessions with BlockPrivate:
// RFC 1918, shared address space (CGNAT, also used by overlay VPNs) and
// link-local (cloud metadata services live at 169.254.169.254).
var privateRanges = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"}

// Egress is the user-mode network helper of an isolated session. It never
// travels to the holder: the supervisor side starts the helper.
type Egress struct {
	Helper string // HelperPasta or HelperSlirp4netns
	Path   string // the helper's binary
	// StateDir holds the helper's pid file (pasta); a directory of the
	// session the supervisor owns.
	StateDir string
}

// HelperArgs is the helper's command line for the holder with host PID pid.
func (e Egress) HelperArgs(pid int, pidFile string, readyFD int) []string {
	p := strconv.Itoa(pid)
	switch e.Helper {
	case HelperPasta:
		return []string{"-f", "-q", "-4", "--config-net", "--no-map-gw",
			"-t", "none", "-u", "none", "-T", "none", "-U", "none",
			"-a", NetSessionAddr, "-n", "24", "-g", NetGateway, "--dns-forward", NetDNS,
			"-I", "eth0", "-P", pidFile, p}
	default:
		return []string{"--configure", "--mtu=65520", "--disable-host-loopback", "--cidr=" + netCIDR,
			"--ready-fd=" + strconv.Itoa(readyFD), "--userns-path=/proc/" + p + "/ns/user",
			"--netns-type=path", "/proc/" + p + "/ns/net", "eth0"}
	}
}

// startEgress starts the helper for the holder pid and waits until the
// namespace is configured. The returned process is the caller's to kill.
func startEgress(ctx context.Context, e Egress, pid int) (*exec.Cmd, error) {
	if e.Path == "" {
		return nil, fmt.Errorf("no network helper binary")
	}
	pidFile := filepath.Join(e.StateDir, "net-helper.pid")
	_ = os.Remove(pidFile)
	var readyR, readyW *os.File
	if e.Helper == HelperSlirp4netns {
		var err error
		if readyR, readyW, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("%s ready pipe: %w", e.Helper, err)
		}
		defer readyR.Close()
	}
	cmd := exec.Command(e.Path, e.HelperArgs(pid, pidFile, 3)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if readyW != nil {
		cmd.ExtraFiles = []*os.File{readyW} // fd 3
	}
	stderr := &tailBuffer{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	err := cmd.Start()
	if readyW != nil {
		readyW.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", e.Helper, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	fail := func(why string) (*exec.Cmd, error) {
		_ = cmd.Process.Kill()
		<-exited
		msg := helperLog(stderr.String())
		if msg != "" {
			why += ": " + msg
		}
		if strings.Contains(msg, "tun") {
			why += " (fix: /dev/net/tun must be mode 0666, as distributions ship it: sudo chmod 0666 /dev/net/tun)"
		}
		return nil, fmt.Errorf("%s %s", e.Helper, why)
	}
	if readyR != nil {
		got := make(chan error, 1)
		go func() {
			var b [1]byte
			_, err := readyR.Read(b[:])
			got <- err
		}()
		select {
		case err := <-got:
			if err != nil {
				return fail("exited before the namespace was configured")
			}
			return cmd, nil
		case <-ctx.Done():
			return fail("not ready: " + ctx.Err().Error())
		}
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if _, err := os.Stat(pidFile); err == nil {
			return cmd, nil // written once pasta has configured the namespace
		}
		select {
		case <-exited:
			return fail("exited before the namespace was configured")
		case <-ctx.Done():
			return fail("not ready: " + ctx.Err().Error())
		case <-t.C:
		}
	}
}

// helperLog keeps the helper's own messages (pasta also complains that it
// cannot reach syslog, which is noise here).
func helperLog(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.Contains(l, "syslog") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "; ")
}

// blockPrivate installs a prohibit route per private range in the
// holder's network namespace (the holder has CAP_NET_ADMIN there; its
// commands do not).
func blockPrivate() error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink bind: %w", err)
	}
	for i, cidr := range privateRanges {
		_, n, err := net.ParseCIDR(cidr)
		if err != nil {
			return err
		}
		bits, _ := n.Mask.Size()
		if err := prohibitRoute(fd, uint32(i+1), n.IP.To4(), bits); err != nil {
			return fmt.Errorf("prohibit route %s: %w", cidr, err)
		}
	}
	return nil
}

// prohibitRoute sends one RTM_NEWROUTE (type RTN_PROHIBIT, main table) and
// reads its acknowledgement.
func prohibitRoute(fd int, seq uint32, dst net.IP, bits int) error {
	attrLen := unix.SizeofRtAttr + 4
	total := unix.SizeofNlMsghdr + unix.SizeofRtMsg + attrLen
	b := make([]byte, total)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(total))
	ne.PutUint16(b[4:], unix.RTM_NEWROUTE)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	ne.PutUint32(b[8:], seq)
	r := b[unix.SizeofNlMsghdr:]
	r[0] = unix.AF_INET
	r[1] = byte(bits)             // dst_len
	r[4] = unix.RT_TABLE_MAIN     // table
	r[5] = unix.RTPROT_BOOT       // protocol
	r[6] = unix.RT_SCOPE_UNIVERSE // scope
	r[7] = unix.RTN_PROHIBIT      // type
	a := r[unix.SizeofRtMsg:]
	ne.PutUint16(a[0:], uint16(attrLen))
	ne.PutUint16(a[2:], unix.RTA_DST)
	copy(a[4:], dst)
	if err := unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != seq || m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			if code := int32(ne.Uint32(m.Data[0:4])); code != 0 {
				return syscall.Errno(-code)
			}
			return nil
		}
	}
}

// dialLoopback connects to 127.0.0.1:port in the holder's namespace and
// returns the connected socket as a file (the net.Conn is closed; the file
// is an independent descriptor).
func dialLoopback(port int, timeout time.Duration) (*os.File, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial: bad port %d", port)
	}
	c, err := net.DialTimeout("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), timeout)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return nil, fmt.Errorf("connect to 127.0.0.1:%d in the session: %w", port, errno)
		}
		return nil, fmt.Errorf("connect to 127.0.0.1:%d in the session: %w", port, err)
	}
	defer c.Close()
	return c.(*net.TCPConn).File()
}
