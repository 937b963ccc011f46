package layers

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Reasons a Sweep is skipped (SweepResult.SkippedReason starts with one).
const (
	SweepSkipManifestMissing    = "manifest_missing"
	SweepSkipManifestUnreadable = "manifest_unreadable"
	SweepSkipNoVersion          = "manifest_version_zero"
	SweepSkipNoLayers           = "manifest_without_layers"
)

// SweepResult reports a start-up sweep.
type SweepResult struct {
	RemovedLayerIDs       []string // layer directories and/or sidecars removed, sorted
	RemovedStagingEntries int      // entries removed from staging/
	RemovedTempFiles      int      // interrupted atomic writes (manifest, sidecars)
	SkippedReason         string   // non-empty when nothing was done
}

// Sweep is the fail-closed start-up sweep (§8.7). Only when manifest.json
// parses with version ≥ 1 and a non-empty layer list does it delete staging/*,
// leftover temp files of atomic writes, and every layer directory or sidecar
// that is neither in the manifest, nor in a persisted lease, nor in a live
// lease of this Stack; B* layers are never deleted. Otherwise it only sets
// SkippedReason. It runs under the writer lock.
func (s *Stack) Sweep(persisted [][]LayerRef) (SweepResult, error) {
	var res SweepResult
	unlock, err := s.lockWriter(context.Background())
	if err != nil {
		return res, fmt.Errorf("sweep: %w", err)
	}
	defer unlock()
	m, exists, err := readManifest(s.dir)
	switch {
	case err != nil:
		res.SkippedReason = SweepSkipManifestUnreadable + ": " + err.Error()
		return res, nil
	case !exists:
		res.SkippedReason = SweepSkipManifestMissing
		return res, nil
	case m.Version < 1:
		res.SkippedReason = SweepSkipNoVersion
		return res, nil
	case len(m.Layers) == 0:
		res.SkippedReason = SweepSkipNoLayers
		return res, nil
	}

	keep := make(map[string]bool)
	add := func(refs []LayerRef) {
		for _, r := range refs {
			keep[r.LayerID] = true
			keep[path.Base(r.Path)] = true
		}
	}
	add(m.Layers)
	for _, refs := range persisted {
		add(refs)
	}
	s.mu.Lock()
	for _, l := range s.leases {
		add(l.m.Layers)
	}
	s.mu.Unlock()

	var errs []error
	// staging/*
	if names, err := readNames(filepath.Join(s.dir, stagingDirName)); err != nil {
		errs = append(errs, err)
	} else {
		for _, n := range names {
			if err := forceRemoveAll(filepath.Join(s.dir, stagingDirName, n)); err != nil {
				errs = append(errs, err)
				continue
			}
			res.RemovedStagingEntries++
		}
	}
	removed := make(map[string]bool)
	// layers/*
	if names, err := readNames(filepath.Join(s.dir, layersDirName)); err != nil {
		errs = append(errs, err)
	} else {
		for _, n := range names {
			if keep[n] || strings.HasPrefix(n, "B") {
				continue
			}
			if err := forceRemoveAll(filepath.Join(s.dir, layersDirName, n)); err != nil {
				errs = append(errs, err)
				continue
			}
			removed[n] = true
		}
	}
	// .layer-metadata/*
	meta := filepath.Join(s.dir, metaDirName)
	if names, err := readNames(meta); err != nil {
		errs = append(errs, err)
	} else {
		for _, n := range names {
			if isTempName(n) {
				if err := os.Remove(filepath.Join(meta, n)); err != nil {
					errs = append(errs, err)
				} else {
					res.RemovedTempFiles++
				}
				continue
			}
			id, ok := strings.CutSuffix(n, digestSuffix)
			if !ok {
				id, ok = strings.CutSuffix(n, bytesSuffix)
			}
			if !ok || keep[id] || strings.HasPrefix(id, "B") {
				continue
			}
			if err := os.Remove(filepath.Join(meta, n)); err != nil {
				errs = append(errs, err)
				continue
			}
			removed[id] = true
		}
	}
	// Interrupted atomic writes of manifest.json / workspace.json.
	if names, err := readNames(s.dir); err != nil {
		errs = append(errs, err)
	} else {
		for _, n := range names {
			if strings.HasPrefix(n, "."+manifestName+tmpInfix) || strings.HasPrefix(n, "."+workspaceName+tmpInfix) {
				if err := os.Remove(filepath.Join(s.dir, n)); err != nil {
					errs = append(errs, err)
				} else {
					res.RemovedTempFiles++
				}
			}
		}
	}
	for id := range removed {
		res.RemovedLayerIDs = append(res.RemovedLayerIDs, id)
	}
	slices.Sort(res.RemovedLayerIDs)
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("sweep %s: %w", s.dir, err)
	}
	return res, nil
}

// readNames lists a directory; a missing one is empty.
func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	slices.Sort(names)
	return names, nil
}
