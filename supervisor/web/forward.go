package web

// The preview routes of §2.8: /forward/shared/<port>/… reverse-proxies to
// 127.0.0.1:<port> in the user's network namespace, and
// /forward/isolated=<session>/<port>/… to 127.0.0.1:<port> inside an
// isolated session, through its holder (Forwarder).
//
// What the target sees and returns is trimmed so forwarded content can never
// act with the UI's credentials: Authorization, Cookie and client-sent
// X-Forwarded-*/Forwarded are dropped toward it, Set-Cookie is dropped from
// its answers, and every answer carries a sandboxing CSP, so a page served
// here runs in an opaque origin even though its URL is the listener's own.
// The listener's own ports (HTTP and TCP) are refused so that a forward
// cannot be used to reach the supervisor with credentials injected by a
// page.

import (
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// Forwarder reaches the isolated sessions for /forward/isolated=….
type Forwarder interface {
	// IsolatedSession reports whether id names a live session whose network
	// profile is isolated (anything else is a 404, §2.8).
	IsolatedSession(id string) bool
	// DialSession connects to 127.0.0.1:port inside session id.
	DialSession(ctx context.Context, id string, port int) (net.Conn, error)
}

// ForwardConfig is what the /forward routes need; a nil Forwarder turns off
// /forward/isolated=… (404).
type ForwardConfig struct {
	Forwarder Forwarder
	// OwnPorts are the supervisor's other listener ports (the TCP
	// listener); the HTTP listener's own port is always refused.
	OwnPorts []int
	// ConnectTimeout and ResponseTimeout are http.forward.connect_timeout_s
	// and response_timeout_s; zero means the contract's 10 s and 30 s.
	ConnectTimeout  time.Duration
	ResponseTimeout time.Duration
}

// sandboxCSP is §2.8's policy for forwarded responses: the content may run
// scripts, but in an opaque origin without the UI's cookies or storage.
const sandboxCSP = "sandbox allow-scripts allow-forms allow-popups allow-modals"

// Upstream requests carry the target in the URL's host so that the
// transport's connection pool never hands a connection into one target to
// a request for another: shared targets are 127.0.0.1, session targets a
// name under .invalid that only forwardDial understands.
const sessionHostSuffix = ".session.invalid"

func sessionHost(id string) string { return "s" + hex.EncodeToString([]byte(id)) + sessionHostSuffix }

type forwarder struct {
	cfg   ForwardConfig
	own   map[int]bool
	proxy *httputil.ReverseProxy
}

func newForwarder(cfg ForwardConfig, httpPort int, logger *slog.Logger) *forwarder {
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.ResponseTimeout <= 0 {
		cfg.ResponseTimeout = 30 * time.Second
	}
	f := &forwarder{cfg: cfg, own: map[int]bool{httpPort: true}}
	for _, p := range cfg.OwnPorts {
		f.own[p] = true
	}
	tr := &http.Transport{
		DialContext:           f.dial,
		ResponseHeaderTimeout: cfg.ResponseTimeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		DisableCompression:    true, // pass the target's encoding through untouched
	}
	f.proxy = &httputil.ReverseProxy{
		Rewrite:        f.rewrite,
		Transport:      tr,
		FlushInterval:  -1, // streaming bodies reach the client as they come
		ModifyResponse: f.modifyResponse,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status := http.StatusBadGateway
			var ne net.Error
			if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
				status = http.StatusGatewayTimeout
			}
			if r.Context().Err() != nil {
				return // the client went away; nobody reads an answer
			}
			logger.Warn("http forward", "path", r.URL.Path, "err", err)
			// This answer is the listener's own, not the target's: it gets
			// the headers guard gives every other answer, which serve
			// dropped for the target's response.
			h := w.Header()
			h.Set("Content-Security-Policy", csp)
			h.Set("Cache-Control", "no-store")
			h.Set("X-Frame-Options", "DENY")
			writeError(w, status, catalog.Errorf(catalog.OperationFailed, "forward: %v", err))
		},
	}
	return f
}

// dial reaches the target named by addr (see sessionHostSuffix).
func (f *forwarder) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return nil, err
	}
	if host == "127.0.0.1" {
		d := net.Dialer{Timeout: f.cfg.ConnectTimeout}
		return d.DialContext(ctx, "tcp4", addr)
	}
	enc, ok := strings.CutSuffix(host, sessionHostSuffix)
	if !ok || len(enc) < 1 || enc[0] != 's' || f.cfg.Forwarder == nil {
		return nil, errors.New("forward: unexpected upstream " + addr)
	}
	id, err := hex.DecodeString(enc[1:])
	if err != nil {
		return nil, errors.New("forward: unexpected upstream " + addr)
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.ConnectTimeout)
	defer cancel()
	return f.cfg.Forwarder.DialSession(ctx, string(id), port)
}

// target is one parsed /forward path.
type target struct {
	host   string // URL host for the transport: 127.0.0.1:port or the session name
	port   int
	prefix string // what is stripped, e.g. /forward/shared/8000
	rest   string // the rest of the path, starting with /
}

// parseForward splits /forward/<kind>/<port>/<rest>. Errors are the
// contract's: 400 for a bad port, 404 for an unknown session or route.
func (f *forwarder) parseForward(p string) (target, int, *catalog.Error) {
	rest, _ := strings.CutPrefix(p, "/forward/")
	kind, rest, _ := strings.Cut(rest, "/")
	portStr, tail, _ := strings.Cut(rest, "/")
	t := target{prefix: "/forward/" + kind + "/" + portStr, rest: "/" + tail}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != portStr {
		return t, http.StatusBadRequest, catalog.Errorf(catalog.InvalidRequest, "forward: port must be decimal 1-65535, got %q", truncate(portStr, 20))
	}
	t.port = port
	if f.own[port] {
		return t, http.StatusForbidden, catalog.Errorf(catalog.Unauthorized, "forward: port %d is one of the supervisor's own listeners", port).With("port", port)
	}
	switch {
	case kind == "shared":
		t.host = net.JoinHostPort("127.0.0.1", portStr)
	case strings.HasPrefix(kind, "isolated="):
		id := strings.TrimPrefix(kind, "isolated=")
		if f.cfg.Forwarder == nil || id == "" || !f.cfg.Forwarder.IsolatedSession(id) {
			return t, http.StatusNotFound, catalog.Errorf(catalog.NotFound, "forward: no isolated workspace session %q", truncate(id, 100)).
				With("workspace_session_id", truncate(id, 100))
		}
		t.host = net.JoinHostPort(sessionHost(id), portStr)
	default:
		return t, http.StatusNotFound, catalog.Errorf(catalog.NotFound, "no such route: %s", truncate(p, 200))
	}
	return t, 0, nil
}

type targetKey struct{}

// serve is the handler of both routes (behind authed).
func (f *forwarder) serve(w http.ResponseWriter, r *http.Request) {
	t, status, e := f.parseForward(r.URL.EscapedPath())
	if e != nil {
		writeError(w, status, e)
		return
	}
	// guard's policy is the console's; forwarded pages get sandboxCSP
	// instead (added in modifyResponse, after the target's own headers).
	h := w.Header()
	h.Del("Content-Security-Policy")
	h.Del("Cache-Control")
	h.Set("X-Frame-Options", "SAMEORIGIN") // the console may frame a preview
	f.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
}

func (f *forwarder) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(targetKey{}).(target)
	// Rewrite mode has already dropped hop-by-hop headers and the client's
	// X-Forwarded-For/Host/Proto.
	out := pr.Out
	out.URL = &url.URL{Scheme: "http", Host: t.host, RawQuery: pr.In.URL.RawQuery}
	if u, err := url.Parse(t.rest); err == nil {
		out.URL.Path, out.URL.RawPath = u.Path, u.RawPath
	} else {
		out.URL.Path = t.rest
	}
	out.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(t.port))
	out.Header.Del("Authorization")
	out.Header.Del("Cookie")
	out.Header.Del("Forwarded")
	out.Header.Del("X-Forwarded-Prefix")
	pr.SetXForwarded() // For, Host (the listener's) and Proto
	out.Header.Set("X-Forwarded-Prefix", t.prefix)
}

func (f *forwarder) modifyResponse(resp *http.Response) error {
	resp.Header.Del("Set-Cookie")
	resp.Header.Add("Content-Security-Policy", sandboxCSP)
	resp.Header.Set("Cache-Control", "no-store")
	return nil
}
