package supervisor

import (
	"crypto/subtle"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// listenAddr resolves an optional loopback TCP endpoint (§2.1): the flag
// (--listen or --http) wins over its configuration key (supervisor.listen,
// http.listen); the host must be a loopback literal
// (catalog.ParseEndpoint refuses anything else with config_error). "" means
// the listener is off. It runs before anything else happens, so a refused
// address leaves no trace.
func listenAddr(flagName, flag string, cfgValue *string) (string, error) {
	raw := flag
	if raw == "" && cfgValue != nil {
		raw = *cfgValue
	}
	if raw == "" {
		return "", nil
	}
	ep, err := catalog.ParseEndpoint(raw)
	if err != nil {
		return "", err
	}
	if ep.Network != "tcp" {
		return "", catalog.Errorf(catalog.ConfigError, "%s must be tcp://127.0.0.1:PORT or tcp://[::1]:PORT, got %q", flagName, raw)
	}
	return ep.Address, nil
}

// tcpListen opens a TCP listener on addr (from listenAddr) and writes the
// bound address to addrName (listen.addr, http.addr) in runDir, so that
// port 0 is usable.
func tcpListen(addr, runDir, addrName string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, catalog.Errorf(catalog.ConfigError, "listen on tcp://%s: %w", addr, err)
	}
	addrFile := filepath.Join(runDir, addrName)
	if err := writeRuntimeFile(addrFile, []byte("tcp://"+ln.Addr().String()+"\n")); err != nil {
		ln.Close()
		return nil, catalog.Errorf(catalog.ConfigError, "write %s: %w", addrFile, err)
	}
	return ln, nil
}

// readToken returns a token file's token (§2.2: gateway.token, ui.token)
// without its newline; ensureTokens has already checked the file's owner,
// mode and shape.
func readToken(configDir, name string) ([]byte, error) {
	p := filepath.Join(configDir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, catalog.Errorf(catalog.ConfigError, "token file %s: %w", p, err)
	}
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	return b, nil
}

// authorize applies §2.4 step 4 and strips the token field before anything
// else (validation, tracing, logging) can see it. Unix peers were already
// checked by uid; their token field is ignored. The comparison is constant
// time and the error never names the presented value.
func (s *Supervisor) authorize(raw map[string]any, tcp bool) *catalog.Error {
	v, present := raw[catalog.TokenField]
	delete(raw, catalog.TokenField)
	if !tcp {
		return nil
	}
	tok, _ := v.(string)
	if !present || tok == "" {
		return catalog.Errorf(catalog.Unauthorized, "missing %s: TCP clients must present the gateway token", catalog.TokenField)
	}
	if len(s.gatewayToken) == 0 || subtle.ConstantTimeCompare([]byte(tok), s.gatewayToken) != 1 {
		return catalog.Errorf(catalog.Unauthorized, "%s", "wrong gateway token")
	}
	return nil
}

// tcpAddrString is for logs: the address only, never the token.
func tcpAddrString(ln net.Listener) string { return fmt.Sprintf("tcp://%s", ln.Addr()) }
