package tests

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"
)

// mcpClient speaks newline-delimited JSON-RPC to `sandbox-mcp --set X` over stdio.
type mcpClient struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	next  int
	lines chan string
}

func (e *env) mcp(set string) *mcpClient {
	e.t.Helper()
	cmd := exec.Command(bin("sandbox-mcp"), "--set", set)
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
	c := &mcpClient{t: e.t, cmd: cmd, in: in, lines: make(chan string, 16)}
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
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("%s: sandbox-mcp closed stdout", method)
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				c.t.Fatalf("%s: not JSON: %q", method, line)
			}
			if id, ok := m["id"].(float64); ok && int(id) == c.next {
				return m
			}
		case <-time.After(30 * time.Second):
			c.t.Fatalf("%s: no answer", method)
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
			"file_edit", "file_list", "file_read", "file_write", "forward_port", "list_commands", "list_workspace_sessions", "publish_workspace_session",
			"read_command_lines", "write_command_stdin"},
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
		{"create_sandbox", map[string]any{"sandbox_id": id}, "unknown operation: create_sandbox"},
		{"help", map[string]any{"sandbox_id": id}, "unknown operation: help"},
	}
	for _, tc := range bad {
		isErr, obj := rt.call(tc.tool, tc.args)
		if !isErr || errKind(obj) != "invalid_request" || errMsg(obj) != tc.msg {
			t.Errorf("%s %v: isError=%v %v, want %q", tc.tool, tc.args, isErr, obj, tc.msg)
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
