// Package web is the supervisor's optional HTTP listener (contract §2.8):
// GET /health, token login at /auth, POST /api/rpc (the socket's request
// handling, reached through Dispatcher) and the live event stream
// GET /api/events (SSE over the event store, through Events) and a
// command's transcript while it runs, GET /api/commands/{id}/stream, and
// the preview routes /forward/shared/<port>/… and
// /forward/isolated=<session>/<port>/… (forward.go).
//
// It never listens on anything but the loopback listener it is given, never
// logs, echoes or traces the UI token, and never imports the supervisor: the
// supervisor implements Dispatcher and Events. GET / and /app/, /vendor/
// serve the console's pages (package console), embedded in the binary.
//
// Security model: every route but /health and /auth needs the UI token,
// presented as `Authorization: Bearer <token>` or the es_ui cookie that
// /auth sets (HttpOnly, SameSite=Strict). The cookie holds a value derived
// from the token, not the token itself. A browser on another site cannot
// send the cookie (SameSite=Strict), and anything that does reach a
// state-changing route with a foreign or null Origin is refused (403), as is
// a Host other than the listener's own (DNS rebinding). Responses are never
// cached and carry a strict Content-Security-Policy.
package web

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/web/console"
)

// Dispatcher runs one request object exactly as the Unix socket would
// (§2.4 steps 3-9) and returns the response value: a result, or a
// *catalog.Error. ctx ends when the HTTP client goes away; progress
// receives the _stream_logs messages of streaming operations.
type Dispatcher interface {
	Dispatch(ctx context.Context, body []byte, progress func(string)) any
}

// Doctor diagnoses the host the way `sandbox-supervisor doctor` does; its
// report (checks with their fixes) is JSON as the CLI prints it. It is not
// a catalog operation: it describes the host, not a sandbox, and runs
// probes, so only the console (behind the token) asks for it.
type Doctor interface {
	Doctor(ctx context.Context) any
}

// Config is what New needs.
type Config struct {
	Listener   net.Listener // loopback, already bound (its address is in http.addr)
	Token      []byte       // the UI token, without its newline
	Dispatcher Dispatcher
	Events     Events
	Commands   Commands
	Doctor     Doctor // nil: GET /api/doctor is 404
	Forward    ForwardConfig
	Logger     *slog.Logger
	// MaxBodyBytes bounds a /api/rpc body (the socket's max_request_bytes).
	MaxBodyBytes int
	// ReadTimeout bounds reading a request (headers and body), like the
	// socket's request_read_timeout_s.
	ReadTimeout time.Duration
}

// MaxEventStreams caps concurrent /api/events streams: each holds a
// goroutine and a bounded buffer.
const MaxEventStreams = 32

// Server is the running listener.
type Server struct {
	cfg     Config
	srv     *http.Server
	origins map[string]bool // the listener's own origins (scheme://host:port)
	hosts   map[string]bool // the Host values it answers to
	cookie  string          // expected es_ui value
	streams chan struct{}   // event stream slots
	done    chan struct{}   // closed at Shutdown: streams end
	once    sync.Once
}

// CookieName is the login cookie of §2.8.
const CookieName = "es_ui"

// New prepares the server on cfg.Listener; Serve runs it.
func New(cfg Config) (*Server, error) {
	if len(cfg.Token) == 0 {
		return nil, errors.New("web: empty UI token")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	tcp, ok := cfg.Listener.Addr().(*net.TCPAddr)
	if !ok || !tcp.IP.IsLoopback() {
		return nil, fmt.Errorf("web: listener %s is not a loopback TCP address", cfg.Listener.Addr())
	}
	s := &Server{cfg: cfg, origins: map[string]bool{}, hosts: map[string]bool{},
		streams: make(chan struct{}, MaxEventStreams), done: make(chan struct{})}
	port := strconv.Itoa(tcp.Port)
	// The listener's literal is its own origin; "localhost" names the same
	// listener on this machine and is what people type.
	for _, h := range []string{net.JoinHostPort(tcp.IP.String(), port), net.JoinHostPort("localhost", port)} {
		s.hosts[h] = true
		s.origins["http://"+h] = true
	}
	s.cookie = cookieValue(cfg.Token)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /auth", s.auth)
	mux.HandleFunc("POST /api/rpc", s.authed(s.rpc))
	mux.HandleFunc("GET /api/events", s.authed(s.events))
	mux.HandleFunc("GET /api/commands/{id}/stream", s.authed(s.commandStream))
	if cfg.Doctor != nil {
		mux.HandleFunc("GET /api/doctor", s.authed(func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, cfg.Doctor.Doctor(r.Context()))
		}))
	}
	notFound := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, catalog.Errorf(catalog.NotFound, "no such route: %s %s", r.Method, r.URL.Path))
	})
	assets := console.Handler(notFound)
	pages := s.authed(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", pageCSP)
		assets.ServeHTTP(w, r)
	})
	for _, p := range []string{"GET /{$}", "GET /app/", "GET /vendor/"} {
		mux.HandleFunc(p, pages)
	}
	mux.HandleFunc("/forward/", s.authed(newForwarder(cfg.Forward, tcp.Port, cfg.Logger).serve))
	mux.Handle("/", notFound)
	s.srv = &http.Server{
		Handler:           s.guard(mux),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       cfg.ReadTimeout,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		// net/http's own messages (panics, bad handshakes) name no URL or
		// header, so they cannot carry the token.
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// Serve answers requests until Shutdown; it returns nil after Shutdown.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.cfg.Listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve http on %s: %w", s.cfg.Listener.Addr(), err)
	}
	return nil
}

// Shutdown stops accepting, ends the event streams and waits (bounded by
// ctx) for requests in flight; what is still running then is cut off.
func (s *Server) Shutdown(ctx context.Context) {
	s.once.Do(func() { close(s.done) })
	if err := s.srv.Shutdown(ctx); err != nil {
		s.srv.Close()
	}
}

// cookieValue derives the es_ui value from the token, so the cookie jar
// never holds the token itself.
func cookieValue(token []byte) string {
	m := hmac.New(sha256.New, token)
	m.Write([]byte("ephemeral-sandbox es_ui cookie v1"))
	return hex.EncodeToString(m.Sum(nil))
}

// csp allows only same-origin resources and no inline script or style: the
// console (when it exists) ships its scripts as files.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; " +
	"connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// pageCSP is the console pages' policy: csp, except that styles may be
// inline. The terminal (xterm.js) injects <style> elements and per-cell
// style attributes at run time; scripts stay 'self'-only, and the pages put
// supervisor data into the DOM as text, never as markup.
const pageCSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; " +
	"connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// guard applies what holds for every route: security headers, the Host
// check and the Origin check of state-changing methods.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", csp)
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		if !s.hosts[strings.ToLower(r.Host)] {
			// A page whose name was rebound to 127.0.0.1 arrives with its
			// own name as Host.
			writeError(w, http.StatusForbidden, catalog.Errorf(catalog.Unauthorized, "unexpected Host header"))
			return
		}
		if stateChanging(r.Method) || r.URL.Path == "/api/rpc" {
			if e := s.checkOrigin(r); e != nil {
				writeError(w, http.StatusForbidden, e)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func stateChanging(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// checkOrigin refuses a request whose Origin is null or another site's
// (§2.8). A request without Origin (curl, the CLIs) is not from a page.
func (s *Server) checkOrigin(r *http.Request) *catalog.Error {
	vals := r.Header.Values("Origin")
	if len(vals) == 0 {
		return nil
	}
	if len(vals) > 1 || !s.origins[strings.ToLower(vals[0])] {
		return catalog.Errorf(catalog.Unauthorized, "cross-origin request refused").With("origin", truncate(vals[0], 200))
	}
	return nil
}

func truncate(v string, n int) string {
	if len(v) > n {
		return v[:n]
	}
	return v
}

// authed requires the UI token (Bearer) or the es_ui cookie.
func (s *Server) authed(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if e := s.authenticate(r); e != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ephemeral-sandbox"`)
			writeError(w, http.StatusUnauthorized, e)
			return
		}
		next(w, r)
	}
}

func (s *Server) authenticate(r *http.Request) *catalog.Error {
	if a := r.Header.Get("Authorization"); a != "" {
		scheme, tok, ok := strings.Cut(a, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return catalog.Errorf(catalog.Unauthorized, "Authorization must be Bearer <ui token>")
		}
		if subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), s.cfg.Token) != 1 {
			return catalog.Errorf(catalog.Unauthorized, "wrong UI token")
		}
		return nil
	}
	if c, err := r.Cookie(CookieName); err == nil {
		if subtle.ConstantTimeCompare([]byte(c.Value), []byte(s.cookie)) == 1 {
			return nil
		}
		return catalog.Errorf(catalog.Unauthorized, "stale or wrong %s cookie: log in again with the URL from `sandbox-supervisor ui`", CookieName)
	}
	return catalog.Errorf(catalog.Unauthorized, "the UI token is required: Authorization: Bearer <ui token>, or log in with the URL from `sandbox-supervisor ui`")
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "service": "supervisor_http"})
}

// auth exchanges the token in the URL for the es_ui cookie and sends the
// browser on to / so that the token leaves the address bar and history.
func (s *Server) auth(w http.ResponseWriter, r *http.Request) {
	tok := r.URL.Query().Get("token")
	if tok == "" || subtle.ConstantTimeCompare([]byte(tok), s.cfg.Token) != 1 {
		writeError(w, http.StatusUnauthorized, catalog.Errorf(catalog.Unauthorized, "wrong or missing UI token"))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: s.cookie, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode})
	w.Header().Set("Location", "/")
	w.WriteHeader(http.StatusSeeOther)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(catalog.CompactJSON(v), '\n'))
}

func writeError(w http.ResponseWriter, status int, e *catalog.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(e.MarshalEnvelope(), '\n'))
}
