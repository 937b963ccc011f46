package cli

import "golang.org/x/sys/unix"

// ioctlGetTermios reads a terminal's attributes (isTerminal).
const ioctlGetTermios = unix.TCGETS
