// Command sandbox-supervisor is the per-user daemon (`serve`), its internal
// holder mode (`nsholder`) and its maintenance subcommands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/buildinfo"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/doctor"
)

// version is set at build time with -ldflags "-X main.version=…"; when
// empty the build's own information decides (cmd/internal/buildinfo).
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// subcommand is one word of `sandbox-supervisor WORD`.
type subcommand struct {
	name, args, summary string
	internal            bool // run by the supervisor itself or by packaging, not by people
	run                 func(args []string, stdout, stderr io.Writer) int
}

// subcommands is the one list `help`, the man page and run use.
func subcommands() []subcommand {
	return []subcommand{
		{name: "serve", args: "[--config FILE] [--endpoint SOCKET] [--listen tcp://127.0.0.1:PORT] [--http tcp://127.0.0.1:PORT]",
			summary: "run the supervisor (what the user unit and autostart run)",
			run:     func(a []string, _, e io.Writer) int { return serve(a, e) }},
		{name: "setup", summary: "first run after a package install: enable and start the user unit (when a systemd user manager answers), then print doctor's verdict and the console URL; idempotent", run: setup},
		{name: "doctor", args: "[--json] [--config FILE]", summary: "check this host (user namespaces, overlay, FUSE, network helpers, Docker, …) and say how to fix what is missing", run: runDoctor},
		{name: "ui", args: "[--no-browser] [--endpoint SOCKET]", summary: "print (and open) the browser console's login URL of the running supervisor", run: ui},
		{name: "install", args: "[--print]", summary: "write the systemd user units for this binary to ~/.config/systemd/user (not needed with the package)", run: install},
		{name: "uninstall", summary: "disable and remove the user units `install` wrote (data is kept)", run: uninstall},
		{name: "version", summary: "print the version", run: func(_ []string, o, _ io.Writer) int { fmt.Fprintln(o, buildinfo.Version(version)); return 0 }},
		{name: "help", summary: "list these subcommands", run: func(_ []string, o, _ io.Writer) int { fmt.Fprint(o, usage()); return 0 }},
		{name: "nsholder", args: "probe DIR | serve | shim -- ARGV...", summary: "the session holder and exec shim modes, started by the supervisor", internal: true,
			run: func(a []string, _, _ io.Writer) int { return nsholder.Main(a) }},
		{name: "package-files", args: "DIR", summary: "write the packaged user units and man page to DIR (make dist)", internal: true, run: packageFiles},
	}
}

// usage is `sandbox-supervisor help`.
func usage() string {
	var b strings.Builder
	b.WriteString("sandbox-supervisor: the per-user daemon of Ephemeral Sandbox, and its maintenance commands.\n\nUsage: sandbox-supervisor <command> [flags]\n\nCommands:\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, c := range subcommands() {
		if !c.internal {
			fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
		}
	}
	_ = tw.Flush()
	b.WriteString("\nInternal (started by the supervisor or by packaging):\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, c := range subcommands() {
		if c.internal {
			fmt.Fprintf(tw, "  %s %s\t%s\n", c.name, c.args, c.summary)
		}
	}
	_ = tw.Flush()
	b.WriteString("\nRun `sandbox-supervisor <command> -h` for a command's flags.\n")
	return b.String()
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	switch args[0] {
	case "-h", "--help":
		fmt.Fprint(stdout, usage())
		return 0
	case "--version":
		args[0] = "version"
	}
	for _, c := range subcommands() {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "sandbox-supervisor: unknown command %q\n\n%s", args[0], usage())
	return 2
}

func serve(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := fs.String("config", "", "configuration file (default <config dir>/config.yml)")
	endpoint := fs.String("endpoint", "", "Unix socket path (default: SANDBOX_SUPERVISOR_SOCKET, config, runtime dir)")
	listen := fs.String("listen", "", "optional loopback TCP RPC listener tcp://127.0.0.1:PORT (default: config supervisor.listen)")
	httpFlag := fs.String("http", "", "optional loopback HTTP listener (API, event stream) tcp://127.0.0.1:PORT (default: config http.listen)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (for `make bench -profile`)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(serviceLogHandler(stderr))
	if *cpuProfile != "" {
		stopProfile, err := startCPUProfile(*cpuProfile)
		if err != nil {
			log.Error("cpu profile", "err", err)
			return 1
		}
		defer stopProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	opts := supervisor.Options{ConfigPath: *cfg, Endpoint: *endpoint, Listen: *listen, HTTP: *httpFlag, Version: buildinfo.Version(version), Logger: log}
	err := withService(ctx, &opts)
	if err == nil {
		err = supervisor.Serve(ctx, opts)
	}
	if err == nil {
		return 0
	}
	var ce *catalog.Error
	if errors.As(err, &ce) {
		fmt.Fprintln(stderr, string(ce.MarshalEnvelope()))
		if ce.Kind == catalog.ConfigError {
			return 2
		}
		return 1
	}
	log.Error("supervisor failed", "err", err)
	return 1
}

// startCPUProfile profiles the process until the returned function runs.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile %s: %w", path, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile %s: %w", path, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// doctor checks the host capabilities (§4.5, §13) against the configuration
// (defaults when there is no file): exit 0 when everything required is
// present, 1 otherwise, 2 on bad flags.
func runDoctor(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	cfgPath := fs.String("config", "", "configuration file (default <config dir>/config.yml)")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return 2
	}
	var opt doctor.Options
	// A stand-in for /dev/fuse, so the FUSE check can be shown failing
	// (tests, or judging another device node) without touching the host's.
	opt.FuseDevice = os.Getenv("SANDBOX_DOCTOR_FUSE_DEVICE")
	if dirs, err := catalog.ResolveDirs(); err == nil {
		opt.DataDir = dirs.Data
		if *cfgPath == "" {
			*cfgPath = filepath.Join(dirs.Config, "config.yml")
		}
	} else {
		opt.ConfigErr = err
	}
	if *cfgPath != "" {
		opt.Config, opt.ConfigErr = config.Load(*cfgPath)
	}
	r := doctor.Run(context.Background(), opt)
	if *asJSON {
		if err := r.WriteJSON(stdout); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	} else {
		r.WriteText(stdout)
	}
	if !r.OK {
		return 1
	}
	return 0
}
