package obs

import (
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
	LastN    int // the newest LastN (0 or above the cap: MaxRecords)
}

// Events returns the store's events that pass f, chronological, the newest
// within MaxRecords and MaxBytes.
func (st *Store) Events(ctx context.Context, f EventFilter) ([]json.RawMessage, error) {
	snap, err := st.Open()
	if err != nil {
		return nil, fmt.Errorf("read event store: %w", err)
	}
	defer snap.Close()
	w := newRecordWindow(f.LastN, MaxBytes-EnvelopeSlack)
	if err := snap.Scan(ctx, func(line []byte) {
		var h recordHead
		if json.Unmarshal(line, &h) != nil || h.Kind != "event" {
			return
		}
		if (f.HasName && h.Name != f.Name) || (f.HasSince && h.TS < f.SinceMs) {
			return
		}
		w.add(h, line)
	}); err != nil {
		return nil, fmt.Errorf("read event store: %w", err)
	}
	recs := w.recs
	if recs == nil {
		recs = []json.RawMessage{}
	}
	return recs, nil
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
