package supervisor

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/doctor"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/rpc"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/web"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// newHTTP binds the HTTP listener (§2.8) on addr, writes http.addr into
// runDir (before the socket exists, like listen.addr) and prepares the
// server; Serve starts it. tcp is the TCP listener or nil: /forward refuses
// its port like the HTTP listener's own.
func (s *Supervisor) newHTTP(addr, runDir string, tcp net.Listener) (*web.Server, error) {
	token, err := readToken(s.dirs.Config, "ui.token")
	if err != nil {
		return nil, err
	}
	ln, err := tcpListen(addr, runDir, "http.addr")
	if err != nil {
		return nil, err
	}
	fwd := web.ForwardConfig{Forwarder: webForwarder{s},
		ConnectTimeout:  time.Duration(s.cfg.HTTP.Forward.ConnectTimeoutS * float64(time.Second)),
		ResponseTimeout: time.Duration(s.cfg.HTTP.Forward.ResponseTimeoutS * float64(time.Second))}
	if tcp != nil {
		fwd.OwnPorts = append(fwd.OwnPorts, tcp.Addr().(*net.TCPAddr).Port)
	}
	srv, err := web.New(web.Config{Listener: ln, Token: token, Dispatcher: webDispatcher{s}, Events: webEvents{s}, Commands: webCommands{s},
		Doctor:  webDoctor{s},
		Forward: fwd,
		Logger:  s.log, MaxBodyBytes: s.cfg.Supervisor.MaxRequestBytes,
		ReadTimeout: time.Duration(s.cfg.Supervisor.RequestReadTimeoutS * float64(time.Second))})
	if err != nil {
		ln.Close()
		return nil, catalog.Errorf(catalog.ConfigError, "%w", err)
	}
	s.httpBase = "http://" + ln.Addr().String()
	s.log.Info("supervisor listening on HTTP", "addr", tcpAddrString(ln))
	return srv, nil
}

// webDispatcher runs /api/rpc requests through the socket's mux: the same
// validation, handlers, envelope and limits.
type webDispatcher struct{ s *Supervisor }

func (d webDispatcher) Dispatch(ctx context.Context, body []byte, progress func(string)) any {
	s := d.s
	if s.draining.Load() {
		return catalog.Errorf(catalog.ServerShuttingDown, "the supervisor is shutting down")
	}
	// An HTTP request holds a connection slot like a socket connection.
	select {
	case s.conns <- struct{}{}:
		defer func() { <-s.conns }()
	default:
		return catalog.Errorf(catalog.ServerBusy, "too many concurrent connections").
			With("max_concurrent_connections", s.cfg.Supervisor.MaxConcurrentConnections)
	}
	s.active.Add(1)
	defer s.active.Add(-1)
	// Only the operations that may stop early see the hang-up, as on the
	// socket; the others complete (§2.4).
	return s.mux.Serve(body, rpc.Origin{Progress: progress, Conn: func() (context.Context, func()) { return rpc.HangupOf(ctx) }})
}

// webCommands gives the transcript stream the commands of a sandbox.
type webCommands struct{ s *Supervisor }

func (c webCommands) Follow(sandboxID, commandID string) (web.Transcript, error) {
	c.s.mu.Lock()
	sb := c.s.sandboxes.Get(sandboxID)
	c.s.mu.Unlock()
	if sb == nil {
		return nil, catalog.Errorf(catalog.NotFound, "sandbox not found: %s", sandboxID).With("sandbox_id", sandboxID)
	}
	cmd, e := workspace.LookupCommand(sb, commandID)
	if e != nil {
		return nil, e
	}
	return cmdTranscript{cmd}, nil
}

type cmdTranscript struct{ cmd *command }

func (t cmdTranscript) Rows(cursor, limit int) ([]string, int, int) {
	rows, first, end, _ := t.cmd.Transcript.Rows(cursor, limit)
	return rows, first, end
}

func (t cmdTranscript) Changed() <-chan struct{} { return t.cmd.Transcript.Changed() }
func (t cmdTranscript) Done() <-chan struct{}    { return t.cmd.Done }

func (t cmdTranscript) Result() map[string]any {
	t.cmd.Mu.Lock()
	defer t.cmd.Mu.Unlock()
	r := t.cmd.Rec
	return map[string]any{"command_session_id": r.CommandSessionID, "workspace_session_id": r.WorkspaceSessionID,
		"status": r.Status, "exit_code": r.ExitCode, "total_lines": t.cmd.Transcript.Total()}
}

// webForwarder opens /forward/isolated=… connections through the session's
// holder, like forward_port's listeners.
type webForwarder struct{ s *Supervisor }

// session finds a live isolated session by ID in any sandbox: the route
// names no sandbox, and session IDs are unique across them.
func (f webForwarder) session(id string) *session {
	f.s.mu.Lock()
	sbs := make([]*sandbox, 0, f.s.sandboxes.Len())
	for _, sb := range f.s.sandboxes.All() {
		sbs = append(sbs, sb)
	}
	f.s.mu.Unlock()
	for _, sb := range sbs {
		if ss, e := workspace.LookupSession(sb, id); e == nil {
			if ss.IsGone() || ss.Rec.NetworkProfile != workspace.NetIsolated {
				return nil
			}
			return ss
		}
	}
	return nil
}

func (f webForwarder) IsolatedSession(id string) bool { return f.session(id) != nil }

func (f webForwarder) DialSession(ctx context.Context, id string, port int) (net.Conn, error) {
	ss := f.session(id)
	if ss == nil {
		return nil, fmt.Errorf("dial %s:%d: %w", id, port, catalog.Errorf(catalog.NotFound, "no isolated workspace session %s", id))
	}
	return ss.Dial(ctx, port, time.Duration(f.s.cfg.HTTP.Forward.ConnectTimeoutS*float64(time.Second)))
}

// webDoctor runs the host diagnosis for the console's Doctor tab with the
// configuration and data directory this supervisor runs with.
type webDoctor struct{ s *Supervisor }

func (d webDoctor) Doctor(ctx context.Context) any {
	return doctor.Run(ctx, doctor.Options{Self: d.s.self, DataDir: d.s.dirs.Data, Config: d.s.cfg})
}
