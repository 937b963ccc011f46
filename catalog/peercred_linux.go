package catalog

import "golang.org/x/sys/unix"

// peerCred is who listens on the other end of a connected Unix socket.
type peerCred struct{ Uid, Pid int }

// getPeerCred reads SO_PEERCRED.
func getPeerCred(fd int) (peerCred, error) {
	c, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return peerCred{}, err
	}
	return peerCred{Uid: int(c.Uid), Pid: int(c.Pid)}, nil
}
