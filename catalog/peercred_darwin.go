package catalog

import "golang.org/x/sys/unix"

// peerCred is who listens on the other end of a connected Unix socket.
type peerCred struct{ Uid, Pid int }

// getPeerCred reads LOCAL_PEERCRED (and LOCAL_PEERPID): the clients are
// built for macOS too, where they reach a supervisor over TCP or a
// forwarded Unix socket.
func getPeerCred(fd int) (peerCred, error) {
	c, err := unix.GetsockoptXucred(fd, unix.SOL_LOCAL, unix.LOCAL_PEERCRED)
	if err != nil {
		return peerCred{}, err
	}
	pid, _ := unix.GetsockoptInt(fd, unix.SOL_LOCAL, unix.LOCAL_PEERPID)
	return peerCred{Uid: int(c.Uid), Pid: pid}, nil
}
