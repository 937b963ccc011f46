package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// TestMCPOutputSchemas calls every tool that declares an outputSchema, on
// each overlay driver, and validates what it returned in structuredContent
// against that schema with a JSON Schema validator, as a client that checks
// outputSchema (the MCP TypeScript SDK) does. Error results are validated
// too: clients check structuredContent whenever it is present.
func TestMCPOutputSchemas(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		root := e.project(map[string]string{"src/app.txt": "one\ntwo\nthree\n", "README": "hi\n"})
		c := e.mcpIn("", bin("sandbox-mcp"))
		c.initialize()
		schemas := map[string]*jsonschema.Schema{}
		for _, tl := range c.send("tools/list", nil, false)["result"].(map[string]any)["tools"].([]any) {
			m := tl.(map[string]any)
			name := m["name"].(string)
			out, ok := m["outputSchema"]
			if !ok {
				continue
			}
			raw, _ := json.Marshal(out)
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			comp := jsonschema.NewCompiler()
			if err := comp.AddResource("mem://"+name, doc); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			sch, err := comp.Compile("mem://" + name)
			if err != nil {
				t.Fatalf("%s: outputSchema does not compile: %v", name, err)
			}
			schemas[name] = sch
		}
		called := map[string]bool{}
		// call validates one result against its tool's outputSchema; the
		// validator wants the result as decoded by its own JSON reader
		// (json.Number), so it re-reads the structuredContent.
		call := func(tool string, args map[string]any, wantErr bool) map[string]any {
			t.Helper()
			isErr, sc := c.call(tool, args)
			if isErr != wantErr {
				t.Fatalf("%s %v: isError=%v %v", tool, args, isErr, sc)
			}
			raw, _ := json.Marshal(sc)
			if os.Getenv("ESBX_MCP_DUMP") != "" {
				t.Logf("%s → %s", tool, raw)
			}
			sch, ok := schemas[tool]
			if !ok {
				return sc
			}
			called[tool] = true
			inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			if err := sch.Validate(inst); err != nil {
				t.Errorf("%s: structuredContent does not match its outputSchema: %v\n%s", tool, err, raw)
			}
			return sc
		}

		args := map[string]any{"workspace_root": root}
		if d := driverOf(t); d != "" {
			args["overlay"] = d
		}
		sbx := call("create_sandbox", args, false)
		id := sbx["id"].(string)
		args["count"] = 2
		call("create_sandbox", args, false)
		call("list_sandboxes", map[string]any{}, false)
		call("inspect_sandbox", map[string]any{"sandbox_id": id}, false)
		call("inspect_sandbox", map[string]any{"sandbox_id": "sbx-missing"}, true)
		call("health", map[string]any{}, false)

		ws := call("create_workspace_session", map[string]any{"sandbox_id": id, "agent": "schema"}, false)
		wsID := ws["workspace_session_id"].(string)
		in := func(m map[string]any) map[string]any { m["sandbox_id"] = id; return m }
		call("list_workspace_sessions", in(map[string]any{}), false)
		call("file_write", in(map[string]any{"path": "src/new.txt", "content": "new\n", "workspace_session_id": wsID}), false)
		call("file_write", in(map[string]any{"path": "README", "content": "hello\n"}), false) // sessionless: publishes
		call("file_edit", in(map[string]any{"path": "src/app.txt", "workspace_session_id": wsID,
			"edits": []any{map[string]any{"old_string": "two", "new_string": "TWO"}}}), false)
		call("file_edit", in(map[string]any{"path": "README",
			"edits": []any{map[string]any{"old_string": "hello", "new_string": "HELLO"}}}), false)
		call("file_read", in(map[string]any{"path": "src/app.txt", "workspace_session_id": wsID}), false)
		call("file_read", in(map[string]any{"path": "src/app.txt", "limit": 1}), false)
		call("file_read", in(map[string]any{"path": "missing.txt"}), true)
		call("file_list", in(map[string]any{}), false)
		call("file_list", in(map[string]any{"path": "src", "workspace_session_id": wsID}), false)
		call("diff_workspace_session", in(map[string]any{"workspace_session_id": wsID}), false)
		call("diff_workspace_session", in(map[string]any{"workspace_session_id": wsID, "against": "head"}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": wsID, "dry_run": true}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": wsID}), false)
		call("file_blame", in(map[string]any{"path": "src/app.txt"}), false)
		call("file_blame", in(map[string]any{"path": "src/app.txt", "format": "agent-trace"}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": wsID}), true) // gone
		// A conflict: the dry run reports it, the publish is refused.
		conf := call("create_workspace_session", in(map[string]any{}), false)["workspace_session_id"]
		call("file_write", in(map[string]any{"path": "README", "content": "mine\n", "workspace_session_id": conf}), false)
		call("file_write", in(map[string]any{"path": "README", "content": "theirs\n"}), false)
		dry := call("publish_workspace_session", in(map[string]any{"workspace_session_id": conf, "dry_run": true, "default_strategy": "reject"}), false)
		if dry["would_commit"] != false {
			t.Errorf("conflicting dry run: %v", dry)
		}
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": conf, "default_strategy": "reject"}), true)
		// Live sessions (#19): the same conflict on a sync (dry run, refused,
		// then resolved), a fork, and a publish that keeps the session.
		call("sync_workspace_session", in(map[string]any{"workspace_session_id": conf, "dry_run": true, "default_strategy": "reject"}), false)
		call("sync_workspace_session", in(map[string]any{"workspace_session_id": conf, "default_strategy": "reject"}), true)
		call("sync_workspace_session", in(map[string]any{"workspace_session_id": conf,
			"resolutions": []any{map[string]any{"path": "README", "strategy": "ours"}}}), false)
		fork := call("fork_workspace_session", in(map[string]any{"workspace_session_id": conf, "agent": "forked"}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": fork["workspace_session_id"], "keep": true}), false)
		// Refused before the supervisor: the same envelope.
		call("file_read", in(map[string]any{"path": "README", "frobnicate": true}), true)
		// A session without changes publishes nothing.
		idle := call("create_workspace_session", in(map[string]any{"network_profile": "offline"}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": idle["workspace_session_id"], "dry_run": true}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": idle["workspace_session_id"]}), false)
		call("list_workspace_sessions", in(map[string]any{}), false)

		var missed []string
		for name := range schemas {
			if !called[name] {
				missed = append(missed, name)
			}
		}
		sort.Strings(missed)
		if len(missed) > 0 {
			t.Errorf("tools with an outputSchema this test does not call: %s", strings.Join(missed, ", "))
		}
		if len(schemas) < 13 {
			t.Errorf("%d tools declare an outputSchema, want at least the 13 of issue 17", len(schemas))
		}
	})
}

// TestMCPBoundedOutputMarkerLeadsOn (issue #27 item 8): the marker of a
// bounded output names reads that return what it left out — a row cut in
// part comes back whole, omitted rows come back from their first — and
// says when rows fell out of the transcript window (truncated_before).
func TestMCPBoundedOutputMarkerLeadsOn(t *testing.T) {
	e := newEnv(t)
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	c := e.mcpIn("", bin("sandbox-mcp"), "--sandbox-id", id)
	c.initialize()
	fnum := func(v any) int64 { f, _ := v.(float64); return int64(f) } // commandText decodes numbers as float64
	readRe := regexp.MustCompile(`read_command_lines start_offset=(\d+) limit=(\d+)( max_output_tokens=0)?`)
	exec := func(cmd string) (map[string]any, string) {
		t.Helper()
		meta, out := c.commandText(c.send("tools/call", map[string]any{"name": "exec_command",
			"arguments": map[string]any{"cmd": cmd, "yield_time_ms": 60000}}, false))
		if meta["status"] != "ok" {
			t.Fatalf("%s: %v", cmd, meta)
		}
		return meta, out
	}
	read := func(cmdID any, m []string) (map[string]any, string) {
		t.Helper()
		args := map[string]any{"command_session_id": cmdID, "start_offset": m[1], "limit": m[2]}
		if m[3] != "" {
			args["max_output_tokens"] = 0
		}
		for _, k := range []string{"start_offset", "limit"} {
			n, _ := strconv.Atoi(args[k].(string))
			args[k] = n
		}
		return c.commandText(c.send("tools/call", map[string]any{"name": "read_command_lines", "arguments": args}, false))
	}

	// One row of 300000 characters, then a short one: the long row is
	// cut, and the marker's read returns it whole.
	long := strings.Repeat("x", 300000)
	meta, out := exec(`head -c 300000 /dev/zero | tr '\0' x; echo; echo after`)
	reads := readRe.FindAllStringSubmatch(out, -1)
	if meta["output_truncated"] == nil || len(reads) != 1 || reads[0][3] == "" {
		t.Fatalf("marker of a cut row: %v\n%.300s", meta, out[len(out)-min(len(out), 600):])
	}
	m2, whole := read(meta["command_session_id"], reads[0])
	if whole != long || m2["output_truncated"] != nil {
		t.Fatalf("the marker's read returned %d characters (%v), want the whole row of %d", len(whole), m2["output_truncated"], len(long))
	}

	// More than the transcript window (1 MiB): the earliest rows are gone,
	// and the marker says so; its read of the omitted rows starts at the
	// first of them.
	meta, out = exec(`seq 1 250000`)
	tb := fnum(meta["truncated_before"])
	if tb == 0 || !strings.Contains(out, fmt.Sprintf("%d earlier rows fell out of the transcript window (truncated_before)", tb)) {
		t.Fatalf("marker without truncated_before %d: %.600s", tb, out)
	}
	reads = readRe.FindAllStringSubmatch(out, -1)
	tr := meta["output_truncated"].(map[string]any)
	if len(reads) != 1 || reads[0][3] != "" || reads[0][1] != fmt.Sprint(tr["omitted_start_offset"]) {
		t.Fatalf("marker of omitted rows: %v %v", reads, tr)
	}
	m3, rows := read(meta["command_session_id"], reads[0])
	from := fnum(tr["omitted_start_offset"])
	if first, _, _ := strings.Cut(rows, "\n"); first != strconv.FormatInt(from+1, 10) || fnum(m3["start_offset"]) != from {
		t.Fatalf("omitted rows read from %v: first row %q, want %d", m3["start_offset"], first, from+1)
	}
}

// TestMCPProgressPerSlice (issue #27 item 9): a long yield is served as
// slices of 1 s, then 2 s; every slice but the last (the response) sends
// notifications/progress with its new output, the first one too — so a
// 3 s yield sends one, and a 5 s yield two.
func TestMCPProgressPerSlice(t *testing.T) {
	e := newEnv(t)
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	c := e.mcpIn("", bin("sandbox-mcp"), "--sandbox-id", id)
	c.initialize()
	isErr, ws := c.call("create_workspace_session", map[string]any{})
	if isErr {
		t.Fatalf("session: %v", ws)
	}
	progress := func(token string) (msgs []string) {
		var last float64
		for _, n := range c.notes {
			p, _ := n["params"].(map[string]any)
			if n["method"] != "notifications/progress" || p["progressToken"] != token {
				continue
			}
			if v, _ := p["progress"].(float64); v <= last {
				t.Errorf("progress %v after %v", v, last)
			} else {
				last = v
			}
			m, _ := p["message"].(string)
			msgs = append(msgs, m)
		}
		return msgs
	}
	// The command prints s1 at once, then a row a second.
	script := `for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo s$i; sleep 1; done`
	meta, out := c.commandText(c.send("tools/call", map[string]any{"name": "exec_command", "_meta": map[string]any{"progressToken": "p-3"},
		"arguments": map[string]any{"cmd": script, "workspace_session_id": ws["workspace_session_id"], "yield_time_ms": 3000}}, false))
	if meta["status"] != "running" || !strings.HasPrefix(out, "s1\n") {
		t.Fatalf("exec: %v %q", meta, out)
	}
	if msgs := progress("p-3"); len(msgs) != 1 || !strings.HasPrefix(msgs[0], "s1") {
		t.Fatalf("a 3 s yield sends one notification, the first slice's output: %q", msgs)
	}
	_, _ = c.commandText(c.send("tools/call", map[string]any{"name": "write_command_stdin", "_meta": map[string]any{"progressToken": "p-5"},
		"arguments": map[string]any{"command_session_id": meta["command_session_id"], "stdin": "", "yield_time_ms": 5000}}, false))
	if msgs := progress("p-5"); len(msgs) != 2 {
		t.Fatalf("a 5 s yield sends two notifications: %q", msgs)
	}
	c.send("tools/call", map[string]any{"name": "write_command_stdin", "arguments": map[string]any{
		"command_session_id": meta["command_session_id"], "stdin": "\u0003"}}, false)
}

// TestREADMEListsOutputSchemaTools: the README's list of tools that declare
// an outputSchema is the one sandbox-mcp serves (it once named 14 of 15).
func TestREADMEListsOutputSchemaTools(t *testing.T) {
	e := newEnv(t)
	c := e.mcpIn("", bin("sandbox-mcp"))
	c.initialize()
	var served []string
	for _, tl := range c.send("tools/list", nil, false)["result"].(map[string]any)["tools"].([]any) {
		m := tl.(map[string]any)
		if _, ok := m["outputSchema"]; ok {
			served = append(served, m["name"].(string))
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "declare an `outputSchema`:")
	list, _, ok2 := strings.Cut(rest, ". It is")
	if !ok || !ok2 {
		t.Fatal("README has no list of the tools that declare an outputSchema")
	}
	var listed []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(list, -1) {
		listed = append(listed, m[1])
	}
	sort.Strings(served)
	sort.Strings(listed)
	if strings.Join(listed, " ") != strings.Join(served, " ") {
		t.Fatalf("README lists %d tools with an outputSchema:\n%v\nsandbox-mcp serves %d:\n%v", len(listed), listed, len(served), served)
	}
}
