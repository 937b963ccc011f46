package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/cli"
)

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
