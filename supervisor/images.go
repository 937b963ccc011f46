package supervisor

// Image sandboxes: the glue between the handlers and package images
// (create_sandbox's image argument, list_docker_images, the image rootfs of
// a session, the command environment, health's docker entry).
//
// Decisions the contract leaves open or contradicts:
//   - list_docker_images without an Engine answers §3.2's success shape,
//     whose "error" is a string; §2.4 says a response with a top-level
//     "error" is an error. The clients (catalog.ErrorFromResponse, MCP)
//     treat only an error object as the envelope, so the operation never
//     fails because Docker is absent, as §3.2 requires.
//   - A batch (count > 1) resolves and unpacks the image once and takes one
//     cache reference per sandbox; a rolled-back create releases them all.
//   - health's docker entry is the Engine ping taken at start (§10.3: probe
//     results are the ones taken at start).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/images"
)

// dockerProbe is health's docker entry, probed once at start (§10.3).
type dockerProbe struct {
	Available bool    `json:"available"`
	Reason    *string `json:"reason"`
}

// openImages opens the image cache and pings the Docker Engine once.
func (s *Supervisor) openImages(ctx context.Context) error {
	host := ""
	if h := s.cfg.Images.DockerHost; h != nil {
		host = *h
	}
	c, err := images.Open(images.Options{
		Dir: filepath.Join(s.dirs.Data, "images"), DockerHost: images.DockerHost(host, os.Getenv),
		Pull: s.cfg.Images.Pull, MaxBytes: s.cfg.Images.CacheMaxBytes, Log: s.log,
	})
	if err != nil {
		return catalog.Errorf(catalog.ConfigError, "%v", err)
	}
	s.images = c
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := images.Ping(pctx, c.Host()); err != nil {
		reason := err.Error()
		s.docker = dockerProbe{Reason: &reason}
	} else {
		s.docker = dockerProbe{Available: true}
	}
	return nil
}

// imageError maps an image failure to the contract's kinds (§3.2).
func imageError(ie *images.Error) *catalog.Error {
	var e *catalog.Error
	switch ie.Kind {
	case images.BadInput:
		e = catalog.Errorf(catalog.InvalidRequest, "%v", ie.Err)
	case images.Unavailable:
		e = catalog.Errorf(catalog.OperationFailed, "%v", ie.Err).With("docker", "unavailable")
	default:
		e = catalog.Errorf(catalog.OperationFailed, "%v", ie.Err)
	}
	if ie.Image != "" {
		e = e.With("image", ie.Image)
	}
	return e.With("reason", ie.Reason)
}

// acquireImage resolves create_sandbox's image for a batch of count
// sandboxes: one cache reference per sandbox. It returns the image (nil
// for "host") and a release function for rollback.
func (s *Supervisor) acquireImage(c *call, image string, count int) (*images.Result, func(), error) {
	if image == "host" {
		return nil, func() {}, nil
	}
	sp := c.span.child("image.resolve", map[string]any{"image": image})
	res, err := s.images.Acquire(c.ctx, image, c.progress)
	if err != nil {
		sp.end(spanStatus(err), map[string]any{"error": err.Error()})
		return nil, nil, err
	}
	sp.end(spanCompleted, map[string]any{"image_id": res.ID})
	// The unpack span reports what the cache did; cached:true means nothing was unpacked.
	c.span.child("image.unpack", map[string]any{"image_id": res.ID, "cached": res.Cached, "layers": res.Layers,
		"bytes": res.Bytes, "export_bytes": res.ExportBytes, "skipped_devices": res.SkippedDevices}).end(spanCompleted, nil)
	for i := 1; i < count; i++ {
		s.images.Hold(res.ID)
	}
	release := func() {
		for range count {
			s.images.Release(res.ID)
		}
	}
	return res, release, nil
}

// loadImageEnv sets sb.ImageEnv from the cache (creation and recovery).
func (s *Supervisor) loadImageEnv(sb *sandbox) error {
	if sb.Rec.Rootfs == "host" {
		return nil
	}
	img, err := s.images.Lookup(sb.Rec.Rootfs)
	if err != nil {
		return fmt.Errorf("image rootfs %s: %w", sb.Rec.Rootfs, err)
	}
	sb.ImageEnv = img.Env
	return nil
}

func (s *Supervisor) listDockerImages(c *call) (any, error) {
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	list, err := images.ListEngine(ctx, s.images.Host())
	if err != nil {
		return map[string]any{"images": []string{}, "docker": "unavailable", "error": err.Error()}, nil
	}
	return map[string]any{"docker": "available", "images": list}, nil
}
