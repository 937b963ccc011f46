package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/cli"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/clitest"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// session drives a server over newline-delimited JSON-RPC pipes, as a
// stdio MCP client would.
type session struct {
	t    *testing.T
	in   *io.PipeWriter
	out  *bufio.Reader
	done chan error
	id   int
}

func start(t *testing.T, g catalog.Group, ops []catalog.Op, sup *clitest.Supervisor) *session {
	t.Helper()
	return startWith(t, g, ops, sup, Options{})
}

func startWith(t *testing.T, g catalog.Group, ops []catalog.Op, sup *clitest.Supervisor, opts Options) *session {
	t.Helper()
	t.Setenv("SANDBOX_NO_AUTOSTART", "1")
	conn, err := cli.NewConn(sup.Endpoint, true, "")
	if err != nil {
		t.Fatal(err)
	}
	if ops == nil {
		ops = catalog.GroupOps(g)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &session{t: t, in: inW, out: bufio.NewReader(outR), done: make(chan error, 1)}
	go func() {
		err := Serve(context.Background(), newServer(ops, conn, opts), inR, outW, io.Discard)
		outW.Close()
		s.done <- err
	}()
	return s
}

func (s *session) close() {
	s.t.Helper()
	s.in.Close()
	go func() { _, _ = io.Copy(io.Discard, s.out) }()
	select {
	case err := <-s.done:
		if err != nil {
			s.t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		s.t.Fatal("server did not stop at end of input")
	}
}

func (s *session) send(v any) {
	s.t.Helper()
	b, _ := json.Marshal(v)
	if _, err := s.in.Write(append(b, '\n')); err != nil {
		s.t.Fatal(err)
	}
}

// rpc sends one request and returns its response object.
func (s *session) rpc(method string, params any) map[string]any {
	s.t.Helper()
	s.id++
	msg := map[string]any{"jsonrpc": "2.0", "id": s.id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	s.send(msg)
	for {
		line, err := s.out.ReadBytes('\n')
		if err != nil {
			s.t.Fatalf("%s: reading response: %v", method, err)
		}
		d := json.NewDecoder(bytes.NewReader(line))
		d.UseNumber()
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			s.t.Fatalf("bad output line %q", line)
		}
		if id, _ := m["id"].(json.Number); id.String() == jsonInt(s.id) {
			return m
		}
	}
}

func jsonInt(n int) string { b, _ := json.Marshal(n); return string(b) }

func (s *session) initialize(version string) map[string]any {
	s.t.Helper()
	resp := s.rpc("initialize", map[string]any{
		"protocolVersion": version, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "test", "version": "1"},
	})
	s.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
	return resp
}

// call runs tools/call and returns the result object.
func (s *session) call(name string, args any) map[string]any {
	s.t.Helper()
	params := map[string]any{"name": name}
	if args != nil {
		params["arguments"] = args
	}
	resp := s.rpc("tools/call", params)
	res, ok := resp["result"].(map[string]any)
	if !ok {
		s.t.Fatalf("tools/call %s: no result: %v", name, resp)
	}
	return res
}

// checkResult verifies the result shape of §3.1 and returns structuredContent.
func checkResult(t *testing.T, res map[string]any) (map[string]any, bool) {
	t.Helper()
	sc, ok := res["structuredContent"].(map[string]any)
	if !ok {
		t.Fatalf("no structuredContent object: %v", res)
	}
	content, _ := res["content"].([]any)
	if len(content) != 1 {
		t.Fatalf("want one content item: %v", res)
	}
	item, _ := content[0].(map[string]any)
	if item["type"] != "text" {
		t.Fatalf("content item is not text: %v", item)
	}
	text, _ := item["text"].(string)
	if strings.Contains(text, "\n") {
		t.Fatalf("text is not compact: %q", text)
	}
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	var fromText map[string]any
	if err := d.Decode(&fromText); err != nil || !reflect.DeepEqual(fromText, sc) {
		t.Fatalf("text %q does not match structuredContent %v", text, sc)
	}
	isErr, _ := res["isError"].(bool)
	if _, hasErr := sc["error"]; hasErr != isErr {
		t.Fatalf("isError %v but error key present=%v", isErr, hasErr)
	}
	return sc, isErr
}

func TestInitializeAndList(t *testing.T) {
	sup := clitest.NewUnix(t, clitest.Echo)
	for _, g := range []catalog.Group{catalog.Management, catalog.Runtime, catalog.Observability} {
		s := startWith(t, g, catalog.GroupOps(g), sup, Options{Version: "v1.2.3-test"})
		init := s.initialize("2025-06-18")
		res, _ := init["result"].(map[string]any)
		if res["protocolVersion"] != "2025-06-18" {
			t.Fatalf("%s: protocolVersion %v", g, res["protocolVersion"])
		}
		info, _ := res["serverInfo"].(map[string]any)
		if info["name"] != "sandbox-mcp" || info["title"] != "Ephemeral Sandbox MCP" || info["version"] != "v1.2.3-test" {
			t.Fatalf("%s: serverInfo %v", g, info)
		}
		caps, _ := res["capabilities"].(map[string]any)
		if len(caps) != 1 || caps["tools"] == nil {
			t.Fatalf("%s: capabilities %v, want only tools", g, caps)
		}
		if p := s.rpc("ping", nil); !reflect.DeepEqual(p["result"], map[string]any{}) {
			t.Fatalf("ping: %v", p)
		}
		for _, m := range []string{"prompts/list", "resources/list", "resources/templates/list", "completion/complete"} {
			e, _ := s.rpc(m, map[string]any{})["error"].(map[string]any)
			if e == nil || e["code"] != json.Number("-32601") {
				t.Fatalf("%s %s: want method not found, got %v", g, m, e)
			}
		}

		list, _ := s.rpc("tools/list", map[string]any{})["result"].(map[string]any)
		tools, _ := list["tools"].([]any)
		var names []string
		for _, tl := range tools {
			tm := tl.(map[string]any)
			names = append(names, tm["name"].(string))
			op, _ := catalog.Lookup(tm["name"].(string))
			if op == nil {
				continue
			}
			checkSchema(t, g, op, tm["inputSchema"].(map[string]any))
			if d, _ := tm["description"].(string); !strings.HasPrefix(d, op.Summary) {
				t.Errorf("%s: description %q", op.ID, d)
			}
		}
		var want []string
		for _, op := range catalog.GroupOps(g) {
			want = append(want, op.ID)
		}
		if !reflect.DeepEqual(names, want) {
			t.Fatalf("%s: tools %v, want %v", g, names, want)
		}
		s.close()
	}
	if n := len(sup.Requests()); n != 0 {
		t.Fatalf("listing contacted the supervisor %d times", n)
	}
}

func checkSchema(t *testing.T, g catalog.Group, op *catalog.Op, sch map[string]any) {
	t.Helper()
	if sch["type"] != "object" || sch["additionalProperties"] != false {
		t.Errorf("%s: schema %v", op.ID, sch)
	}
	props, _ := sch["properties"].(map[string]any)
	var wantProps, wantReq []string
	if g == catalog.Runtime {
		wantProps, wantReq = append(wantProps, "sandbox_id"), append(wantReq, "sandbox_id")
		if p, _ := props["sandbox_id"].(map[string]any); p["type"] != "string" {
			t.Errorf("%s: sandbox_id property %v", op.ID, p)
		}
	}
	kinds := map[catalog.Kind]string{catalog.String: "string", catalog.Path: "string", catalog.Integer: "integer",
		catalog.Float: "number", catalog.Boolean: "boolean", catalog.JSONArray: "array"}
	for _, a := range op.Args {
		wantProps = append(wantProps, a.Name)
		if a.Required {
			wantReq = append(wantReq, a.Name)
		}
		p, _ := props[a.Name].(map[string]any)
		if p["type"] != kinds[a.Kind] {
			t.Errorf("%s.%s: type %v, want %s", op.ID, a.Name, p["type"], kinds[a.Kind])
		}
		if a.Kind == catalog.Integer {
			if _, ok := p["minimum"]; !ok {
				t.Errorf("%s.%s: integer without minimum", op.ID, a.Name)
			}
		}
	}
	var gotProps []string
	for k := range props {
		gotProps = append(gotProps, k)
	}
	sort.Strings(gotProps)
	sort.Strings(wantProps)
	if !reflect.DeepEqual(gotProps, wantProps) {
		t.Errorf("%s: properties %v, want %v", op.ID, gotProps, wantProps)
	}
	var gotReq []string
	req, ok := sch["required"].([]any)
	if !ok {
		t.Errorf("%s: no required array", op.ID)
	}
	for _, r := range req {
		gotReq = append(gotReq, r.(string))
	}
	if !reflect.DeepEqual(gotReq, wantReq) {
		t.Errorf("%s: required %v, want %v", op.ID, gotReq, wantReq)
	}
}

// synth adds kinds the catalog does not use yet.
var synth = []catalog.Op{{
	ID: "do_things", Group: catalog.Runtime, Family: "command", Scope: catalog.ScopeSandbox, Summary: "Synthetic.",
	Args: []catalog.Arg{
		{Name: "cmd", Kind: catalog.String, Required: true, Positional: "COMMAND"},
		{Name: "on", Kind: catalog.Boolean},
		{Name: "ratio", Kind: catalog.Float},
		{Name: "items", Kind: catalog.JSONArray},
		{Name: "big", Kind: catalog.Integer, Max: ptr(uint64(10)), ClampMax: true},
	},
}}

func ptr[T any](v T) *T { return &v }

func TestLocalValidation(t *testing.T) {
	sup := clitest.NewUnix(t, clitest.Echo)
	cases := []struct {
		name string
		args any
		msg  string
	}{
		{"file_read", map[string]any{"path": "a"}, "sandbox_id is required for runtime operations"},
		{"file_read", nil, "sandbox_id is required for runtime operations"},
		{"file_read", map[string]any{"sandbox_id": 5, "path": "a"}, "sandbox_id must be a string"},
		{"file_read", map[string]any{"sandbox_id": nil, "path": "a"}, "sandbox_id must be a string"},
		{"file_read", map[string]any{"sandbox_id": " ", "path": "a"}, "sandbox_id must be non-empty"},
		{"file_read", map[string]any{"sandbox_id": "sbx-1"}, "path is required for file_read"},
		{"file_read", map[string]any{"sandbox_id": "sbx-1", "path": 5}, "path must be a string"},
		{"file_read", map[string]any{"sandbox_id": "sbx-1", "path": nil}, "path must be a string"},
		{"file_read", map[string]any{"sandbox_id": "sbx-1", "path": "a", "limit": "10"}, "limit must be an unsigned integer"},
		{"file_read", map[string]any{"sandbox_id": "sbx-1", "path": "a", "limit": -1}, "limit must be an unsigned integer"},
		{"file_read", map[string]any{"sandbox_id": "sbx-1", "path": "a", "limit": 1.5}, "limit must be an unsigned integer"},
		{"file_read", map[string]any{"sandbox_id": "sbx-1", "path": "a", "offset": json.RawMessage("18446744073709551616")}, "offset must be an unsigned integer"},
		{"file_read", map[string]any{"sandbox_id": "sbx-1", "path": "a", "limit": 5000}, "limit must be between 1 and 2000"},
		{"file_read", map[string]any{"sandbox_id": "sbx-1", "path": "a", "bogus": 1}, "unknown argument for file_read: bogus"},
		{"file_edit", map[string]any{"sandbox_id": "sbx-1", "path": "a", "edits": "[]"}, "edits must be an array"},
		{"do_things", map[string]any{"sandbox_id": "sbx-1", "cmd": "x", "on": "true"}, "on must be a boolean"},
		{"do_things", map[string]any{"sandbox_id": "sbx-1", "cmd": "x", "ratio": "1"}, "ratio must be a finite number"},
		{"do_things", map[string]any{"sandbox_id": "sbx-1", "cmd": "x", "items": map[string]any{}}, "items must be an array"},
		{"do_things", []any{1}, "arguments must be an object"},
		{"file_edit", map[string]any{"sandbox_id": "sbx-1", "path": "a", "edits": []any{map[string]any{"old_string": "a"}}}, "edits[0].new_string is required"},
		{"file_edit", map[string]any{"sandbox_id": "sbx-1", "path": "a", "edits": []any{map[string]any{"old_string": "a", "new_string": "b", "replace_all": nil}}}, "edits[0].replace_all must be a boolean"},
		{"file_edit", map[string]any{"sandbox_id": "sbx-1", "path": "a", "edits": []any{"x"}}, "edits[0] must be an object {old_string, new_string, replace_all?}"},
	}
	ops := append(append([]catalog.Op{}, catalog.GroupOps(catalog.Runtime)...), synth...)
	s := start(t, catalog.Runtime, ops, sup)
	s.initialize("2025-06-18")
	for _, c := range cases {
		res := s.call(c.name, c.args)
		sc, isErr := checkResult(t, res)
		want := map[string]any{"error": map[string]any{"kind": "invalid_request", "message": c.msg, "details": map[string]any{}}}
		if !isErr || !reflect.DeepEqual(sc, want) {
			t.Errorf("%s %v: got %v, want %q", c.name, c.args, sc, c.msg)
		}
	}
	// Tools this server does not serve are a protocol error (-32602), as
	// the MCP specification lists for unknown tools, not a tool result.
	for _, name := range []string{"help", "create_sandbox", "nope", "_sandbox_mcp_local_error"} {
		resp := s.rpc("tools/call", map[string]any{"name": name, "arguments": map[string]any{"sandbox_id": "sbx-1"}})
		e, _ := resp["error"].(map[string]any)
		if e == nil || e["code"] != json.Number("-32602") || resp["result"] != nil {
			t.Errorf("%s: want JSON-RPC error -32602, got %v", name, resp)
		}
	}
	if n := len(sup.Requests()); n != 0 {
		t.Fatalf("invalid calls reached the supervisor %d times: %v", n, sup.RawLines())
	}

	// Valid calls reach it: scope from sandbox_id, defaults filled in,
	// exact integers, clamping left to the catalog (not the schema).
	res := s.call("file_read", map[string]any{"sandbox_id": "sbx-1", "path": "a.go"})
	if sc, isErr := checkResult(t, res); isErr || !reflect.DeepEqual(sc, map[string]any{"ok": true, "op": "file_read"}) {
		t.Fatalf("valid call: %v", res)
	}
	res = s.call("do_things", map[string]any{"sandbox_id": "sbx-2", "cmd": "x", "on": true, "ratio": 0.5,
		"items": []any{1}, "big": json.RawMessage("18446744073709551615")})
	if _, isErr := checkResult(t, res); isErr {
		t.Fatalf("valid call: %v", res)
	}
	s.close()

	reqs := sup.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	for _, r := range reqs {
		if id, _ := r["request_id"].(string); !uuidV4.MatchString(id) {
			t.Errorf("request_id %q", id)
		}
		if r["_stream_logs"] != false {
			t.Errorf("_stream_logs %v", r["_stream_logs"])
		}
	}
	if want := map[string]any{"path": "a.go", "offset": json.Number("1"), "limit": json.Number("2000")}; !reflect.DeepEqual(reqs[0]["args"], want) {
		t.Errorf("args %v, want %v", reqs[0]["args"], want)
	}
	if want := map[string]any{"kind": "sandbox", "sandbox_id": "sbx-1"}; !reflect.DeepEqual(reqs[0]["scope"], want) {
		t.Errorf("scope %v", reqs[0]["scope"])
	}
	if want := map[string]any{"cmd": "x", "on": true, "ratio": json.Number("0.5"), "items": []any{json.Number("1")}, "big": json.Number("10")}; !reflect.DeepEqual(reqs[1]["args"], want) {
		t.Errorf("args %v, want %v", reqs[1]["args"], want)
	}
}

func TestSupervisorResultsPassThrough(t *testing.T) {
	env := `{"error":{"kind":"not_found","message":"sandbox not found: sbx-9","details":{"sandbox_id":"sbx-9"}}}`
	sup := clitest.NewUnix(t, func(req map[string]any) []string {
		if req["op"] == "inspect_sandbox" {
			return []string{env}
		}
		return []string{`{"sandboxes":[],"n":12345678901234567890}`}
	})
	s := start(t, catalog.Management, nil, sup)
	s.initialize("2025-06-18")
	sc, isErr := checkResult(t, s.call("inspect_sandbox", map[string]any{"sandbox_id": "sbx-9"}))
	d := json.NewDecoder(strings.NewReader(env))
	d.UseNumber()
	var want map[string]any
	_ = d.Decode(&want)
	if !isErr || !reflect.DeepEqual(sc, want) {
		t.Fatalf("error passthrough: %v", sc)
	}
	sc, isErr = checkResult(t, s.call("list_sandboxes", nil))
	if isErr || sc["n"] != json.Number("12345678901234567890") {
		t.Fatalf("success passthrough: %v", sc)
	}
	s.close()
	if r := sup.Requests(); len(r) != 2 || !reflect.DeepEqual(r[0]["scope"], map[string]any{"kind": "system"}) {
		t.Fatalf("requests %v", sup.RawLines())
	}
}

func TestTransportErrorIsToolError(t *testing.T) {
	sup := clitest.NewUnix(t, clitest.Lines("garbage"))
	s := start(t, catalog.Observability, nil, sup)
	s.initialize("2025-06-18")
	sc, isErr := checkResult(t, s.call("health", nil))
	if e, _ := sc["error"].(map[string]any); !isErr || e["kind"] != catalog.ProtocolError {
		t.Fatalf("%v", sc)
	}
	s.close()
}

// The hook also guards the in-process transport.
func TestInProcessClient(t *testing.T) {
	sup := clitest.NewUnix(t, clitest.Echo)
	conn, _ := cli.NewConn(sup.Endpoint, true, "")
	c, err := client.NewInProcessClient(New(conn, Options{Groups: []catalog.Group{catalog.Runtime}}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = "2025-06-18"
	init.Params.ClientInfo = mcp.Implementation{Name: "t", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	call := func(name string, args map[string]any) *mcp.CallToolResult {
		req := mcp.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = name, args
		res, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}
	res := call("file_read", map[string]any{"sandbox_id": "sbx-1", "path": 7})
	if txt := res.Content[0].(mcp.TextContent).Text; !res.IsError || !strings.Contains(txt, `"path must be a string"`) {
		t.Fatalf("%v", res)
	}
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = "list_sandboxes", map[string]any{"sandbox_id": "sbx-1"}
	if res, err := c.CallTool(ctx, req); err == nil {
		t.Fatalf("a tool of another set answered: %v", res)
	}
	res = call("file_list", map[string]any{"sandbox_id": "sbx-1"})
	if res.IsError || len(sup.Requests()) != 1 {
		t.Fatalf("%v", res)
	}
}

func TestMainConfigErrors(t *testing.T) {
	for _, args := range [][]string{{"--set", "bogus"}, {"--set", "runtime,bogus"}, {"--set"}, {"--nope"}, {"--set", "runtime", "extra"},
		{"--set", "runtime", "--endpoint", "relative"}, {"--sandbox-id", "bad id"}, {"--max-output-tokens", "-1"}} {
		var out, errb bytes.Buffer
		code := Main(args, "", strings.NewReader(""), &out, &errb)
		var env struct {
			Error struct{ Kind, Message string }
		}
		if code != 2 || out.Len() != 0 || json.Unmarshal(errb.Bytes(), &env) != nil || env.Error.Kind != catalog.ConfigError {
			t.Errorf("%v: code %d stdout %q stderr %q", args, code, out.String(), errb.String())
		}
	}
}
