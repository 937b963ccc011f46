package mcpserver

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/clitest"
)

// commandFake answers like a supervisor running one long command cmd-1:
// exec_command and polls say running with one new row each; a \u0003
// cancels it; after finishAfter polls it ends by itself.
func commandFake(finishAfter int64) (clitest.Reply, *atomic.Int64) {
	var polls atomic.Int64
	out := func(status string, row int64) []string {
		b, _ := json.Marshal(map[string]any{"status": status, "exit_code": nil, "command_session_id": "cmd-1", "workspace_session_id": "ws-1",
			"start_offset": row, "end_offset": row + 1, "total_lines": row + 1, "output": fmt.Sprintf("\x1b[31mrow%d\x1b[0m", row),
			"original_token_count": 2, "wall_time_seconds": 0.1, "command_total_time_seconds": 1})
		return []string{string(b)}
	}
	return func(req map[string]any) []string {
		args, _ := req["args"].(map[string]any)
		y, _ := strconv.Atoi(fmt.Sprint(args["yield_time_ms"]))
		switch req["op"] {
		case "exec_command":
			time.Sleep(100 * time.Millisecond)
			return out("running", 0)
		case "write_command_stdin":
			if args["stdin"] == "\u0003" {
				return out("cancelled", polls.Load()+1)
			}
			time.Sleep(time.Duration(y) * time.Millisecond / 4)
			n := polls.Add(1)
			if n >= finishAfter {
				return out("ok", n)
			}
			return out("running", n)
		case "health":
			time.Sleep(3 * time.Second)
		}
		return clitest.Echo(req)
	}, &polls
}

// readUntil reads output lines until one satisfies stop; it returns them all.
func (s *session) readUntil(stop func(map[string]any) bool) []map[string]any {
	s.t.Helper()
	var got []map[string]any
	for {
		line, err := s.out.ReadBytes('\n')
		if err != nil {
			s.t.Fatalf("reading: %v (after %v)", err, got)
		}
		var m map[string]any
		d := json.NewDecoder(strings.NewReader(string(line)))
		d.UseNumber()
		if err := d.Decode(&m); err != nil {
			s.t.Fatalf("bad line %q", line)
		}
		got = append(got, m)
		if stop(m) {
			return got
		}
	}
}

func hasID(id int) func(map[string]any) bool {
	return func(m map[string]any) bool { v, _ := m["id"].(json.Number); return v.String() == strconv.Itoa(id) }
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sentInterrupt(sup *clitest.Supervisor) bool {
	for _, r := range sup.Requests() {
		a, _ := r["args"].(map[string]any)
		if r["op"] == "write_command_stdin" && a["stdin"] == "\u0003" && a["command_session_id"] == "cmd-1" {
			return true
		}
	}
	return false
}

// A cancelled call gets no response (MCP: "receivers SHOULD NOT send a
// response for a cancelled request"); a cancelled exec_command cancels its
// command, whether the cancel comes during the first request (the command's
// ID is not known yet) or while it is being polled; another cancelled call
// just stops.
func TestCancelledCallsGetNoResponse(t *testing.T) {
	for _, when := range []string{"first request", "polling", "other tool"} {
		t.Run(when, func(t *testing.T) {
			reply, polls := commandFake(1 << 30)
			sup := clitest.NewUnix(t, reply)
			s := start(t, catalog.Runtime, append(catalog.GroupOps(catalog.Runtime), catalog.GroupOps(catalog.Observability)...), sup)
			s.initialize("2025-06-18")
			s.id++
			cancelled := s.id
			name, args := "exec_command", map[string]any{"sandbox_id": "sbx-1", "cmd": "sleep 600", "yield_time_ms": 60000}
			if when == "other tool" {
				name, args = "health", map[string]any{}
			}
			s.send(map[string]any{"jsonrpc": "2.0", "id": cancelled, "method": "tools/call", "params": map[string]any{"name": name, "arguments": args}})
			switch when {
			case "polling":
				waitFor(t, "a poll", func() bool { return polls.Load() >= 1 })
			default:
				waitFor(t, "the request", func() bool { return len(sup.Requests()) >= 1 })
			}
			s.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": map[string]any{"requestId": cancelled, "reason": "user"}})
			if when != "other tool" {
				waitFor(t, "the command's cancel", func() bool { return sentInterrupt(sup) })
			} else {
				time.Sleep(3500 * time.Millisecond) // the fake answers after 3 s
			}
			s.id++
			s.send(map[string]any{"jsonrpc": "2.0", "id": s.id, "method": "ping"})
			for _, m := range s.readUntil(hasID(s.id)) {
				if hasID(cancelled)(m) {
					t.Fatalf("the cancelled request was answered: %v", m)
				}
			}
			if when == "other tool" && sentInterrupt(sup) {
				t.Fatal("a cancelled call of another tool interrupted a command")
			}
			s.close()
		})
	}
}

// With a progressToken a long yield sends notifications/progress with the
// new output; the result joins every row in order, escapes stripped.
func TestProgressAndJoinedOutput(t *testing.T) {
	reply, _ := commandFake(3)
	sup := clitest.NewUnix(t, reply)
	s := start(t, catalog.Runtime, nil, sup)
	s.initialize("2025-06-18")
	s.id++
	s.send(map[string]any{"jsonrpc": "2.0", "id": s.id, "method": "tools/call", "params": map[string]any{
		"name": "exec_command", "arguments": map[string]any{"sandbox_id": "sbx-1", "cmd": "make", "yield_time_ms": 20000},
		"_meta": map[string]any{"progressToken": "tok-1"}}})
	lines := s.readUntil(hasID(s.id))
	progress := 0
	for _, m := range lines {
		if m["method"] == "notifications/progress" {
			p := m["params"].(map[string]any)
			if p["progressToken"] != "tok-1" || !strings.HasPrefix(fmt.Sprint(p["message"]), "row") {
				t.Errorf("progress %v", p)
			}
			progress++
		}
	}
	if progress == 0 {
		t.Errorf("no progress notifications: %v", lines)
	}
	res := lines[len(lines)-1]["result"].(map[string]any)
	text := res["content"].([]any)[0].(map[string]any)["text"].(string)
	head, output, _ := strings.Cut(text, "\n")
	if output != "row0\nrow1\nrow2\nrow3" || res["structuredContent"] != nil {
		t.Fatalf("result %q / %v", output, res)
	}
	var meta map[string]any
	if err := json.Unmarshal([]byte(head), &meta); err != nil || meta["status"] != "ok" || meta["start_offset"] != float64(0) || meta["end_offset"] != float64(4) {
		t.Fatalf("meta %q", head)
	}
	s.close()
}

// Output is bounded (default or per call) with head, tail and a marker
// naming the omitted offsets; 2.0 is an integer; a relative workspace_root
// is taken from the server's directory; the default sandbox is used.
func TestBoundsIntegersAndDefaults(t *testing.T) {
	var rows []string
	for i := range 300 {
		rows = append(rows, fmt.Sprintf("\x1b[1mline %03d\x1b[0m", i))
	}
	big, _ := json.Marshal(map[string]any{"status": "ok", "exit_code": 0, "command_session_id": "cmd-1", "workspace_session_id": "ws-1",
		"start_offset": 0, "end_offset": 300, "total_lines": 300, "output": strings.Join(rows, "\n"), "original_token_count": 1000})
	sup := clitest.NewUnix(t, func(req map[string]any) []string {
		if req["op"] == "read_command_lines" {
			return []string{string(big)}
		}
		return clitest.Echo(req)
	})
	s := startWith(t, "", catalog.Ops(), sup, Options{SandboxID: "sbx-d", MaxOutputTokens: 100, Cwd: "/home/u/proj"})
	s.initialize("2025-06-18")
	for _, tc := range []struct {
		args     map[string]any
		bounded  bool
		maxChars int
	}{
		{map[string]any{"command_session_id": "cmd-1"}, true, 400},
		{map[string]any{"command_session_id": "cmd-1", "max_output_tokens": 50}, true, 200},
		{map[string]any{"command_session_id": "cmd-1", "max_output_tokens": 0}, false, 1 << 20},
	} {
		res := s.call("read_command_lines", tc.args)
		text := res["content"].([]any)[0].(map[string]any)["text"].(string)
		head, output, _ := strings.Cut(text, "\n")
		if strings.Contains(text, "\x1b") {
			t.Errorf("escapes kept: %q", text)
		}
		var meta map[string]any
		_ = json.Unmarshal([]byte(head), &meta)
		tr, _ := meta["output_truncated"].(map[string]any)
		if (tr != nil) != tc.bounded || !strings.HasPrefix(output, "line 000") || !strings.HasSuffix(output, "line 299") {
			t.Errorf("%v: meta %v output %q", tc.args, meta, output)
			continue
		}
		if tc.bounded {
			from := int(tr["omitted_start_offset"].(float64))
			to := int(tr["omitted_end_offset"].(float64))
			marker := fmt.Sprintf("with read_command_lines start_offset=%d limit=%d …]", from, to-from)
			// The marker row replaces exactly the omitted rows.
			if got := strings.Count(output, "\n") + 1; got != 300-(to-from)+1 || !strings.Contains(output, marker) || len(output) > tc.maxChars+250 {
				t.Errorf("%v: %d rows, omitted [%d,%d): %q", tc.args, got, from, to, output)
			}
		}
	}
	s.call("file_read", map[string]any{"path": "a", "limit": json.RawMessage("2.0")})
	s.call("create_sandbox", map[string]any{"workspace_root": "sub/dir"})
	reqs := sup.Requests()
	last := reqs[len(reqs)-2:]
	if a := last[0]["args"].(map[string]any); a["limit"] != json.Number("2") || fmt.Sprint(last[0]["scope"]) != "map[kind:sandbox sandbox_id:sbx-d]" {
		t.Errorf("file_read request %v", last[0])
	}
	if a := last[1]["args"].(map[string]any); a["workspace_root"] != "/home/u/proj/sub/dir" {
		t.Errorf("create_sandbox request %v", last[1])
	}
	for _, r := range reqs {
		if a, _ := r["args"].(map[string]any); a["max_output_tokens"] != nil {
			t.Errorf("client-side argument sent: %v", r)
		}
	}
	s.close()
}
