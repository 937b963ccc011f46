package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// previewServer is what an agent runs in a session: it echoes each request
// (method, path with query, body, headers) as JSON, sets a cookie, and on
// GET /ws speaks just enough WebSocket to echo short frames; GET /stream
// sends its second chunk only after GET /release.
const previewServer = `import base64, hashlib, json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

release = threading.Event()

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.ws()
        if self.path == "/stream":
            return self.stream()
        if self.path == "/release":
            release.set()
        self.reply()

    def stream(self):
        # The second chunk waits for /release, which the client sends only
        # once it has read the first: a buffering proxy deadlocks here.
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.write(b"6\r\nfirst\n\r\n")
        release.wait(60)
        self.wfile.write(b"7\r\nsecond\n\r\n0\r\n\r\n")

    def do_POST(self):
        self.reply()

    def reply(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        out = json.dumps({"method": self.command, "path": self.path, "body": body,
                          "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Set-Cookie", "tracker=1; Path=/")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def ws(self):
        key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.close_connection = True
        while True:
            h = self.rfile.read(2)
            if len(h) < 2:
                return
            n = h[1] & 0x7f
            mask = self.rfile.read(4) if h[1] & 0x80 else bytes(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if h[0] & 0x0f == 8:
                self.wfile.write(b"\x88\x00")
                return
            self.wfile.write(bytes([h[0], len(data)]) + data)

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// forwardEnv starts a supervisor with the TCP and HTTP listeners and a
// sandbox whose isolated sessions use pasta.
func forwardEnv(t *testing.T, config string) (*env, string) {
	t.Helper()
	needHelper(t, "pasta")
	e := newEnv(t)
	writeConfig(t, e, "network:\n  isolated:\n    helper: pasta\n"+config)
	e.start("--listen", "tcp://127.0.0.1:0", "--http", "tcp://127.0.0.1:0")
	return e, e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
}

// startPreview runs previewServer on port 8000 inside session ws.
func (e *env) startPreview(id, ws string) {
	e.t.Helper()
	start := "cat > /tmp/preview.py <<'EOF'\n" + previewServer + "EOF\n" +
		"setsid python3 /tmp/preview.py 8000 >/dev/null 2>&1 & " +
		"for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))' 2>/dev/null && break; sleep 0.1; done; echo up"
	if out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "30000", start); !strings.Contains(out["output"].(string), "up") {
		e.t.Fatalf("preview server: %v", out)
	}
}

// echoed is previewServer's answer.
type echoed struct {
	Method, Path, Body string
	Headers            map[string]string
}

// TestForwardIsolatedHTTP: /forward/isolated=<ws>/<port>/… reaches a server
// inside an isolated session with the UI token; the prefix is stripped,
// method, query, body and status are kept, the UI's credentials never reach
// the target and its cookie never reaches the browser, X-Forwarded-* say
// where the request came from, and the answer carries the sandboxing CSP.
func TestForwardIsolatedHTTP(t *testing.T) {
	e, id := forwardEnv(t, "")
	ws := e.session(id, "--network-profile", "isolated")
	e.startPreview(id, ws)
	w := e.web()
	prefix := "/forward/isolated=" + ws + "/8000"
	for _, tc := range []struct{ ws, want string }{
		{ws, "http://" + w.addr + prefix + "/"},
		{"", "http://" + w.addr + "/forward/shared/8000/"},
		{e.session(id, "--network-profile", "offline"), ""},
	} {
		args := []string{"forward_port", "--port", "8000"}
		if tc.ws != "" {
			args = append(args, "--workspace-session-id", tc.ws)
		}
		if got, _ := e.rt(id, args...)["url"].(string); got != tc.want {
			t.Errorf("forward_port %v: url %q, want %q", args, got, tc.want)
		}
	}

	cookie := e.webCookie(w)
	for _, tc := range []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
	}{
		{"bearer GET with query", "GET", "/page/x?q=1&r=two", "", map[string]string{"Authorization": "Bearer " + w.token}, 200},
		{"cookie POST with body", "POST", "/submit?k=v", "payload=1", map[string]string{"Cookie": "es_ui=" + cookie + "; other=2",
			"Content-Type": "application/x-www-form-urlencoded", "X-Forwarded-For": "6.6.6.6", "X-Forwarded-Host": "evil.example",
			"X-Forwarded-Prefix": "/evil"}, 201},
		{"port without a trailing slash", "GET", "", "", map[string]string{"Authorization": "Bearer " + w.token}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := w.do(tc.method, prefix+tc.path, tc.body, tc.hdr)
			if resp.StatusCode != tc.status {
				t.Fatalf("HTTP %d %s", resp.StatusCode, body)
			}
			var got echoed
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			wantPath := tc.path
			if wantPath == "" {
				wantPath = "/"
			}
			if got.Method != tc.method || got.Path != wantPath || got.Body != tc.body {
				t.Errorf("target saw %s %s %q, want %s %s %q", got.Method, got.Path, got.Body, tc.method, wantPath, tc.body)
			}
			for _, h := range []string{"authorization", "cookie"} {
				if v, ok := got.Headers[h]; ok {
					t.Errorf("%s reached the target: %q", h, v)
				}
			}
			if got.Headers["x-forwarded-host"] != w.addr || got.Headers["x-forwarded-proto"] != "http" ||
				got.Headers["x-forwarded-prefix"] != prefix || got.Headers["x-forwarded-for"] != "127.0.0.1" {
				t.Errorf("X-Forwarded-* = %v", got.Headers)
			}
			if sc := resp.Header.Values("Set-Cookie"); len(sc) != 0 {
				t.Errorf("Set-Cookie reached the client: %q", sc)
			}
			csp := resp.Header.Values("Content-Security-Policy")
			if len(csp) != 1 || csp[0] != "sandbox allow-scripts allow-forms allow-popups allow-modals" {
				t.Errorf("Content-Security-Policy = %q", csp)
			}
		})
	}

	t.Run("streaming body", func(t *testing.T) {
		req, err := http.NewRequest("GET", w.url(prefix+"/stream"), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+w.token)
		resp, err := w.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if first, err := br.ReadString('\n'); first != "first\n" {
			t.Fatalf("first chunk %q: %v", first, err)
		}
		if r, b := w.do("GET", prefix+"/release", "", map[string]string{"Authorization": "Bearer " + w.token}); r.StatusCode != 200 {
			t.Fatalf("release: HTTP %d %s", r.StatusCode, b)
		}
		if rest, err := io.ReadAll(br); err != nil || string(rest) != "second\n" {
			t.Fatalf("rest %q: %v", rest, err)
		}
	})

	resp, body := w.do("GET", prefix+"/", "", nil)
	if resp.StatusCode != 401 {
		t.Fatalf("without the token: HTTP %d %s", resp.StatusCode, body)
	}
	wantEnvelope(t, "forward without token", body, "unauthorized")
}

// webCookie logs in at /auth and returns the es_ui value.
func (e *env) webCookie(w *webClient) string {
	e.t.Helper()
	resp, _ := w.do("GET", "/auth?token="+w.token, "", nil)
	for _, c := range resp.Cookies() {
		if c.Name == "es_ui" {
			return c.Value
		}
	}
	e.t.Fatalf("/auth set no es_ui cookie: %v", resp.Header)
	return ""
}

// TestForwardWebSocket: a WebSocket echo server inside an isolated session
// works through /forward/isolated=… with the UI token, also after the
// listener's request read timeout (1 s here) has passed.
func TestForwardWebSocket(t *testing.T) {
	e, id := forwardEnv(t, "supervisor:\n  request_read_timeout_s: 1\n")
	ws := e.session(id, "--network-profile", "isolated")
	e.startPreview(id, ws)
	w := e.web()

	c, err := net.Dial("tcp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second)) // a hang fails instead of blocking the suite
	fmt.Fprintf(c, "GET /forward/isolated=%s/8000/ws HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"+
		"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
		ws, w.addr, w.token)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The RFC 6455 example key's accept value.
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		t.Fatalf("handshake: %s %v %s", resp.Status, resp.Header, b)
	}
	for i, msg := range []string{"hello through the holder", "after the read timeout"} {
		if i == 1 {
			time.Sleep(1500 * time.Millisecond) // past request_read_timeout_s
		}
		mask := []byte{1, 2, 3, 4}
		frame := []byte{0x81, 0x80 | byte(len(msg))}
		frame = append(frame, mask...)
		for i := range len(msg) {
			frame = append(frame, msg[i]^mask[i%4])
		}
		if _, err := c.Write(frame); err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, 2)
		if _, err := io.ReadFull(br, hdr); err != nil {
			t.Fatalf("reading the echo of %q: %v", msg, err)
		}
		got := make([]byte, hdr[1]&0x7f)
		if _, err := io.ReadFull(br, got); err != nil {
			t.Fatal(err)
		}
		if hdr[0] != 0x81 || hdr[1]&0x80 != 0 || string(got) != msg {
			t.Errorf("echo frame %x %q, want an unmasked text frame %q", hdr, got, msg)
		}
	}
	if _, err := c.Write([]byte{0x88, 0x80, 0, 0, 0, 0}); err != nil { // close
		t.Fatal(err)
	}
	if hdr, err := io.ReadAll(br); err != nil || !bytes.Equal(hdr, []byte{0x88, 0}) {
		t.Errorf("close: %x %v", hdr, err)
	}
}

// TestForwardRefusals: the route's errors of §2.8, each an envelope, and a
// shared target reached on the host's loopback.
func TestForwardRefusals(t *testing.T) {
	e, id := forwardEnv(t, "")
	offline := e.session(id, "--network-profile", "offline")
	w := e.web()
	target := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "shared %s %s", r.URL.Path, r.URL.RawQuery)
	}))
	defer target.Close()
	sharedPort := target.Listener.Addr().(*net.TCPAddr).Port

	resp, body := w.do("GET", fmt.Sprintf("/forward/shared/%d/a/b?c=d", sharedPort), "", w.bearer())
	if resp.StatusCode != 200 || string(body) != "shared /a/b c=d" {
		t.Fatalf("shared forward: HTTP %d %q", resp.StatusCode, body)
	}

	_, tcpPortStr, _ := net.SplitHostPort(strings.TrimPrefix(e.tcpAddr(), "tcp://"))
	_, httpPortStr, _ := net.SplitHostPort(w.addr)
	for _, tc := range []struct {
		name, path string
		status     int
		kind       string
	}{
		{"the HTTP listener's own port", "/forward/shared/" + httpPortStr + "/health", 403, "unauthorized"},
		{"the TCP listener's port", "/forward/shared/" + tcpPortStr + "/", 403, "unauthorized"},
		{"the TCP listener's port through a session", "/forward/isolated=" + offline + "/" + tcpPortStr + "/", 403, "unauthorized"},
		{"port 0", "/forward/shared/0/", 400, "invalid_request"},
		{"port 65536", "/forward/shared/65536/", 400, "invalid_request"},
		{"port not decimal", "/forward/shared/0x50/", 400, "invalid_request"},
		{"unknown session", "/forward/isolated=ws-nosuch/8000/", 404, "not_found"},
		{"offline session", "/forward/isolated=" + offline + "/8000/", 404, "not_found"},
		{"unknown kind", "/forward/other/8000/", 404, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := w.do("GET", tc.path, "", w.bearer())
			if resp.StatusCode != tc.status {
				t.Fatalf("HTTP %d %s, want %d", resp.StatusCode, body, tc.status)
			}
			wantEnvelope(t, tc.path, body, tc.kind)
		})
	}
}

// TestForwardErrorHeaders (issue #27 item 11): a /forward answer the
// listener makes itself (502: nothing listens on the port) carries the
// listener's Content-Security-Policy and Cache-Control: no-store, as every
// other answer of the listener does.
func TestForwardErrorHeaders(t *testing.T) {
	e := newEnv(t)
	e.start("--http", "tcp://127.0.0.1:0")
	w := e.web()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	resp, body := w.do("GET", fmt.Sprintf("/forward/shared/%d/page", port), "", map[string]string{"Authorization": "Bearer " + w.token})
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("HTTP %d %s", resp.StatusCode, body)
	}
	wantEnvelope(t, "forward to a closed port", body, "operation_failed")
	if csp := resp.Header.Values("Content-Security-Policy"); len(csp) != 1 || !strings.HasPrefix(csp[0], "default-src 'none';") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control = %q", cc)
	}
	if xf := resp.Header.Get("X-Frame-Options"); xf != "DENY" {
		t.Errorf("X-Frame-Options = %q", xf)
	}
}
