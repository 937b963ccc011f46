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
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

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
	// pollSlice is the length of each further yield. Every slice but the
	// last, the first included, sends one progress notification when the
	// caller sent a progressToken.
	pollSlice = 2000 * time.Millisecond
)

// Instructions are sent in the initialize result: the workflow in a few lines.
const Instructions = `Ephemeral Sandbox runs commands and file edits inside sandboxes: isolated copy-on-write copies of a project directory, never the host's files.
Workflow: create_sandbox (workspace_root = the project directory) → create_workspace_session (a private view) → exec_command / file_read / file_edit / file_write with its workspace_session_id → diff_workspace_session → publish_workspace_session (dry_run first to see conflicts; keep:true publishes and goes on working in the same session) → export_changes to write the published result back to a host directory. sync_workspace_session brings a live session up to date with what others published, keeping its own changes.
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
