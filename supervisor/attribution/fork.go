package attribution

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
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
//   - every stored checkpoint is shared (hard links: checkpoint files are
//     only ever replaced), its index entry naming the session that wrote
//     its unmarked lines (from, or the source of an earlier fork); the
//     fork's own checkpoints of the file then store the marks per line;
//   - the index's stat identities are moved to the copies where the
//     source's file is still the one checkpointed, so the fork's next
//     checkpoint does not re-read every copied file;
//   - what the source wrote since its last checkpoint (running is its
//     running commands, frozen) is checkpointed in the fork as the
//     source's, with a FUSE session's pending write ranges;
//   - the fork's file activity starts from its upper dir as copied: its
//     records are what happens in the fork afterwards (the source's
//     records stay under the source's ID).
//
// Call it with from quiescent (no command writes its upper) and into's
// holder not started; into.Base must be set. On error into's attribution may be partial; the
// caller discards the new session.
func (t *Tracker) Fork(ctx context.Context, from Workspace, running []string, to *Tracker, into Workspace) error {
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
	// One walk of the copy gives both the fork's activity state and the
	// identities of its files.
	state, ids := map[string]upperState{}, map[string]ckIdentity{}
	err = dst.Walk(ctx, func(rel string, fi fs.FileInfo) error {
		if isStagingName(fi.Name()) || rel == fuseStagingDir {
			if fi.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if u, ok := upperStateOf(dst, rel, fi); ok {
			state[rel] = u
		}
		if st, ok := fi.Sys().(*unix.Stat_t); ok && fi.Mode().IsRegular() {
			ids[rel] = identityOf(st)
		}
		return nil
	})
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("fork attribution: %w", err)
	}
	var agent string
	if from.Agent != nil {
		agent = *from.Agent
	}
	idx := t.cachedIndex(srcDir)
	out := &ckIndex{V: 1, Files: make(map[string]*ckEntry, len(idx.Files))}
	packs := map[string]error{} // linked already, and how
	for p, e := range idx.Files {
		ne := *e
		if e.State == ckStored {
			// Checkpoint files and packs are replaced by rename, never
			// written in place: both sessions can share them.
			var err error
			if e.Pack != "" {
				var done bool
				if err, done = packs[e.Pack]; !done {
					err = os.Link(filepath.Join(srcDir, e.Pack), filepath.Join(dstDir, e.Pack))
					packs[e.Pack] = err
				}
			} else {
				err = linkCheckpoint(srcDir, dstDir, e.Key)
			}
			if err != nil {
				// Only attribution is lost: the fork's next checkpoint of p
				// diffs it against the base.
				from.Log.Warn("attribution.fork_failed", "workspace_session_id", into.ID, "path", p, "err", err)
				continue
			}
			if ne.Sess == "" { // else an earlier fork's lines, still unwritten here
				ne.Sess, ne.Agent = from.ID, agent
			}
		}
		// The copy's identity where the source's file is still the one
		// checkpointed; else the fork re-reads it (as the source would).
		if cur, ok := ids[p]; ok && e.ckIdentity != (ckIdentity{}) && identityAt(src, p) == e.ckIdentity {
			ne.ckIdentity = cur
		}
		out.Files[p] = &ne
	}
	to.mu.Lock()
	err = to.saveIndex(dstDir, out)
	to.mu.Unlock()
	if err != nil {
		return fmt.Errorf("fork attribution: %w", err)
	}
	var ranges map[string][]writeRange
	if fa := t.fuse; fa != nil {
		fa.mu.Lock()
		ranges = make(map[string][]writeRange, len(fa.ranges))
		for p, rs := range fa.ranges {
			ranges[p] = slices.Clone(rs)
		}
		fa.mu.Unlock()
	}
	// What the source wrote since its last checkpoint (its running
	// commands' writes so far) is the source's: checkpointed now in the
	// fork, credited to the one running command (approximately: it may be
	// another writer's), else to none, and to the FUSE ranges' writers.
	line := ckLine{Approx: len(running) > 0, Sess: from.ID, Agent: agent}
	if len(running) == 1 {
		line.Cmd = running[0]
	}
	to.checkpointWith(ctx, into, line, ranges, false, nil)
	// The fork's file activity starts from the copy: its first capture
	// reports only what the fork changes.
	to.actMu.Lock()
	defer to.actMu.Unlock()
	b, err := json.Marshal(state)
	if err == nil {
		err = writeFileAtomic(filepath.Join(into.Dir, activityStateName), b)
	}
	if err != nil {
		return fmt.Errorf("fork file activity: %w", err)
	}
	return nil
}

// linkCheckpoint links the stored checkpoint key of srcDir into dstDir.
func linkCheckpoint(srcDir, dstDir, key string) error {
	for _, ext := range []string{".json", ".txt"} {
		if err := os.Link(filepath.Join(srcDir, key+ext), filepath.Join(dstDir, key+ext)); err != nil {
			return err
		}
	}
	return nil
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
