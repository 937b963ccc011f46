package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/buildinfo"
	"github.com/ephemeral-ai-lab/sandbox/systemd"
)

// setup is the first run after a package install, and safe to repeat: when
// a systemd user manager answers and it knows the units (the package puts
// them in /usr/lib/systemd/user; `install` writes them for a go install),
// it enables and starts the socket and the service (systemctl writes its
// enablement symlinks; setup writes nothing itself); without a manager the
// clients' autostart starts a supervisor on first use. Then it prints
// doctor's verdict and the console URL. Exit 1 when the units could not be
// enabled or doctor finds a required capability missing.
func setup(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("setup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return 2
	}
	code := 0
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := systemd.UserManager(ctx); err != nil {
		fmt.Fprintf(stdout, "user unit: not enabled, no systemd user manager answers (%v);\n  the CLIs and sandbox-mcp start a supervisor on first use (autostart)\n", err)
	} else if _, err := systemd.Systemctl(ctx, "cat", systemd.SocketName); err != nil {
		fmt.Fprintf(stdout, "user unit: %s is not installed: install the ephemeral-sandbox package, or run `sandbox-supervisor install` for this binary, then setup again\n", systemd.SocketName)
		code = 1
	} else if _, err := systemd.Systemctl(ctx, "enable", "--now", systemd.SocketName); err != nil {
		fmt.Fprintln(stderr, "sandbox-supervisor setup:", err)
		code = 1
	} else if _, err := systemd.Systemctl(ctx, "start", systemd.ServiceName); err != nil {
		fmt.Fprintln(stderr, "sandbox-supervisor setup:", err)
		code = 1
	} else {
		fmt.Fprintf(stdout, "user unit: %s enabled and started (systemctl --user status %s)\n", systemd.SocketName, systemd.ServiceName)
	}
	fmt.Fprintln(stdout)
	if runDoctor(nil, stdout, stderr) != 0 {
		code = 1
	}
	fmt.Fprintln(stdout)
	if url, err := loginURL("", ""); err == nil {
		fmt.Fprintln(stdout, "console:", url)
	} else {
		fmt.Fprintf(stdout, "console: not available: %v\n  (then: sandbox-supervisor ui)\n", err)
	}
	return code
}

// packageFiles writes what a distribution package installs besides the
// binaries (make dist): the user units for /usr/bin/sandbox-supervisor
// (DIR/systemd/user/) and this binary's man page (DIR/man/man1/).
func packageFiles(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 || !filepath.IsAbs(args[0]) {
		fmt.Fprintln(stderr, "usage: sandbox-supervisor package-files /ABS/DIR")
		return 2
	}
	units, err := systemd.Units(systemd.UnitConfig{Binary: "/usr/bin/sandbox-supervisor", Packaged: true})
	if err == nil {
		if _, err = systemd.WriteUnits(filepath.Join(args[0], "systemd", "user"), units); err == nil {
			man := filepath.Join(args[0], "man", "man1")
			if err = os.MkdirAll(man, 0o755); err == nil {
				err = os.WriteFile(filepath.Join(man, "sandbox-supervisor.1"), manPage(), 0o644)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "sandbox-supervisor package-files:", err)
		return 1
	}
	return 0
}

// manPage is sandbox-supervisor(1), from the subcommand list.
func manPage() []byte {
	secs := []buildinfo.ManSection{
		{Heading: "Synopsis", Text: "sandbox-supervisor <command> [flags]"},
		{Heading: "Description", Text: usage()},
		{Heading: "Commands"},
	}
	for _, c := range subcommands() {
		secs = append(secs, buildinfo.ManSection{Sub: c.name + " " + c.args, Text: c.summary})
	}
	secs = append(secs,
		buildinfo.ManSection{Heading: "Files", Text: "$XDG_DATA_HOME/ephemeral-sandbox/    state, layer stacks, sessions, images\n" +
			"$XDG_CONFIG_HOME/ephemeral-sandbox/  config.yml, UI and gateway tokens\n" +
			"$XDG_RUNTIME_DIR/ephemeral-sandbox/  the socket\n" +
			"EPHEMERAL_SANDBOX_HOME=DIR           one root for all of them\n" +
			"/usr/lib/systemd/user/ephemeral-sandbox.{socket,service}  the packaged user units"},
		buildinfo.ManSection{Heading: "See also", Text: "sandbox-manager-cli(1), sandbox-runtime-cli(1), sandbox-observability-cli(1), systemctl(1)"})
	return buildinfo.ManPage("sandbox-supervisor", "the per-user daemon of Ephemeral Sandbox", buildinfo.Version(version), buildinfo.ManDate(), secs...)
}
