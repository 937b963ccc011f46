package obs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// The events and trace queries (§10.3) over one store: bounded results
// from one streaming pass (two for trace "last"), nothing cached.

// ErrTraceNotFound is returned by Trace for an explicit trace id the store
// does not hold.
var ErrTraceNotFound = errors.New("trace not found")

// EventFilter selects the events of an events query.
type EventFilter struct {
	Name     string // only events of this name, when HasName
	HasName  bool
	SinceMs  int64 // only events at or after this Unix millisecond, when HasSince
	HasSince bool
	AfterSeq uint64 // only events whose seq is above this, when HasAfter
	HasAfter bool
	LastN    int // the newest LastN of the selection (0: no such bound)
}

// EventPage is the result of an events query. A query without LastN and
// AfterSeq returns the newest events within MaxRecords and MaxBytes, the
// oldest dropped first (§10.1). With either, the query is paged: the
// selection (the newest LastN of the events with seq above AfterSeq) is
// returned oldest first, a response's worth at a time; when more of it
// is left, Truncated is set and NextAfterSeq is the seq of the last event
// returned: the same query with AfterSeq = NextAfterSeq returns the next
// page. That is how a caller reads more than one response holds — upstream
// tools ask for the newest 10000 events (issue #27).
type EventPage struct {
	Events       []json.RawMessage
	Paged        bool
	Truncated    bool
	NextAfterSeq uint64
}

// match reports whether an event record passes f.
func (f EventFilter) match(h recordHead) bool {
	return h.Kind == "event" && (!f.HasName || h.Name == f.Name) && (!f.HasSince || h.TS >= f.SinceMs) &&
		(!f.HasAfter || h.Seq > f.AfterSeq)
}

// Events returns the store's events that pass f, chronological, the newest
// within MaxRecords and MaxBytes (see EventPage for a paged query).
func (st *Store) Events(ctx context.Context, f EventFilter) ([]json.RawMessage, error) {
	p, err := st.EventsPage(ctx, f)
	return p.Events, err
}

// EventsPage is the events query of §10.3 with the paging of EventPage.
func (st *Store) EventsPage(ctx context.Context, f EventFilter) (EventPage, error) {
	snap, err := st.Open()
	if err != nil {
		return EventPage{}, fmt.Errorf("read event store: %w", err)
	}
	defer snap.Close()
	readErr := func(err error) (EventPage, error) { return EventPage{}, fmt.Errorf("read event store: %w", err) }
	if f.LastN <= 0 && !f.HasAfter {
		w := newRecordWindow(0, MaxBytes-EnvelopeSlack)
		if err := snap.Scan(ctx, func(line []byte) {
			var h recordHead
			if json.Unmarshal(line, &h) == nil && f.match(h) {
				w.add(h, line)
			}
		}); err != nil {
			return readErr(err)
		}
		recs := w.recs
		if recs == nil {
			recs = []json.RawMessage{}
		}
		return EventPage{Events: recs}, nil
	}
	// Two passes over the same snapshot: count the selection, then skip to
	// its newest LastN. Records appended between the passes come after
	// the counted ones, so the skip stays right; they only add pages.
	skip := 0
	if f.LastN > 0 {
		n := 0
		if err := snap.Scan(ctx, func(line []byte) {
			var h recordHead
			if json.Unmarshal(line, &h) == nil && f.match(h) {
				n++
			}
		}); err != nil {
			return readErr(err)
		}
		skip = max(n-f.LastN, 0)
	}
	page := EventPage{Events: []json.RawMessage{}, Paged: true}
	budget := MaxBytes - EnvelopeSlack
	seen := 0
	if err := snap.Scan(ctx, func(line []byte) {
		if page.Truncated {
			return
		}
		var h recordHead
		if json.Unmarshal(line, &h) != nil || !f.match(h) {
			return
		}
		if seen++; seen <= skip || len(line)+1 > MaxBytes-EnvelopeSlack {
			return
		}
		if len(page.Events) == MaxRecords || len(line)+1 > budget {
			page.Truncated = true
			return
		}
		page.Events = append(page.Events, json.RawMessage(bytes.Clone(line)))
		budget -= len(line) + 1
		page.NextAfterSeq = h.Seq
	}); err != nil {
		return readErr(err)
	}
	if !page.Truncated {
		page.NextAfterSeq = 0
	}
	return page, nil
}

// TraceNode is one span of a trace tree with its children and events.
type TraceNode struct {
	Span     json.RawMessage `json:"span"`
	OffsetMs int64           `json:"offset_ms"`
	Children []*TraceNode    `json:"children"`
	Events   []TraceEvent    `json:"events"`

	head  recordHead
	start int64
	seq   uint64
	order int
}

// TraceEvent is one event under a trace node.
type TraceEvent struct {
	OffsetMs int64           `json:"offset_ms"`
	Event    json.RawMessage `json:"event"`
}

// Trace returns the span trees of trace id, or with id "last" of the trace
// whose root started last; trace is "" when there is none. An explicit id
// the store does not hold is ErrTraceNotFound (unless the store is nil:
// observability disabled).
func (st *Store) Trace(ctx context.Context, id string) (trace string, roots []*TraceNode, err error) {
	snap, err := st.Open()
	if err != nil {
		return "", nil, fmt.Errorf("read event store: %w", err)
	}
	defer snap.Close()
	readErr := func(err error) error {
		return fmt.Errorf("read event store: %w", err)
	}
	explicit := id != "last"
	if !explicit {
		found, best := false, int64(0)
		if err := snap.Scan(ctx, func(line []byte) {
			var h recordHead
			if json.Unmarshal(line, &h) != nil || h.Kind != "span" || h.Parent != "" {
				return
			}
			if start := h.TS - h.DurMs; !found || start >= best {
				found, best, id = true, start, h.Trace
			}
		}); err != nil {
			return "", nil, readErr(err)
		}
		if !found {
			return "", []*TraceNode{}, nil
		}
	}
	// Each node adds about 60 bytes of wrapping to its record.
	w := newRecordWindow(0, MaxBytes-EnvelopeSlack-60*MaxRecords)
	if err := snap.Scan(ctx, func(line []byte) {
		var h recordHead
		if json.Unmarshal(line, &h) != nil || h.Trace != id || (h.Kind != "span" && h.Kind != "event") {
			return
		}
		w.add(h, line)
	}); err != nil {
		return "", nil, readErr(err)
	}
	if len(w.recs) == 0 {
		if explicit && st != nil {
			return "", nil, fmt.Errorf("%w: %s", ErrTraceNotFound, id)
		}
		return "", []*TraceNode{}, nil
	}
	return id, buildTree(w), nil
}

// buildTree turns a trace's records into span trees: roots are spans whose
// parent is not in the trace; siblings are sorted by start; events hang
// under their parent span (under the first root when it is absent).
func buildTree(w *recordWindow) []*TraceNode {
	var nodes []*TraceNode
	type ev struct {
		h    recordHead
		line json.RawMessage
	}
	var events []ev
	earliest := int64(math.MaxInt64)
	for i, h := range w.heads {
		switch h.Kind {
		case "span":
			n := &TraceNode{Span: w.recs[i], head: h, start: h.TS - h.DurMs, order: i, Children: []*TraceNode{}, Events: []TraceEvent{}}
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
	placed := map[string]*TraceNode{}
	roots := []*TraceNode{}
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
			n.Events = append(n.Events, TraceEvent{OffsetMs: e.h.TS - earliest, Event: e.line})
		}
	}
	return roots
}
