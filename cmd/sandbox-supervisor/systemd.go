package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/systemd"
)

// statusEvery is how often serve refreshes its systemd STATUS= line.
const statusEvery = 5 * time.Second

// serviceLogHandler logs to the journal when running as a systemd unit,
// else as text on stderr.
func serviceLogHandler(stderr io.Writer) slog.Handler {
	if h := systemd.JournalHandler(nil); h != nil {
		return h
	}
	return slog.NewTextHandler(stderr, nil)
}

// withService wires systemd into serve: the socket-activated listener
// (LISTEN_FDS) if one was passed, READY=1 with a STATUS= line after
// recovery, a STATUS= ticker with counts, WATCHDOG=1 while WATCHDOG_USEC is
// set, and STOPPING=1 once ctx is cancelled (SIGTERM/SIGINT). Without
// systemd every notification is a no-op.
func withService(ctx context.Context, opts *supervisor.Options) error {
	ln, err := systemd.Listener()
	if err != nil {
		return catalog.Errorf(catalog.ConfigError, "%v", err)
	}
	if ln != nil {
		opts.Listener = ln
	}
	// Pinged from the start (recovery may take a while) until the process
	// exits, through the shutdown drain.
	go systemd.Watchdog(context.Background())
	context.AfterFunc(ctx, func() { _ = systemd.Stopping("shutting down") })
	var counts func() supervisor.Counts
	status := func() string {
		if counts == nil {
			return "serving"
		}
		c := counts()
		return fmt.Sprintf("serving: %d sandboxes (%d ready), %d sessions, %d requests in flight",
			c.Sandboxes, c.Ready, c.Sessions, c.Requests)
	}
	opts.Counts = func(get func() supervisor.Counts) { counts = get }
	log := opts.Logger
	opts.Ready = func(socket string) {
		if err := systemd.Ready(status() + " on " + socket); err != nil {
			log.Warn("sd_notify READY failed", "err", err)
		}
		go systemd.StatusLoop(ctx, statusEvery, status)
	}
	return nil
}

// unitConfig describes the units for the running binary and the socket
// serve would bind (SANDBOX_SUPERVISOR_SOCKET, config, runtime dir).
func unitConfig() (systemd.UnitConfig, error) {
	self, err := os.Executable()
	if err != nil {
		return systemd.UnitConfig{}, fmt.Errorf("cannot find the running binary: %v", err)
	}
	if r, err := filepath.EvalSymlinks(self); err == nil {
		self = r
	}
	dirs, err := catalog.ResolveDirs()
	if err != nil {
		return systemd.UnitConfig{}, err
	}
	raw := os.Getenv("SANDBOX_SUPERVISOR_SOCKET")
	if raw == "" {
		cfg, err := config.Load(filepath.Join(dirs.Config, "config.yml"))
		if err != nil {
			return systemd.UnitConfig{}, err
		}
		raw = cfg.Supervisor.SocketPath
	}
	if raw == "" {
		raw = dirs.SocketPath()
	}
	ep, err := catalog.ParseEndpoint(raw)
	if err != nil {
		return systemd.UnitConfig{}, err
	}
	if ep.Network != "unix" {
		return systemd.UnitConfig{}, fmt.Errorf("the supervisor socket must be a Unix path, got %s", raw)
	}
	uc := systemd.UnitConfig{Binary: self, Socket: ep.Address}
	// The user manager does not see this shell's environment: carry over
	// what chooses the data, config and runtime directories.
	for _, k := range []string{"EPHEMERAL_SANDBOX_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"} {
		if v := os.Getenv(k); v != "" {
			uc.Environment = append(uc.Environment, k+"="+v)
		}
	}
	return uc, nil
}

// install writes (or with --print prints) the user units and reloads the
// user manager when one answers.
func install(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	fs.SetOutput(stderr)
	printOnly := fs.Bool("print", false, "print the units instead of installing them")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return 2
	}
	uc, err := unitConfig()
	if err == nil {
		var units []systemd.Unit
		if units, err = systemd.Units(uc); err == nil {
			if *printOnly {
				for i, u := range units {
					if i > 0 {
						fmt.Fprintln(stdout)
					}
					fmt.Fprint(stdout, u.Text)
				}
				return 0
			}
			var dir string
			if dir, err = systemd.UserUnitDir(); err == nil {
				var paths []string
				paths, err = systemd.WriteUnits(dir, units)
				for _, p := range paths {
					fmt.Fprintln(stdout, "wrote", p)
				}
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "sandbox-supervisor install:", err)
		return 1
	}
	ctx := context.Background()
	if merr := systemd.UserManager(ctx); merr != nil {
		fmt.Fprintf(stdout, "systemctl --user daemon-reload skipped: no systemd user manager answers (%v)\n", merr)
		fmt.Fprintln(stdout, "once one runs: systemctl --user daemon-reload && systemctl --user enable --now", systemd.SocketName)
		return 0
	}
	if _, err := systemd.Systemctl(ctx, "daemon-reload"); err != nil {
		fmt.Fprintln(stderr, "sandbox-supervisor install:", err)
		return 1
	}
	fmt.Fprintln(stdout, "ran systemctl --user daemon-reload")
	fmt.Fprintln(stdout, "start with: systemctl --user enable --now", systemd.SocketName)
	return 0
}

// uninstall disables and removes the user units.
func uninstall(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("uninstall", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return 2
	}
	dir, err := systemd.UserUnitDir()
	if err != nil {
		fmt.Fprintln(stderr, "sandbox-supervisor uninstall:", err)
		return 1
	}
	ctx := context.Background()
	manager := systemd.UserManager(ctx) == nil
	if manager {
		// Best effort: the units may never have been enabled.
		_, _ = systemd.Systemctl(ctx, "disable", systemd.SocketName, systemd.ServiceName)
	}
	removed, err := systemd.RemoveUnits(dir)
	for _, p := range removed {
		fmt.Fprintln(stdout, "removed", p)
	}
	if err != nil {
		fmt.Fprintln(stderr, "sandbox-supervisor uninstall:", err)
		return 1
	}
	if len(removed) == 0 {
		fmt.Fprintln(stdout, "no units installed in", dir)
	}
	if !manager {
		fmt.Fprintln(stdout, "systemctl --user daemon-reload skipped: no systemd user manager answers")
		return 0
	}
	if _, err := systemd.Systemctl(ctx, "daemon-reload"); err != nil {
		fmt.Fprintln(stderr, "sandbox-supervisor uninstall:", err)
		return 1
	}
	fmt.Fprintln(stdout, "ran systemctl --user daemon-reload (a running supervisor keeps running until: systemctl --user stop", systemd.SocketName, systemd.ServiceName+")")
	return 0
}
