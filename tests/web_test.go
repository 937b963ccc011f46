package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// webClient talks to the HTTP listener (§2.8) of a supervisor started with
// --http; it never follows redirects, so /auth's answer is seen as sent.
type webClient struct {
	t     *testing.T
	addr  string // host:port from http.addr
	token string // ui.token
	c     *http.Client
}

func (e *env) web() *webClient {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.home, "run", "http.addr"))
	if err != nil {
		e.t.Fatalf("http.addr: %v", err)
	}
	addr := strings.TrimPrefix(strings.TrimSpace(string(b)), "tcp://")
	tok, err := os.ReadFile(filepath.Join(e.home, "config", "ui.token"))
	if err != nil {
		e.t.Fatal(err)
	}
	return &webClient{t: e.t, addr: addr, token: strings.TrimSuffix(string(tok), "\n"), c: &http.Client{
		Timeout:       60 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (w *webClient) url(path string) string { return "http://" + w.addr + path }

// do sends one request; hdr values "" are left out.
func (w *webClient) do(method, path, body string, hdr map[string]string) (*http.Response, []byte) {
	w.t.Helper()
	req, err := http.NewRequest(method, w.url(path), strings.NewReader(body))
	if err != nil {
		w.t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
		} else if v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := w.c.Do(req)
	if err != nil {
		w.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		w.t.Fatal(err)
	}
	return resp, b
}

func (w *webClient) bearer() map[string]string {
	return map[string]string{"Authorization": "Bearer " + w.token, "Content-Type": "application/json"}
}

// rpc posts one request object with the Bearer token and decodes the
// response object; the HTTP status must be 200.
func (w *webClient) rpc(req any) map[string]any {
	w.t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		w.t.Fatal(err)
	}
	resp, body := w.do("POST", "/api/rpc", string(b), w.bearer())
	if resp.StatusCode != 200 {
		w.t.Fatalf("/api/rpc %s: HTTP %d %s", b, resp.StatusCode, body)
	}
	return decodeObj(w.t, body)
}

func decodeObj(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("not a JSON object: %q", b)
	}
	return m
}

// wantEnvelope checks the contract's error shape: exactly kind, message
// and an object details.
func wantEnvelope(t *testing.T, what string, body []byte, kind string) map[string]any {
	t.Helper()
	m := decodeObj(t, body)
	e, _ := m["error"].(map[string]any)
	if len(m) != 1 || e == nil || len(e) != 3 || e["kind"] != kind {
		t.Fatalf("%s: want a %s envelope, got %s", what, kind, body)
	}
	if _, ok := e["details"].(map[string]any); !ok {
		t.Fatalf("%s: details is not an object: %s", what, body)
	}
	if msg, _ := e["message"].(string); msg == "" {
		t.Fatalf("%s: empty message: %s", what, body)
	}
	return e
}

func TestHTTPAuthAndOrigin(t *testing.T) {
	e := newEnv(t)
	e.start("--http", "tcp://127.0.0.1:0")
	w := e.web()
	if len(w.token) != 64 {
		t.Fatalf("ui.token length %d", len(w.token))
	}
	if st, err := os.Stat(filepath.Join(e.home, "config", "ui.token")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("ui.token: %v %v", st.Mode(), err)
	}
	list := `{"op":"list_sandboxes","scope":{"kind":"system"}}`
	own := "http://" + w.addr

	resp, body := w.do("GET", "/health", "", nil)
	if resp.StatusCode != 200 || !reflect.DeepEqual(decodeObj(t, body), map[string]any{"status": "ok", "service": "supervisor_http"}) {
		t.Fatalf("/health: %d %s", resp.StatusCode, body)
	}

	// 401 without, or with a wrong, token: the contract's envelope.
	for _, tc := range []struct {
		name string
		hdr  map[string]string
	}{
		{"no token", map[string]string{"Content-Type": "application/json"}},
		{"wrong bearer", map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + strings.Repeat("0", 64)}},
		{"token prefix", map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + w.token[:63]}},
		{"basic scheme", map[string]string{"Content-Type": "application/json", "Authorization": "Basic " + w.token}},
		{"token as cookie", map[string]string{"Content-Type": "application/json", "Cookie": "es_ui=" + w.token}},
	} {
		resp, body := w.do("POST", "/api/rpc", list, tc.hdr)
		if resp.StatusCode != 401 {
			t.Errorf("%s: HTTP %d %s", tc.name, resp.StatusCode, body)
			continue
		}
		wantEnvelope(t, tc.name, body, "unauthorized")
		if strings.Contains(string(body), w.token[:16]) {
			t.Errorf("%s: the answer echoes the token", tc.name)
		}
	}
	if resp, body := w.do("GET", "/", "", nil); resp.StatusCode != 401 {
		t.Errorf("GET / without a token: %d %s", resp.StatusCode, body)
	}

	// Bearer works.
	if m := w.rpc(json.RawMessage(list)); errKind(m) != "" || m["sandboxes"] == nil {
		t.Fatalf("list_sandboxes with the Bearer token: %v", m)
	}

	// /auth: a wrong token is 401 and sets nothing.
	resp, body = w.do("GET", "/auth?token="+strings.Repeat("0", 64), "", nil)
	if resp.StatusCode != 401 || len(resp.Header.Values("Set-Cookie")) != 0 {
		t.Fatalf("/auth with a wrong token: %d cookies %v %s", resp.StatusCode, resp.Header.Values("Set-Cookie"), body)
	}
	wantEnvelope(t, "/auth wrong token", body, "unauthorized")
	// The right one sets an HttpOnly SameSite=Strict cookie and sends the
	// browser on to / without the token.
	resp, _ = w.do("GET", "/auth?token="+w.token, "", nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("/auth: %d Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	cookies := resp.Cookies()
	if len(cookies) != 1 || cookies[0].Name != "es_ui" || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode ||
		cookies[0].Path != "/" || cookies[0].Value == "" || strings.Contains(cookies[0].Value, w.token) {
		t.Fatalf("/auth cookie: %v (raw %q)", cookies, resp.Header.Values("Set-Cookie"))
	}
	if resp.Header.Get("Referrer-Policy") != "no-referrer" {
		t.Errorf("/auth Referrer-Policy %q", resp.Header.Get("Referrer-Policy"))
	}
	cookie := "es_ui=" + cookies[0].Value
	resp, body = w.do("POST", "/api/rpc", list, map[string]string{"Content-Type": "application/json", "Cookie": cookie, "Origin": own})
	if resp.StatusCode != 200 || errKind(decodeObj(t, body)) != "" {
		t.Fatalf("list_sandboxes with the cookie: %d %s", resp.StatusCode, body)
	}
	if resp, body := w.do("GET", "/", "", map[string]string{"Cookie": cookie}); resp.StatusCode != 200 {
		t.Errorf("GET / with the cookie: %d %s", resp.StatusCode, body)
	}

	// Origin: null and foreign origins are refused, even with the token;
	// the listener's own origin and no Origin at all (curl) are not.
	for _, tc := range []struct {
		origin string
		want   int
	}{
		{"null", 403}, {"http://evil.example", 403}, {"http://127.0.0.1:1", 403}, {"https://" + w.addr, 403},
		{own, 200}, {"", 200},
	} {
		for _, auth := range []map[string]string{
			{"Content-Type": "application/json", "Cookie": cookie, "Origin": tc.origin},
			{"Content-Type": "application/json", "Authorization": "Bearer " + w.token, "Origin": tc.origin},
		} {
			resp, body := w.do("POST", "/api/rpc", list, auth)
			if resp.StatusCode != tc.want {
				t.Errorf("Origin %q: HTTP %d, want %d: %s", tc.origin, resp.StatusCode, tc.want, body)
			} else if tc.want == 403 {
				wantEnvelope(t, "Origin "+tc.origin, body, "unauthorized")
			}
		}
	}
	// A page whose name was rebound to 127.0.0.1 (its own name as Host).
	if resp, body := w.do("POST", "/api/rpc", list, map[string]string{"Content-Type": "application/json",
		"Authorization": "Bearer " + w.token, "Host": "evil.example:" + strings.Split(w.addr, ":")[1]}); resp.StatusCode != 403 {
		t.Errorf("foreign Host: HTTP %d %s", resp.StatusCode, body)
	}

	// Malformed HTTP is non-2xx; every answer is uncacheable and locked down.
	if resp, body := w.do("POST", "/api/rpc", list, map[string]string{"Authorization": "Bearer " + w.token, "Content-Type": "text/plain"}); resp.StatusCode != 415 {
		t.Errorf("text/plain body: %d %s", resp.StatusCode, body)
	}
	if resp, body := w.do("GET", "/api/rpc", "", w.bearer()); resp.StatusCode/100 == 2 {
		t.Errorf("GET /api/rpc: %d %s", resp.StatusCode, body)
	}
	resp, body = w.do("GET", "/nope", "", w.bearer())
	if resp.StatusCode != 404 {
		t.Errorf("unknown route: %d %s", resp.StatusCode, body)
	}
	for _, path := range []string{"/health", "/nope", "/api/rpc"} {
		method := "GET"
		if path == "/api/rpc" {
			method = "POST"
		}
		resp, _ := w.do(method, path, list, w.bearer())
		for k, v := range map[string]string{"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"} {
			if resp.Header.Get(k) != v {
				t.Errorf("%s %s: %s = %q", method, path, k, resp.Header.Get(k))
			}
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("%s %s: CSP %q", method, path, csp)
		}
	}

	e.stop()
	if strings.Contains(e.log.String(), w.token) || strings.Contains(e.log.String(), cookies[0].Value) {
		t.Fatal("the supervisor logged the UI token or the cookie")
	}
	if _, err := os.Stat(filepath.Join(e.home, "run", "http.addr")); !os.IsNotExist(err) {
		t.Errorf("http.addr left after stop: %v", err)
	}
}

// TestHTTPRPC: /api/rpc runs the socket's handlers with the socket's
// validation and envelopes, and streams _stream_logs as SSE.
func TestHTTPRPC(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start("--http", "tcp://127.0.0.1:0")
		w := e.web()
		root := e.project(map[string]string{"a.txt": "base\n"})
		args := map[string]any{"workspace_root": root}
		if e.overlay != "" {
			args["overlay"] = e.overlay
		}
		rec := w.rpc(map[string]any{"op": "create_sandbox", "scope": map[string]any{"kind": "system"}, "args": args})
		id, _ := rec["id"].(string)
		if !strings.HasPrefix(id, "sbx-") {
			if strings.Contains(errMsg(rec), "is unavailable") {
				skipOrFail(t, "overlay driver %s: %v", e.overlay, rec)
			}
			t.Fatalf("create_sandbox over HTTP: %v", rec)
		}
		scope := map[string]any{"kind": "sandbox", "sandbox_id": id}
		if m := w.rpc(map[string]any{"op": "file_write", "scope": scope, "args": map[string]any{"path": "b.txt", "content": "over http\n"}}); errKind(m) != "" {
			t.Fatalf("file_write over HTTP: %v", m)
		}
		read := map[string]any{"op": "file_read", "scope": scope, "args": map[string]any{"path": "b.txt"}}
		got := w.rpc(read)
		if got["content"] != "over http" {
			t.Fatalf("file_read over HTTP: %v", got)
		}
		// The same request on the socket answers the same object.
		b, _ := json.Marshal(read)
		lines := e.raw(append(b, '\n'))
		if len(lines) != 1 || !reflect.DeepEqual(decodeObj(t, []byte(lines[0])), got) {
			t.Fatalf("socket and HTTP differ:\nsocket %q\nhttp   %v", lines, got)
		}
		if r := e.rt(id, "file_read", "--path", "b.txt"); r["content"] != "over http" {
			t.Fatalf("file_read via the CLI: %v", r)
		}

		// Dispatched errors: HTTP 200 with the socket's envelope.
		for _, tc := range []struct{ name, body, kind string }{
			{"bad json", `{"op":`, "bad_json"},
			{"not an object", `[1]`, "bad_json"},
			{"unknown op", `{"op":"launch_rockets","scope":{"kind":"system"}}`, "unknown_op"},
			{"unknown field", `{"op":"list_sandboxes","scope":{"kind":"system"},"x":1}`, "invalid_request"},
			{"unknown argument", fmt.Sprintf(`{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":%q},"args":{"path":"b.txt","nope":1}}`, id), "invalid_request"},
			{"unknown sandbox", `{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":"sbx-nope"},"args":{"path":"b.txt"}}`, "not_found"},
			{"write to a bad path", fmt.Sprintf(`{"op":"file_write","scope":{"kind":"sandbox","sandbox_id":%q},"args":{"path":"../x","content":"x"}}`, id), "invalid_request"},
		} {
			resp, body := w.do("POST", "/api/rpc", tc.body, w.bearer())
			if resp.StatusCode != 200 {
				t.Errorf("%s: HTTP %d %s", tc.name, resp.StatusCode, body)
				continue
			}
			wantEnvelope(t, tc.name, body, tc.kind)
			// The socket answers the same line.
			if lines := e.raw([]byte(tc.body + "\n")); len(lines) != 1 || strings.TrimSpace(string(body)) != lines[0] {
				t.Errorf("%s: socket %q, HTTP %s", tc.name, lines, body)
			}
		}
		// The refused write changed nothing.
		if r := e.rt(id, "file_list", "--path", "."); strings.Contains(fmt.Sprint(r), "\"x\"") {
			t.Errorf("after the refused write: %v", r)
		}

		// A body over the socket's limit.
		big := `{"op":"list_sandboxes","scope":{"kind":"system"},"args":{"pad":"` + strings.Repeat("x", 16<<20) + `"}}`
		resp, body := w.do("POST", "/api/rpc", big, w.bearer())
		if resp.StatusCode != 413 {
			t.Fatalf("oversized body: %d %s", resp.StatusCode, body[:min(len(body), 200)])
		}
		if e := wantEnvelope(t, "oversized", body, "request_too_large"); fmt.Sprint(e["details"].(map[string]any)["limit"]) != strconv.Itoa(16<<20) {
			t.Errorf("oversized details: %v", e)
		}

		// Progress as SSE: log events, then one result event.
		hdr := w.bearer()
		hdr["Accept"] = "text/event-stream"
		req, _ := json.Marshal(map[string]any{"op": "destroy_sandbox", "scope": map[string]any{"kind": "system"},
			"args": map[string]any{"sandbox_id": id}, "_stream_logs": true})
		resp, body = w.do("POST", "/api/rpc", string(req), hdr)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("streamed destroy: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		evs := parseSSE(t, bytes.NewReader(body), -1)
		if len(evs) < 2 || evs[len(evs)-1].event != "result" {
			t.Fatalf("streamed destroy events: %+v", evs)
		}
		for _, ev := range evs[:len(evs)-1] {
			var l map[string]any
			if ev.event != "log" || json.Unmarshal([]byte(ev.data), &l) != nil || len(l) != 1 || l["line"] == "" {
				t.Fatalf("progress event %+v", ev)
			}
		}
		if res := decodeObj(t, []byte(evs[len(evs)-1].data)); errKind(res) != "" {
			t.Fatalf("streamed destroy result: %v", res)
		}
		if got := e.mgr("list_sandboxes")["sandboxes"].([]any); len(got) != 0 {
			t.Fatalf("sandboxes after the destroy: %v", got)
		}
	})
}

func TestHTTPRefusesNonLoopback(t *testing.T) {
	refusesNonLoopback(t, "--http", "http", "http.addr")
	// The config key opens the listener (what the systemd unit relies on).
	e := newEnv(t)
	writeConfig(t, e, "http:\n  listen: tcp://127.0.0.1:0\n")
	e.start()
	w := e.web()
	if m := w.rpc(map[string]any{"op": "list_sandboxes", "scope": map[string]any{"kind": "system"}}); errKind(m) != "" {
		t.Fatalf("list over the configured listener: %v", m)
	}
}

// TestHTTPAddrBeforeSocket: like listen.addr, http.addr is complete before
// the socket file exists, so whoever sees the supervisor answer can log in.
func TestHTTPAddrBeforeSocket(t *testing.T) {
	e := newEnv(t)
	watch := watchRunDir(t, e)
	e.start("--http", "tcp://127.0.0.1:0")
	if w := e.web(); !strings.HasPrefix(w.addr, "127.0.0.1:") {
		t.Fatalf("http.addr right after the socket answered: %q", w.addr)
	}
	watch.completeBeforeSocket(t, "http.addr")
}

type sseEvent struct {
	id, event, data string
}

// parseSSE reads events (comments skipped) until n have arrived (n < 0:
// until EOF).
func parseSSE(t *testing.T, r io.Reader, n int) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 32<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur != (sseEvent{}) {
				out = append(out, cur)
				if len(out) == n {
					return out
				}
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			cur.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			cur.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[6:]
		}
	}
	return out
}

// eventStream is one open GET /api/events.
type eventStream struct {
	t    *testing.T
	resp *http.Response
	evs  chan sseEvent
}

func (w *webClient) stream(query string, hdr map[string]string) *eventStream {
	w.t.Helper()
	req, _ := http.NewRequest("GET", w.url("/api/events"+query), nil)
	req.Header.Set("Authorization", "Bearer "+w.token)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		w.t.Fatalf("/api/events%s: %d %s", query, resp.StatusCode, b)
	}
	s := &eventStream{t: w.t, resp: resp, evs: make(chan sseEvent, 4096)}
	go func() {
		defer close(s.evs)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 32<<20)
		var cur sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if cur != (sseEvent{}) {
					s.evs <- cur
				}
				cur = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				cur.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				cur.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				cur.data = line[6:]
			}
		}
	}()
	w.t.Cleanup(func() { resp.Body.Close() })
	return s
}

// next returns the next record event (ready/truncated are checked and
// skipped).
func (s *eventStream) next() (sseEvent, map[string]any) {
	s.t.Helper()
	for {
		select {
		case ev, ok := <-s.evs:
			if !ok {
				s.t.Fatal("the event stream ended")
			}
			if ev.event == "ready" {
				continue
			}
			if ev.event != "event" && ev.event != "span" {
				s.t.Fatalf("unexpected stream event %+v", ev)
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(ev.data), &m); err != nil {
				s.t.Fatalf("event data %q: %v", ev.data, err)
			}
			rec, _ := m["record"].(map[string]any)
			if rec == nil || fmt.Sprint(rec["seq"]) != ev.id || rec["kind"] != ev.event {
				s.t.Fatalf("event %+v: record without its seq/kind", ev)
			}
			return ev, m
		case <-time.After(60 * time.Second):
			s.t.Fatal("no event within 60s")
		}
	}
}

// until reads records until one satisfies pred; it returns every id read.
func (s *eventStream) until(pred func(m map[string]any) bool) []uint64 {
	s.t.Helper()
	var ids []uint64
	for {
		ev, m := s.next()
		n, err := strconv.ParseUint(ev.id, 10, 64)
		if err != nil {
			s.t.Fatalf("id %q", ev.id)
		}
		ids = append(ids, n)
		if pred(m) {
			return ids
		}
	}
}

func (s *eventStream) close() { s.resp.Body.Close() }

// dispatchOf matches the supervisor.dispatch span of op (for sandbox id,
// when given, by its result in the store it lands in).
func dispatchOf(op string) func(m map[string]any) bool {
	return func(m map[string]any) bool {
		rec := m["record"].(map[string]any)
		attrs, _ := rec["attrs"].(map[string]any)
		return rec["name"] == "supervisor.dispatch" && attrs != nil && attrs["op"] == op
	}
}

// storedSeqs reads every event log under the data directory and returns
// the sequence numbers above after, ascending.
func (e *env) storedSeqs(after uint64) []uint64 {
	e.t.Helper()
	var out []uint64
	logs, _ := filepath.Glob(filepath.Join(e.data(), "sandboxes", "*", "observability", "observability.ndjson*"))
	sys, _ := filepath.Glob(filepath.Join(e.data(), "supervisor", "observability", "observability.ndjson*"))
	for _, p := range append(logs, sys...) {
		b, err := os.ReadFile(p)
		if err != nil {
			e.t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			var h struct {
				Seq uint64 `json:"seq"`
			}
			if json.Unmarshal([]byte(line), &h) == nil && h.Seq > after {
				out = append(out, h.Seq)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func TestHTTPEventStream(t *testing.T) {
	e := newEnv(t)
	e.start("--http", "tcp://127.0.0.1:0")
	w := e.web()
	root := e.project(map[string]string{"a.txt": "a\n"})

	// Live: a sandbox created by the CLI shows up on an open stream.
	s := w.stream("", nil)
	id := e.createSandbox(root)
	ids := s.until(dispatchOf("create_sandbox"))
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			t.Fatalf("ids not increasing: %v", ids)
		}
	}
	last := ids[len(ids)-1]
	s.close()

	// Missed while disconnected, then resumed with Last-Event-ID: exactly
	// the records stored after it, in order, once each.
	e.rt(id, "file_write", "--path", "b.txt", "--content", "b\n")
	id2 := e.createSandbox(root)
	// Background records (lease events, autosquash) may still be landing:
	// wait until the stores are quiet.
	missed := e.storedSeqs(last)
	for {
		time.Sleep(200 * time.Millisecond)
		again := e.storedSeqs(last)
		if reflect.DeepEqual(again, missed) {
			break
		}
		missed = again
	}
	if len(missed) == 0 {
		t.Fatal("no records stored while disconnected")
	}
	s = w.stream("", map[string]string{"Last-Event-ID": strconv.FormatUint(last, 10)})
	var got []uint64
	for len(got) == 0 || got[len(got)-1] < missed[len(missed)-1] {
		ev, _ := s.next()
		n, _ := strconv.ParseUint(ev.id, 10, 64)
		got = append(got, n)
	}
	if !reflect.DeepEqual(got, missed) {
		t.Fatalf("resumed after %d:\ngot  %v\nwant %v", last, got, missed)
	}
	// And it goes on live.
	e.mgr("destroy_sandbox", "--sandbox-id", id2)
	ids = s.until(dispatchOf("destroy_sandbox"))
	if ids[0] <= got[len(got)-1] {
		t.Fatalf("live after replay repeats ids: %v after %v", ids, got)
	}
	s.close()

	// One sandbox's store only, from the start (?last_event_id=0).
	s = w.stream("?sandbox_id="+id+"&last_event_id=0", nil)
	want := 0
	for _, p := range []string{"observability.ndjson.1", "observability.ndjson"} {
		b, _ := os.ReadFile(filepath.Join(e.data(), "sandboxes", id, "observability", p))
		want += strings.Count(string(b), "\n")
	}
	if want == 0 {
		t.Fatal("the sandbox's store is empty")
	}
	for range want {
		_, m := s.next()
		if m["sandbox_id"] != id {
			t.Fatalf("filtered stream carries %v", m)
		}
	}
	s.close()

	// Bad parameters and unknown sandboxes are refused in the envelope.
	for _, tc := range []struct {
		query  string
		hdr    map[string]string
		status int
		kind   string
	}{
		{"?sandbox_id=sbx-nope", nil, 404, "not_found"},
		{"?kind=bogus", nil, 400, "invalid_request"},
		{"?last_n=100000", nil, 400, "invalid_request"},
		{"", map[string]string{"Last-Event-ID": "x"}, 400, "invalid_request"},
	} {
		h := w.bearer()
		for k, v := range tc.hdr {
			h[k] = v
		}
		resp, body := w.do("GET", "/api/events"+tc.query, "", h)
		if resp.StatusCode != tc.status {
			t.Errorf("%s %v: %d %s", tc.query, tc.hdr, resp.StatusCode, body)
			continue
		}
		wantEnvelope(t, tc.query, body, tc.kind)
	}
	if resp, body := w.do("GET", "/api/events", "", nil); resp.StatusCode != 401 {
		t.Errorf("/api/events without a token: %d %s", resp.StatusCode, body)
	}

	// Streams are capped: one more than the cap is server_busy, and a
	// closed stream frees its slot.
	var open []*eventStream
	for range 32 {
		open = append(open, w.stream("", nil))
	}
	resp, body := w.do("GET", "/api/events", "", w.bearer())
	if resp.StatusCode != 503 {
		t.Fatalf("stream over the cap: %d %s", resp.StatusCode, body)
	}
	if e := wantEnvelope(t, "stream over the cap", body, "server_busy"); fmt.Sprint(e["details"].(map[string]any)["max_event_streams"]) != "32" {
		t.Errorf("cap details: %v", e)
	}
	open[0].close()
	for range open[0].evs {
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest("GET", w.url("/api/events"), nil)
		req.Header.Set("Authorization", "Bearer "+w.token)
		resp, err := (&http.Client{}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 || time.Now().After(deadline) {
			if resp.StatusCode != 200 {
				t.Fatalf("slot not freed after a stream closed: %d", resp.StatusCode)
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHTTPOtherUser: another local user reaches the port (loopback is
// shared) but cannot read ui.token and gets 401 without it.
func TestHTTPOtherUser(t *testing.T) {
	u := otherUser(t)
	peer := peerBin(t)
	e := newEnv(t)
	e.start("--http", "tcp://127.0.0.1:0")
	w := e.web()
	tokFile := filepath.Join(e.home, "config", "ui.token")
	// Let the other user get as far as the file itself: only its own
	// mode protects it.
	for d := filepath.Dir(tokFile); d != "/" && strings.HasPrefix(d, e.root); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o711)
	}
	for _, tc := range []struct{ path, body string }{
		{"/api/rpc", `{"op":"list_sandboxes","scope":{"kind":"system"}}`},
		{"/api/events", ""},
		{"/", ""},
	} {
		out, err := exec.Command("sudo", "-n", "-u", u.Username, peer, "http", w.url(tc.path), tc.body, tokFile).CombinedOutput()
		if err != nil {
			t.Fatalf("peer http %s: %v %s", tc.path, err, out)
		}
		if !strings.Contains(string(out), "permission denied") {
			t.Errorf("the other user could read ui.token: %s", out)
		}
		status, body, _ := strings.Cut(strings.SplitN(string(out), "\n", 2)[1], " ")
		if status != "401" {
			t.Errorf("%s as %s: %s", tc.path, u.Username, out)
			continue
		}
		wantEnvelope(t, "other user "+tc.path, []byte(body), "unauthorized")
	}
}

// TestSupervisorUI: `sandbox-supervisor ui` prints a login URL that logs
// in, and says how to turn the listener on when it is off.
func TestSupervisorUI(t *testing.T) {
	e := newEnv(t)
	e.start()
	r := e.runEnv([]string{"DISPLAY=", "WAYLAND_DISPLAY="}, "sandbox-supervisor", "ui")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "--http") || !strings.Contains(r.stderr, "http.listen") {
		t.Fatalf("ui with the listener off: %+v", r)
	}
	e.stop()

	e.start("--http", "tcp://127.0.0.1:0")
	w := e.web()
	r = e.runEnv([]string{"DISPLAY=", "WAYLAND_DISPLAY="}, "sandbox-supervisor", "ui")
	want := "http://" + w.addr + "/auth?token=" + w.token
	if r.code != 0 || strings.TrimSpace(r.stdout) != want {
		t.Fatalf("ui: %+v, want %s", r, want)
	}
	if !regexp.MustCompile(`^http://127\.0\.0\.1:\d+/auth\?token=[0-9a-f]{64}$`).MatchString(strings.TrimSpace(r.stdout)) {
		t.Fatalf("ui URL %q", r.stdout)
	}
	// The URL logs in: a cookie, then / answers with it.
	resp, err := w.c.Get(strings.TrimSpace(r.stdout))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || len(cookies) != 1 {
		t.Fatalf("login URL: %d %v", resp.StatusCode, cookies)
	}
	if resp, body := w.do("GET", resp.Header.Get("Location"), "", map[string]string{"Cookie": "es_ui=" + cookies[0].Value}); resp.StatusCode != 200 {
		t.Fatalf("after login: %d %s", resp.StatusCode, body)
	}
}

// TestHTTPDisconnectCancels: an /api/rpc client that goes away cancels
// its long read like a socket client does (the request's span ends
// "cancelled"), while one that waits gets its answer.
func TestHTTPDisconnectCancels(t *testing.T) {
	e := newEnv(t)
	e.start("--http", "tcp://127.0.0.1:0")
	w := e.web()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	ws := e.session(id)
	if out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "300000",
		"mkdir d && cd d && seq 1 8000 | xargs -n 500 touch"); out["status"] != "ok" {
		t.Fatalf("make files: %v", out)
	}
	body, _ := json.Marshal(map[string]any{"op": "diff_workspace_session", "request_id": "req-http-hangup",
		"scope": map[string]any{"kind": "sandbox", "sandbox_id": id}, "args": map[string]any{"workspace_session_id": ws}})
	c, err := net.Dial("tcp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /api/rpc HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		w.addr, w.token, len(body), body)
	c.Close()
	if sp := e.dispatchSpan("req-http-hangup", "--sandbox-id", id); sp["status"] != "cancelled" {
		t.Fatalf("diff whose HTTP client hung up: %v", sp)
	}
	m := w.rpc(map[string]any{"op": "diff_workspace_session", "request_id": "req-http-waits",
		"scope": map[string]any{"kind": "sandbox", "sandbox_id": id}, "args": map[string]any{"workspace_session_id": ws, "paths": []string{"d/1"}}})
	if errKind(m) != "" {
		t.Fatalf("diff over HTTP: %v", m)
	}
	if sp := e.dispatchSpan("req-http-waits", "--sandbox-id", id); sp["status"] != "completed" {
		t.Fatalf("waited-for diff span: %v", sp)
	}
}

// commandStream opens GET /api/commands/{id}/stream and returns its
// events as they arrive.
func (w *webClient) commandStream(sandboxID, cmd, query string, hdr map[string]string) *eventStream {
	w.t.Helper()
	req, _ := http.NewRequest("GET", w.url("/api/commands/"+cmd+"/stream?sandbox_id="+sandboxID+query), nil)
	req.Header.Set("Authorization", "Bearer "+w.token)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		w.t.Fatalf("command stream: %d %s", resp.StatusCode, b)
	}
	s := &eventStream{t: w.t, resp: resp, evs: make(chan sseEvent, 4096)}
	go func() {
		defer close(s.evs)
		for _, ev := range parseSSE(w.t, resp.Body, -1) {
			s.evs <- ev
		}
	}()
	w.t.Cleanup(func() { resp.Body.Close() })
	return s
}

// TestHTTPCommandStream: a command's transcript streams while it runs
// (a row written after the stream opened arrives without polling), ends
// with its exit, and resumes after Last-Event-ID.
func TestHTTPCommandStream(t *testing.T) {
	e := newEnv(t)
	e.start("--http", "tcp://127.0.0.1:0")
	w := e.web()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	out := e.exec(id, "--yield-time-ms", "1000", "echo first; read x; echo got-$x; read y; echo last")
	cmd, _ := out["command_session_id"].(string)
	if out["status"] != "running" || cmd == "" {
		t.Fatalf("exec: %v", out)
	}
	// parseSSE below returns only at EOF, so read the stream through a
	// goroutine-fed channel: rows must arrive before the command ends.
	req, _ := http.NewRequest("GET", w.url("/api/commands/"+cmd+"/stream?sandbox_id="+id), nil)
	req.Header.Set("Authorization", "Bearer "+w.token)
	resp, err := (&http.Client{}).Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("command stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	evs := make(chan sseEvent, 64)
	go func() {
		defer close(evs)
		var cur sseEvent
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			switch line := sc.Text(); {
			case line == "":
				if cur != (sseEvent{}) {
					evs <- cur
				}
				cur = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				cur.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				cur.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				cur.data = line[6:]
			}
		}
	}()
	next := func() sseEvent {
		select {
		case ev, ok := <-evs:
			if !ok {
				t.Fatal("the command stream ended early")
			}
			return ev
		case <-time.After(60 * time.Second):
			t.Fatal("no command stream event within 60s")
		}
		return sseEvent{}
	}
	rowOf := func(ev sseEvent) string {
		var m map[string]string
		if ev.event != "row" || json.Unmarshal([]byte(ev.data), &m) != nil {
			t.Fatalf("want a row event, got %+v", ev)
		}
		return m["row"]
	}
	if ev := next(); rowOf(ev) != "first" || ev.id != "0" {
		t.Fatalf("first row: %+v", ev)
	}
	// The command waits for stdin: its next rows can only come later, and
	// got-hi must arrive while it still waits for more (live, not at exit).
	e.rt(id, "write_command_stdin", "--command-session-id", cmd, "hi\n")
	rows, ids := []string{"first"}, []string{"0"}
	for !slices.Contains(rows, "got-hi") {
		ev := next()
		rows, ids = append(rows, rowOf(ev)), append(ids, ev.id)
	}
	e.rt(id, "write_command_stdin", "--command-session-id", cmd, "bye\n")
	for {
		ev := next()
		if ev.event == "exit" {
			var res map[string]any
			if err := json.Unmarshal([]byte(ev.data), &res); err != nil || res["status"] != "ok" || fmt.Sprint(res["exit_code"]) != "0" {
				t.Fatalf("exit event: %+v", ev)
			}
			break
		}
		rows, ids = append(rows, rowOf(ev)), append(ids, ev.id)
	}
	if rows[len(rows)-1] != "last" {
		t.Fatalf("rows after stdin: %q", rows)
	}
	// Resuming after row 0 replays the rest of the finished transcript.
	s := w.commandStream(id, cmd, "", map[string]string{"Last-Event-ID": "0"})
	var again []string
	for ev := range s.evs {
		if ev.event == "exit" {
			break
		}
		again = append(again, rowOf(ev))
	}
	if !reflect.DeepEqual(again, rows[1:]) {
		t.Fatalf("resumed rows %q, want %q (ids %v)", again, rows, ids)
	}
	if resp, body := w.do("GET", "/api/commands/cmd-nope/stream?sandbox_id="+id, "", w.bearer()); resp.StatusCode != 404 {
		t.Errorf("unknown command: %d %s", resp.StatusCode, body)
	} else {
		wantEnvelope(t, "unknown command", body, "not_found")
	}
}
