// Package mcpserver projects one catalog group into an MCP server
// (mark3labs/mcp-go): the implementation of `sandbox-mcp --set
// management|runtime|observability` (contract §3.1).
//
// Tools are exactly the group's operations, named by operation ID, listed in
// catalog order, with a raw JSON input schema derived from the catalog
// (type object, additionalProperties false, required, the kinds of §2.6;
// the runtime set adds a required sandbox_id string that travels in the
// request scope). A call result carries the whole response object in
// structuredContent and the same object as compact JSON in one text item;
// isError is true iff the response has a top-level error.
//
// Local validation and mcp-go. mcp-go's input-schema validation
// (WithInputSchemaValidation, on) answers a schema violation with its own
// text ("input schema validation failed: …") before any handler or
// middleware runs, and answers a call of an unregistered tool with a
// JSON-RPC error. The contract wants invalid_request envelopes with its exact
// messages in both cases. So a before-call-tool hook (it runs before tool
// lookup and schema validation, and receives the request by pointer)
// validates every call against the catalog first — unknown operation,
// sandbox_id, unknown argument, JSON kind, then op.Validate — and reroutes a
// failing call to an internal tool whose handler returns the envelope. That
// tool is hidden from tools/list by a tool filter and cannot be reached
// directly (the hook reroutes every call to its name as an unknown
// operation). Calls that pass go on to mcp-go's schema validation against the
// advertised schema, which is never stricter than the catalog's checks
// (clamped limits are not in the schema), and then to the handler. Nothing
// that fails validation contacts the supervisor.
//
// JSON null for an argument is a type error here ("<name> must be a
// string", …), as the advertised schema says; numbers are decoded exactly
// (json.Number), so integers above 2^53 are not rounded.
package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/spf13/pflag"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/cli"
)

const (
	// Name and Title are reported in serverInfo.
	Name  = "sandbox-mcp"
	Title = "Ephemeral Sandbox MCP"

	// rejectTool answers calls that failed local validation; never listed.
	rejectTool = "_sandbox_mcp_local_error"
)

// Caller sends one request to the supervisor; *cli.Conn implements it.
type Caller interface {
	Call(ctx context.Context, req *catalog.Request, log func(string)) (map[string]any, *catalog.Error)
}

type projection struct {
	group  catalog.Group
	ops    []catalog.Op
	order  map[string]int
	caller Caller
}

// New builds the MCP server of one group; calls go through caller.
func New(group catalog.Group, caller Caller) *server.MCPServer {
	return newServer(group, catalog.GroupOps(group), caller)
}

// newServer is New over an explicit operation list (tests project synthetic ops).
func newServer(group catalog.Group, ops []catalog.Op, caller Caller) *server.MCPServer {
	p := &projection{group: group, ops: ops, order: map[string]int{}, caller: caller}
	for i, op := range p.ops {
		p.order[op.ID] = i
	}
	hooks := &server.Hooks{}
	hooks.AddBeforeCallTool(p.beforeCall)
	s := server.NewMCPServer(Name, cli.ClientVersion(),
		server.WithTitle(Title),
		server.WithToolCapabilities(false),
		server.WithInputSchemaValidation(),
		server.WithHooks(hooks),
		server.WithToolFilter(p.filter),
		server.WithRecovery(),
	)
	for i := range p.ops {
		op := &p.ops[i]
		tool := mcp.NewToolWithRawSchema(op.ID, Description(op), InputSchema(group, op))
		if group == catalog.Observability {
			tool.Annotations.ReadOnlyHint = mcp.ToBoolPtr(true)
		}
		s.AddTool(tool, p.handler(op))
	}
	s.AddTool(mcp.NewToolWithRawSchema(rejectTool, "internal: answers calls that failed local validation",
		json.RawMessage(`{"type":"object"}`)), p.reject)
	return s
}

// filter lists the group's tools in catalog order and hides rejectTool. At
// call time mcp-go passes only the called tool, so rejectTool stays callable
// for the hook's reroutes.
func (p *projection) filter(_ context.Context, tools []mcp.Tool) []mcp.Tool {
	if len(tools) == 1 && tools[0].Name == rejectTool {
		return tools
	}
	out := make([]mcp.Tool, 0, len(tools))
	for _, t := range tools {
		if _, ok := p.order[t.Name]; ok {
			out = append(out, t)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return p.order[out[i].Name] < p.order[out[j].Name] })
	return out
}

// beforeCall validates every tools/call before mcp-go looks up the tool or
// checks its schema, and reroutes failures to rejectTool.
func (p *projection) beforeCall(_ context.Context, _ any, req *mcp.CallToolRequest) {
	if _, err := p.prepare(req.Params.Name, rawArguments(req)); err != nil {
		req.Params.Name = rejectTool
		req.Params.Arguments = map[string]any{"error": err}
		req.Params.RawArguments = nil
		req.Params.Task = nil
	}
}

func (p *projection) reject(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	if m, ok := req.Params.Arguments.(map[string]any); ok {
		if e, ok := m["error"].(*catalog.Error); ok {
			return errorResult(e), nil
		}
	}
	// Only the hook's reroutes carry an *catalog.Error; anything else means
	// the hook did not run.
	return errorResult(catalog.Errorf(catalog.InvalidRequest, "unknown operation: %s", req.Params.Name)), nil
}

func (p *projection) handler(op *catalog.Op) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		r, err := p.prepare(op.ID, rawArguments(&req))
		if err != nil {
			return errorResult(err), nil
		}
		resp, terr := p.caller.Call(ctx, r, nil)
		if terr != nil {
			return errorResult(terr), nil
		}
		return responseResult(resp), nil
	}
}

// rawArguments returns the call's arguments as JSON: the bytes from the wire
// when mcp-go kept them, else the decoded value re-encoded.
func rawArguments(req *mcp.CallToolRequest) []byte {
	if len(req.Params.RawArguments) > 0 {
		return req.Params.RawArguments
	}
	if req.Params.Arguments == nil {
		return nil
	}
	b, err := json.Marshal(req.Params.Arguments)
	if err != nil {
		return []byte(`"unencodable"`)
	}
	return b
}

// Prepare validates a tools/call of this set locally and builds the request
// it sends. Messages are the contract's (§3.1, §2.6).
func (p *projection) prepare(name string, raw []byte) (*catalog.Request, *catalog.Error) {
	var op *catalog.Op
	if i, ok := p.order[name]; ok {
		op = &p.ops[i]
	} else {
		return nil, catalog.Errorf(catalog.InvalidRequest, "unknown operation: %s", name)
	}
	m := map[string]any{}
	if t := bytes.TrimSpace(raw); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		d := json.NewDecoder(bytes.NewReader(t))
		d.UseNumber()
		var v any
		err := d.Decode(&v)
		mm, isMap := v.(map[string]any)
		if err != nil || d.More() || !isMap {
			return nil, catalog.Errorf(catalog.InvalidRequest, "arguments must be an object")
		}
		m = mm
	}
	sandboxID := ""
	if p.group == catalog.Runtime {
		v, present := m["sandbox_id"]
		if !present {
			return nil, catalog.Errorf(catalog.InvalidRequest, "sandbox_id is required for runtime operations")
		}
		s, ok := v.(string)
		if !ok {
			return nil, catalog.Errorf(catalog.InvalidRequest, "sandbox_id must be a string")
		}
		if err := cli.CheckSandboxID("sandbox_id", s); err != nil {
			return nil, err
		}
		sandboxID = s
		delete(m, "sandbox_id")
	}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if op.Arg(k) == nil {
			return nil, catalog.Errorf(catalog.InvalidRequest, "unknown argument for %s: %s", op.ID, k)
		}
	}
	for i := range op.Args {
		a := &op.Args[i]
		v, present := m[a.Name]
		if !present {
			if a.Required {
				return nil, catalog.Errorf(catalog.InvalidRequest, "%s is required for %s", a.Name, op.ID)
			}
			continue
		}
		if err := cli.StrictJSONKind(a, v); err != nil {
			return nil, err
		}
	}
	args, err := op.Validate(m)
	if err != nil {
		return nil, err
	}
	if id := cli.ArgSandboxID(op, args); id != "" {
		sandboxID = id
	}
	return &catalog.Request{
		Op:        op.ID,
		RequestID: cli.NewRequestID(),
		Scope:     cli.Scope(op, sandboxID),
		Args:      args,
	}, nil
}

func responseResult(resp map[string]any) *mcp.CallToolResult {
	isErr := catalog.ErrorFromResponse(resp) != nil
	return &mcp.CallToolResult{
		Content:           []mcp.Content{mcp.NewTextContent(string(catalog.CompactJSON(resp)))},
		StructuredContent: resp,
		IsError:           isErr,
	}
}

func errorResult(e *catalog.Error) *mcp.CallToolResult {
	env := e.Envelope()
	return &mcp.CallToolResult{
		Content:           []mcp.Content{mcp.NewTextContent(string(catalog.CompactJSON(env)))},
		StructuredContent: env,
		IsError:           true,
	}
}

// Description is a tool's description: summary, help and result.
func Description(op *catalog.Op) string {
	parts := []string{op.Summary}
	if op.Help != "" {
		parts = append(parts, op.Help)
	}
	if op.Result != "" {
		parts = append(parts, "Result: "+op.Result)
	}
	return strings.Join(parts, "\n\n")
}

// property is one input-schema property; field order is the output order.
type property struct {
	Type        string   `json:"type"`
	Description string   `json:"description,omitempty"`
	Enum        []string `json:"enum,omitempty"`
	Minimum     *float64 `json:"minimum,omitempty"`
	Maximum     *float64 `json:"maximum,omitempty"`
	MaxLength   int      `json:"maxLength,omitempty"`
	MaxItems    int      `json:"maxItems,omitempty"`
	Default     any      `json:"default,omitempty"`
}

// InputSchema renders the tool input schema of op (§3.1, §2.6), properties
// in catalog order. Limits the catalog clamps are left out so that mcp-go's
// validation never refuses what the catalog accepts.
func InputSchema(g catalog.Group, op *catalog.Op) json.RawMessage {
	var b bytes.Buffer
	b.WriteString(`{"type":"object","properties":{`)
	var required []string
	n := 0
	add := func(name string, p property) {
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		k, _ := json.Marshal(name)
		b.Write(k)
		b.WriteByte(':')
		b.Write(catalog.CompactJSON(p))
	}
	if g == catalog.Runtime {
		add("sandbox_id", property{Type: "string", Description: "The sandbox to operate in (sent in the request scope)."})
		required = append(required, "sandbox_id")
	}
	for i := range op.Args {
		a := &op.Args[i]
		p := property{Description: a.Help, Default: a.Default}
		if a.DefaultDoc != "" {
			p.Description = strings.TrimSpace(p.Description + " Default: " + a.DefaultDoc + ".")
		}
		switch a.Kind {
		case catalog.String, catalog.Path:
			p.Type, p.Enum, p.MaxLength = "string", a.Enum, a.MaxLen
		case catalog.Integer:
			p.Type = "integer"
			lo := 0.0
			if a.Min != nil && !a.ClampMin {
				lo = float64(*a.Min)
			}
			p.Minimum = &lo
			if a.Max != nil && !a.ClampMax {
				hi := float64(*a.Max)
				p.Maximum = &hi
			}
		case catalog.Float:
			p.Type, p.Minimum, p.Maximum = "number", a.FMin, a.FMax
		case catalog.Boolean:
			p.Type = "boolean"
		case catalog.JSONArray:
			p.Type, p.MaxItems = "array", a.MaxItems
		}
		add(a.Name, p)
		if a.Required {
			required = append(required, a.Name)
		}
	}
	if required == nil {
		required = []string{}
	}
	b.WriteString(`},"required":`)
	b.Write(catalog.CompactJSON(required))
	b.WriteString(`,"additionalProperties":false}`)
	return json.RawMessage(b.Bytes())
}

// ParseSet maps a --set value to its group.
func ParseSet(s string) (catalog.Group, bool) {
	switch g := catalog.Group(s); g {
	case catalog.Management, catalog.Runtime, catalog.Observability:
		return g, true
	}
	return "", false
}

const usage = `Usage: sandbox-mcp --set management|runtime|observability [--endpoint ENDPOINT] [--auth-token TOKEN]

Serves one domain of Ephemeral Sandbox operations as MCP tools over stdio.
  --set         management, runtime or observability (required)
  --endpoint    supervisor endpoint (alias --gateway-endpoint): /abs/path,
                unix:///abs/path or tcp://127.0.0.1:PORT; default
                $SANDBOX_SUPERVISOR_SOCKET, else the runtime directory's socket
                (a supervisor is started there when none answers)
  --auth-token  gateway token for a TCP endpoint (else $SANDBOX_GATEWAY_AUTH_TOKEN,
                else <config dir>/gateway.token)
`

// Main runs sandbox-mcp with the given arguments (program name excluded)
// and returns the exit code: 0 after stdin ends, 2 for a configuration error
// (config_error envelope on stderr), 1 when serving fails.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		_, _ = stderr.Write(append(catalog.Errorf(catalog.ConfigError, format, a...).MarshalEnvelope(), '\n'))
		return cli.ExitUsage
	}
	fs := pflag.NewFlagSet(Name, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	set := fs.String("set", "", "")
	endpoint := fs.String("endpoint", "", "")
	fs.Var(fs.Lookup("endpoint").Value, "gateway-endpoint", "")
	token := fs.String("auth-token", "", "")
	help := fs.BoolP("help", "h", false, "")
	if err := fs.Parse(args); err != nil {
		return fail("%v", err)
	}
	if *help {
		_, _ = io.WriteString(stdout, usage)
		return cli.ExitOK
	}
	if fs.NArg() > 0 {
		return fail("unexpected argument: %s", fs.Arg(0))
	}
	if !fs.Changed("set") {
		return fail("--set is required: management, runtime or observability")
	}
	group, ok := ParseSet(*set)
	if !ok {
		return fail("--set must be management, runtime or observability, not %q", *set)
	}
	conn, cerr := cli.NewConn(*endpoint, fs.Changed("endpoint") || fs.Changed("gateway-endpoint"), *token)
	if cerr != nil {
		_, _ = stderr.Write(append(catalog.CompactJSON(cerr.Envelope()), '\n'))
		return cli.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := Serve(ctx, New(group, conn), stdin, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "sandbox-mcp: %v\n", err)
		return cli.ExitError
	}
	return cli.ExitOK
}

// Serve runs the server over newline-delimited JSON-RPC on in/out until in
// ends or ctx is cancelled. When in ends, Serve first waits for the answers
// to the requests already read (mcp-go would otherwise cancel them), so
// `printf '…' | sandbox-mcp --set …` gets every response.
func Serve(ctx context.Context, s *server.MCPServer, in io.Reader, out, errLog io.Writer) error {
	t := &tracker{pending: map[string]int{}, idle: make(chan struct{}, 1)}
	stdio := server.NewStdioServer(s)
	stdio.SetErrorLogger(log.New(errLog, Name+": ", log.LstdFlags))
	err := stdio.Listen(ctx, &drainReader{ctx: ctx, r: bufio.NewReaderSize(in, 64<<10), t: t}, &trackingWriter{w: out, t: t})
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// tracker counts the requests read and not yet answered, by JSON-RPC id.
type tracker struct {
	mu      sync.Mutex
	pending map[string]int
	idle    chan struct{}
}

type wireMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		RequestID json.RawMessage `json:"requestId"`
	} `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// idKey normalizes a JSON-RPC id (1 and 1.0 are the same id).
func idKey(raw json.RawMessage) (string, bool) {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil || v == nil {
		return "", false
	}
	b, _ := json.Marshal(v)
	return string(b), true
}

func (t *tracker) add(key string, delta int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := t.pending[key] + delta; n > 0 {
		t.pending[key] = n
	} else {
		delete(t.pending, key)
	}
	if len(t.pending) == 0 {
		select {
		case t.idle <- struct{}{}:
		default:
		}
	}
}

func (t *tracker) empty() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending) == 0
}

// sawInput records a client request (and forgets one the client cancelled).
func (t *tracker) sawInput(line []byte) {
	var m wireMessage
	if json.Unmarshal(line, &m) != nil {
		return
	}
	if m.Method == "notifications/cancelled" {
		if k, ok := idKey(m.Params.RequestID); ok {
			t.add(k, -1)
		}
		return
	}
	if k, ok := idKey(m.ID); ok && m.Method != "" {
		t.add(k, 1)
	}
}

// sawOutput records the server's answer to a request.
func (t *tracker) sawOutput(line []byte) {
	var m wireMessage
	if json.Unmarshal(line, &m) != nil || m.Method != "" || (m.Result == nil && m.Error == nil) {
		return
	}
	if k, ok := idKey(m.ID); ok {
		t.add(k, -1)
	}
}

// drainReader hands mcp-go whole input lines; at the end of input it waits
// until every request read has been answered before reporting io.EOF.
type drainReader struct {
	ctx context.Context
	r   *bufio.Reader
	t   *tracker
	buf []byte
	eof bool
}

func (d *drainReader) Read(p []byte) (int, error) {
	for len(d.buf) == 0 {
		if d.eof {
			for !d.t.empty() {
				select {
				case <-d.t.idle:
				case <-d.ctx.Done():
					return 0, io.EOF
				}
			}
			return 0, io.EOF
		}
		line, err := d.r.ReadBytes('\n')
		if len(line) > 0 {
			d.t.sawInput(line)
			if line[len(line)-1] != '\n' {
				line = append(line, '\n')
			}
			d.buf = line
		}
		if err != nil {
			d.eof = true
		}
	}
	n := copy(p, d.buf)
	d.buf = d.buf[n:]
	return n, nil
}

// trackingWriter passes output through; mcp-go writes one message per Write.
type trackingWriter struct {
	w io.Writer
	t *tracker
}

func (w *trackingWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.t.sawOutput(p)
	return n, err
}
