package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
)

// ui prints the console's login URL (like Jupyter's token link) and, when
// there is a display and xdg-open, opens it. The URL carries the UI token,
// so it is printed only for the user who owns the runtime directory, and the
// browser is pointed at it through a private file rather than a command
// line other users could read in /proc.
func ui(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ui", flag.ContinueOnError)
	fs.SetOutput(stderr)
	endpoint := fs.String("endpoint", "", "the supervisor's Unix socket (default: SANDBOX_SUPERVISOR_SOCKET, config, runtime dir)")
	cfgPath := fs.String("config", "", "configuration file (default <config dir>/config.yml)")
	noOpen := fs.Bool("no-browser", false, "only print the URL")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return 2
	}
	url, err := loginURL(*endpoint, *cfgPath)
	if err != nil {
		var ce *catalog.Error
		if !errors.As(err, &ce) {
			ce = catalog.Errorf(catalog.ConfigError, "%v", err)
		}
		fmt.Fprintln(stderr, string(ce.MarshalEnvelope()))
		return 1
	}
	fmt.Fprintln(stdout, url)
	if !*noOpen && (os.Getenv("DISPLAY") != "" || os.Getenv("WAYLAND_DISPLAY") != "") {
		if err := openBrowser(url); err != nil {
			fmt.Fprintf(stderr, "could not open a browser (%v); open the URL above yourself\n", err)
		}
	}
	return 0
}

// loginURL reads http.addr and ui.token of the running supervisor.
func loginURL(endpoint, cfgPath string) (string, error) {
	dirs, err := catalog.ResolveDirs()
	if err != nil {
		return "", err
	}
	socket := endpoint
	if socket == "" {
		socket = os.Getenv("SANDBOX_SUPERVISOR_SOCKET")
	}
	if socket == "" {
		if cfgPath == "" {
			cfgPath = filepath.Join(dirs.Config, "config.yml")
		}
		if cfg, err := config.Load(cfgPath); err == nil && cfg.Supervisor.SocketPath != "" {
			socket = cfg.Supervisor.SocketPath
		}
	}
	if socket == "" {
		socket = dirs.SocketPath()
	}
	ep, err := catalog.ParseEndpoint(socket)
	if err != nil {
		return "", err
	}
	if ep.Network != "unix" {
		return "", catalog.Errorf(catalog.ConfigError, "--endpoint must be the supervisor's Unix socket")
	}
	runDir := filepath.Dir(ep.Address)
	// http.addr decides where the token goes: only a directory of ours
	// may tell us.
	if err := catalog.CheckPrivateDir("runtime directory", runDir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", catalog.Errorf(catalog.ConnectionError, "the supervisor is not running (no %s)", runDir)
		}
		return "", err
	}
	c, err := net.DialTimeout("unix", ep.Address, 2*time.Second)
	if err != nil {
		return "", catalog.Errorf(catalog.ConnectionError, "the supervisor is not running (cannot connect to %s)", ep.Address)
	}
	c.Close()
	b, err := os.ReadFile(filepath.Join(runDir, "http.addr"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", catalog.Errorf(catalog.ConfigError,
			"the HTTP listener is off: start the supervisor with --http tcp://127.0.0.1:PORT, or set http.listen: tcp://127.0.0.1:PORT in %s and restart it",
			filepath.Join(dirs.Config, "config.yml"))
	}
	if err != nil {
		return "", catalog.Errorf(catalog.ConfigError, "read http.addr: %v", err)
	}
	addr, err := catalog.ParseEndpoint(strings.TrimSpace(string(b)))
	if err != nil || addr.Network != "tcp" {
		return "", catalog.Errorf(catalog.ConfigError, "http.addr holds no tcp:// address: %q", strings.TrimSpace(string(b)))
	}
	tok, err := os.ReadFile(filepath.Join(dirs.Config, "ui.token"))
	if err != nil {
		return "", catalog.Errorf(catalog.ConfigError, "read ui.token: %v", err)
	}
	return fmt.Sprintf("http://%s/auth?token=%s", addr.Address, strings.TrimSpace(string(tok))), nil
}

// openBrowser hands the URL to xdg-open through a 0600 HTML file that
// redirects to it, as Jupyter does: a command-line argument would show the
// token to every local user.
func openBrowser(url string) error {
	xdg, err := exec.LookPath("xdg-open")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp("", "esbx-ui-*.html")
	if err != nil {
		return err
	}
	page := `<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url=` + url +
		`"><title>Ephemeral Sandbox</title><p><a href="` + url + `">Open the Ephemeral Sandbox console</a></p>`
	if _, err := f.WriteString(page); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	cmd := exec.Command(xdg, f.Name())
	if err := cmd.Start(); err != nil {
		os.Remove(f.Name())
		return err
	}
	go func() {
		_ = cmd.Wait()
	}()
	// The browser reads the file after xdg-open returns; give it a moment
	// before removing it.
	time.Sleep(2 * time.Second)
	os.Remove(f.Name())
	return nil
}
