package web

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// rpc is POST /api/rpc: the body is one request object, answered with HTTP
// 200 and the response object, success or error envelope, as on the socket.
// Only what is wrong with the HTTP itself (content type, size) is non-2xx.
func (s *Server) rpc(w http.ResponseWriter, r *http.Request) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, catalog.Errorf(catalog.InvalidRequest, "Content-Type must be application/json"))
		return
	}
	limit := s.cfg.MaxBodyBytes
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(limit)))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge,
				catalog.Errorf(catalog.RequestTooLarge, "request exceeds %d bytes", limit).With("limit", limit))
			return
		}
		writeError(w, http.StatusBadRequest, catalog.Errorf(catalog.InvalidRequest, "read request body: %v", err))
		return
	}
	// The body is in: from here the request may run as long as its
	// operation does (a command), and only the client's hang-up ends it.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	if !acceptsEventStream(r) {
		out := s.cfg.Dispatcher.Dispatch(r.Context(), body, func(string) {})
		writeJSON(w, http.StatusOK, response(out))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	var mu sync.Mutex
	done := false
	progress := func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		// A vanished client must not fail the operation: errors are dropped.
		_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_ = writeSSE(w, "log", "", catalog.CompactJSON(map[string]string{"line": msg}))
		_ = rc.Flush()
	}
	out := s.cfg.Dispatcher.Dispatch(r.Context(), body, progress)
	mu.Lock()
	defer mu.Unlock()
	done = true
	_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
	_ = writeSSE(w, "result", "", catalog.CompactJSON(response(out)))
	_ = rc.Flush()
}

// response is the wire object of a dispatch result.
func response(out any) any {
	if e, ok := out.(*catalog.Error); ok {
		return e.Envelope()
	}
	if b, ok := out.([]byte); ok {
		return json.RawMessage(b)
	}
	return out
}

func acceptsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err == nil && mt == "text/event-stream" {
				return true
			}
		}
	}
	return false
}

// writeSSE writes one event; data is one line of JSON (no newlines).
func writeSSE(w io.Writer, event, id string, data []byte) error {
	var b strings.Builder
	if id != "" {
		b.WriteString("id: " + id + "\n")
	}
	if event != "" {
		b.WriteString("event: " + event + "\n")
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	_, err := io.WriteString(w, b.String())
	return err
}
