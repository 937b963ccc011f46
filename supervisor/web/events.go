package web

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// Record is one record of the event store (§10.2, a span or an event) with
// the sequence number the supervisor gave it. Sequence numbers grow across
// every store and survive restarts; they are the SSE ids.
type Record struct {
	Seq       uint64
	SandboxID string // "" for the supervisor's own store
	Kind      string // "event" or "span"
	Line      json.RawMessage
}

// Events is the event store as the stream needs it.
type Events interface {
	// Replay returns the stored records of sandboxID ("" every store)
	// with Seq > after, in sequence order, keeping the newest max; skipped
	// counts the older ones left out. An unknown sandbox is a not_found
	// *catalog.Error.
	Replay(sandboxID string, after uint64, max int) (recs []Record, skipped int, err error)
	// Subscribe delivers every record stored from now on, in sequence
	// order, until cancel. A subscriber that lets buf records pile up is
	// dropped: its channel is closed.
	Subscribe(buf int) (ch <-chan Record, cancel func())
}

const (
	// heartbeat keeps idle streams (and proxies) from timing out and lets
	// a dead client be noticed.
	heartbeat = 15 * time.Second
	// streamBuffer is how far a client may fall behind before it is dropped.
	streamBuffer = 512
	// maxReplay bounds one replay (the events operation's record cap).
	maxReplay = 500
	// streamWriteTimeout drops a client that stops reading.
	streamWriteTimeout = 10 * time.Second
)

// events is GET /api/events: the event store as Server-Sent Events. Each
// record is sent as `event: <kind>`, `id: <seq>`, `data:
// {"sandbox_id":…,"record":{…}}`. A reconnect with Last-Event-ID (or
// ?last_event_id=N, for the first connection) first replays what was
// stored after N, then continues live; ?last_n=K replays the newest K.
// Filters: sandbox_id (one sandbox's store), kind (event|span).
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sandboxID, kind := q.Get("sandbox_id"), q.Get("kind")
	if q.Has("sandbox_id") && sandboxID == "" {
		writeError(w, http.StatusBadRequest, catalog.Errorf(catalog.InvalidRequest, "sandbox_id must be non-empty"))
		return
	}
	if kind != "" && kind != "event" && kind != "span" {
		writeError(w, http.StatusBadRequest, catalog.Errorf(catalog.InvalidRequest, "kind must be event or span"))
		return
	}
	replay, after := false, uint64(0)
	lastID := r.Header.Get("Last-Event-ID")
	if lastID == "" {
		lastID = q.Get("last_event_id")
	}
	if lastID != "" {
		n, err := strconv.ParseUint(lastID, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, catalog.Errorf(catalog.InvalidRequest, "Last-Event-ID must be an unsigned integer"))
			return
		}
		replay, after = true, n
	}
	limit := maxReplay
	if v := q.Get("last_n"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n > maxReplay {
			writeError(w, http.StatusBadRequest, catalog.Errorf(catalog.InvalidRequest, "last_n must be an integer 0..%d", maxReplay))
			return
		}
		if !replay {
			replay = n > 0
		}
		limit = int(n)
	}
	done, ok := s.takeStream(w)
	if !ok {
		return
	}
	defer done()
	// Subscribe before reading the store: whatever is stored meanwhile
	// arrives live, and what both deliver is sent once (by sequence).
	live, cancel := s.cfg.Events.Subscribe(streamBuffer)
	defer cancel()
	var recs []Record
	skipped := 0
	if replay {
		var err error
		if recs, skipped, err = s.cfg.Events.Replay(sandboxID, after, limit); err != nil {
			writeCause(w, "read event store", err)
			return
		}
	} else if sandboxID != "" {
		// An unknown sandbox is refused even when nothing is replayed.
		if _, _, err := s.cfg.Events.Replay(sandboxID, ^uint64(0), 0); err != nil {
			var ce *catalog.Error
			if errors.As(err, &ce) && ce.Kind == catalog.NotFound {
				writeError(w, http.StatusNotFound, ce)
				return
			}
		}
	}
	out := startSSE(w)
	send := out.send
	if !send("ready", "", catalog.CompactJSON(map[string]any{"heartbeat_s": int(heartbeat / time.Second)})) {
		return
	}
	if skipped > 0 && !send("truncated", "", catalog.CompactJSON(map[string]any{"skipped": skipped,
		"message": "older records were left out of the replay; fetch them with the events operation"})) {
		return
	}
	last := after
	deliver := func(rec Record) bool {
		if rec.Seq <= last {
			return true
		}
		last = rec.Seq
		if (sandboxID != "" && rec.SandboxID != sandboxID) || (kind != "" && rec.Kind != kind) {
			return true
		}
		var sb any
		if rec.SandboxID != "" {
			sb = rec.SandboxID
		}
		data := catalog.CompactJSON(map[string]any{"sandbox_id": sb, "record": rec.Line})
		return send(rec.Kind, strconv.FormatUint(rec.Seq, 10), data)
	}
	for _, rec := range recs {
		if !deliver(rec) {
			return
		}
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		case <-tick.C:
			if !out.heartbeat() {
				return
			}
		case rec, ok := <-live:
			if !ok {
				// Dropped for falling behind: say so, with where to resume.
				send("dropped", "", catalog.CompactJSON(map[string]any{"reason": "the client fell behind the event stream",
					"last_event_id": strconv.FormatUint(last, 10)}))
				return
			}
			if !deliver(rec) {
				return
			}
		}
	}
}

// takeStream takes one of the MaxEventStreams slots (server_busy when none
// is free); done gives it back.
func (s *Server) takeStream(w http.ResponseWriter) (done func(), ok bool) {
	select {
	case s.streams <- struct{}{}:
		return func() { <-s.streams }, true
	default:
		writeError(w, http.StatusServiceUnavailable, catalog.Errorf(catalog.ServerBusy, "too many event streams").
			With("max_event_streams", MaxEventStreams))
		return nil, false
	}
}

// startSSE answers 200 with an event stream. Every write of it runs under
// its own deadline and is flushed; false means the client is gone or too
// slow.
func startSSE(w http.ResponseWriter) sseStream {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{}) // the stream outlives the request read timeout
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	return sseStream{w, rc}
}

type sseStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (s sseStream) send(event, id string, data []byte) bool {
	if err := s.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout)); err != nil {
		return false
	}
	return writeSSE(s.w, event, id, data) == nil && s.rc.Flush() == nil
}

// heartbeat writes a comment line, which keeps proxies and idle timers from
// closing a quiet stream.
func (s sseStream) heartbeat() bool {
	if err := s.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout)); err != nil {
		return false
	}
	_, err := s.w.Write([]byte(": heartbeat\n\n"))
	return err == nil && s.rc.Flush() == nil
}

// writeCause answers a failure of the supervisor behind a stream: its
// catalog error with the matching status, else operation_failed.
func writeCause(w http.ResponseWriter, what string, err error) {
	var ce *catalog.Error
	if !errors.As(err, &ce) {
		ce = catalog.Errorf(catalog.OperationFailed, "%s: %v", what, err)
	}
	status := http.StatusInternalServerError
	switch ce.Kind {
	case catalog.NotFound:
		status = http.StatusNotFound
	case catalog.InvalidRequest:
		status = http.StatusBadRequest
	}
	writeError(w, status, ce)
}
