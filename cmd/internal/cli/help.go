package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/buildinfo"
)

// GroupHelp renders `<bin> help`: the group's operations grouped by family in
// catalog order. Capability families are headings with their help and no
// operations; other families without operations in this group are skipped.
func GroupHelp(g catalog.Group) string { return groupHelp(g, catalog.GroupOps(g)) }

func groupHelp(g catalog.Group, ops []catalog.Op) string {
	var b strings.Builder
	bin := Binary(g)
	fmt.Fprintf(&b, "%s: %s operations of Ephemeral Sandbox.\n\n", bin, g)
	fmt.Fprintf(&b, "Usage:\n  %s %s<operation> [flags]\n  %s help [<operation>]\n\n", bin, usagePrefix(g), bin)

	seen := map[string]bool{}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	writeFamily := func(name, help string, capability bool, members []catalog.Op) {
		heading := name
		if capability {
			heading += " (capability)"
		}
		fmt.Fprintf(tw, "%s\t%s\n", heading, help)
		for _, op := range members {
			fmt.Fprintf(tw, "  %s\t%s\n", op.ID, op.Summary)
		}
		fmt.Fprintln(tw, "\t")
	}
	for _, f := range catalog.Families() {
		if f.Group != g {
			continue
		}
		seen[f.Name] = true
		members := familyOps(ops, f.Name)
		if !f.Capability && len(members) == 0 {
			continue
		}
		writeFamily(f.Name, f.Help, f.Capability, members)
	}
	// Families used by operations but not declared as headings, in the order
	// of their first operation.
	for _, op := range ops {
		if !seen[op.Family] {
			seen[op.Family] = true
			writeFamily(op.Family, "", false, familyOps(ops, op.Family))
		}
	}
	_ = tw.Flush()

	b.WriteString("Global flags:\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, f := range globalFlags(g) {
		fmt.Fprintf(tw, "  %s\t%s\n", f[0], f[1])
	}
	_ = tw.Flush()
	fmt.Fprintf(&b, "\nOutput: one JSON line (or text with --output text); success on stdout (exit 0), errors on stderr (exit 1; usage errors exit 2).\n")
	fmt.Fprintf(&b, "Run `%s help <operation>` for an operation's flags.\n", bin)
	return trimRight(b.String())
}

// OpHelp renders `<bin> help <op>`: its flags with kind, default and whether
// each is required.
func OpHelp(g catalog.Group, op *catalog.Op) string {
	var b strings.Builder
	bin := Binary(g)
	fmt.Fprintf(&b, "%s: %s\n", op.ID, op.Summary)
	if op.Help != "" {
		fmt.Fprintf(&b, "\n%s\n", op.Help)
	}
	fmt.Fprintf(&b, "\nUsage:\n  %s %s%s", bin, usagePrefix(g), op.ID)
	for i := range op.Args {
		a := &op.Args[i]
		var s string
		if a.Positional != "" {
			s = a.Positional
		} else {
			s = "--" + a.FlagName()
			if a.Kind != catalog.Boolean {
				s += " " + metavar(a)
			}
		}
		if !a.Required {
			s = "[" + s + "]"
		}
		b.WriteString(" " + s)
	}
	b.WriteString("\n\n")
	if len(op.Args) == 0 {
		b.WriteString("Arguments: none\n")
	} else {
		b.WriteString("Arguments:\n")
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  FLAG\tKIND\tREQUIRED\tDEFAULT\tDESCRIPTION\n")
		for i := range op.Args {
			a := &op.Args[i]
			name := a.Positional
			if name == "" {
				name = "--" + a.FlagName()
				for _, al := range a.FlagAliases {
					name += ", --" + al
				}
			} else {
				name += " (positional)"
			}
			req := "no"
			if a.Required {
				req = "yes"
			}
			def := a.DefaultText()
			if def == "" {
				def = "-"
			}
			desc := a.Help
			if l := a.LimitsText(); l != "" {
				desc += " [" + l + "]"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", name, a.Kind, req, def, desc)
		}
		_ = tw.Flush()
	}
	if op.Result != "" {
		fmt.Fprintf(&b, "\nResult: %s\n", op.Result)
	}
	fmt.Fprintf(&b, "\nEffect: %s.\n", op.EffectText())
	fmt.Fprintf(&b, "\nScope: %s. Global flags: see `%s help`.\n", op.Scope, bin)
	return trimRight(b.String())
}

func (r *runner) printGroupHelp()            { _, _ = io.WriteString(r.stdout, GroupHelp(r.group)) }
func (r *runner) printOpHelp(op *catalog.Op) { _, _ = io.WriteString(r.stdout, OpHelp(r.group, op)) }
func familyOps(ops []catalog.Op, family string) []catalog.Op {
	var out []catalog.Op
	for _, op := range ops {
		if op.Family == family {
			out = append(out, op)
		}
	}
	return out
}

func usagePrefix(g catalog.Group) string {
	switch g {
	case catalog.Runtime:
		return "--sandbox-id ID [global flags] "
	default:
		return "[global flags] "
	}
}

func metavar(a *catalog.Arg) string {
	switch a.Kind {
	case catalog.Path:
		return "PATH"
	case catalog.Integer:
		return "N"
	case catalog.Float:
		return "NUMBER"
	case catalog.JSONArray:
		return "JSON"
	}
	if len(a.Enum) > 0 && len(a.Enum) <= 4 {
		return strings.Join(a.Enum, "|")
	}
	if a.ID {
		return "ID"
	}
	return "VALUE"
}

func globalFlags(g catalog.Group) [][2]string {
	var out [][2]string
	if g == catalog.Runtime {
		out = append(out, [2]string{"--sandbox-id ID", "the sandbox (required for operations; must precede the operation)"})
	}
	out = append(out,
		[2]string{"--endpoint ENDPOINT", "alias --gateway-endpoint; /abs/path, unix:///abs/path or tcp://127.0.0.1:PORT (default: $SANDBOX_SUPERVISOR_SOCKET, else the runtime directory's socket)"},
		[2]string{"--auth-token TOKEN", "TCP only; default $" + TokenEnv + ", else <config dir>/gateway.token"},
		[2]string{"--request-id ID", "request id to send (default: a new UUIDv4)"},
		[2]string{"--output json|text", "json (default): one line for scripts; text: tables, diffs, summaries for people"},
		[2]string{"--completion bash|zsh|fish", "print the shell completion script (e.g. source <(" + Binary(g) + " --completion bash))"},
		[2]string{"--version", "print the version"},
	)
	if g == catalog.Management {
		out = append(out, [2]string{"--progress", "stream progress messages to stderr as [progress <s>s] <message>"})
	}
	return out
}

// trimRight drops the padding tabwriter leaves at the end of lines.
func trimRight(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return strings.Join(lines, "\n")
}

// ManPage renders the group's CLI as a man page: the group help, then every
// operation's help, from the catalog like `help` itself.
func ManPage(g catalog.Group) []byte {
	bin := Binary(g)
	secs := []buildinfo.ManSection{
		{Heading: "Synopsis", Text: fmt.Sprintf("%s %s<operation> [flags]\n%s help [<operation>]", bin, usagePrefix(g), bin)},
		{Heading: "Description", Text: GroupHelp(g)},
		{Heading: "Operations"},
	}
	for i, op := range catalog.GroupOps(g) {
		secs = append(secs, buildinfo.ManSection{Sub: op.ID, Text: OpHelp(g, &catalog.GroupOps(g)[i])})
	}
	secs = append(secs,
		buildinfo.ManSection{Heading: "Exit status", Text: "0  success (result on stdout)\n1  the operation failed (error envelope on stderr)\n2  usage error"},
		buildinfo.ManSection{Heading: "See also", Text: "sandbox-supervisor(1), sandbox-manager-cli(1), sandbox-runtime-cli(1), sandbox-observability-cli(1)"})
	return buildinfo.ManPage(bin, string(g)+" operations of Ephemeral Sandbox", ClientVersion(), buildinfo.ManDate(), secs...)
}
