package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// Exit codes of the CLIs (§3.1).
const (
	ExitOK    = 0 // success, response on stdout
	ExitError = 1 // supervisor error envelope, connection_error or protocol_error
	ExitUsage = 2 // usage or configuration error; nothing reached the supervisor
)

// Binary returns the CLI binary name of a group.
func Binary(g catalog.Group) string {
	switch g {
	case catalog.Management:
		return "sandbox-manager-cli"
	case catalog.Runtime:
		return "sandbox-runtime-cli"
	case catalog.Observability:
		return "sandbox-observability-cli"
	}
	return "sandbox-" + string(g) + "-cli"
}

// Main runs the CLI of a group on the process's arguments and exits.
func Main(g catalog.Group) {
	os.Exit(Run(g, os.Args[1:], os.Stdout, os.Stderr))
}

// Run executes one CLI invocation of the group's binary and returns its exit
// code. args excludes the program name.
func Run(g catalog.Group, args []string, stdout, stderr io.Writer) int {
	return run(g, catalog.GroupOps(g), args, stdout, stderr)
}

// run is Run over an explicit operation list (tests project synthetic ops).
func run(g catalog.Group, ops []catalog.Op, args []string, stdout, stderr io.Writer) int {
	r := &runner{group: g, ops: ops, bin: Binary(g), stdout: stdout, stderr: stderr, args: args, start: time.Now(), code: -1}
	root := r.build()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetIn(strings.NewReader(""))

	// Resolve the operation name ourselves: anything that is neither an
	// operation of this group nor help is "unknown operation" (this also
	// keeps cobra's hidden __complete command unreachable).
	if i := r.operandIndex(root); i >= 0 {
		// cobra's hidden completion requests (what the scripts of
		// --completion call) start with "__", which no operation does.
		if name := args[i]; name != "help" && name != cobra.ShellCompRequestCmd && name != cobra.ShellCompNoDescRequestCmd && r.lookup(name) == nil {
			return r.usage(catalog.Errorf(catalog.InvalidRequest, "unknown operation: %s", name))
		}
	}
	if err := root.Execute(); err != nil {
		return r.usage(catalog.Errorf(catalog.InvalidRequest, "%s", err.Error()))
	}
	if r.code < 0 {
		return ExitOK
	}
	return r.code
}

type runner struct {
	group          catalog.Group
	bin            string
	stdout, stderr io.Writer
	args           []string
	start          time.Time
	code           int
	ops            []catalog.Op

	endpoint, authToken, requestID, sandboxID string
	progress                                  bool
	output                                    string
	shell                                     string
	version, man                              bool
}

// completion prints the completion script of --completion SHELL; its
// completions come from cobra's hidden __complete request, so operations and
// their flags complete from the catalog.
func (r *runner) completion(cmd *cobra.Command) error {
	var err error
	root := cmd.Root()
	switch r.shell {
	case "bash":
		err = root.GenBashCompletionV2(r.stdout, true)
	case "zsh":
		err = root.GenZshCompletion(r.stdout)
	case "fish":
		err = root.GenFishCompletion(r.stdout, true)
	default:
		return r.fail(catalog.Errorf(catalog.InvalidRequest, "--completion must be bash, zsh or fish, not %q", r.shell))
	}
	if err != nil {
		return r.fail(catalog.Errorf(catalog.InternalError, "completion script: %v", err))
	}
	r.code = ExitOK
	return nil
}

func (r *runner) lookup(id string) *catalog.Op {
	for i := range r.ops {
		if r.ops[i].ID == id {
			return &r.ops[i]
		}
	}
	return nil
}

func (r *runner) build() *cobra.Command {
	root := &cobra.Command{
		Use:                r.bin,
		Short:              string(r.group) + " operations of Ephemeral Sandbox",
		SilenceErrors:      true,
		SilenceUsage:       true,
		DisableSuggestions: true,
		CompletionOptions:  cobra.CompletionOptions{DisableDefaultCmd: true, HiddenDefaultCmd: true},
		Args:               cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return r.fail(catalog.Errorf(catalog.InvalidRequest, "unknown operation: %s", args[0]))
			}
			if cmd.Flags().Changed("completion") {
				return r.completion(cmd)
			}
			if r.version {
				fmt.Fprintln(r.stdout, ClientVersion())
				r.code = ExitOK
				return nil
			}
			if r.man {
				_, _ = r.stdout.Write(ManPage(r.group))
				r.code = ExitOK
				return nil
			}
			return r.fail(catalog.Errorf(catalog.InvalidRequest, "an operation is required; run `%s help`", r.bin))
		},
	}
	// A flag rather than cobra's `completion` command, so that no word is
	// taken from the operation namespace.
	root.Flags().StringVar(&r.shell, "completion", "", "print the shell completion script: bash, zsh or fish")
	root.Flags().BoolVar(&r.version, "version", false, "print the version")
	// --man prints the man page (make dist installs it); not for people.
	root.Flags().BoolVar(&r.man, "man", false, "print the man page (roff)")
	_ = root.Flags().MarkHidden("man")
	pf := root.PersistentFlags()
	pf.StringVar(&r.endpoint, "endpoint", "", "supervisor endpoint: /abs/path, unix:///abs/path or tcp://127.0.0.1:PORT")
	pf.Var(pf.Lookup("endpoint").Value, "gateway-endpoint", "alias of --endpoint")
	pf.StringVar(&r.authToken, "auth-token", "", "gateway token for a TCP endpoint (else $"+TokenEnv+", else the token file)")
	pf.StringVar(&r.requestID, "request-id", "", "request id to send (default: a new UUIDv4)")
	pf.StringVar(&r.output, "output", "json", "json (one line, for scripts) or text (tables, diffs, summaries, for people)")
	if r.group == catalog.Management {
		pf.BoolVar(&r.progress, "progress", false, "print progress messages on stderr")
	}
	if r.group == catalog.Runtime {
		pf.StringVar(&r.sandboxID, "sandbox-id", "", "the sandbox (required; must precede the operation)")
	}

	// help is ours: the reserved operation name and -h/--help.
	root.SetHelpCommand(&cobra.Command{
		Use:   "help [operation]",
		Short: "List the operations, or one operation's flags",
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch len(args) {
			case 0:
				r.printGroupHelp()
				return nil
			case 1:
				op := r.lookup(args[0])
				if op == nil {
					return r.fail(catalog.Errorf(catalog.InvalidRequest, "unknown operation: %s", args[0]))
				}
				r.printOpHelp(op)
				return nil
			}
			return r.fail(catalog.Errorf(catalog.InvalidRequest, "help takes at most one operation"))
		},
	})
	root.SetHelpFunc(func(cmd *cobra.Command, _ []string) {
		if op := r.lookup(cmd.Name()); op != nil && cmd != root {
			r.printOpHelp(op)
			return
		}
		r.printGroupHelp()
	})
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		if op := r.lookup(cmd.Name()); op != nil && cmd != root {
			return fmt.Errorf("%v (see `%s help %s`)", err, r.bin, op.ID)
		}
		return err
	})

	for i := range r.ops {
		root.AddCommand(r.opCommand(&r.ops[i]))
	}
	return root
}

// opCommand projects one operation into a subcommand.
func (r *runner) opCommand(op *catalog.Op) *cobra.Command {
	var positional []*catalog.Arg
	for i := range op.Args {
		if op.Args[i].Positional != "" {
			positional = append(positional, &op.Args[i])
		}
	}
	cmd := &cobra.Command{
		Use:   op.ID,
		Short: op.Summary,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > len(positional) {
				if len(positional) == 0 {
					return fmt.Errorf("unexpected argument for %s: %s (it takes only flags)", op.ID, args[0])
				}
				return fmt.Errorf("unexpected argument for %s: %s (quote %s as one argument)", op.ID, args[len(positional)], positional[len(positional)-1].Positional)
			}
			return nil
		},
	}
	vals := addArgFlags(cmd.Flags(), op)
	cmd.RunE = func(cmd *cobra.Command, pos []string) error {
		if err := r.checkGlobals(cmd); err != nil {
			return r.fail(err)
		}
		raw := map[string]any{}
		for i := range op.Args {
			a := &op.Args[i]
			text, given := "", false
			if a.Positional != "" {
				for j, p := range positional {
					if p == a && j < len(pos) {
						text, given = pos[j], true
					}
				}
			} else if v := vals[a.Name]; v.set {
				text, given = v.val, true
			}
			if !given {
				continue
			}
			val, err := ConvertFlag(a, text)
			if err != nil {
				return r.fail(err)
			}
			raw[a.Name] = val
		}
		return r.call(cmd, op, raw)
	}
	return cmd
}

// checkGlobals checks the global flags that need no supervisor: the
// runtime --sandbox-id and --request-id. It also mints the request id.
func (r *runner) checkGlobals(cmd *cobra.Command) *catalog.Error {
	if r.group == catalog.Runtime {
		if err := r.checkSandboxFlag(cmd); err != nil {
			return err
		}
	}
	if r.output != "json" && r.output != "text" {
		bad := r.output
		r.output = "json"
		return catalog.Errorf(catalog.InvalidRequest, "--output must be json or text, not %q", bad)
	}
	if !cmd.Flags().Changed("request-id") {
		r.requestID = NewRequestID()
	} else if !catalog.ValidID(r.requestID) {
		return catalog.Errorf(catalog.InvalidRequest, "--request-id must be 1-128 characters of [A-Za-z0-9._:-]")
	}
	return nil
}

// call validates the arguments locally, then sends the request and prints
// the response.
func (r *runner) call(cmd *cobra.Command, op *catalog.Op, raw map[string]any) error {
	sandboxID := ""
	if r.group == catalog.Runtime {
		sandboxID = r.sandboxID
	}
	args, verr := op.Validate(raw)
	if verr != nil {
		return r.fail(verr)
	}
	if id := ArgSandboxID(op, args); id != "" {
		sandboxID = id
	}
	args, local := ClientArgs(op, args)
	conn, cerr := NewConn(r.endpoint, cmd.Flags().Changed("endpoint") || cmd.Flags().Changed("gateway-endpoint"), r.authToken)
	if cerr != nil {
		return r.fail(cerr)
	}
	req := &catalog.Request{
		Op:         op.ID,
		RequestID:  r.requestID,
		Scope:      Scope(op, sandboxID),
		Args:       args,
		StreamLogs: r.progress,
	}
	var logf func(string)
	if r.progress {
		logf = func(msg string) {
			fmt.Fprintf(r.stderr, "[progress %.1fs] %s\n", time.Since(r.start).Seconds(), msg)
		}
	}
	resp, terr := conn.Call(context.Background(), req, logf)
	switch {
	case terr != nil && terr.Kind == catalog.ConfigError:
		return r.fail(terr)
	case terr != nil:
		r.emit(r.stderr, terr.Envelope(), ExitError)
	case catalog.ErrorFromResponse(resp) != nil:
		r.emit(r.stderr, resp, ExitError)
	default:
		if local.Has("max_output_tokens") {
			BoundOutput(resp, local.Uint("max_output_tokens"))
		}
		r.emit(r.stdout, resp, ExitOK)
	}
	return nil
}

// checkSandboxFlag enforces §3.1: --sandbox-id is given before the
// operation and names a sandbox.
func (r *runner) checkSandboxFlag(cmd *cobra.Command) *catalog.Error {
	opIdx := r.operandIndex(cmd.Root())
	for i, a := range r.args {
		if a == "--" {
			break
		}
		if (a == "--sandbox-id" || strings.HasPrefix(a, "--sandbox-id=")) && i > opIdx {
			return catalog.Errorf(catalog.InvalidRequest, "--sandbox-id must precede the operation")
		}
	}
	if !cmd.Flags().Changed("sandbox-id") {
		return catalog.Errorf(catalog.InvalidRequest, "--sandbox-id is required for runtime operations")
	}
	return CheckSandboxID("--sandbox-id", r.sandboxID)
}

// operandIndex returns the index in r.args of the operation name (the first
// argument that is neither a global flag nor a global flag's value), or -1.
func (r *runner) operandIndex(root *cobra.Command) int {
	pf := root.PersistentFlags()
	for i := 0; i < len(r.args); i++ {
		a := r.args[i]
		switch {
		case a == "--":
			if i+1 < len(r.args) {
				return i + 1
			}
			return -1
		case strings.HasPrefix(a, "--"):
			if strings.Contains(a, "=") {
				continue
			}
			f := pf.Lookup(a[2:])
			if f == nil {
				f = root.Flags().Lookup(a[2:]) // --completion SHELL
			}
			if f != nil && f.NoOptDefVal == "" {
				i++
			}
		case strings.HasPrefix(a, "-") && a != "-":
			continue
		default:
			return i
		}
	}
	return -1
}

// fail records a usage/configuration error (exit 2); the envelope goes to
// stderr and stdout stays empty.
func (r *runner) fail(e *catalog.Error) error {
	r.emit(r.stderr, e.Envelope(), ExitUsage)
	return nil
}

func (r *runner) usage(e *catalog.Error) int {
	r.emit(r.stderr, e.Envelope(), ExitUsage)
	return ExitUsage
}

func (r *runner) emit(w io.Writer, v any, code int) {
	if r.code >= 0 {
		return // one JSON line per invocation
	}
	r.code = code
	if r.output == "text" {
		_, _ = io.WriteString(w, Text(v, isTerminal(w)))
		return
	}
	_, _ = w.Write(append(catalog.CompactJSON(v), '\n'))
}

var _ pflag.Value = (*argValue)(nil)
