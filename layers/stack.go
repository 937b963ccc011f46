package layers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Stack is one sandbox's LayerStack rooted at a directory
// (sandboxes/<id>/layerstack). It is safe for concurrent use; publications
// serialize on the writer flock, also across processes.
type Stack struct {
	dir string
	sem chan struct{} // in-process writer gate, taken before the flock

	mu     sync.Mutex
	leases map[string]*Lease

	// hook, when set by tests, is consulted at each publish step.
	hook func(publishStep) hookAction
	// syncHook, when set by tests, is consulted at each SyncUpper step;
	// true simulates a crash there (return at once, no cleanup).
	syncHook func(syncStep) bool
}

func newStack(dir string) *Stack {
	return &Stack{dir: dir, sem: make(chan struct{}, 1), leases: make(map[string]*Lease)}
}

// Open opens the LayerStack at dir. The directory must exist; manifest.json,
// when present, must parse (schema_version 1). A missing manifest is version 0
// without layers.
func Open(dir string) (*Stack, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open layer stack %s: %w", dir, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("open layer stack: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("open layer stack %s: not a directory", abs)
	}
	if _, _, err := readManifest(abs); err != nil {
		return nil, fmt.Errorf("open layer stack: %w", err)
	}
	return newStack(abs), nil
}

// Dir is the absolute layerstack directory.
func (s *Stack) Dir() string { return s.dir }

// Head re-reads manifest.json (version 0 without layers when it is missing).
func (s *Stack) Head() (Manifest, error) {
	m, _, err := readManifest(s.dir)
	return m, err
}

// LayerDir is the absolute directory of a layer of this stack.
func (s *Stack) LayerDir(ref LayerRef) string {
	return filepath.Join(s.dir, filepath.FromSlash(ref.Path))
}

// LayerDirs returns the absolute layer directories of m, newest first (the
// order of an overlay lowerdir list).
func (s *Stack) LayerDirs(m Manifest) []string {
	out := make([]string, len(m.Layers))
	for i, l := range m.Layers {
		out[i] = s.LayerDir(l)
	}
	return out
}

// StoredDigest reads .layer-metadata/<id>.digest (layer digest of an L layer,
// base root hash of the base).
func (s *Stack) StoredDigest(layerID string) (string, error) {
	if err := validLayerID(layerID); err != nil {
		return "", fmt.Errorf("read digest: %w", err)
	}
	data, err := os.ReadFile(filepath.Join(s.dir, metaDirName, layerID+digestSuffix))
	if err != nil {
		return "", fmt.Errorf("read digest of %s: %w", layerID, err)
	}
	return strings.TrimSpace(string(data)), nil
}

// StoredBytes reads .layer-metadata/<id>.bytes (published payload bytes).
func (s *Stack) StoredBytes(layerID string) (int64, error) {
	if err := validLayerID(layerID); err != nil {
		return 0, fmt.Errorf("read bytes: %w", err)
	}
	data, err := os.ReadFile(filepath.Join(s.dir, metaDirName, layerID+bytesSuffix))
	if err != nil {
		return 0, fmt.Errorf("read bytes of %s: %w", layerID, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read bytes of %s: %w", layerID, err)
	}
	return n, nil
}

// Workspace reads workspace.json.
func (s *Stack) Workspace() (WorkspaceInfo, error) {
	var w WorkspaceInfo
	data, err := os.ReadFile(filepath.Join(s.dir, workspaceName))
	if err != nil {
		return w, fmt.Errorf("read workspace.json: %w", err)
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return w, fmt.Errorf("parse %s: %w", filepath.Join(s.dir, workspaceName), err)
	}
	return w, nil
}

// Remove deletes the whole stack directory (destroy_sandbox). In-memory
// leases are forgotten.
func (s *Stack) Remove() error {
	s.mu.Lock()
	for id, l := range s.leases {
		l.released = true
		delete(s.leases, id)
	}
	s.mu.Unlock()
	if err := forceRemoveAll(s.dir); err != nil {
		return fmt.Errorf("remove layer stack: %w", err)
	}
	return nil
}

// lockWriter takes the exclusive writer lock: the in-process gate, then the
// flock on .storage-writer.lock, waiting until ctx is done.
func (s *Stack) lockWriter(ctx context.Context) (unlock func(), err error) {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for writer lock: %w", ctx.Err())
	}
	release := func() { <-s.sem }
	f, err := os.OpenFile(filepath.Join(s.dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		release()
		return nil, fmt.Errorf("open writer lock: %w", err)
	}
	fd := int(f.Fd())
	delay := time.Millisecond
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			release()
			return nil, fmt.Errorf("flock %s: %w", f.Name(), err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			release()
			return nil, fmt.Errorf("wait for writer lock: %w", ctx.Err())
		case <-t.C:
		}
		delay = min(delay*2, 50*time.Millisecond)
	}
	return func() {
		_ = unix.Flock(fd, unix.LOCK_UN)
		f.Close()
		release()
	}, nil
}
