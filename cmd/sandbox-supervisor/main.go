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
	"syscall"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "0.1.0-dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: sandbox-supervisor serve|version [flags]")
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stderr)
	case "version":
		fmt.Fprintln(stdout, version)
		return 0
	case "nsholder":
		return nsholder.Main(args[1:])
	}
	fmt.Fprintf(stderr, "sandbox-supervisor: unknown command %q (want serve or version)\n", args[0])
	return 2
}

func serve(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := fs.String("config", "", "configuration file (default <config dir>/config.yml)")
	endpoint := fs.String("endpoint", "", "Unix socket path (default: SANDBOX_SUPERVISOR_SOCKET, config, runtime dir)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := supervisor.Serve(ctx, supervisor.Options{ConfigPath: *cfg, Endpoint: *endpoint, Version: version, Logger: log})
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
