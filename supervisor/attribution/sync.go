package attribution

// A session's attribution across a sync (issue #19): the upper dir is
// replaced by a rebuilt one over a newer base. Blame of the session view
// takes a path's base lines from the (new) base's audit and the others
// from the checkpoints, so what has to follow the sync is:
//
//   - checkpoints of paths no longer in the upper (the head's version
//     shows) are dropped;
//   - a merged path's checkpoint is rewritten for the merged content: lines
//     the session had keep their writers, lines that come from the head are
//     marked as base lines (the head's owners show through);
//   - the file activity capture state follows the new upper's inodes, so
//     the next capture reports what the session changes afterwards, not the
//     rebuilt files or the head's contribution.

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// Synced moves the tracker onto the session's new upper dir after a sync.
// w carries the new base; merged lists the paths whose new content is a
// 3-way merge (layers.CommittedFile.Merged). Best effort: a failure only
// loses attribution.
func (t *Tracker) Synced(ctx context.Context, w Workspace, merged map[string]bool) {
	root, err := layers.OpenRoot(w.Upper)
	if err != nil {
		return
	}
	defer root.Close()
	t.syncCheckpoints(w, root, merged)
	t.syncActivity(ctx, w, root, merged)
	fa := t.fuseState()
	fa.mu.Lock()
	for p := range fa.ranges {
		if merged[p] {
			delete(fa.ranges, p) // offsets of the session's bytes, not of the merge
		}
	}
	fa.mu.Unlock()
}

func (t *Tracker) syncCheckpoints(w Workspace, root *layers.Root, merged map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	dir := attrDir(w)
	if _, err := os.Stat(dir); err != nil {
		return
	}
	idx := t.cachedIndex(dir)
	changed := false
	for p, e := range idx.Files {
		content, st, ok := readUpperFile(root, p)
		if !ok {
			dropCheckpoint(dir, e)
			delete(idx.Files, p)
			changed = true
			continue
		}
		if !merged[p] {
			continue // the session's own file, carried as is
		}
		next := &ckEntry{State: ckNonText, Digest: ContentDigest(content), ckIdentity: identityOf(st)}
		if IsText(content) {
			if lines := mergedLines(dir, e, w.Base, p, content); lines != nil {
				key := ckKey(p)
				meta, err := json.Marshal(ckFile{V: 1, Path: p, Digest: next.Digest, Lines: encodeRuns(lines)})
				if err == nil {
					err = writeFileAtomic(filepath.Join(dir, key+".txt"), content)
				}
				if err == nil {
					err = writeFileAtomic(filepath.Join(dir, key+".json"), meta)
				}
				if err == nil {
					next.State, next.Key, next.Bytes = ckStored, key, int64(len(content))
				}
			}
		}
		if next.Key == "" {
			dropCheckpoint(dir, e)
		}
		idx.Files[p] = next
		changed = true
	}
	if changed {
		if err := t.saveIndex(dir, idx); err != nil {
			w.Log.Warn("attribution.sync_failed", "workspace_session_id", w.ID, "err", err)
		}
	}
}

// mergedLines attributes the lines of a merge: a line of the head's
// version (the new base) is a base line, a line of the session's
// checkpointed version keeps its writer, any other line has no known
// writer. nil when the session's version has no checkpoint.
func mergedLines(dir string, e *ckEntry, base *layers.View, p string, content []byte) []ckLine {
	prevLines, prevContent, ok := loadCheckpoint(dir, e)
	if !ok {
		return nil
	}
	var head []byte
	if base != nil {
		if b, err := base.ReadFile(p); err == nil && IsText(b) {
			head = b
		}
	}
	fromHead := lineOrigins(head, content)
	fromSession := lineOrigins(prevContent, content)
	lines := make([]ckLine, len(fromHead))
	for i := range lines {
		switch {
		case i < len(fromSession) && fromSession[i] >= 0 && fromSession[i] < len(prevLines) && !prevLines[fromSession[i]].Base:
			lines[i] = prevLines[fromSession[i]]
		case fromHead[i] >= 0:
			lines[i] = ckLine{Base: true}
		case i < len(fromSession) && fromSession[i] >= 0 && fromSession[i] < len(prevLines):
			lines[i] = prevLines[fromSession[i]]
		}
	}
	return lines
}

// readUpperFile reads a regular file of the upper dir (no whiteout).
func readUpperFile(root *layers.Root, p string) ([]byte, *unix.Stat_t, bool) {
	f, err := root.Open(p)
	if err != nil {
		return nil, nil, false
	}
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || layers.IsUpperWhiteout(root, p, &st) {
		return nil, nil, false
	}
	if st.Size > TextMax {
		return nil, &st, true
	}
	b, err := io.ReadAll(io.LimitReader(f, TextMax+1))
	if err != nil {
		return nil, nil, false
	}
	return b, &st, true
}

// syncActivity rewrites the capture state for the new upper: an entry the
// sync carried keeps what the previous capture saw (so a change the session
// made since is still reported) with the new inode; a merged entry is taken
// as it is now (the head's part is nobody's activity in the session); an
// entry the sync removed is forgotten (the session did not delete it).
func (t *Tracker) syncActivity(ctx context.Context, w Workspace, root *layers.Root, merged map[string]bool) {
	t.actMu.Lock()
	defer t.actMu.Unlock()
	if _, err := os.Stat(filepath.Join(w.Dir, activityStateName)); err != nil {
		return // never captured (FUSE sessions, no commands yet)
	}
	prev := loadUpperState(w.Dir)
	cur := t.walkUpper(ctx, root)
	if ctx.Err() != nil {
		return
	}
	for p, c := range cur {
		if o, ok := prev[p]; ok && !merged[p] && o.Kind == c.Kind {
			o.Ino = c.Ino
			cur[p] = o
		}
	}
	if b, err := json.Marshal(cur); err == nil {
		if err := writeFileAtomic(filepath.Join(w.Dir, activityStateName), b); err != nil {
			w.Log.Warn("file_activity.state", "workspace_session_id", w.ID, "err", err)
		}
	}
}
