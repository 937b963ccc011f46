package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// Request is one validated request on its way through a handler.
type Request struct {
	// Ctx derives from the request's connection and carries its request ID
	// (RequestID). It ends with the client only for cancellable operations.
	Ctx  context.Context
	Req  *catalog.Request
	Op   *catalog.Op
	Args catalog.Args
	// Progress sends a _stream_logs line (§2.5); a no-op unless the request
	// asked for them and the operation streams.
	Progress func(string)
	// State is what Config.Bind attached (the resolved sandbox).
	State any
}

// Handler runs one operation.
type Handler func(r *Request) (any, error)

// Config is the supervisor's part of the request line.
type Config struct {
	Log *slog.Logger
	// Authorize applies §2.4 step 4 to the parsed line and removes the
	// token field from raw before anything else sees it; tcp marks the
	// token-authenticated listener.
	Authorize func(raw map[string]any, tcp bool) *catalog.Error
	// NewRequestID mints the ID of a request that has none.
	NewRequestID func() string
	// Bind runs once the scope is normalised and before the arguments are
	// validated (a request for an unknown sandbox is not_found whatever its
	// arguments); it may set r.State, and release runs when the request
	// ends.
	Bind func(r *Request) (release func(), err error)
	// Errors translate domain errors to the contract's kinds, tried in
	// order by Error (see As).
	Errors []func(error) *catalog.Error
}

// Mux routes requests to the handlers registered against catalog
// declarations.
type Mux struct {
	cfg      Config
	handlers map[string]Handler
}

// New returns a Mux without handlers.
func New(cfg Config) *Mux {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Mux{cfg: cfg, handlers: map[string]Handler{}}
}

// Handle registers h for the declared operation opID. An operation the
// catalog does not declare, or one registered twice, is refused: every
// handler answers exactly one declaration.
func (m *Mux) Handle(opID string, h Handler) error {
	if _, ok := catalog.Lookup(opID); !ok {
		return fmt.Errorf("handler for %s: the catalog declares no such operation", opID)
	}
	if _, dup := m.handlers[opID]; dup {
		return fmt.Errorf("handler for %s registered twice", opID)
	}
	if h == nil {
		return fmt.Errorf("handler for %s is nil", opID)
	}
	m.handlers[opID] = h
	return nil
}

// Missing lists the declared operations without a handler, in catalog
// order; a client would get unknown_op for them.
func (m *Mux) Missing() []string {
	var out []string
	for _, op := range catalog.Ops() {
		if m.handlers[op.ID] == nil {
			out = append(out, op.ID)
		}
	}
	return out
}

// Origin is where a request came from.
type Origin struct {
	TCP bool // the TCP RPC listener: the gateway token is required
	// Conn returns the context of the request's connection, cancelled with
	// cause ErrClientGone when the client goes away, and the function that
	// ends the watch (WatchHangup, HangupOf). Required.
	Conn     func() (context.Context, func())
	Progress func(string) // _stream_logs lines (§2.5)
}

type requestIDKey struct{}

// RequestID is the ID of the request ctx belongs to, "" outside one.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// Serve runs §2.4 steps 3-9 for one request line and returns the response
// value: a result, or a *catalog.Error.
func (m *Mux) Serve(line []byte, from Origin) (out any) {
	raw, perr := catalog.ParseLine(line)
	if perr != nil {
		return perr
	}
	if m.cfg.Authorize != nil {
		if e := m.cfg.Authorize(raw, from.TCP); e != nil { // strips the token
			return e
		}
	}
	req, perr := catalog.DecodeRequest(raw)
	if perr != nil {
		return perr
	}
	if req.RequestID == "" && m.cfg.NewRequestID != nil {
		req.RequestID = m.cfg.NewRequestID()
	}
	op, known := catalog.Lookup(req.Op)
	h := m.handlers[req.Op]
	if !known || h == nil {
		return catalog.Errorf(catalog.UnknownOp, "unknown operation: %s", req.Op).With("op", req.Op)
	}
	if e := NormalizeScope(op, req); e != nil {
		return e
	}
	r := &Request{Req: req, Op: op, Progress: func(string) {}}
	ctx, stop := requestContext(req, op, from)
	defer stop()
	r.Ctx = ctx
	if req.StreamLogs && op.Streams && from.Progress != nil {
		r.Progress = from.Progress
	}
	if m.cfg.Bind != nil {
		release, err := m.cfg.Bind(r)
		if err != nil {
			return m.Error(op.ID, err)
		}
		defer release()
	}
	args, verr := op.Validate(req.Args)
	if verr != nil {
		return verr
	}
	r.Args = args
	defer func() {
		if p := recover(); p != nil {
			m.cfg.Log.Error("handler panic", "op", op.ID, "panic", p, "stack", string(debug.Stack()))
			out = catalog.Errorf(catalog.InternalError, "internal error in %s", op.ID)
		}
	}()
	res, err := h(r)
	if err = ClientGone(r.Ctx, err); errors.Is(err, ErrClientGone) {
		m.cfg.Log.Info("request cancelled: the client disconnected", "op", op.ID, "request_id", req.RequestID)
	}
	if err != nil {
		return m.Error(op.ID, err)
	}
	return res
}

// requestContext derives the request's context from its connection: the
// request ID as a value, and the connection's cancellation only for the
// operations whose declaration says they may stop; the others complete even
// when their client goes away (§2.4), so they get the values without the
// cancellation. stop ends the connection's watch when the request ends.
func requestContext(req *catalog.Request, op *catalog.Op, from Origin) (ctx context.Context, stop func()) {
	ctx, stop = from.Conn()
	ctx = context.WithValue(ctx, requestIDKey{}, req.RequestID)
	if !op.Cancellable {
		ctx = context.WithoutCancel(ctx)
	}
	return ctx, stop
}
