package layers

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
)

func (s *Stack) dryRun(ctx context.Context, base Manifest, cs *Changeset, opt PublishOptions) (*Plan, PublishResult, error) {
	head, err := s.Head()
	if err != nil {
		return nil, PublishResult{}, fmt.Errorf("publish dry run: %w", err)
	}
	lease := s.AcquireAt(head, "publish-dry-run")
	defer func() { _, _ = lease.Release() }()
	hv := s.View(head)
	pr, err := s.plan(ctx, base, head, hv, cs, opt)
	if err != nil {
		return nil, PublishResult{}, err
	}
	res := PublishResult{Revision: head.Revision()}
	if pr.plan.Rejection != nil {
		return pr.plan, res, nil
	}
	noop := len(pr.layer) == 0
	if !noop {
		if noop, err = s.wouldBeNoOp(head, hv, pr.layer); err != nil {
			return nil, PublishResult{}, fmt.Errorf("publish dry run: %w", err)
		}
	}
	res.NoOp = noop
	pr.plan.WouldCommit = !noop
	return pr.plan, res, nil
}

// wouldBeNoOp predicts commit's no-op test (§8.3) for a dry run: the layer
// would have the head layer's stored digest and exactly its modes.
func (s *Stack) wouldBeNoOp(head Manifest, v *View, changes []Change) (bool, error) {
	if len(head.Layers) == 0 {
		return false, nil
	}
	ref := head.Layers[0]
	have, err := layerModes(s.LayerDir(ref))
	if err != nil {
		return false, err
	}
	want, err := simulateModes(v, changes)
	if err != nil {
		return false, err
	}
	if len(have) != len(want) {
		return false, nil
	}
	for p, m := range want {
		if hm, ok := have[p]; !ok || hm != m {
			return false, nil
		}
	}
	stored, err := s.StoredDigest(ref.LayerID)
	if err != nil {
		return false, nil
	}
	digest, err := ComputeLayerDigest(changes)
	if err != nil {
		return false, err
	}
	return digest == stored, nil
}

// simulateModes is the modes map layerBuilder would record for changes on v.
func simulateModes(v *View, changes []Change) (map[string]fs.FileMode, error) {
	built := map[string]bool{"": true}
	modes := make(map[string]fs.FileMode)
	var ensure func(rel string) error
	ensure = func(rel string) error {
		if built[rel] {
			return nil
		}
		if err := ensure(parentOf(rel)); err != nil {
			return err
		}
		mode := fs.FileMode(0o755)
		e, err := v.Lstat(rel)
		switch {
		case err == nil && e.Kind == KindDir:
			mode = dirMode(e.Mode)
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return err
		}
		built[rel] = true
		modes[rel] = fs.ModeDir | mode
		return nil
	}
	for _, c := range aggregateChanges(changes) {
		if err := ensure(parentOf(c.Path)); err != nil {
			return nil, err
		}
		built[c.Path] = true
		switch c.Kind {
		case ChangeWrite:
			modes[c.Path] = c.Mode.Perm()
		case ChangeDirectory, ChangeOpaqueDir:
			modes[c.Path] = fs.ModeDir | dirMode(c.Mode)
		}
	}
	return modes, nil
}
