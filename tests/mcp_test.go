package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// mcpClient speaks newline-delimited JSON-RPC to `sandbox-mcp` over stdio.
type mcpClient struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	next  int
	lines chan string
	// notes are the notifications received; answered the ids answered.
	notes    []map[string]any
	answered map[int]map[string]any
}

func (e *env) mcp(set string) *mcpClient {
	e.t.Helper()
	return e.mcpIn("", bin("sandbox-mcp"), "--set", set)
}

// setTools counts the tools of the three sets together: what a server
// without --set must serve (counted, not hard-coded, so a new operation
// cannot make the all-tools server silently lose one).
func (e *env) setTools() int {
	e.t.Helper()
	n := 0
	for _, set := range []string{"management", "runtime", "observability"} {
		c := e.mcp(set)
		c.initialize()
		n += len(c.send("tools/list", nil, false)["result"].(map[string]any)["tools"].([]any))
	}
	return n
}

// mcpIn starts an MCP server command in dir ("" = the test's directory).
func (e *env) mcpIn(dir, name string, args ...string) *mcpClient {
	e.t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = e.environ()
	in, err := cmd.StdinPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	c := &mcpClient{t: e.t, cmd: cmd, in: in, lines: make(chan string, 16), answered: map[int]map[string]any{}}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 32<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	e.t.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	return c
}

func (c *mcpClient) send(method string, params any, notify bool) map[string]any {
	c.t.Helper()
	msg := map[string]any{"jsonrpc": "2.0", "method": method}
	if params != nil {
		msg["params"] = params
	}
	if !notify {
		c.next++
		msg["id"] = c.next
	}
	b, _ := json.Marshal(msg)
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		c.t.Fatal(err)
	}
	if notify {
		return nil
	}
	return c.await(c.next, method)
}

// await reads until the answer to id, recording notifications and answers.
func (c *mcpClient) await(id int, what string) map[string]any {
	c.t.Helper()
	if m, ok := c.answered[id]; ok {
		return m
	}
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("%s: sandbox-mcp closed stdout", what)
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				c.t.Fatalf("%s: not JSON: %q", what, line)
			}
			if _, ok := m["method"]; ok {
				c.notes = append(c.notes, m)
				continue
			}
			if got, ok := m["id"].(float64); ok {
				c.answered[int(got)] = m
				if int(got) == id {
					return m
				}
			}
		case <-time.After(90 * time.Second):
			c.t.Fatalf("%s: no answer", what)
		}
	}
}

func (c *mcpClient) initialize() map[string]any {
	c.t.Helper()
	r := c.send("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "esbx-test", "version": "1"}}, false)
	c.send("notifications/initialized", nil, true)
	return r
}

// call returns (isError, the structured response object).
func (c *mcpClient) call(tool string, args map[string]any) (bool, map[string]any) {
	c.t.Helper()
	r := c.send("tools/call", map[string]any{"name": tool, "arguments": args}, false)
	res, ok := r["result"].(map[string]any)
	if !ok {
		c.t.Fatalf("tools/call %s: %v", tool, r)
	}
	isErr, _ := res["isError"].(bool)
	sc, _ := res["structuredContent"].(map[string]any)
	content, _ := res["content"].([]any)
	if len(content) != 1 {
		c.t.Fatalf("tools/call %s: content %v", tool, res)
	}
	var text map[string]any
	if err := json.Unmarshal([]byte(content[0].(map[string]any)["text"].(string)), &text); err != nil || sc == nil {
		c.t.Fatalf("tools/call %s: text/structuredContent %v", tool, res)
	}
	a, _ := json.Marshal(text)
	b, _ := json.Marshal(sc)
	if string(a) != string(b) {
		c.t.Fatalf("text %s != structuredContent %s", a, b)
	}
	return isErr, sc
}

func TestMCPSets(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"a.txt": "alpha\n"})
	id := e.createSandbox(root)
	want := map[string][]string{
		"management": {"create_sandbox", "destroy_sandbox", "export_changes", "inspect_sandbox", "list_docker_images", "list_sandboxes", "list_workspace_directories", "squash_layerstacks"},
		"runtime": {"create_workspace_session", "destroy_workspace_session", "diff_workspace_session", "exec_command", "file_blame",
			"file_edit", "file_list", "file_read", "file_write", "fork_workspace_session", "forward_port", "list_commands", "list_workspace_sessions", "publish_workspace_session",
			"read_command_lines", "sync_workspace_session", "write_command_stdin"},
		"observability": {"cgroup", "daemon", "events", "file_activity", "health", "layerstack", "resources", "snapshot", "topology", "trace"},
	}
	for set, tools := range want {
		c := e.mcp(set)
		init := c.initialize()
		res := init["result"].(map[string]any)
		if res["protocolVersion"] != "2025-06-18" {
			t.Errorf("%s: protocolVersion %v", set, res["protocolVersion"])
		}
		if si := res["serverInfo"].(map[string]any); si["name"] != "sandbox-mcp" {
			t.Errorf("%s: serverInfo %v", set, si)
		}
		caps := res["capabilities"].(map[string]any)
		if _, ok := caps["tools"]; !ok || caps["prompts"] != nil || caps["resources"] != nil {
			t.Errorf("%s: capabilities %v", set, caps)
		}
		if p := c.send("ping", nil, false); p["result"] == nil {
			t.Errorf("%s: ping %v", set, p)
		}
		if p := c.send("prompts/list", nil, false); p["error"] == nil {
			t.Errorf("%s: prompts/list served: %v", set, p)
		}
		list := c.send("tools/list", nil, false)["result"].(map[string]any)["tools"].([]any)
		var names []string
		for _, tl := range list {
			m := tl.(map[string]any)
			names = append(names, m["name"].(string))
			schema := m["inputSchema"].(map[string]any)
			if schema["type"] != "object" || schema["additionalProperties"] != false {
				t.Errorf("%s/%s: schema %v", set, m["name"], schema)
			}
			if set == "runtime" {
				props := schema["properties"].(map[string]any)
				req, _ := schema["required"].([]any)
				has := false
				for _, r := range req {
					has = has || r == "sandbox_id"
				}
				if props["sandbox_id"] == nil || !has {
					t.Errorf("%s: runtime tool without required sandbox_id: %v", m["name"], schema)
				}
			}
		}
		sort.Strings(names)
		if strings.Join(names, ",") != strings.Join(tools, ",") {
			t.Errorf("%s: tools %v, want %v", set, names, tools)
		}
	}

	rt := e.mcp("runtime")
	rt.initialize()
	bad := []struct {
		tool string
		args map[string]any
		msg  string
	}{
		{"file_read", map[string]any{"path": "a.txt"}, "sandbox_id is required for runtime operations"},
		{"file_read", map[string]any{"sandbox_id": 7, "path": "a.txt"}, "sandbox_id must be a string"},
		{"file_read", map[string]any{"sandbox_id": id}, "path is required for file_read"},
		{"file_read", map[string]any{"sandbox_id": id, "path": 3}, "path must be a string"},
		{"file_read", map[string]any{"sandbox_id": id, "path": "a.txt", "limit": "ten"}, "limit must be an unsigned integer"},
		{"file_read", map[string]any{"sandbox_id": id, "path": "a.txt", "frobnicate": true}, "unknown argument for file_read: frobnicate"},
	}
	for _, tc := range bad {
		isErr, obj := rt.call(tc.tool, tc.args)
		if !isErr || errKind(obj) != "invalid_request" || errMsg(obj) != tc.msg {
			t.Errorf("%s %v: isError=%v %v, want %q", tc.tool, tc.args, isErr, obj, tc.msg)
		}
	}
	// A tool of another set, or no tool at all, is the protocol error the
	// MCP specification lists for unknown tools.
	for _, name := range []string{"create_sandbox", "help"} {
		r := rt.send("tools/call", map[string]any{"name": name, "arguments": map[string]any{"sandbox_id": id}}, false)
		if e, _ := r["error"].(map[string]any); e == nil || e["code"] != float64(-32602) {
			t.Errorf("%s: want JSON-RPC error -32602, got %v", name, r)
		}
	}
	if rec := e.mgr("inspect_sandbox", "--sandbox-id", id); rec["activity_revision"].(json.Number).String() != "0" {
		t.Fatalf("a refused MCP call reached the supervisor: %v", rec)
	}
	isErr, obj := rt.call("file_write", map[string]any{"sandbox_id": id, "path": "b.txt", "content": "beta\n"})
	if isErr || obj["type"] != "create" {
		t.Fatalf("valid write: %v %v", isErr, obj)
	}
	isErr, obj = rt.call("file_read", map[string]any{"sandbox_id": id, "path": "b.txt"})
	if isErr || obj["content"] != "beta" {
		t.Fatalf("valid read: %v %v", isErr, obj)
	}
	// A supervisor error passes through unchanged.
	isErr, obj = rt.call("file_read", map[string]any{"sandbox_id": id, "path": "missing.txt"})
	if !isErr || errKind(obj) != "not_found" || errMsg(obj) != "file not found: missing.txt" {
		t.Fatalf("supervisor error: %v %v", isErr, obj)
	}
	mg := e.mcp("management")
	mg.initialize()
	if isErr, obj := mg.call("inspect_sandbox", map[string]any{"sandbox_id": id}); isErr || obj["id"] != id {
		t.Fatalf("management inspect: %v", obj)
	}
	if isErr, obj := mg.call("create_sandbox", map[string]any{}); !isErr || errMsg(obj) != "workspace_root is required for create_sandbox" {
		t.Fatalf("management missing arg: %v", obj)
	}
	obs := e.mcp("observability")
	obs.initialize()
	if isErr, obj := obs.call("health", map[string]any{}); isErr || obj["status"] == nil {
		t.Fatalf("health: %v", obj)
	}
}

// commandText splits a command-output tool result: the JSON line of its
// fields, and the output text after it.
func (c *mcpClient) commandText(r map[string]any) (map[string]any, string) {
	c.t.Helper()
	res, ok := r["result"].(map[string]any)
	if !ok || res["isError"] == true || res["structuredContent"] != nil {
		c.t.Fatalf("command result: %v", r)
	}
	text := res["content"].([]any)[0].(map[string]any)["text"].(string)
	head, out, _ := strings.Cut(text, "\n")
	var meta map[string]any
	if err := json.Unmarshal([]byte(head), &meta); err != nil {
		c.t.Fatalf("first line is not JSON: %q", text)
	}
	return meta, out
}

// TestMCPAgentFlow drives sandbox-mcp as an agent's client does: one server
// with every tool (no --set), started in the project's parent directory and
// built with the Makefile's -X main.version; a whole flow create → session
// → exec (bounded output, progress) → edit → dry run → publish → blame →
// destroy; a cancelled exec gets no response and its command is cancelled;
// a second server with --sandbox-id needs no sandbox_id.
func TestMCPAgentFlow(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"src/app.txt": "one\ntwo\nthree\n"})

	// The version the Makefile sets reaches serverInfo.
	mcpBin := filepath.Join(e.root, "sandbox-mcp")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7-e2e", "-o", mcpBin, "./cmd/sandbox-mcp")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	c := e.mcpIn(filepath.Dir(root), mcpBin)
	init := c.initialize()["result"].(map[string]any)
	if si := init["serverInfo"].(map[string]any); si["version"] != "v9.8.7-e2e" {
		t.Errorf("serverInfo %v", si)
	}
	if ins, _ := init["instructions"].(string); !strings.Contains(ins, "publish_workspace_session") {
		t.Errorf("instructions %q", ins)
	}
	list := c.send("tools/list", nil, false)
	raw, _ := json.Marshal(list["result"])
	t.Logf("tools/list: %d bytes", len(raw))
	tools := list["result"].(map[string]any)["tools"].([]any)
	for _, tl := range tools {
		m := tl.(map[string]any)
		ann, _ := m["annotations"].(map[string]any)
		if m["title"] == nil || ann["readOnlyHint"] == nil || ann["destructiveHint"] == nil || ann["idempotentHint"] == nil || ann["openWorldHint"] == nil {
			t.Errorf("%s: title/annotations %v", m["name"], m)
		}
		if m["name"] == "file_edit" {
			b, _ := json.MarshalIndent(m, "", "  ")
			t.Logf("file_edit tool:\n%s", b)
		}
	}
	if want := e.setTools(); len(tools) != want || want < 30 {
		t.Errorf("%d tools, want every operation of every set (%d)", len(tools), want)
	}
	if r := c.send("tools/call", map[string]any{"name": "no_such_tool", "arguments": map[string]any{}}, false); r["error"].(map[string]any)["code"] != float64(-32602) {
		t.Errorf("unknown tool: %v", r)
	}

	// A workspace_root relative to the server's directory.
	isErr, sbx := c.call("create_sandbox", map[string]any{"workspace_root": filepath.Base(root)})
	if isErr || sbx["workspace_root"] != root {
		t.Fatalf("create_sandbox: %v", sbx)
	}
	id := sbx["id"].(string)
	// integers sent as 2.0 are integers
	if isErr, obj := c.call("list_commands", map[string]any{"sandbox_id": id, "limit": 2.0}); isErr {
		t.Fatalf("limit 2.0: %v", obj)
	}

	// The rest runs against a server whose runtime tools default to the sandbox.
	rt := e.mcpIn("", bin("sandbox-mcp"), "--sandbox-id", id)
	rt.initialize()
	isErr, ws := rt.call("create_workspace_session", map[string]any{"agent": "e2e"})
	if isErr {
		t.Fatalf("session: %v", ws)
	}
	wsID := ws["workspace_session_id"].(string)

	// A command that outlives the first yield: progress, then a bounded,
	// escape-free output with the offsets of what was left out.
	script := `for i in 1 2 3 4 5; do echo step $i; sleep 1; done; seq 1 20000; printf '\033[31mred\033[0m\n'`
	r := rt.send("tools/call", map[string]any{"name": "exec_command", "_meta": map[string]any{"progressToken": "p-1"},
		"arguments": map[string]any{"cmd": script, "workspace_session_id": wsID, "yield_time_ms": 30000, "max_output_tokens": 300}}, false)
	meta, out := rt.commandText(r)
	if meta["status"] != "ok" || !strings.HasPrefix(out, "step 1\nstep 2\nstep 3\n") || !strings.HasSuffix(out, "\nred") || strings.Contains(out, "\x1b") {
		t.Fatalf("exec: %v\n%.500s", meta, out)
	}
	tr, _ := meta["output_truncated"].(map[string]any)
	if tr == nil || len(out) > 300*4+300 || !strings.Contains(out, fmt.Sprintf("start_offset=%v", tr["omitted_start_offset"])) {
		t.Fatalf("output not bounded: %v (%d chars)", meta, len(out))
	}
	progressed := 0
	for _, n := range rt.notes {
		if n["method"] == "notifications/progress" && n["params"].(map[string]any)["progressToken"] == "p-1" {
			progressed++
		}
	}
	if progressed == 0 {
		t.Errorf("no progress notifications: %v", rt.notes)
	}
	// The omitted rows are there to read.
	r = rt.send("tools/call", map[string]any{"name": "read_command_lines", "arguments": map[string]any{
		"command_session_id": meta["command_session_id"], "start_offset": tr["omitted_start_offset"], "limit": 2}}, false)
	if _, rows := rt.commandText(r); !regexp.MustCompile(`^\d+\n\d+$`).MatchString(rows) {
		t.Errorf("omitted rows: %q", rows)
	}

	if isErr, obj := rt.call("file_edit", map[string]any{"path": "src/app.txt", "workspace_session_id": wsID,
		"edits": []any{map[string]any{"old_string": "two", "new_string": "TWO"}}}); isErr || obj["replacements"] != float64(1) {
		t.Fatalf("file_edit: %v", obj)
	}
	summary := func(obj map[string]any) string {
		sum, _ := obj["publish"].(map[string]any)["summary"].(map[string]any)
		return fmt.Sprintf("%v %v/%v", sum["result"], sum["published_paths"], sum["changed_paths"])
	}
	if isErr, obj := rt.call("publish_workspace_session", map[string]any{"workspace_session_id": wsID, "dry_run": true}); isErr || obj["would_commit"] != true || summary(obj) != "would_publish 1/1" {
		t.Fatalf("dry run: %v", obj)
	}
	// A clean publish reads as one: the contract's outcome_summary says
	// unchanged_head:1, applied:0; summary counts what was published.
	isErr, pub := rt.call("publish_workspace_session", map[string]any{"workspace_session_id": wsID})
	if isErr || pub["destroyed"] != true || summary(pub) != "published 1/1" {
		t.Fatalf("publish: %v", pub)
	}
	isErr, blame := rt.call("file_blame", map[string]any{"path": "src/app.txt"})
	if isErr || !strings.Contains(fmt.Sprint(blame["ranges"]), "workspace_session:"+wsID) {
		t.Fatalf("blame: %v", blame)
	}

	// Cancel a running exec: no response, the command is cancelled, and its
	// implicit session publishes what it wrote before the cancel.
	rt.next++
	cancelled := rt.next
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": cancelled, "method": "tools/call", "params": map[string]any{
		"name": "exec_command", "arguments": map[string]any{"cmd": "echo before > cancel.txt; sleep 600", "yield_time_ms": 120000}}})
	if _, err := rt.in.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	var cmdID string
	deadline := time.Now().Add(60 * time.Second)
	for cmdID == "" && time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		if _, lc := rt.call("list_commands", map[string]any{"status": "running"}); len(lc["commands"].([]any)) > 0 {
			cmdID = lc["commands"].([]any)[0].(map[string]any)["command_session_id"].(string)
		}
	}
	if cmdID == "" {
		t.Fatal("the command never ran")
	}
	rt.send("notifications/cancelled", map[string]any{"requestId": cancelled, "reason": "user pressed Esc"}, true)
	var status map[string]any
	for time.Now().Before(deadline) {
		_, lc := rt.call("list_commands", map[string]any{})
		for _, cm := range lc["commands"].([]any) {
			if m := cm.(map[string]any); m["command_session_id"] == cmdID && m["status"] != "running" {
				status = m
			}
		}
		if status != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if status == nil || status["status"] != "cancelled" || status["exit_code"] != float64(130) {
		t.Fatalf("cancelled command: %v", status)
	}
	rt.send("ping", nil, false)
	if m, ok := rt.answered[cancelled]; ok {
		t.Fatalf("the cancelled call was answered: %v", m)
	}
	read := func() map[string]any {
		_, obj := rt.call("file_read", map[string]any{"path": "cancel.txt"})
		return obj
	}
	for read()["content"] != "before" && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond) // the implicit session publishes as it finalizes
	}
	if obj := read(); obj["content"] != "before" {
		t.Fatalf("the cancelled command's write: %v", obj)
	}

	isErr, obj := c.call("destroy_sandbox", map[string]any{"sandbox_id": id})
	if isErr || obj["state"] != "stopped" {
		t.Fatalf("destroy: %v", obj)
	}
}

// TestMCPReadmeSnippets parses the client configurations the README gives
// (Claude Code's command line, Codex's TOML, Cursor's and VS Code's JSON)
// and starts the server each names, as the client would, up to tools/list.
func TestMCPReadmeSnippets(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Agents over MCP")
	if !ok {
		t.Fatal("README has no Agents over MCP section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	type server struct {
		Type    string
		Command string
		Args    []string
	}
	found := map[string]server{}
	blocks := regexp.MustCompile("(?s)```(\\w+)\n(.*?)```").FindAllStringSubmatch(section, -1)
	for _, blk := range blocks {
		lang, body := blk[1], blk[2]
		switch lang {
		case "sh":
			if !strings.HasPrefix(body, "claude mcp add") {
				continue
			}
			f := strings.Fields(strings.TrimSpace(body))
			if len(f) < 6 || f[0] != "claude" || f[1] != "mcp" || f[2] != "add" || f[4] != "--" {
				t.Fatalf("claude snippet: %q", body)
			}
			found["claude"] = server{Command: f[5], Args: f[6:]}
		case "toml":
			var cfg struct {
				MCPServers map[string]server `toml:"mcp_servers"`
			}
			if _, err := toml.Decode(body, &cfg); err != nil {
				t.Fatalf("codex snippet: %v", err)
			}
			found["codex"] = cfg.MCPServers["ephemeral-sandbox"]
		case "json":
			var cfg struct {
				MCPServers map[string]server `json:"mcpServers"`
				Servers    map[string]server `json:"servers"`
			}
			if err := json.Unmarshal([]byte(body), &cfg); err != nil {
				t.Fatalf("json snippet %q: %v", body, err)
			}
			if s, ok := cfg.MCPServers["ephemeral-sandbox"]; ok {
				found["cursor"] = s
			}
			if s, ok := cfg.Servers["ephemeral-sandbox"]; ok {
				if s.Type != "stdio" {
					t.Errorf("vscode snippet type %q", s.Type)
				}
				found["vscode"] = s
			}
		}
	}
	e := newEnv(t)
	want := e.setTools()
	for _, client := range []string{"claude", "codex", "cursor", "vscode"} {
		s, ok := found[client]
		if !ok || s.Command != "sandbox-mcp" {
			t.Fatalf("%s: no snippet naming sandbox-mcp: %+v", client, found)
		}
		c := e.mcpIn("", bin(s.Command), s.Args...)
		if r := c.initialize(); r["result"] == nil {
			t.Fatalf("%s: initialize %v", client, r)
		}
		tools := c.send("tools/list", nil, false)["result"].(map[string]any)["tools"].([]any)
		if len(tools) != want {
			t.Errorf("%s: %d tools, want %d", client, len(tools), want)
		}
	}
}
