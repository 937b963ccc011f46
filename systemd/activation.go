package systemd

import (
	"fmt"
	"net"

	"github.com/coreos/go-systemd/v22/activation"
)

// Listener returns the Unix stream socket passed by systemd socket
// activation (LISTEN_FDS, LISTEN_PID equal to our pid), or nil when none was
// passed. The LISTEN_* variables are unset so children do not inherit them.
// More than one socket, or one that is not a listening Unix stream socket,
// is an error.
func Listener() (net.Listener, error) {
	files := activation.Files(true)
	if len(files) == 0 {
		return nil, nil
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if len(files) != 1 {
		return nil, fmt.Errorf("socket activation passed %d sockets, want exactly one Unix socket", len(files))
	}
	ln, err := net.FileListener(files[0])
	if err != nil {
		return nil, fmt.Errorf("socket activation: fd %d is not a listening socket: %v", files[0].Fd(), err)
	}
	ul, ok := ln.(*net.UnixListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("socket activation passed a %s socket, want a Unix stream socket", ln.Addr().Network())
	}
	ul.SetUnlinkOnClose(false) // the socket belongs to systemd
	return ul, nil
}
