package attribution

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// Fork gives the tracker to of a new session (into, whose upper dir is
// already a copy of from's) t's attribution state, so the fork's blame
// and its publish keep crediting every line the source wrote to the source
// session and its commands:
//
//   - every stored checkpoint is copied, its lines not kept from the base
//     marked with the session that wrote them (from, unless a line came
//     from an earlier fork and names its own);
//   - the index's stat identities are moved to the copies where the
//     source's file is still the one checkpointed, so the fork's next
//     checkpoint does not re-read every copied file (a stale one is
//     re-read and diffed against its copied checkpoint, as in the source);
//   - a FUSE session's pending write ranges are copied with it;
//   - the fork's file activity starts from its upper dir as copied: its
//     records are what happens in the fork afterwards (the source's
//     records stay under the source's ID).
//
// Call it with from quiescent (no command writes its upper) and into's
// holder not started. On error into's attribution may be partial; the
// caller discards the new session.
func (t *Tracker) Fork(ctx context.Context, from Workspace, to *Tracker, into Workspace) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	srcDir, dstDir := attrDir(from), attrDir(into)
	if err := os.MkdirAll(dstDir, 0o700); err != nil {
		return fmt.Errorf("fork attribution: %w", err)
	}
	src, err := layers.OpenRoot(from.Upper)
	if err != nil {
		return fmt.Errorf("fork attribution: %w", err)
	}
	defer src.Close()
	dst, err := layers.OpenRoot(into.Upper)
	if err != nil {
		return fmt.Errorf("fork attribution: %w", err)
	}
	defer dst.Close()
	var agent string
	if from.Agent != nil {
		agent = *from.Agent
	}
	idx := t.cachedIndex(srcDir)
	out := &ckIndex{V: 1, Files: make(map[string]*ckEntry, len(idx.Files))}
	for p, e := range idx.Files {
		if err := ctx.Err(); err != nil {
			return err
		}
		ne := *e
		if e.State == ckStored {
			if err := forkCheckpoint(srcDir, dstDir, e, from.ID, agent); err != nil {
				// Only attribution is lost: the fork's next checkpoint of p
				// diffs it against the base.
				from.Log.Warn("attribution.fork_failed", "workspace_session_id", into.ID, "path", p, "err", err)
				continue
			}
		}
		ne.ckIdentity = movedIdentity(src, dst, p, e.ckIdentity)
		out.Files[p] = &ne
	}
	to.mu.Lock()
	err = to.saveIndex(dstDir, out)
	to.mu.Unlock()
	if err != nil {
		return fmt.Errorf("fork attribution: %w", err)
	}
	if fa := t.fuse; fa != nil {
		fa.mu.Lock()
		ranges := make(map[string][]writeRange, len(fa.ranges))
		for p, rs := range fa.ranges {
			ranges[p] = slices.Clone(rs)
		}
		fa.mu.Unlock()
		to.fuseState().ranges = ranges
	}
	return to.seedActivity(ctx, into, dst)
}

// forkCheckpoint copies the stored checkpoint e from srcDir to dstDir,
// marking the lines of the source session (sess, agent).
func forkCheckpoint(srcDir, dstDir string, e *ckEntry, sess, agent string) error {
	b, err := os.ReadFile(filepath.Join(srcDir, e.Key+".json"))
	if err != nil {
		return err
	}
	var f ckFile
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	for i := range f.Lines {
		if r := &f.Lines[i]; !r.Base && r.Sess == "" {
			r.Sess, r.Agent = sess, agent
		}
	}
	meta, err := json.Marshal(f)
	if err != nil {
		return err
	}
	// The content copy is never written in place (writeFileAtomic renames
	// over it), so both sessions may share it.
	txt := filepath.Join(dstDir, e.Key+".txt")
	if err := os.Link(filepath.Join(srcDir, e.Key+".txt"), txt); err != nil {
		content, rerr := os.ReadFile(filepath.Join(srcDir, e.Key+".txt"))
		if rerr != nil {
			return errors.Join(err, rerr)
		}
		if err := writeFileAtomic(txt, content); err != nil {
			return err
		}
	}
	return writeFileAtomic(filepath.Join(dstDir, e.Key+".json"), meta)
}

// movedIdentity is the identity of the copy of p when the source's p
// is still the file checkpointed as id, else id (the fork re-reads it).
func movedIdentity(src, dst *layers.Root, p string, id ckIdentity) ckIdentity {
	if id == (ckIdentity{}) {
		return id
	}
	if identityAt(src, p) != id {
		return id
	}
	if got := identityAt(dst, p); got != (ckIdentity{}) {
		return got
	}
	return id
}

func identityAt(root *layers.Root, p string) ckIdentity {
	fi, err := root.Lstat(p)
	if err != nil {
		return ckIdentity{}
	}
	st, ok := fi.Sys().(*unix.Stat_t)
	if !ok || !fi.Mode().IsRegular() {
		return ckIdentity{}
	}
	return identityOf(st)
}

// seedActivity remembers root (w's upper dir) as the state of w's last
// file-activity capture, so the next capture reports only what changes
// from here.
func (t *Tracker) seedActivity(ctx context.Context, w Workspace, root *layers.Root) error {
	t.actMu.Lock()
	defer t.actMu.Unlock()
	cur := walkUpper(ctx, root)
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := json.Marshal(cur)
	if err == nil {
		err = writeFileAtomic(filepath.Join(w.Dir, activityStateName), b)
	}
	if err != nil {
		return fmt.Errorf("fork file activity: %w", err)
	}
	return nil
}
