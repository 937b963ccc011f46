package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/uuid"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/buildinfo"
)

// Version is reported by sandbox-mcp's serverInfo; release builds set it with
// -ldflags "-X github.com/ephemeral-ai-lab/sandbox/cmd/internal/cli.Version=…".
var Version = ""

// ClientVersion returns Version, else what the build says (package
// buildinfo: module version, VCS revision, else "dev").
func ClientVersion() string { return buildinfo.Version(Version) }

// TokenEnv names the environment variable holding the TCP gateway token.
const TokenEnv = "SANDBOX_GATEWAY_AUTH_TOKEN"

// Conn is how a client reaches the supervisor: the resolved endpoint, whether
// it may autostart a supervisor, and where the TCP token comes from.
type Conn struct {
	client    catalog.Client
	tokenFlag string
}

// NewConn resolves the endpoint (§2.1): the --endpoint value when given
// (endpointGiven), else catalog.DefaultEndpoint. Autostart is enabled only
// for a Unix endpoint the client resolved itself (§13). Errors are
// config_error.
func NewConn(endpoint string, endpointGiven bool, tokenFlag string) (*Conn, *catalog.Error) {
	var ep catalog.Endpoint
	var err error
	if endpointGiven {
		ep, err = catalog.ParseEndpoint(endpoint)
	} else {
		ep, err = catalog.DefaultEndpoint()
	}
	if err != nil {
		return nil, asError(catalog.ConfigError, err)
	}
	return &Conn{
		client:    catalog.Client{Endpoint: ep, Autostart: !endpointGiven && ep.Network == "unix"},
		tokenFlag: tokenFlag,
	}, nil
}

// Endpoint returns the resolved endpoint.
func (c *Conn) Endpoint() catalog.Endpoint { return c.client.Endpoint }

// Autostart reports whether a missing supervisor would be started.
func (c *Conn) Autostart() bool { return c.client.Autostart }

// Call sends one request. log receives progress messages (may be nil). The
// *Error result is a transport failure (connection_error, protocol_error) or
// a token problem (config_error); a supervisor error envelope is a response.
func (c *Conn) Call(ctx context.Context, req *catalog.Request, log func(string)) (map[string]any, *catalog.Error) {
	cl := c.client
	cl.Log = log
	if cl.Endpoint.Network == "tcp" {
		tok, err := c.token()
		if err != nil {
			return nil, err
		}
		cl.Token = tok
	}
	return cl.Call(ctx, req)
}

// token finds the gateway token for TCP endpoints (§2.2): the flag, the
// environment, then the token file in the config directory.
func (c *Conn) token() (string, *catalog.Error) {
	if c.tokenFlag != "" {
		return c.tokenFlag, nil
	}
	if t := os.Getenv(TokenEnv); t != "" {
		return t, nil
	}
	dirs, err := catalog.ResolveDirs()
	if err != nil {
		return "", asError(catalog.ConfigError, err)
	}
	p := filepath.Join(dirs.Config, "gateway.token")
	b, err := os.ReadFile(p)
	if err != nil {
		return "", catalog.Errorf(catalog.ConfigError, "no gateway token for a TCP endpoint: use --auth-token, %s or %s: %v", TokenEnv, p, err).With("path", p)
	}
	t := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if t == "" || strings.ContainsAny(t, "\r\n") {
		return "", catalog.Errorf(catalog.ConfigError, "gateway token file %s must hold exactly one non-empty line", p).With("path", p)
	}
	return t, nil
}

// NewRequestID mints the UUIDv4 request id clients send by default (§3.1).
func NewRequestID() string { return uuid.NewString() }

// Scope is the request scope for op (§2.3, §3.1): management operations are
// always system-scoped; runtime operations carry the sandbox; other
// operations that accept a sandbox scope get one when a sandbox is named.
func Scope(op *catalog.Op, sandboxID string) catalog.RequestScope {
	switch {
	case op.Group == catalog.Management:
		return catalog.RequestScope{Kind: "system"}
	case op.Group == catalog.Runtime:
		return catalog.RequestScope{Kind: "sandbox", SandboxID: sandboxID}
	case sandboxID != "" && op.Scope != catalog.ScopeSystem:
		return catalog.RequestScope{Kind: "sandbox", SandboxID: sandboxID}
	}
	return catalog.RequestScope{Kind: "system"}
}

// ArgSandboxID returns args.sandbox_id for operations that declare it
// (observability), so it can also travel in the scope.
func ArgSandboxID(op *catalog.Op, args catalog.Args) string {
	if op.Group == catalog.Management || op.Arg("sandbox_id") == nil {
		return ""
	}
	return args.String("sandbox_id")
}

// CheckSandboxID applies the client-side rule to a sandbox id given for the
// scope; what names it (e.g. "--sandbox-id" or "sandbox_id") prefixes the message.
func CheckSandboxID(what, id string) *catalog.Error {
	if strings.TrimSpace(id) == "" {
		return catalog.Errorf(catalog.InvalidRequest, "%s must be non-empty", what)
	}
	if !catalog.ValidID(id) {
		return catalog.Errorf(catalog.InvalidRequest, "%s must match [A-Za-z0-9._:-]{1,128}", what)
	}
	return nil
}

func asError(kind string, err error) *catalog.Error {
	if e, ok := err.(*catalog.Error); ok {
		return e
	}
	return catalog.Errorf(kind, "%v", err)
}
