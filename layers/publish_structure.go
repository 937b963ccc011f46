package layers

import (
	"context"
	"fmt"
)

// ancestorsMoved reports whether an ancestor of path that the session does
// not change itself is no longer the directory the session wrote into: a
// directory in base that head deleted or replaced, or a non-directory in head
// (the change would silently replace head's entry). Ancestors at or above a
// changed ancestor are that change's business.
func (p *planner) ancestorsMoved(path string) (bool, error) {
	for a := parentOf(path); a != ""; a = parentOf(a) {
		if p.changed[a] {
			return false, nil
		}
		k, ok := p.dirCache[a]
		if !ok {
			b, err := p.stat(p.bv, a, false)
			if err != nil {
				return false, err
			}
			h, err := p.stat(p.hv, a, false)
			if err != nil {
				return false, err
			}
			k = [2]EntryKind{b.kind(), h.kind()}
			p.dirCache[a] = k
		}
		bk, hk := k[0], k[1]
		if (hk != "" && hk != KindDir) || (hk == "" && bk == KindDir) {
			return true, nil
		}
	}
	return false, nil
}

// subtreeDiffers is the structural check of §9.5: whether any visible
// descendant of path in base ∪ head has different fingerprints (overflow:
// more than the expansion limit).
func (p *planner) subtreeDiffers(path string, b, h side) (diff, overflow bool, err error) {
	bw := walkResult{}
	if b.kind() == KindDir {
		if bw, err = p.baseWalk(path); err != nil {
			return false, false, err
		}
	}
	hw := walkResult{}
	if h.kind() == KindDir {
		if hw, err = walkView(p.ctx, p.hv, path, p.opt.ExpansionLimit); err != nil {
			return false, false, err
		}
	}
	if bw.overflow || hw.overflow {
		return false, true, nil
	}
	union := make(map[string][2]*Entry, len(bw.entries)+len(hw.entries))
	for i := range bw.entries {
		d := &bw.entries[i]
		union[d.Path] = [2]*Entry{d, nil}
	}
	for i := range hw.entries {
		d := &hw.entries[i]
		u := union[d.Path]
		u[1] = d
		union[d.Path] = u
	}
	if len(union) > p.opt.ExpansionLimit {
		return false, true, nil
	}
	for _, u := range union {
		if u[0] == nil || u[1] == nil {
			diff = true
			continue
		}
		same, err := sameEntry(*u[0], *u[1])
		if err != nil {
			return false, false, err
		}
		if !same {
			diff = true
		}
	}
	return diff, false, nil
}

func (p *planner) baseWalk(path string) (walkResult, error) {
	if w, ok := p.baseWalks[path]; ok {
		return w, nil
	}
	w, err := walkView(p.ctx, p.bv, path, p.opt.ExpansionLimit)
	if err != nil {
		return walkResult{}, err
	}
	p.baseWalks[path] = w
	return w, nil
}

// walkView lists the visible descendants of dir (pre-order, sorted), at most
// limit of them (overflow when there are more).
func walkView(ctx context.Context, v *View, dir string, limit int) (walkResult, error) {
	var w walkResult
	var rec func(d string) error
	rec = func(d string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		es, err := v.ReadDir(d)
		if err != nil {
			return err
		}
		for _, e := range es {
			if len(w.entries) == limit {
				w.overflow = true
				return nil
			}
			w.entries = append(w.entries, e)
			if e.Kind == KindDir {
				if err := rec(e.Path); err != nil || w.overflow {
					return err
				}
			}
		}
		return nil
	}
	if err := rec(dir); err != nil {
		return walkResult{}, fmt.Errorf("publish: expand %q: %w", dir, err)
	}
	return w, nil
}

// sameEntry compares the fingerprints of two visible entries.
func sameEntry(a, b Entry) (bool, error) {
	if a.Kind != b.Kind {
		return false, nil
	}
	switch a.Kind {
	case KindDir:
		return true, nil
	case KindSymlink:
		return a.Target == b.Target, nil
	case KindFile:
		if a.HostPath == b.HostPath {
			return true, nil
		}
		if a.Size != b.Size || (a.Mode&0o111 != 0) != (b.Mode&0o111 != 0) {
			return false, nil
		}
		x, err := hashHostFile(a.HostPath)
		if err != nil {
			return false, err
		}
		y, err := hashHostFile(b.HostPath)
		if err != nil {
			return false, err
		}
		return x == y, nil
	}
	return a.HostPath == b.HostPath, nil
}
