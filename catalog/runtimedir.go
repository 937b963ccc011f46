package catalog

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"strconv"

	"golang.org/x/sys/unix"
)

// The socket's directory is the only thing that tells a client which
// process it is about to trust with a request, and the default one
// (/tmp/ephemeral-sandbox-<uid>) sits in a directory every local user can
// write. So clients and the supervisor hold it to one rule (§2.1): a real
// directory, owned by the effective uid, mode 0700. A directory that fails
// it may belong to someone waiting for our requests; nothing is sent to it,
// nothing is created in it and no log is written there.

// CheckPrivateDir applies that rule to dir, which is named what in the
// message ("runtime directory", "socket directory"). A missing directory is
// reported as an error wrapping fs.ErrNotExist, so callers that would create
// it can tell. Every other failure is a config_error naming the directory,
// its owner (uid and user name) and its mode, in details too.
func CheckPrivateDir(what, dir string) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%s %s: %w", what, dir, fs.ErrNotExist)
		}
		return Errorf(ConfigError, "%s %s: %v", what, dir, err).With("path", dir)
	}
	return checkPrivateStat(what, dir, &st)
}

// checkPrivateStat judges a directory by its stat (from lstat, or fstat of a
// descriptor opened with O_NOFOLLOW, which cannot be swapped afterwards).
func checkPrivateStat(what, dir string, st *unix.Stat_t) error {
	uid := os.Geteuid()
	mode := st.Mode & 0o7777
	ok := st.Mode&unix.S_IFMT == unix.S_IFDIR && int(st.Uid) == uid && mode == 0o700
	if ok {
		// The owner's name is for messages only: looking it up reads the
		// user database (nsswitch, /etc/passwd) on every client start.
		return nil
	}
	owner := userName(int(st.Uid))
	e := func(format string, a ...any) error {
		return Errorf(ConfigError, format, a...).With("path", dir).
			With("owner_uid", int(st.Uid)).With("owner", owner).With("mode", fmt.Sprintf("%04o", mode))
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return e("%s %s is a symlink (owned by uid %d (%s)); it must be a real directory owned by you (uid %d) with mode 0700", what, dir, st.Uid, owner, uid)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return e("%s %s is not a directory (owned by uid %d (%s))", what, dir, st.Uid, owner)
	case int(st.Uid) != uid:
		return e("%s %s is owned by uid %d (%s), not by you (uid %d): another user may be standing in for the supervisor, so nothing is sent there (remove it, or set XDG_RUNTIME_DIR or EPHEMERAL_SANDBOX_HOME)",
			what, dir, st.Uid, owner, uid)
	case mode != 0o700:
		return e("%s %s has mode %04o; it must be 0700 (fix: chmod 0700 %s)", what, dir, mode, dir)
	}
	return nil
}

// userName is the account name of uid for messages, or "unknown user".
func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return u.Username
	}
	return "unknown user"
}

// checkPeer refuses a Unix connection whose server is not this user: the
// SO_PEERCRED of a connected socket names whoever called listen() on it. It
// runs before a byte is written, so a socket planted by another user (or
// reached through a symlink) never sees the request.
func checkPeer(conn net.Conn, endpoint string) error {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("peer credentials of %s: %w", endpoint, err)
	}
	var cred peerCred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = getPeerCred(int(fd))
	}); err != nil {
		return fmt.Errorf("peer credentials of %s: %w", endpoint, err)
	}
	if cerr != nil {
		return fmt.Errorf("peer credentials of %s: %w", endpoint, cerr)
	}
	if uid := os.Geteuid(); int(cred.Uid) != uid {
		owner := userName(int(cred.Uid))
		return Errorf(ConfigError, "%s is served by uid %d (%s), not by you (uid %d): refusing to send the request", endpoint, cred.Uid, owner, uid).
			With("endpoint", endpoint).With("peer_uid", int(cred.Uid)).With("peer", owner).With("peer_pid", cred.Pid)
	}
	return nil
}
