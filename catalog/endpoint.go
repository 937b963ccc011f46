package catalog

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Dirs are the supervisor's data, config and runtime directories (§2.1, §8.1).
type Dirs struct {
	Data, Config, Runtime string
}

// ResolveDirs finds the directories from the environment:
// EPHEMERAL_SANDBOX_HOME puts all three below one root, otherwise the XDG
// base directories apply with their standard fallbacks; the runtime
// directory without XDG_RUNTIME_DIR is $TMPDIR/ephemeral-sandbox-<uid>
// (TMPDIR defaults to /tmp).
func ResolveDirs() (Dirs, error) {
	if h := os.Getenv("EPHEMERAL_SANDBOX_HOME"); h != "" {
		if !filepath.IsAbs(h) {
			return Dirs{}, Errorf(ConfigError, "EPHEMERAL_SANDBOX_HOME must be absolute: %s", h)
		}
		h = filepath.Clean(h)
		return Dirs{Data: filepath.Join(h, "data"), Config: filepath.Join(h, "config"), Runtime: filepath.Join(h, "run")}, nil
	}
	home, _ := os.UserHomeDir()
	xdg := func(env, fallback string) (string, error) {
		if v := os.Getenv(env); v != "" && filepath.IsAbs(v) {
			return filepath.Join(v, "ephemeral-sandbox"), nil
		}
		if home == "" {
			return "", Errorf(ConfigError, "neither %s nor HOME is set", env)
		}
		return filepath.Join(home, fallback, "ephemeral-sandbox"), nil
	}
	data, err := xdg("XDG_DATA_HOME", ".local/share")
	if err != nil {
		return Dirs{}, err
	}
	config, err := xdg("XDG_CONFIG_HOME", ".config")
	if err != nil {
		return Dirs{}, err
	}
	// Without a runtime directory the fallback lives in the shared temp
	// directory, where another user may have made it first: clients and the
	// supervisor check it before use (CheckPrivateDir). An absolute TMPDIR
	// is honoured, as os.TempDir does, so a private TMPDIR avoids sharing.
	tmp := os.TempDir()
	if !filepath.IsAbs(tmp) {
		tmp = "/tmp"
	}
	runtime := filepath.Join(tmp, fmt.Sprintf("ephemeral-sandbox-%d", os.Geteuid()))
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" && filepath.IsAbs(x) {
		var st syscall.Stat_t
		if syscall.Stat(x, &st) == nil && int(st.Uid) == os.Geteuid() {
			runtime = filepath.Join(x, "ephemeral-sandbox")
		}
	}
	return Dirs{Data: data, Config: config, Runtime: runtime}, nil
}

// SocketPath is the default Unix socket in the runtime directory.
func (d Dirs) SocketPath() string { return filepath.Join(d.Runtime, "supervisor.sock") }

// Endpoint is a parsed client or supervisor endpoint.
type Endpoint struct {
	Network string // "unix" or "tcp"
	Address string // socket path or host:port
}

func (e Endpoint) String() string {
	if e.Network == "unix" {
		return e.Address
	}
	return "tcp://" + e.Address
}

// ParseEndpoint accepts /abs/path, unix:///abs/path, tcp://127.0.0.1:PORT and
// tcp://[::1]:PORT (any 127.0.0.0/8 host). Errors are config_error.
func ParseEndpoint(s string) (Endpoint, error) {
	switch {
	case strings.HasPrefix(s, "unix://"):
		return unixEndpoint(strings.TrimPrefix(s, "unix://"), s)
	case strings.HasPrefix(s, "/"):
		return unixEndpoint(s, s)
	case strings.HasPrefix(s, "tcp://"):
		hostport := strings.TrimPrefix(s, "tcp://")
		host, port, err := net.SplitHostPort(hostport)
		if err != nil {
			return Endpoint{}, Errorf(ConfigError, "invalid endpoint %q: %v", s, err)
		}
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() || strings.Contains(host, "%") {
			return Endpoint{}, Errorf(ConfigError, "invalid endpoint %q: the host must be a loopback literal (127.0.0.0/8 or [::1])", s)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
			return Endpoint{}, Errorf(ConfigError, "invalid endpoint %q: bad port", s)
		}
		return Endpoint{Network: "tcp", Address: hostport}, nil
	}
	return Endpoint{}, Errorf(ConfigError, "invalid endpoint %q: use /abs/path, unix:///abs/path or tcp://127.0.0.1:PORT", s)
}

func unixEndpoint(p, orig string) (Endpoint, error) {
	if !strings.HasPrefix(p, "/") || len(p) > 107 {
		return Endpoint{}, Errorf(ConfigError, "invalid endpoint %q: a Unix socket path must be absolute and at most 107 bytes", orig)
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return Endpoint{}, Errorf(ConfigError, "invalid endpoint %q: empty, . or .. path segment", orig)
		}
	}
	return Endpoint{Network: "unix", Address: p}, nil
}

// DefaultEndpoint resolves the client's endpoint when no flag is given:
// SANDBOX_SUPERVISOR_SOCKET, else the runtime directory's socket.
func DefaultEndpoint() (Endpoint, error) {
	if s := os.Getenv("SANDBOX_SUPERVISOR_SOCKET"); s != "" {
		return ParseEndpoint(s)
	}
	d, err := ResolveDirs()
	if err != nil {
		return Endpoint{}, err
	}
	return ParseEndpoint(d.SocketPath())
}
