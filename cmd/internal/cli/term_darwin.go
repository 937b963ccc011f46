package cli

import "golang.org/x/sys/unix"

// ioctlGetTermios reads a terminal's attributes (isTerminal); macOS names
// it TIOCGETA (the clients are built for macOS too).
const ioctlGetTermios = unix.TIOCGETA
