package doctor

// The checks of services the supervisor talks to when they are there:
// Docker Engine (Docker images) and the systemd user manager (the service
// unit).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// dockerEndpoints are the Docker Engine addresses in resolution order
// (§13 images.docker_host: the configuration, DOCKER_HOST, the defaults).
func (d *doctor) dockerEndpoints() []string {
	var out []string
	if d.opt.Config != nil && d.opt.Config.Images.DockerHost != nil && *d.opt.Config.Images.DockerHost != "" {
		out = append(out, *d.opt.Config.Images.DockerHost)
	}
	if h := d.env["DOCKER_HOST"]; h != "" {
		out = append(out, h)
	}
	for _, s := range d.opt.DockerSockets {
		out = append(out, "unix://"+s)
	}
	return out
}

// pingDocker sends GET /_ping to a unix:// or plain tcp:// endpoint.
func pingDocker(ctx context.Context, endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil {
		return err
	}
	tr := &http.Transport{DisableKeepAlives: true}
	base := "http://docker"
	switch u.Scheme {
	case "unix":
		path := u.Path
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", path)
		}
	case "tcp", "http":
		base = "http://" + u.Host
	default:
		return fmt.Errorf("unsupported scheme %q", u.Scheme)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/_ping", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /_ping: %s", resp.Status)
	}
	if strings.TrimSpace(string(body)) != "OK" {
		return fmt.Errorf("GET /_ping answered %q", body)
	}
	return nil
}

func (d *doctor) checkDocker(ctx context.Context) Check {
	c := Check{ID: "docker", Required: false}
	var tried []string
	denied := false
	for _, ep := range d.dockerEndpoints() {
		err := pingDocker(ctx, ep)
		if err == nil {
			c.OK, c.Detail = true, "Docker Engine answers GET /_ping at "+ep
			return c
		}
		if errors.Is(err, fs.ErrPermission) {
			denied = true
		}
		msg := err.Error()
		if errors.Is(err, fs.ErrNotExist) {
			msg = "no such socket"
		}
		tried = append(tried, ep+": "+msg)
	}
	c.Detail = "no reachable Docker Engine (optional: only Docker images need it): " + strings.Join(tried, "; ")
	switch {
	case denied:
		c.Fix = "sudo usermod -aG docker " + d.user + " (then log in again), or use rootless Docker: dockerd-rootless-setuptool.sh install"
	default:
		c.Fix = "start Docker Engine (sudo systemctl enable --now docker) or rootless Docker (dockerd-rootless-setuptool.sh install), or set images.docker_host / DOCKER_HOST to its unix:// socket"
	}
	return c
}

func (d *doctor) checkSystemdUser(ctx context.Context) Check {
	c := Check{ID: "systemd_user", Required: false}
	fix := "sudo loginctl enable-linger " + d.user + " (starts your systemd user manager now and at every boot)"
	if x := d.env["XDG_RUNTIME_DIR"]; x != "" {
		if st, err := os.Stat(filepath.Join(x, "systemd", "private")); err == nil && st.Mode()&fs.ModeSocket != 0 {
			c.OK, c.Detail = true, "systemd user manager is running ("+filepath.Join(x, "systemd", "private")+")"
			return c
		}
	}
	systemctl, ok := d.lookPath("systemctl")
	if !ok {
		c.Detail = "systemctl not found on PATH: no systemd user manager (optional: without it `sandbox-supervisor serve` is started automatically on first CLI use)"
		c.Fix = fix
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, systemctl, "--user", "is-system-running")
	cmd.Env = d.opt.Env
	out, _ := cmd.CombinedOutput()
	state := strings.TrimSpace(string(out))
	if i := strings.IndexByte(state, '\n'); i >= 0 {
		state = state[:i]
	}
	switch state {
	case "running", "degraded", "starting", "initializing":
		c.OK, c.Detail = true, "systemd user manager is "+state
		return c
	}
	if state == "" {
		state = "no answer"
	}
	c.Detail = "no systemd user manager (systemctl --user is-system-running: " + state + "; optional: without it `sandbox-supervisor serve` is started automatically on first CLI use)"
	c.Fix = fix
	return c
}
