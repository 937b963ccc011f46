package obs

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Spans and events (§10.2).
//
// The span travels in the context:
//
//   - Start(ctx, name, attrs) starts name as a child of the span ctx
//     carries or, outside any request, as the root of a synthetic trace in
//     the store WithScope put in ctx; it returns ctx carrying the new span.
//     Event(ctx, name, attrs) records an event the same way.
//   - (*Registry).StartSpan and (*Registry).Event record into a named Scope
//     with an explicit trace; trace "" means "not part of a request": a
//     synthetic `<origin>-<id>` trace is minted with the origin of
//     eventOrigin(name).
//   - (*Span).End/Done write a span's record once; Child, Event and
//     Measured record below it. Every method is a no-op on a nil span
//     (observability disabled, or an observability op, which is never
//     traced).
//   - Every event is also logged with slog under its name (Warn for names
//     ending in "failed" and holder.exited, Info otherwise).
//
// Span IDs are s-<n> with n from one registry-wide counter, so they are
// unique within every trace recorded by one supervisor process (parents are
// always numbered before their children).

type spanKey struct{}

// With returns ctx carrying sp, so code below a handler can record
// children and events in the request's trace.
func With(ctx context.Context, sp *Span) context.Context {
	if sp == nil {
		return ctx
	}
	return context.WithValue(ctx, spanKey{}, sp)
}

// From returns the span carried by ctx, or nil.
func From(ctx context.Context) *Span {
	if ctx == nil {
		return nil
	}
	sp, _ := ctx.Value(spanKey{}).(*Span)
	return sp
}

type scopeKey struct{}

type scoped struct {
	r  *Registry
	sc Scope
}

// WithScope returns ctx naming the registry and store that Start and Event
// record into when ctx carries no span (work outside a request).
func WithScope(ctx context.Context, r *Registry, sc Scope) context.Context {
	if r == nil {
		return ctx
	}
	return context.WithValue(ctx, scopeKey{}, scoped{r, sc})
}

func scopeFrom(ctx context.Context) (scoped, bool) {
	v, ok := ctx.Value(scopeKey{}).(scoped)
	return v, ok
}

// Start starts name as a child of the span ctx carries or, without one, as
// the root of a synthetic trace (origin from eventOrigin(name)) in the
// scope of ctx. It returns ctx carrying the new span, so the work below
// records its spans and events under it. Without a span or a scope in ctx
// (or with observability disabled) the span is nil and ctx unchanged.
func Start(ctx context.Context, name string, attrs map[string]any) (context.Context, *Span) {
	if parent := From(ctx); parent != nil {
		sp := parent.Child(name, attrs)
		return With(ctx, sp), sp
	}
	v, ok := scopeFrom(ctx)
	if !ok {
		return ctx, nil
	}
	sp := v.r.StartSpan(v.sc, "", "", name, attrs)
	return With(ctx, sp), sp
}

// Event records an event as a child of the span ctx carries or, without
// one, outside any request in the scope of ctx.
func Event(ctx context.Context, name string, attrs map[string]any) {
	if sp := From(ctx); sp != nil {
		sp.Event(name, attrs)
		return
	}
	if v, ok := scopeFrom(ctx); ok {
		v.r.Event(v.sc, "", name, attrs)
	}
}

// Span is one open span; its record is written by End.
type Span struct {
	reg    *Registry
	st     *Store
	scope  Scope
	trace  string
	id     string
	parent string
	name   string
	start  time.Time
	attrs  map[string]any
	ended  atomic.Bool
}

type spanRecord struct {
	Kind   string `json:"kind"`
	TS     int64  `json:"ts"`
	Trace  string `json:"trace"`
	Span   string `json:"span"`
	Parent string `json:"parent,omitempty"`
	Name   string `json:"name"`
	DurMs  int64  `json:"dur_ms"`
	Status string `json:"status"`
	Attrs  any    `json:"attrs"`
	// Seq orders every event-log record of the supervisor (feed.go).
	Seq uint64 `json:"seq,omitempty"`
}

type eventRecord struct {
	Kind   string `json:"kind"`
	TS     int64  `json:"ts"`
	Trace  string `json:"trace"`
	Parent string `json:"parent,omitempty"`
	Name   string `json:"name"`
	Attrs  any    `json:"attrs"`
	Seq    uint64 `json:"seq,omitempty"`
}

// Span statuses (§10.2).
const (
	Completed = "completed"
	Error     = "error"
	Cancelled = "cancelled"
	TimedOut  = "timed_out"
)

// SyntheticTrace mints a trace id for records outside a request (§10.2);
// origin is boot, recovery, autosquash, finalize, holder, sampler or squash.
func (r *Registry) SyntheticTrace(origin string) string {
	if r == nil {
		return origin + "-"
	}
	if r.newID == nil {
		return origin + "-" + strconv.FormatUint(r.spanSeq.Add(1), 10)
	}
	return r.newID(origin + "-")
}

// eventOrigin is the origin of a synthetic trace id for an event recorded
// outside any request.
func eventOrigin(name string) string {
	switch {
	case strings.HasPrefix(name, "holder."):
		return "holder"
	case strings.HasPrefix(name, "workspace_session.restore"), name == "command.interrupted":
		return "recovery"
	case strings.HasPrefix(name, "layerstack.autosquash"):
		return "autosquash"
	case strings.HasPrefix(name, "layerstack.squash"):
		return "squash"
	case strings.HasPrefix(name, "lease."), strings.HasPrefix(name, "workspace_session."):
		return "finalize"
	case name == "sample":
		return "sampler"
	}
	return "boot"
}

// StartSpan starts a span in sc's store. trace "" mints a synthetic id
// with the origin of eventOrigin(name). It returns nil when observability
// is disabled.
func (r *Registry) StartSpan(sc Scope, trace, parent, name string, attrs map[string]any) *Span {
	st := r.Store(sc)
	if st == nil {
		return nil
	}
	if trace == "" {
		trace = r.SyntheticTrace(eventOrigin(name))
	}
	a := make(map[string]any, len(attrs))
	for k, v := range attrs {
		a[k] = v
	}
	return &Span{reg: r, st: st, scope: sc, trace: trace, parent: parent, name: name, start: time.Now(), attrs: a,
		id: "s-" + strconv.FormatUint(r.spanSeq.Add(1), 10)}
}

// Trace is the span's trace id ("" for a nil span).
func (sp *Span) Trace() string {
	if sp == nil {
		return ""
	}
	return sp.trace
}

// ID is the span's id ("" for a nil span).
func (sp *Span) ID() string {
	if sp == nil {
		return ""
	}
	return sp.id
}

// Child starts a child span in the same trace and store.
func (sp *Span) Child(name string, attrs map[string]any) *Span {
	if sp == nil {
		return nil
	}
	return sp.reg.StartSpan(sp.scope, sp.trace, sp.id, name, attrs)
}

// Event records an event whose parent is sp.
func (sp *Span) Event(name string, attrs map[string]any) {
	if sp == nil {
		return
	}
	sp.reg.logEvent(sp.scope, name, attrs)
	writeEvent(sp.st, sp.trace, sp.id, name, attrs)
}

// End writes the span record once; attrs are merged into the start attrs.
func (sp *Span) End(status string, attrs map[string]any) {
	if sp == nil || !sp.ended.CompareAndSwap(false, true) {
		return
	}
	for k, v := range attrs {
		sp.attrs[k] = v
	}
	now := time.Now()
	ts := now.UnixMilli()
	rec := spanRecord{Kind: "span", TS: ts, Trace: sp.trace, Span: sp.id, Parent: sp.parent, Name: sp.name,
		// ts - dur_ms is exactly the start's Unix millisecond.
		DurMs: ts - sp.start.UnixMilli(), Status: status, Attrs: sp.attrs}
	sp.st.AppendRecord(&rec, &rec.Attrs)
}

// Status maps an outcome to a span status.
func Status(err error) string {
	switch {
	case err == nil:
		return Completed
	case errors.Is(err, context.DeadlineExceeded):
		return TimedOut
	case errors.Is(err, context.Canceled):
		return Cancelled
	}
	return Error
}

// Event records an event in sc's store. trace "" mints a synthetic trace
// id (origin from eventOrigin(name)).
func (r *Registry) Event(sc Scope, trace, name string, attrs map[string]any) {
	r.Record(sc, trace, "", name, attrs)
}

// Record records an event with a parent span in sc's store; trace "" mints
// a synthetic trace id (origin from eventOrigin(name)). The event is
// logged even when observability is disabled.
func (r *Registry) Record(sc Scope, trace, parent, name string, attrs map[string]any) {
	if r == nil {
		return
	}
	r.logEvent(sc, name, attrs)
	st := r.Store(sc)
	if st == nil {
		return
	}
	if trace == "" {
		trace = r.SyntheticTrace(eventOrigin(name))
	}
	writeEvent(st, trace, parent, name, attrs)
}

func writeEvent(st *Store, trace, parent, name string, attrs map[string]any) {
	a := any(attrs)
	if attrs == nil {
		a = map[string]any{}
	}
	rec := eventRecord{Kind: "event", TS: time.Now().UnixMilli(), Trace: trace, Parent: parent, Name: name, Attrs: a}
	st.AppendRecord(&rec, &rec.Attrs)
}

func (r *Registry) logEvent(sc Scope, name string, attrs map[string]any) {
	if r.log == nil {
		return
	}
	args := make([]any, 0, 2+2*len(attrs))
	if sc.ID != "" {
		args = append(args, "sandbox", sc.ID)
	}
	keys := make([]string, 0, len(attrs))
	for k := range attrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, k, attrs[k])
	}
	level := slog.LevelInfo
	if strings.HasSuffix(name, "failed") || name == "holder.exited" {
		level = slog.LevelWarn
	}
	r.log.Log(context.Background(), level, name, args...)
}

// Done ends sp with the status err implies, the error (cut to 4 KiB) in
// its attributes.
func (sp *Span) Done(err error, attrs map[string]any) {
	if sp == nil {
		return
	}
	if err != nil {
		if attrs == nil {
			attrs = map[string]any{}
		}
		attrs["error"] = BoundedError(err.Error())
	}
	sp.End(Status(err), attrs)
}

// Measured records a completed child of sp that took d and ended now: work
// timed elsewhere (inside the holder).
func (sp *Span) Measured(name string, d time.Duration, attrs map[string]any) {
	if sp == nil {
		return
	}
	c := sp.Child(name, attrs)
	if c == nil {
		return
	}
	c.start = time.Now().Add(-d)
	c.End(Completed, nil)
}

// BoundedError cuts an error string to 4 KiB on a UTF-8 boundary.
func BoundedError(msg string) string {
	const max = 4096
	if len(msg) <= max {
		return msg
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut]
}
