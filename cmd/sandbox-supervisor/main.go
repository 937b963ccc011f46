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
	"syscall"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/doctor"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "0.1.0-dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: sandbox-supervisor serve|ui|version [flags]")
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
	case "install":
		return install(args[1:], stdout, stderr)
	case "uninstall":
		return uninstall(args[1:], stdout, stderr)
	case "doctor":
		return runDoctor(args[1:], stdout, stderr)
	case "ui":
		return ui(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "sandbox-supervisor: unknown command %q (want serve or version)\n", args[0])
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
	opts := supervisor.Options{ConfigPath: *cfg, Endpoint: *endpoint, Listen: *listen, HTTP: *httpFlag, Version: version, Logger: log}
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
