// Package mcpserver projects the catalog into an MCP server (mark3labs/mcp-go):
// the implementation of `sandbox-mcp [--set all|management|runtime|observability]`
// (contract §3.1 with amendment A2). Without --set it serves every tool.
//
// Tools are the served operations, named by operation ID, listed in catalog
// order, each with a title and the four annotations derived from the
// catalog declaration (Op.Hints), and a raw JSON input schema derived from
// the catalog (type object, additionalProperties false, required, the kinds
// of §2.6, items on every array). Runtime tools add a sandbox_id string that
// travels in the request scope; it is required unless --sandbox-id (or
// $SANDBOX_MCP_SANDBOX_ID) names a default. A call result carries the whole
// response object in structuredContent and the same object as compact JSON
// in one text item; isError is true iff the response has a top-level error.
// A tool whose operation declares an exact result (catalog Op.Output) sends
// it as outputSchema, or'd with the error envelope (see OutputSchema).
// The command-output tools are the exception (see commandResult): one text
// item, the output once, escapes stripped, bounded by max_output_tokens.
//
// Local validation and mcp-go. mcp-go's input-schema validation
// (WithInputSchemaValidation, on) answers a schema violation with its own
// text ("input schema validation failed: …") before any handler or
// middleware runs. The contract wants invalid_request envelopes with its
// exact messages. So a before-call-tool hook (it runs before tool lookup and
// schema validation, and receives the request by pointer) validates every
// call of a served tool against the catalog first — sandbox_id, unknown
// argument, JSON kind, array items, then op.Validate — and reroutes a failing
// call to an internal tool whose handler returns the envelope. That tool has
// a random name, is hidden from tools/list by a tool filter and cannot be
// reached directly. Calls that pass go on to mcp-go's schema validation
// against the advertised schema, which is never stricter than the catalog's
// checks (clamped limits are not in the schema), and then to the handler. A
// tool this server does not serve is left to mcp-go: JSON-RPC error -32602.
// Nothing that fails validation contacts the supervisor.
//
// Cancellation and progress. A notifications/cancelled makes mcp-go cancel
// the handler's context, which closes the handler's supervisor connection
// (the supervisor cancels the request); the answer mcp-go still writes is
// dropped by the tracking writer, so a cancelled request gets no response.
// exec_command and write_command_stdin are served as a series of short
// yields (see yielding), which is what lets a cancel interrupt a command and
// a progressToken receive the output as it comes.
//
// JSON null for an argument is a type error here ("<name> must be a
// string", …), as the advertised schema says; numbers are decoded exactly
// (json.Number), so integers above 2^53 are not rounded, and 2.0 is the
// integer 2.
package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

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

	// DefaultMaxOutputTokens bounds command output returned to a model
	// (about 40 KB): clients such as Claude Code cut tool results near 25k
	// tokens, and an agent cannot afford more in one message.
	DefaultMaxOutputTokens = 10000

	// SandboxEnv names the environment variable that, like --sandbox-id,
	// sets the default sandbox of runtime tools.
	SandboxEnv = "SANDBOX_MCP_SANDBOX_ID"

	// firstSlice bounds the first exec_command request: until it answers,
	// the command's ID is unknown and a cancel has to wait for it.
	firstSlice = 1000 * time.Millisecond
	// pollSlice is the length of each further yield (one progress
	// notification each when the caller sent a progressToken).
	pollSlice = 2000 * time.Millisecond
)

// Instructions are sent in the initialize result: the workflow in a few lines.
const Instructions = `Ephemeral Sandbox runs commands and file edits inside sandboxes: isolated copy-on-write copies of a project directory, never the host's files.
Workflow: create_sandbox (workspace_root = the project directory) → create_workspace_session (a private view) → exec_command / file_read / file_edit / file_write with its workspace_session_id → diff_workspace_session → publish_workspace_session (dry_run first to see conflicts) → export_changes to write the published result back to a host directory.
Without workspace_session_id, file_write/file_edit publish immediately and exec_command runs in a one-off session that publishes when the command ends.
A publish merges each changed path with what others published meanwhile; a conflict rejects the whole publish and keeps the session: pass resolutions (ours/theirs/merge) or edit and publish again.
Long commands: exec_command returns status "running" after yield_time_ms; poll with write_command_stdin stdin "" (or send a progressToken to get progress notifications); output is bounded (max_output_tokens), read omitted rows with read_command_lines.`

// Caller sends one request to the supervisor; *cli.Conn implements it.
type Caller interface {
	Call(ctx context.Context, req *catalog.Request, log func(string)) (map[string]any, *catalog.Error)
}

// Options configure the server.
type Options struct {
	// Groups are the served sets; none means all.
	Groups []catalog.Group
	// SandboxID, when set, is the sandbox of runtime tools called without
	// sandbox_id (which then is optional in their schema).
	SandboxID string
	// MaxOutputTokens is the default bound of command output text (0 =
	// unbounded); a call's max_output_tokens overrides it.
	MaxOutputTokens uint64
	// Cwd resolves a relative create_sandbox workspace_root.
	Cwd string
	// Version is serverInfo.version ("" = the build's module version).
	Version string
}

type projection struct {
	ops        []catalog.Op
	order      map[string]int
	caller     Caller
	opts       Options
	srv        *server.MCPServer
	rejectTool string
}

// New builds the MCP server over the catalog's operations of opts.Groups.
func New(caller Caller, opts Options) *server.MCPServer {
	groups := opts.Groups
	if len(groups) == 0 {
		groups = []catalog.Group{catalog.Management, catalog.Runtime, catalog.Observability}
	}
	var ops []catalog.Op
	for _, op := range catalog.Ops() {
		if slices.Contains(groups, op.Group) {
			ops = append(ops, op)
		}
	}
	return newServer(ops, caller, opts)
}

// newServer is New over an explicit operation list (tests project synthetic ops).
func newServer(ops []catalog.Op, caller Caller, opts Options) *server.MCPServer {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	p := &projection{ops: ops, order: map[string]int{}, caller: caller, opts: opts,
		rejectTool: "_sandbox_mcp_local_error_" + hex.EncodeToString(nonce[:])}
	for i, op := range p.ops {
		p.order[op.ID] = i
	}
	version := opts.Version
	if version == "" {
		version = cli.ClientVersion()
	}
	hooks := &server.Hooks{}
	hooks.AddBeforeCallTool(p.beforeCall)
	s := server.NewMCPServer(Name, version,
		server.WithTitle(Title),
		server.WithInstructions(Instructions),
		server.WithToolCapabilities(false),
		server.WithInputSchemaValidation(),
		server.WithHooks(hooks),
		server.WithToolFilter(p.filter),
		server.WithRecovery(),
	)
	p.srv = s
	for i := range p.ops {
		op := &p.ops[i]
		s.AddTool(Tool(op, opts), p.handler(op))
	}
	s.AddTool(mcp.NewToolWithRawSchema(p.rejectTool, "internal: answers calls that failed local validation",
		json.RawMessage(`{"type":"object"}`)), p.reject)
	return s
}

// Tool is the MCP tool of op: name, title, description, input schema and
// the annotations its catalog declaration implies.
func Tool(op *catalog.Op, opts Options) mcp.Tool {
	t := mcp.NewToolWithRawSchema(op.ID, Description(op), InputSchema(op, opts))
	t.RawOutputSchema = OutputSchema(op)
	h := op.Hints()
	t.Title = op.DisplayTitle()
	t.Annotations = mcp.ToolAnnotation{
		Title:           op.DisplayTitle(),
		ReadOnlyHint:    mcp.ToBoolPtr(h.ReadOnly),
		DestructiveHint: mcp.ToBoolPtr(h.Destructive),
		IdempotentHint:  mcp.ToBoolPtr(h.Idempotent),
		OpenWorldHint:   mcp.ToBoolPtr(h.OpenWorld),
	}
	return t
}

// OutputSchema is the tool output schema of op, nil when the catalog
// declares no exact result. Clients that check it (the MCP TypeScript SDK)
// validate every structuredContent, error results included, and an error
// carries the contract's envelope there (§3.1); so the schema is the
// declared result or the envelope.
func OutputSchema(op *catalog.Op) json.RawMessage {
	if op.Output == nil {
		return nil
	}
	envelope := map[string]any{"type": "object", "required": []string{"error"}, "additionalProperties": true,
		"properties": map[string]any{"error": map[string]any{"type": "object", "required": []string{"kind", "message", "details"},
			"additionalProperties": true, "properties": map[string]any{
				"kind": map[string]any{"type": "string"}, "message": map[string]any{"type": "string"}, "details": map[string]any{"type": "object"}}}}}
	return catalog.CompactJSON(map[string]any{"type": "object", "anyOf": []any{op.Output, envelope}})
}

// filter lists the tools in catalog order and hides the reject tool. At
// call time mcp-go passes only the called tool, so the reject tool stays
// callable for the hook's reroutes.
func (p *projection) filter(_ context.Context, tools []mcp.Tool) []mcp.Tool {
	if len(tools) == 1 && tools[0].Name == p.rejectTool {
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
// checks its schema, and reroutes failures to the reject tool. A tool this
// server does not serve is left to mcp-go, which answers the JSON-RPC error
// -32602 the MCP specification lists for unknown tools.
func (p *projection) beforeCall(_ context.Context, _ any, req *mcp.CallToolRequest) {
	if _, ok := p.order[req.Params.Name]; !ok {
		if req.Params.Name == p.rejectTool {
			req.Params.Name += "/unknown" // reachable only through a reroute
		}
		return
	}
	if _, _, err := p.prepare(req.Params.Name, rawArguments(req)); err != nil {
		req.Params.Name = p.rejectTool
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
	return nil, fmt.Errorf("tool %s is internal", req.Params.Name)
}

func (p *projection) handler(op *catalog.Op) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		r, local, err := p.prepare(op.ID, rawArguments(&req))
		if err != nil {
			return errorResult(err), nil
		}
		if isCommandOutput(op) {
			bound := p.opts.MaxOutputTokens
			if local.Has("max_output_tokens") {
				bound = local.Uint("max_output_tokens")
			}
			var resp map[string]any
			if _, ok := r.Args["yield_time_ms"]; ok {
				resp = p.yielding(ctx, r, progressToken(&req))
			} else {
				resp = p.call(ctx, r)
			}
			return commandResult(resp, bound), nil
		}
		return responseResult(p.call(ctx, r)), nil
	}
}

// call sends one request; a transport failure becomes its envelope.
func (p *projection) call(ctx context.Context, r *catalog.Request) map[string]any {
	resp, terr := p.caller.Call(ctx, r, nil)
	if terr != nil {
		details := terr.Details
		if details == nil {
			details = map[string]any{}
		}
		return map[string]any{"error": map[string]any{"kind": terr.Kind, "message": terr.Message, "details": details}}
	}
	return resp
}

func isCommandOutput(op *catalog.Op) bool {
	return op.Arg("max_output_tokens") != nil
}

func progressToken(req *mcp.CallToolRequest) mcp.ProgressToken {
	if req.Params.Meta == nil {
		return nil
	}
	return req.Params.Meta.ProgressToken
}

// yielding runs exec_command or write_command_stdin as a series of short
// yields that add up to the caller's yield_time_ms, so that
//   - a cancelled exec_command interrupts its command: the first request is
//     short and runs to its end even when the call is cancelled (only its
//     answer carries the command's ID), then the command is cancelled as
//     write_command_stdin "\u0003" does (SIGINT, SIGKILL after 500 ms,
//     status cancelled, exit code 130), and its session finalizes as after
//     any command end: an implicit session publishes what the command had
//     written before the cancel; an explicit session keeps it unpublished;
//   - a cancelled poll closes its connection, which cancels the supervisor
//     request, and leaves the command running;
//   - with a progressToken, every further yield sends notifications/progress
//     with the new output, so a client's request timeout can be reset.
//
// The rows of all yields are joined in order, so the result is the one a
// single yield of the same length would have returned.
func (p *projection) yielding(ctx context.Context, r *catalog.Request, token mcp.ProgressToken) map[string]any {
	start := time.Now()
	budget := time.Duration(catalog.Args(r.Args).Uint("yield_time_ms")) * time.Millisecond
	isExec := r.Op == "exec_command"
	first := *r
	first.Args = maps.Clone(r.Args)
	first.Args["yield_time_ms"] = uint64(min(budget, firstSlice).Milliseconds())
	callCtx := ctx
	if isExec {
		// Its answer names the command to cancel; cancelling the request
		// itself would lose that.
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
	}
	resp := p.call(callCtx, &first)
	if catalog.ErrorFromResponse(resp) != nil {
		return resp
	}
	id, _ := resp["command_session_id"].(string)
	acc := &merged{first: resp}
	seq := 0
	for running(acc.last()) {
		if ctx.Err() != nil {
			if isExec {
				p.interrupt(ctx, r, id)
			}
			return acc.result(start)
		}
		left := budget - time.Since(start)
		if left <= 0 {
			break
		}
		poll := &catalog.Request{Op: "write_command_stdin", RequestID: cli.NewRequestID(), Scope: r.Scope,
			Args: catalog.Args{"command_session_id": id, "stdin": "", "yield_time_ms": uint64(max(min(left, pollSlice).Milliseconds(), 1))}}
		next := p.call(ctx, poll)
		if e := catalog.ErrorFromResponse(next); e != nil {
			if ctx.Err() != nil {
				continue // cancelled: handled at the top of the loop
			}
			if e.Kind != catalog.OperationFailed {
				return next
			}
			// "command already completed": the command is finalizing or
			// done; read the rest by offset, which does not need the cursor.
			next = p.readRest(ctx, r.Scope, id, acc, start.Add(budget))
			if next == nil {
				break
			}
		}
		acc.add(next)
		seq++
		// The last slice's news travels in the response itself; a
		// notification written after it would confuse clients.
		if token != nil && ctx.Err() == nil && running(next) && time.Since(start) < budget {
			msg := cli.StripANSI(next["output"].(string))
			if n := len(msg); n > 2000 {
				msg = "…" + msg[n-2000:]
			}
			_ = p.srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
				"progressToken": token, "progress": seq, "message": msg,
			})
		}
	}
	return acc.result(start)
}

// readRest reads rows after what acc holds until the command is terminal
// or the deadline passes; it returns the rows read as one command output
// (nil on an error or at the deadline without news).
func (p *projection) readRest(ctx context.Context, scope catalog.RequestScope, id string, acc *merged, deadline time.Time) map[string]any {
	for {
		read := &catalog.Request{Op: "read_command_lines", RequestID: cli.NewRequestID(), Scope: scope,
			Args: catalog.Args{"command_session_id": id, "start_offset": uint64(acc.end()), "limit": uint64(1000)}}
		out := p.call(ctx, read)
		if catalog.ErrorFromResponse(out) != nil {
			return nil
		}
		if !running(out) || intOf(out["end_offset"]) > acc.end() || time.Now().After(deadline) {
			return out
		}
		select {
		case <-ctx.Done():
			return out
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// interrupt cancels a command whose exec_command call was cancelled.
func (p *projection) interrupt(ctx context.Context, r *catalog.Request, id string) {
	if id == "" {
		return
	}
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	p.call(c, &catalog.Request{Op: "write_command_stdin", RequestID: cli.NewRequestID(), Scope: r.Scope,
		Args: catalog.Args{"command_session_id": id, "stdin": "\u0003", "yield_time_ms": uint64(1000)}})
}

func running(out map[string]any) bool { return out["status"] == "running" }

// merged joins consecutive command outputs of one command.
type merged struct {
	first map[string]any
	rest  []map[string]any
}

func (m *merged) add(out map[string]any) { m.rest = append(m.rest, out) }

func (m *merged) last() map[string]any {
	if len(m.rest) > 0 {
		return m.rest[len(m.rest)-1]
	}
	return m.first
}

func (m *merged) end() int { return intOf(m.last()["end_offset"]) }

func (m *merged) result(start time.Time) map[string]any {
	if len(m.rest) == 0 {
		return m.first
	}
	out := maps.Clone(m.last())
	var texts []string
	for _, o := range append([]map[string]any{m.first}, m.rest...) {
		if s, _ := o["output"].(string); s != "" || intOf(o["end_offset"]) > intOf(o["start_offset"]) {
			texts = append(texts, s)
		}
		if tb, ok := o["truncated_before"]; ok {
			out["truncated_before"] = tb
		}
	}
	text := strings.Join(texts, "\n")
	out["output"] = text
	out["start_offset"] = m.first["start_offset"]
	out["original_token_count"] = (utf8.RuneCountInString(text) + 3) / 4
	out["wall_time_seconds"] = time.Since(start).Seconds()
	return out
}

func intOf(v any) int {
	switch n := v.(type) {
	case json.Number:
		i, _ := n.Int64()
		return int(i)
	case float64:
		return int(n)
	case int:
		return n
	}
	return 0
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

// prepare validates a tools/call locally and builds the request it sends,
// and returns the client-side arguments apart. Messages are the
// contract's (§3.1, §2.6).
func (p *projection) prepare(name string, raw []byte) (*catalog.Request, catalog.Args, *catalog.Error) {
	var op *catalog.Op
	if i, ok := p.order[name]; ok {
		op = &p.ops[i]
	} else {
		return nil, nil, catalog.Errorf(catalog.InvalidRequest, "unknown operation: %s", name)
	}
	m := map[string]any{}
	if t := bytes.TrimSpace(raw); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		d := json.NewDecoder(bytes.NewReader(t))
		d.UseNumber()
		var v any
		err := d.Decode(&v)
		mm, isMap := v.(map[string]any)
		if err != nil || d.More() || !isMap {
			return nil, nil, catalog.Errorf(catalog.InvalidRequest, "arguments must be an object")
		}
		m = mm
	}
	sandboxID := ""
	if op.Group == catalog.Runtime {
		v, present := m["sandbox_id"]
		switch {
		case !present && p.opts.SandboxID != "":
			v = p.opts.SandboxID
		case !present:
			return nil, nil, catalog.Errorf(catalog.InvalidRequest, "sandbox_id is required for runtime operations")
		}
		s, ok := v.(string)
		if !ok {
			return nil, nil, catalog.Errorf(catalog.InvalidRequest, "sandbox_id must be a string")
		}
		if err := cli.CheckSandboxID("sandbox_id", s); err != nil {
			return nil, nil, err
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
			return nil, nil, catalog.Errorf(catalog.InvalidRequest, "unknown argument for %s: %s", op.ID, k)
		}
	}
	for i := range op.Args {
		a := &op.Args[i]
		v, present := m[a.Name]
		if !present {
			if a.Required {
				return nil, nil, catalog.Errorf(catalog.InvalidRequest, "%s is required for %s", a.Name, op.ID)
			}
			continue
		}
		if err := cli.StrictJSONKind(a, v); err != nil {
			return nil, nil, err
		}
		if arr, ok := v.([]any); ok {
			// Null fields are type errors here, as the advertised schema says.
			if err := a.CheckItems(arr, true); err != nil {
				return nil, nil, err
			}
		}
	}
	if op.ID == "create_sandbox" && p.opts.Cwd != "" {
		// An agent names the project it was started in; the server's cwd
		// is that project for stdio clients.
		if root, ok := m["workspace_root"].(string); ok && root != "" && !filepath.IsAbs(root) {
			m["workspace_root"] = filepath.Join(p.opts.Cwd, root)
		}
	}
	args, err := op.Validate(m)
	if err != nil {
		return nil, nil, err
	}
	if id := cli.ArgSandboxID(op, args); id != "" {
		sandboxID = id
	}
	args, local := cli.ClientArgs(op, args)
	return &catalog.Request{
		Op:        op.ID,
		RequestID: cli.NewRequestID(),
		Scope:     cli.Scope(op, sandboxID),
		Args:      args,
	}, local, nil
}

func responseResult(resp map[string]any) *mcp.CallToolResult {
	if e := catalog.ErrorFromResponse(resp); e != nil {
		return errorResult(e)
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{mcp.NewTextContent(string(catalog.CompactJSON(resp)))},
		StructuredContent: resp,
	}
}

// commandResult renders a command output for a model: one text item whose
// first line is the output object without output (compact JSON) and whose
// remaining lines are the output itself, escape sequences stripped and
// bounded to about bound tokens. There is no structuredContent: the output
// would be sent twice, and clients read one or the other.
func commandResult(resp map[string]any, bound uint64) *mcp.CallToolResult {
	if e := catalog.ErrorFromResponse(resp); e != nil {
		return errorResult(e)
	}
	out, _ := resp["output"].(string)
	resp["output"] = cli.StripANSI(out)
	cli.BoundOutput(resp, bound)
	text := resp["output"].(string)
	delete(resp, "output")
	return &mcp.CallToolResult{
		Content: []mcp.Content{mcp.NewTextContent(string(catalog.CompactJSON(resp)) + "\n" + text)},
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

// Description is a tool's description: summary, help, result and, for
// command outputs, how the result text is laid out.
func Description(op *catalog.Op) string {
	parts := []string{op.Summary}
	if op.Help != "" {
		parts = append(parts, op.Help)
	}
	if op.Result != "" {
		parts = append(parts, "Result: "+op.Result)
	}
	if isCommandOutput(op) {
		parts = append(parts, "Result text: the first line is the command output object as JSON without output; "+
			"the lines after it are the output, terminal escapes stripped, bounded by max_output_tokens "+
			"(output_truncated then names the omitted row offsets).")
	}
	return strings.Join(parts, "\n\n")
}

// property is one input-schema property; field order is the output order.
type property struct {
	Type                 string               `json:"type"`
	Description          string               `json:"description,omitempty"`
	Enum                 []string             `json:"enum,omitempty"`
	Minimum              *float64             `json:"minimum,omitempty"`
	Maximum              *float64             `json:"maximum,omitempty"`
	MaxLength            int                  `json:"maxLength,omitempty"`
	Items                any                  `json:"items,omitempty"`
	MaxItems             int                  `json:"maxItems,omitempty"`
	Properties           map[string]*property `json:"properties,omitempty"`
	Required             []string             `json:"required,omitempty"`
	AdditionalProperties *bool                `json:"additionalProperties,omitempty"`
	Default              any                  `json:"default,omitempty"`
}

// itemsSchema is an array's items: a plain type or an object.
type itemsSchema = property

// itemSchema renders a catalog Items declaration.
func itemSchema(it *catalog.Items) any {
	if it == nil {
		// The catalog test requires items on every array; should one slip
		// through, an empty schema is still present (clients refuse none)
		// and refuses nothing the catalog accepts.
		return map[string]any{}
	}
	if len(it.Fields) == 0 {
		return &itemsSchema{Type: "string"}
	}
	no := false
	s := &itemsSchema{Type: "object", Properties: map[string]*property{}, Required: []string{}, AdditionalProperties: &no}
	for _, f := range it.Fields {
		fp := &property{Description: f.Help, Enum: f.Enum, Default: f.Default}
		switch f.Kind {
		case catalog.Integer:
			fp.Type, fp.Minimum = "integer", new(float64)
		case catalog.Float:
			fp.Type = "number"
		case catalog.Boolean:
			fp.Type = "boolean"
		default:
			fp.Type = "string"
		}
		s.Properties[f.Name] = fp
		if f.Required {
			s.Required = append(s.Required, f.Name)
		}
	}
	return s
}

// InputSchema renders the tool input schema of op (§3.1, §2.6, A2),
// properties in catalog order. Limits the catalog clamps are left out so
// that mcp-go's validation never refuses what the catalog accepts.
func InputSchema(op *catalog.Op, opts Options) json.RawMessage {
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
	if op.Group == catalog.Runtime {
		if opts.SandboxID != "" {
			add("sandbox_id", property{Type: "string", Description: "The sandbox to operate in (sent in the request scope). Default: " + opts.SandboxID + "."})
		} else {
			add("sandbox_id", property{Type: "string", Description: "The sandbox to operate in (sent in the request scope); list_sandboxes shows them."})
			required = append(required, "sandbox_id")
		}
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
			p.Type, p.MaxItems, p.Items = "array", a.MaxItems, itemSchema(a.Items)
		}
		if op.ID == "create_sandbox" && a.Name == "workspace_root" && opts.Cwd != "" {
			p.Description += " A relative path is taken from the MCP server's working directory (" + opts.Cwd + ")."
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

// ParseSet maps a --set value to its groups: "all" (or "") is every group;
// otherwise a comma-separated list of management, runtime, observability.
func ParseSet(s string) ([]catalog.Group, bool) {
	if s == "" || s == "all" {
		return nil, true
	}
	var out []catalog.Group
	for _, part := range strings.Split(s, ",") {
		switch g := catalog.Group(strings.TrimSpace(part)); g {
		case catalog.Management, catalog.Runtime, catalog.Observability:
			if !slices.Contains(out, g) {
				out = append(out, g)
			}
		default:
			return nil, false
		}
	}
	return out, true
}

const usage = `Usage: sandbox-mcp [--set all|management|runtime|observability[,…]] [--sandbox-id ID]
                   [--max-output-tokens N] [--endpoint ENDPOINT] [--auth-token TOKEN]

Serves Ephemeral Sandbox operations as MCP tools over stdio.
  --set                all (default) or a comma-separated list of management,
                       runtime, observability
  --sandbox-id         default sandbox of runtime tools (else $` + SandboxEnv + `);
                       sandbox_id becomes optional in their schemas
  --max-output-tokens  bound of command output text returned to the model,
                       about 4 characters per token (default 10000; 0 = unbounded)
  --endpoint           supervisor endpoint (alias --gateway-endpoint): /abs/path,
                       unix:///abs/path or tcp://127.0.0.1:PORT; default
                       $SANDBOX_SUPERVISOR_SOCKET, else the runtime directory's socket
                       (a supervisor is started there when none answers)
  --auth-token         gateway token for a TCP endpoint (else $SANDBOX_GATEWAY_AUTH_TOKEN,
                       else <config dir>/gateway.token)
  --version            print the version and exit
`

// Main runs sandbox-mcp with the given arguments (program name excluded)
// and returns the exit code: 0 after stdin ends, 2 for a configuration error
// (config_error envelope on stderr), 1 when serving fails. version is the
// build's (-X main.version); "" falls back to the module version.
func Main(args []string, version string, stdin io.Reader, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		_, _ = stderr.Write(append(catalog.Errorf(catalog.ConfigError, format, a...).MarshalEnvelope(), '\n'))
		return cli.ExitUsage
	}
	fs := pflag.NewFlagSet(Name, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	set := fs.String("set", "all", "")
	sandboxID := fs.String("sandbox-id", "", "")
	maxTokens := fs.Uint64("max-output-tokens", DefaultMaxOutputTokens, "")
	endpoint := fs.String("endpoint", "", "")
	fs.Var(fs.Lookup("endpoint").Value, "gateway-endpoint", "")
	token := fs.String("auth-token", "", "")
	help := fs.BoolP("help", "h", false, "")
	showVersion := fs.Bool("version", false, "")
	if err := fs.Parse(args); err != nil {
		return fail("%v", err)
	}
	if version == "" {
		version = cli.ClientVersion()
	}
	if *help {
		_, _ = io.WriteString(stdout, usage)
		return cli.ExitOK
	}
	if *showVersion {
		fmt.Fprintln(stdout, version)
		return cli.ExitOK
	}
	if fs.NArg() > 0 {
		return fail("unexpected argument: %s", fs.Arg(0))
	}
	groups, ok := ParseSet(*set)
	if !ok {
		return fail("--set must be all or a comma-separated list of management, runtime, observability, not %q", *set)
	}
	sid := *sandboxID
	if !fs.Changed("sandbox-id") {
		sid = os.Getenv(SandboxEnv)
	}
	if fs.Changed("sandbox-id") || sid != "" {
		if err := cli.CheckSandboxID("--sandbox-id", sid); err != nil {
			return fail("%s", err.Message)
		}
	}
	cwd, _ := os.Getwd()
	conn, cerr := cli.NewConn(*endpoint, fs.Changed("endpoint") || fs.Changed("gateway-endpoint"), *token)
	if cerr != nil {
		_, _ = stderr.Write(append(catalog.CompactJSON(cerr.Envelope()), '\n'))
		return cli.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv := New(conn, Options{Groups: groups, SandboxID: sid, MaxOutputTokens: *maxTokens, Cwd: cwd, Version: version})
	if err := Serve(ctx, srv, stdin, stdout, stderr); err != nil {
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
	t := &tracker{pending: map[string]int{}, cancelled: map[string]bool{}, idle: make(chan struct{}, 1)}
	stdio := server.NewStdioServer(s)
	stdio.SetErrorLogger(log.New(errLog, Name+": ", log.LstdFlags))
	err := stdio.Listen(ctx, &drainReader{ctx: ctx, r: bufio.NewReaderSize(in, 64<<10), t: t}, &trackingWriter{w: out, t: t})
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// tracker counts the requests read and not yet answered, by JSON-RPC id,
// and remembers the ones the client cancelled: the MCP specification says a
// cancelled request gets no response, while mcp-go writes the handler's
// answer anyway.
type tracker struct {
	mu        sync.Mutex
	pending   map[string]int
	cancelled map[string]bool
	idle      chan struct{}
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
			t.mu.Lock()
			live := t.pending[k] > 0
			if live {
				t.cancelled[k] = true
			}
			t.mu.Unlock()
			if live {
				t.add(k, -1)
			}
		}
		return
	}
	if k, ok := idKey(m.ID); ok && m.Method != "" {
		t.add(k, 1)
	}
}

// sawOutput records the server's answer to a request and reports whether
// it must be dropped (its request was cancelled).
func (t *tracker) sawOutput(line []byte) (drop bool) {
	var m wireMessage
	if json.Unmarshal(line, &m) != nil || m.Method != "" || (m.Result == nil && m.Error == nil) {
		return false
	}
	k, ok := idKey(m.ID)
	if !ok {
		return false
	}
	t.mu.Lock()
	drop = t.cancelled[k]
	delete(t.cancelled, k)
	t.mu.Unlock()
	if !drop {
		t.add(k, -1)
	}
	return drop
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

// trackingWriter passes output through, except answers to cancelled
// requests; mcp-go writes one message per Write.
type trackingWriter struct {
	w io.Writer
	t *tracker
}

func (w *trackingWriter) Write(p []byte) (int, error) {
	if w.t.sawOutput(p) {
		return len(p), nil
	}
	return w.w.Write(p)
}
