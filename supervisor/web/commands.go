package web

import (
	"net/http"
	"strconv"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// Commands finds running or finished commands for the transcript stream.
type Commands interface {
	// Follow returns the command's transcript; unknown sandboxes and
	// commands are not_found *catalog.Error values.
	Follow(sandboxID, commandID string) (Transcript, error)
}

// Transcript is one command's output as rows (§6.3).
type Transcript interface {
	// Rows returns up to limit rows from cursor on, clamped to what is
	// retained: first > cursor means rows were discarded by the caps.
	Rows(cursor, limit int) (rows []string, first, end int)
	// Changed returns a channel closed at the next committed row.
	Changed() <-chan struct{}
	// Done is closed once the command has ended and its record is final.
	Done() <-chan struct{}
	// Result is the command's status and exit code (read_command_lines'
	// fields), final after Done.
	Result() map[string]any
}

const transcriptBatch = 256

// commandStream is GET /api/commands/{id}/stream?sandbox_id=…: the
// command's transcript as SSE, one `row` event per row with id = the row
// number, from ?cursor=N (or after Last-Event-ID) to the end, then one
// `exit` event with the final status, and the stream closes. Rows lost to
// the transcript's caps are announced by a `truncated` event.
func (s *Server) commandStream(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sandboxID, commandID := q.Get("sandbox_id"), r.PathValue("id")
	if sandboxID == "" {
		writeError(w, http.StatusBadRequest, catalog.Errorf(catalog.InvalidRequest, "sandbox_id is required"))
		return
	}
	cursor := 0
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.ParseUint(v, 10, 31)
		if err != nil {
			writeError(w, http.StatusBadRequest, catalog.Errorf(catalog.InvalidRequest, "cursor must be an unsigned integer"))
			return
		}
		cursor = int(n)
	}
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseUint(v, 10, 31)
		if err != nil {
			writeError(w, http.StatusBadRequest, catalog.Errorf(catalog.InvalidRequest, "Last-Event-ID must be an unsigned integer"))
			return
		}
		cursor = int(n) + 1
	}
	tr, err := s.cfg.Commands.Follow(sandboxID, commandID)
	if err != nil {
		writeCause(w, "follow command "+commandID, err)
		return
	}
	done, ok := s.takeStream(w)
	if !ok {
		return
	}
	defer done()
	out := startSSE(w)
	send := out.send
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		// Take the wake-up channel before reading, so a row committed in
		// between is not slept through.
		changed := tr.Changed()
		finished := false
		select {
		case <-tr.Done():
			finished = true
		default:
		}
		rows, first, end := tr.Rows(cursor, transcriptBatch)
		if first > cursor && !send("truncated", "", catalog.CompactJSON(map[string]any{"skipped": first - cursor})) {
			return
		}
		for i, row := range rows {
			if !send("row", strconv.Itoa(first+i), catalog.CompactJSON(map[string]any{"row": row})) {
				return
			}
		}
		cursor = max(cursor, end)
		if len(rows) == transcriptBatch {
			continue
		}
		if finished {
			send("exit", "", catalog.CompactJSON(tr.Result()))
			return
		}
	wait:
		for {
			select {
			case <-r.Context().Done():
				return
			case <-s.done:
				return
			case <-changed:
				break wait
			case <-tr.Done():
				break wait
			case <-tick.C:
				if !out.heartbeat() {
					return
				}
			}
		}
	}
}
