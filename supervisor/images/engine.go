package images

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// DockerHost resolves the Engine endpoint (§4.2, §13): images.docker_host,
// DOCKER_HOST, $XDG_RUNTIME_DIR/docker.sock, /var/run/docker.sock. The
// default sockets are used when they exist; the last one is the answer
// when none does (the error then names it).
func DockerHost(configured string, getenv func(string) string) string {
	if configured != "" {
		return configured
	}
	if h := getenv("DOCKER_HOST"); h != "" {
		return h
	}
	var socks []string
	if x := getenv("XDG_RUNTIME_DIR"); x != "" {
		socks = append(socks, filepath.Join(x, "docker.sock"))
	}
	socks = append(socks, "/var/run/docker.sock")
	for _, s := range socks {
		if st, err := os.Stat(s); err == nil && st.Mode()&fs.ModeSocket != 0 {
			return "unix://" + s
		}
	}
	return "unix://" + socks[len(socks)-1]
}

// engine is a connected Docker Engine client.
type engine struct {
	host string
	cl   *client.Client
}

// connect pings the Engine at host; any failure is Unavailable.
func connect(ctx context.Context, host, image string) (*engine, error) {
	cl, err := client.New(client.WithHost(host)) // negotiates the API version
	if err != nil {
		return nil, &Error{Kind: Unavailable, Image: image, Reason: "docker_unavailable",
			Err: fmt.Errorf("cannot use the Docker Engine at %s: %w", host, err)}
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cl.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		cl.Close()
		return nil, &Error{Kind: Unavailable, Image: image, Reason: "docker_unavailable",
			Err: fmt.Errorf("cannot reach the Docker Engine at %s: %w", host, err)}
	}
	return &engine{host: host, cl: cl}, nil
}

func (e *engine) close() { e.cl.Close() }

// resolve returns the image ID of ref, pulling it first when it is absent
// and pull is "missing".
func (e *engine) resolve(ctx context.Context, ref, pull string, progress func(string)) (string, error) {
	res, err := e.cl.ImageInspect(ctx, ref)
	if err == nil {
		return res.ID, nil
	}
	if !cerrdefs.IsNotFound(err) {
		return "", e.failure(ref, "inspect_failed", "inspect image %s: %w", ref, err)
	}
	if pull == "never" || strings.HasPrefix(ref, "sha256:") {
		return "", errorf(BadInput, ref, "image_absent", "image %s is not present on the Docker Engine at %s (images.pull is %s)", ref, e.host, pull)
	}
	progress(fmt.Sprintf("pulling %s", ref))
	pr, err := e.cl.ImagePull(ctx, ref, client.ImagePullOptions{})
	if err != nil {
		return "", e.failure(ref, "pull_failed", "pull %s: %w", ref, err)
	}
	last := time.Time{}
	for msg, err := range pr.JSONMessages(ctx) {
		if err != nil {
			return "", e.failure(ref, "pull_failed", "pull %s: %w", ref, err)
		}
		if msg.Error != nil {
			return "", errorf(Failed, ref, "pull_failed", "pull %s: %s", ref, msg.Error.Message)
		}
		if time.Since(last) >= time.Second && msg.Status != "" {
			last = time.Now()
			progress(fmt.Sprintf("pull %s: %s %s", ref, msg.ID, msg.Status))
		}
	}
	res, err = e.cl.ImageInspect(ctx, ref)
	if err != nil {
		return "", e.failure(ref, "pull_failed", "inspect %s after pull: %w", ref, err)
	}
	return res.ID, nil
}

// failure classifies an Engine error: a lost connection is Unavailable.
func (e *engine) failure(image, reason, format string, a ...any) error {
	err := fmt.Errorf(format, a...)
	if client.IsErrConnectionFailed(err) {
		return &Error{Kind: Unavailable, Image: image, Reason: "docker_unavailable", Err: err}
	}
	return &Error{Kind: Failed, Image: image, Reason: reason, Err: err}
}

// ListEngine lists every repo tag, and the ID of untagged images, sorted
// and deduplicated (list_docker_images).
func ListEngine(ctx context.Context, host string) ([]string, error) {
	e, err := connect(ctx, host, "")
	if err != nil {
		return nil, err
	}
	defer e.close()
	res, err := e.cl.ImageList(ctx, client.ImageListOptions{})
	if err != nil {
		return nil, e.failure("", "list_failed", "list images at %s: %w", host, err)
	}
	seen := map[string]bool{}
	for _, im := range res.Items {
		tagged := false
		for _, t := range im.RepoTags {
			if t != "" && t != "<none>:<none>" {
				seen[t], tagged = true, true
			}
		}
		if !tagged {
			seen[im.ID] = true
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out, nil
}

// Ping checks that a Docker Engine answers at host.
func Ping(ctx context.Context, host string) error {
	e, err := connect(ctx, host, "")
	if err != nil {
		return err
	}
	e.close()
	return nil
}
