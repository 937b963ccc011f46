package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"math"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/web"
)

// The supervisor's side of observability (package obs): which store a
// sandbox's records go to, the supervisor.dispatch root span of a request,
// the events and trace handlers and the HTTP event stream.
//
// The span helpers (spanIn, eventIn, eventCtxIn, spanFrom and the
// methods of span) are adapters that keep the domain code's call sites as
// they were before obs existed; code that moves out of this package calls
// obs.Start / obs.Event on the request context instead.

type (
	// obsRegistry is every store of the supervisor (§10.1); nil-safe.
	obsRegistry = obs.Registry
	// SinkStats are the drop and truncation counters of a store (§10.1).
	SinkStats = obs.SinkStats
	// span is an obs.Span seen through the adapter methods below.
	span obs.Span
)

// Span statuses (§10.2).
const (
	spanCompleted = obs.Completed
	spanError     = obs.Error
	spanCancelled = obs.Cancelled
	spanTimedOut  = obs.TimedOut
)

// newObsRegistry prepares the stores of observability.* under data; log
// receives every event, ids mints the synthetic trace ids.
func newObsRegistry(cfg *config.Config, data string, log *slog.Logger, ids *statedb.IDs) *obs.Registry {
	opt := obs.Options{Enabled: cfg.Observability.Enabled,
		MaxDiskBytes: int64(cfg.Observability.MaxDiskBytes), MaxLineBytes: cfg.Observability.MaxLineBytes,
		ResourcesEnabled:      cfg.Observability.ResourceStats.Enabled,
		ResourcesMaxDiskBytes: int64(cfg.Observability.ResourceStats.MaxDiskBytes), Log: log}
	if ids != nil {
		opt.NewID = ids.New
	}
	return obs.New(opt, data)
}

// scopeOf names sb's stores (nil: the supervisor's).
func scopeOf(sb *sandbox) obs.Scope {
	if sb == nil {
		return obs.Scope{}
	}
	return obs.Scope{ID: sb.Rec.ID, Dir: sb.Dir}
}

func (sp *span) o() *obs.Span { return (*obs.Span)(sp) }

func spanFrom(ctx context.Context) *span { return (*span)(obs.From(ctx)) }

func (sp *span) child(name string, attrs map[string]any) *span {
	return (*span)(sp.o().Child(name, attrs))
}

func (sp *span) event(name string, attrs map[string]any) { sp.o().Event(name, attrs) }

func (sp *span) end(status string, attrs map[string]any) { sp.o().End(status, attrs) }

func (sp *span) done(err error, attrs map[string]any) { sp.o().Done(err, attrs) }

func spanStatus(err error) string { return obs.Status(err) }

// spanCtx is obs.Start with sb's store for work outside a request. The
// origin of a synthetic trace follows from the span's name (every caller
// passes that same origin or "").
func spanIn(reg *obs.Registry, ctx context.Context, sb *sandbox, _ /* origin */, name string, attrs map[string]any) (*span, context.Context) {
	ctx, sp := obs.Start(obs.WithScope(ctx, reg, scopeOf(sb)), name, attrs)
	return (*span)(sp), ctx
}

// event records an event in sb's store (nil: system store); trace ""
// mints a synthetic trace id.
func eventIn(reg *obs.Registry, sb *sandbox, trace, name string, attrs map[string]any) {
	reg.Event(scopeOf(sb), trace, name, attrs)
}

// eventCtx records an event in sb's store, in the trace of the span ctx
// carries (as its child), or outside any request when there is none.
func eventCtxIn(reg *obs.Registry, ctx context.Context, sb *sandbox, name string, attrs map[string]any) {
	sp := obs.From(ctx)
	reg.Record(scopeOf(sb), sp.Trace(), sp.ID(), name, attrs)
}

// obsStats returns the counters of sb's store, or with sb nil the totals of
// every store (health's event_store).
func obsStats(reg *obs.Registry, sb *sandbox) SinkStats {
	if sb == nil {
		return reg.Totals()
	}
	return reg.Store(scopeOf(sb)).Stats()
}

// requestSpan opens the supervisor.dispatch root span of a request (its
// trace is the request_id) and puts it in c.ctx; observability operations
// are not traced (§3.7).
func requestSpan(reg *obs.Registry, c *call) *span {
	if c.op.Group == catalog.Observability {
		return nil
	}
	sp := reg.StartSpan(scopeOf(c.sb), c.req.RequestID, "", "supervisor.dispatch", map[string]any{"op": c.op.ID})
	c.ctx = obs.With(c.ctx, sp)
	return (*span)(sp)
}

// finish ends a request's root span with the status err implies.
func (sp *span) finish(err error) {
	if sp == nil {
		return
	}
	var attrs map[string]any
	if err != nil {
		kind := string(catalog.OperationFailed)
		var ce *catalog.Error
		if errors.As(err, &ce) {
			kind = string(ce.Kind)
		}
		attrs = map[string]any{"error_kind": kind}
	}
	sp.end(spanStatus(err), attrs)
}

// ---- queries ----

// eventsView is the events operation (§10.3): chronological, filtered, the
// newest records within the caps.
func (s *Supervisor) eventsView(c *call) (any, error) {
	f := obs.EventFilter{Name: c.args.String("name"), HasName: c.args.Has("name"),
		SinceMs: math.MaxInt64, HasSince: c.args.Has("since_ms"), LastN: int(c.args.Uint("last_n")),
		AfterSeq: c.args.Uint("after_seq"), HasAfter: c.args.Has("after_seq")}
	if u := c.args.Uint("since_ms"); u <= math.MaxInt64 {
		f.SinceMs = int64(u)
	}
	page, err := s.obs.Store(scopeOf(c.sb)).EventsPage(c.ctx, f)
	if err != nil {
		// %v until catalog.Error carries a cause: Errorf formats with Sprintf.
		return nil, catalog.Errorf(catalog.OperationFailed, "%v", err)
	}
	out := map[string]any{"view": "events", "events": page.Events}
	if page.Paged {
		out["truncated"] = page.Truncated
		if page.Truncated {
			out["next_after_seq"] = page.NextAfterSeq
		}
	}
	return out, nil
}

// traceView is the trace operation (§10.3).
func (s *Supervisor) traceView(c *call) (any, error) {
	id := c.args.String("trace_id")
	trace, roots, err := s.obs.Store(scopeOf(c.sb)).Trace(c.ctx, id)
	switch {
	case errors.Is(err, obs.ErrTraceNotFound):
		return nil, catalog.Errorf(catalog.NotFound, "trace not found: %s", id).With("trace_id", id)
	case err != nil:
		return nil, catalog.Errorf(catalog.OperationFailed, "%v", err)
	case trace == "":
		return map[string]any{"view": "trace", "trace": nil, "spans": []any{}}, nil
	}
	return map[string]any{"view": "trace", "trace": trace, "spans": roots}, nil
}

// webEvents is the event store as the HTTP stream sees it.
type webEvents struct{ s *Supervisor }

func (e webEvents) Subscribe(buf int) (<-chan web.Record, func()) {
	return obs.Subscribe(e.s.obs, buf, func(r obs.Record) web.Record { return web.Record(r) })
}

// Replay reads the event logs (every sandbox's and the supervisor's, or one
// sandbox's) for records after `after`, keeping the newest max.
func (e webEvents) Replay(sandboxID string, after uint64, maxRecs int) ([]web.Record, int, error) {
	s := e.s
	var scopes []obs.Scope
	if sandboxID != "" {
		sb := s.sandboxes.Get(sandboxID)
		if sb == nil {
			return nil, 0, catalog.Errorf(catalog.NotFound, "sandbox not found: %s", sandboxID).With("sandbox_id", sandboxID)
		}
		scopes = append(scopes, scopeOf(sb))
	} else {
		scopes = append(scopes, obs.Scope{})
		for _, sb := range s.sandboxes.All() {
			scopes = append(scopes, scopeOf(sb))
		}
	}
	// The stream's interface has no context yet; a replay reads at most
	// two bounded segments per store.
	recs, skipped, err := s.obs.Replay(context.Background(), scopes, after, maxRecs)
	if err != nil {
		return nil, 0, err
	}
	out := make([]web.Record, len(recs))
	for i, r := range recs {
		out[i] = web.Record(r)
	}
	return out, skipped, nil
}
