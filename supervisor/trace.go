package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// Spans and events (§10.2) and the trace/events queries (§10.3).
//
// API for the rest of the supervisor:
//
//   - s.startSpan(sb, trace, parent, name, attrs) starts a span in sb's store
//     (sb nil: the system store); (*span).end(status, attrs) writes its
//     record at completion. (*span).child starts a child in the same trace
//     and store. Every method is a no-op on a nil span (observability
//     disabled, or an observability op, which is never traced).
//   - s.event(sb, trace, name, attrs) records an event; trace "" means "not
//     part of a request": a synthetic `<origin>-<ulid>` id is minted with the
//     origin of eventOrigin(name). s.syntheticTrace(origin) mints one
//     explicitly. s.eventCtx(ctx, sb, name, attrs) takes trace and parent from
//     the span carried by ctx (a request's supervisor.dispatch span, or a
//     child installed with withSpan) and falls back to s.event(sb, "", …).
//   - Every event is also logged with slog under its name (Warn for names
//     ending in "failed" and holder.exited, Info otherwise).
//
// Span IDs are s-<n> with n from one supervisor-wide counter, so they are
// unique within every trace recorded by one supervisor process (parents are
// always numbered before their children).

type spanKey struct{}

// withSpan returns ctx carrying sp, so code below a handler can record
// children and events in the request's trace.
func withSpan(ctx context.Context, sp *span) context.Context {
	if sp == nil {
		return ctx
	}
	return context.WithValue(ctx, spanKey{}, sp)
}

// spanFrom returns the span carried by ctx, or nil.
func spanFrom(ctx context.Context) *span {
	if ctx == nil {
		return nil
	}
	sp, _ := ctx.Value(spanKey{}).(*span)
	return sp
}

// span is one open span; its record is written by end.
type span struct {
	s      *Supervisor
	st     *obsStore
	sb     *sandbox
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
	// Seq orders every event-log record of the supervisor (eventfeed.go).
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
	spanCompleted = "completed"
	spanError     = "error"
	spanCancelled = "cancelled"
	spanTimedOut  = "timed_out"
)

// syntheticTrace mints a trace id for records outside a request (§10.2);
// origin is boot, recovery, autosquash, finalize, holder, sampler or squash.
func (s *Supervisor) syntheticTrace(origin string) string {
	ids := s.ids
	if ids == nil {
		ids = fallbackIDs
	}
	return ids.new(origin + "-")
}

var fallbackIDs = newIDSource() // for a Supervisor built without ids (tests)

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

// startSpan starts a span in sb's store (nil: system store). trace "" mints
// a synthetic id with the origin of eventOrigin(name). It returns nil when
// observability is disabled.
func (s *Supervisor) startSpan(sb *sandbox, trace, parent, name string, attrs map[string]any) *span {
	st := s.obs.store(sb)
	if st == nil {
		return nil
	}
	if trace == "" {
		trace = s.syntheticTrace(eventOrigin(name))
	}
	a := make(map[string]any, len(attrs))
	for k, v := range attrs {
		a[k] = v
	}
	return &span{s: s, st: st, sb: sb, trace: trace, parent: parent, name: name, start: time.Now(), attrs: a,
		id: "s-" + strconv.FormatUint(s.obs.spanSeq.Add(1), 10)}
}

// child starts a child span in the same trace and store.
func (sp *span) child(name string, attrs map[string]any) *span {
	if sp == nil {
		return nil
	}
	return sp.s.startSpan(sp.sb, sp.trace, sp.id, name, attrs)
}

// event records an event whose parent is sp.
func (sp *span) event(name string, attrs map[string]any) {
	if sp == nil {
		return
	}
	sp.s.logEvent(sp.sb, name, attrs)
	sp.s.writeEvent(sp.st, sp.trace, sp.id, name, attrs)
}

// end writes the span record once; attrs are merged into the start attrs.
func (sp *span) end(status string, attrs map[string]any) {
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
	sp.st.appendRecord(&rec, &rec.Attrs)
}

// requestSpan opens the supervisor.dispatch root span of a request (its
// trace is the request_id) and puts it in c.ctx; observability operations
// are not traced (§3.7).
func (s *Supervisor) requestSpan(c *call) *span {
	if c.op.Group == catalog.Observability {
		return nil
	}
	sp := s.startSpan(c.sb, c.req.RequestID, "", "supervisor.dispatch", map[string]any{"op": c.op.ID})
	c.ctx = withSpan(c.ctx, sp)
	return sp
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

// spanStatus maps an outcome to a span status.
func spanStatus(err error) string {
	switch {
	case err == nil:
		return spanCompleted
	case errors.Is(err, context.DeadlineExceeded):
		return spanTimedOut
	case errors.Is(err, context.Canceled):
		return spanCancelled
	}
	return spanError
}

// event records an event in sb's store (nil: system store). trace "" mints
// a synthetic trace id (origin from eventOrigin(name)).
func (s *Supervisor) event(sb *sandbox, trace, name string, attrs map[string]any) {
	s.logEvent(sb, name, attrs)
	st := s.obs.store(sb)
	if st == nil {
		return
	}
	if trace == "" {
		trace = s.syntheticTrace(eventOrigin(name))
	}
	s.writeEvent(st, trace, "", name, attrs)
}

// eventCtx records an event in the trace of the span ctx carries (as its
// child), or outside any request when there is none.
func (s *Supervisor) eventCtx(ctx context.Context, sb *sandbox, name string, attrs map[string]any) {
	sp := spanFrom(ctx)
	if sp == nil {
		s.event(sb, "", name, attrs)
		return
	}
	s.logEvent(sb, name, attrs)
	if st := s.obs.store(sb); st != nil {
		s.writeEvent(st, sp.trace, sp.id, name, attrs)
	}
}

func (s *Supervisor) writeEvent(st *obsStore, trace, parent, name string, attrs map[string]any) {
	a := any(attrs)
	if attrs == nil {
		a = map[string]any{}
	}
	rec := eventRecord{Kind: "event", TS: time.Now().UnixMilli(), Trace: trace, Parent: parent, Name: name, Attrs: a}
	st.appendRecord(&rec, &rec.Attrs)
}

func (s *Supervisor) logEvent(sb *sandbox, name string, attrs map[string]any) {
	if s.log == nil {
		return
	}
	args := make([]any, 0, 2+2*len(attrs))
	if sb != nil {
		args = append(args, "sandbox", sb.Rec.ID)
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
	s.log.Log(context.Background(), level, name, args...)
}

// holderPid is the host PID of the session's holder, 0 when it has none.
func holderPid(ss *session) int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.holder == nil {
		return 0
	}
	return ss.holder.Pid()
}

// conflictPaths lists at most 20 rejected paths of a publish rejection.
func conflictPaths(rej *layers.Rejection) []string {
	out := []string{}
	if rej == nil {
		return out
	}
	for _, c := range rej.Conflicts {
		if len(out) == 20 {
			break
		}
		out = append(out, c.Path)
	}
	return out
}

// ---- queries ----

func (s *Supervisor) openObs(sb *sandbox) (*obsSnapshot, error) {
	snap, err := s.obs.store(sb).open()
	if err != nil {
		return nil, catalog.Errorf(catalog.OperationFailed, "read event store: %v", err)
	}
	return snap, nil
}

// eventsView is the events operation (§10.3): chronological, filtered, the
// newest records within the caps.
func (s *Supervisor) eventsView(c *call) (any, error) {
	snap, err := s.openObs(c.sb)
	if err != nil {
		return nil, err
	}
	defer snap.close()
	name, hasName := c.args.String("name"), c.args.Has("name")
	since, hasSince := int64(math.MaxInt64), c.args.Has("since_ms")
	if u := c.args.Uint("since_ms"); u <= math.MaxInt64 {
		since = int64(u)
	}
	w := newRecordWindow(int(c.args.Uint("last_n")), obsMaxBytes-obsEnvelopeSlack)
	if err := snap.scan(func(line []byte) {
		var h recordHead
		if json.Unmarshal(line, &h) != nil || h.Kind != "event" {
			return
		}
		if (hasName && h.Name != name) || (hasSince && h.TS < since) {
			return
		}
		w.add(h, line)
	}); err != nil {
		return nil, catalog.Errorf(catalog.OperationFailed, "read event store: %v", err)
	}
	recs := w.recs
	if recs == nil {
		recs = []json.RawMessage{}
	}
	return map[string]any{"view": "events", "events": recs}, nil
}

type traceNode struct {
	Span     json.RawMessage `json:"span"`
	OffsetMs int64           `json:"offset_ms"`
	Children []*traceNode    `json:"children"`
	Events   []traceEvent    `json:"events"`

	head  recordHead
	start int64
	seq   uint64
	order int
}

type traceEvent struct {
	OffsetMs int64           `json:"offset_ms"`
	Event    json.RawMessage `json:"event"`
}

// traceView is the trace operation (§10.3).
func (s *Supervisor) traceView(c *call) (any, error) {
	empty := map[string]any{"view": "trace", "trace": nil, "spans": []any{}}
	snap, err := s.openObs(c.sb)
	if err != nil {
		return nil, err
	}
	defer snap.close()
	readErr := func(err error) error {
		return catalog.Errorf(catalog.OperationFailed, "read event store: %v", err)
	}
	id := c.args.String("trace_id")
	explicit := id != "last"
	if !explicit {
		found, best := false, int64(0)
		if err := snap.scan(func(line []byte) {
			var h recordHead
			if json.Unmarshal(line, &h) != nil || h.Kind != "span" || h.Parent != "" {
				return
			}
			if start := h.TS - h.DurMs; !found || start >= best {
				found, best, id = true, start, h.Trace
			}
		}); err != nil {
			return nil, readErr(err)
		}
		if !found {
			return empty, nil
		}
	}
	// Each node adds about 60 bytes of wrapping to its record.
	w := newRecordWindow(0, obsMaxBytes-obsEnvelopeSlack-60*obsMaxRecords)
	if err := snap.scan(func(line []byte) {
		var h recordHead
		if json.Unmarshal(line, &h) != nil || h.Trace != id || (h.Kind != "span" && h.Kind != "event") {
			return
		}
		w.add(h, line)
	}); err != nil {
		return nil, readErr(err)
	}
	if len(w.recs) == 0 {
		if explicit && s.obs.store(c.sb) != nil {
			return nil, catalog.Errorf(catalog.NotFound, "trace not found: %s", id).With("trace_id", id)
		}
		return empty, nil
	}
	return map[string]any{"view": "trace", "trace": id, "spans": buildTree(w)}, nil
}

// buildTree turns a trace's records into span trees: roots are spans whose
// parent is not in the trace; siblings are sorted by start; events hang
// under their parent span (under the first root when it is absent).
func buildTree(w *recordWindow) []*traceNode {
	var nodes []*traceNode
	type ev struct {
		h    recordHead
		line json.RawMessage
	}
	var events []ev
	earliest := int64(math.MaxInt64)
	for i, h := range w.heads {
		switch h.Kind {
		case "span":
			n := &traceNode{Span: w.recs[i], head: h, start: h.TS - h.DurMs, order: i, Children: []*traceNode{}, Events: []traceEvent{}}
			n.seq, _ = strconv.ParseUint(strings.TrimPrefix(h.Span, "s-"), 10, 64)
			nodes = append(nodes, n)
			earliest = min(earliest, n.start)
		case "event":
			events = append(events, ev{h, w.recs[i]})
			earliest = min(earliest, h.TS)
		}
	}
	// Parents start no later than their children and are numbered first,
	// so linking only to an already placed node gives a forest (no cycles
	// even if ids repeat).
	sort.SliceStable(nodes, func(i, j int) bool {
		a, b := nodes[i], nodes[j]
		if a.start != b.start {
			return a.start < b.start
		}
		if a.seq != b.seq {
			return a.seq < b.seq
		}
		return a.order < b.order
	})
	placed := map[string]*traceNode{}
	roots := []*traceNode{}
	for _, n := range nodes {
		n.OffsetMs = n.start - earliest
		if p := placed[n.head.Parent]; n.head.Parent != "" && p != nil {
			p.Children = append(p.Children, n)
		} else {
			roots = append(roots, n)
		}
		placed[n.head.Span] = n
	}
	sort.SliceStable(events, func(i, j int) bool { return events[i].h.TS < events[j].h.TS })
	for _, e := range events {
		n := placed[e.h.Parent]
		if n == nil && len(roots) > 0 {
			n = roots[0]
		}
		if n != nil {
			n.Events = append(n.Events, traceEvent{OffsetMs: e.h.TS - earliest, Event: e.line})
		}
	}
	return roots
}

// spanCtx starts name as a child of the span ctx carries or, outside any
// request, as the root of a synthetic trace (origin "" takes
// eventOrigin(name)). It returns ctx carrying the new span, so the work
// below records its spans and events under it.
func (s *Supervisor) spanCtx(ctx context.Context, sb *sandbox, origin, name string, attrs map[string]any) (*span, context.Context) {
	if parent := spanFrom(ctx); parent != nil {
		sp := parent.child(name, attrs)
		return sp, withSpan(ctx, sp)
	}
	trace := ""
	if origin != "" {
		trace = s.syntheticTrace(origin)
	}
	sp := s.startSpan(sb, trace, "", name, attrs)
	return sp, withSpan(ctx, sp)
}

// done ends sp with the status err implies.
func (sp *span) done(err error, attrs map[string]any) {
	if sp == nil {
		return
	}
	if err != nil {
		if attrs == nil {
			attrs = map[string]any{}
		}
		attrs["error"] = boundedError(err.Error())
	}
	sp.end(spanStatus(err), attrs)
}

// measured records a completed child of sp that took d and ended now: work
// timed elsewhere (inside the holder).
func (sp *span) measured(name string, d time.Duration, attrs map[string]any) {
	if sp == nil {
		return
	}
	c := sp.child(name, attrs)
	c.start = time.Now().Add(-d)
	c.end(spanCompleted, nil)
}
