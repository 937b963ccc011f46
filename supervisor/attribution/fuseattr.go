package attribution

// Live attribution and file activity of FUSE sessions (§11.3 fuse, §11.4
// fuse). The holder reports the overlay's provenance records and every
// released written handle as Event.FS notices, in order with the command
// events (a command's records precede its Exited and Done). Here:
//
//   - every record is stored as a file_activity record (source fuse);
//   - write records are kept per path (writeRange: command, offset,
//     length) until that path's next checkpoint, so a checkpoint credits
//     each new line to the command whose write covered it; lines no range
//     covers go to the releasing (or ending) command as a guess, which a
//     later range re-attributes (two commands writing one file: the first
//     release may come before the second writer's records);
//   - a released written handle checkpoints its path with its owner;
//   - a rename checkpoints the destination with the renaming command: the
//     diff is against the destination's previous content, so a save through
//     a temporary file and rename credits only the lines that changed
//     (the temporary file's ranges move with it);
//   - an unlink drops the path's ranges and checkpoint;
//   - at command end every path with ranges not yet checkpointed is.

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// Bounds of the pending write ranges of one session.
const (
	fuseMaxRangesPerPath = 1024
	fuseMaxPaths         = 10000
)

// writeRange is one coalesced write of a command.
type writeRange struct {
	cmd      string
	off, end int64
	// moved: written to another path that was then renamed onto this one
	// (a save through a temporary file). Such a range says who wrote the
	// bytes of the copy, not who first wrote a line the diff keeps, so it
	// credits new lines only (checkpointer.visit).
	moved bool
}

// fuseAttr is a FUSE session's pending write ranges.
type fuseAttr struct {
	mu     sync.Mutex
	ranges map[string][]writeRange
}

func (t *Tracker) fuseState() *fuseAttr {
	t.fuseMu.Lock()
	defer t.fuseMu.Unlock()
	if t.fuse == nil {
		t.fuse = &fuseAttr{ranges: map[string][]writeRange{}}
	}
	return t.fuse
}

func (fa *fuseAttr) add(p string, r writeRange) {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	rs, ok := fa.ranges[p]
	if !ok && len(fa.ranges) >= fuseMaxPaths {
		return // beyond the bound the path's new lines go to the releasing command
	}
	if n := len(rs); n > 0 && rs[n-1].cmd == r.cmd && rs[n-1].end == r.off {
		rs[n-1].end = r.end // an append continuing the previous one
	} else {
		rs = append(rs, r)
		if len(rs) > fuseMaxRangesPerPath {
			rs = rs[len(rs)-fuseMaxRangesPerPath:]
		}
	}
	fa.ranges[p] = rs
}

// take removes and returns the ranges of the given paths (nil: all paths).
func (fa *fuseAttr) take(paths []string) map[string][]writeRange {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	out := map[string][]writeRange{}
	if paths == nil {
		out, fa.ranges = fa.ranges, map[string][]writeRange{}
		return out
	}
	for _, p := range paths {
		if rs, ok := fa.ranges[p]; ok {
			out[p] = rs
			delete(fa.ranges, p)
		}
	}
	return out
}

func (fa *fuseAttr) move(from, to string) {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	if rs, ok := fa.ranges[from]; ok {
		delete(fa.ranges, from)
		for i := range rs {
			rs[i].moved = true
		}
		fa.ranges[to] = rs // the destination's content is now the source's
	}
}

func (fa *fuseAttr) drop(p string) {
	fa.mu.Lock()
	delete(fa.ranges, p)
	fa.mu.Unlock()
}

// rangeWriter returns the writer of the latest range overlapping span;
// inPlace considers only ranges written to the path itself (not moved).
func rangeWriter(rs []writeRange, span [2]int64, inPlace bool) (string, bool) {
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i]
		if inPlace && r.moved {
			continue
		}
		if r.off < span[1] && span[0] < r.end {
			return r.cmd, r.cmd != ""
		}
	}
	return "", false
}

// lineSpans returns the byte range [start, end) of each line of b (end
// includes its terminator), by the one line rule (layers.SplitLines).
func lineSpans(b []byte) [][2]int64 {
	var out [][2]int64
	start := int64(0)
	for _, l := range layers.SplitLines(b) {
		out = append(out, [2]int64{start, start + int64(len(l))})
		start += int64(len(l))
	}
	return out
}

// FSNotice is what the holder reports of a FUSE session (nsholder.FSNotice
// as plain values): provenance records and released written handles.
type FSNotice struct {
	Records  []FSRecord
	Released []FSReleased
}

// FSRecord is one provenance record of the FUSE overlay.
type FSRecord struct {
	TimeUnixNs     int64
	Command, Op    string
	Path, NewPath  string
	Offset, Length int64
}

// FSReleased says a handle that wrote Path was released; Command owned it.
type FSReleased struct{ Path, Command string }

// FuseNotices applies notices of a FUSE session's holder, in order: every
// record is stored and its ranges kept, then the checkpoints they call for
// are taken, consecutive ones of one command in one pass. record stores
// the file_activity records before any checkpoint.
func (t *Tracker) FuseNotices(ctx context.Context, w Workspace, ns []FSNotice, record func([]ActivityRecord)) {
	fa := t.fuseState()
	var acts []ActivityRecord
	type ck struct {
		path, cmd string
	}
	var cks []ck
	for _, n := range ns {
		for _, r := range n.Records {
			if isStagingPath(r.Path) && (r.NewPath == "" || isStagingPath(r.NewPath)) {
				continue
			}
			at := time.Unix(0, r.TimeUnixNs)
			a := ActivityRecord{TS: at.UTC().Format("2006-01-02T15:04:05.000Z"), WorkspaceSessionID: w.ID,
				Op: r.Op, Path: r.Path, NewPath: r.NewPath, Source: "fuse", At: at}
			if r.Command != "" {
				cmd := r.Command
				a.CommandSessionID = &cmd
			}
			switch r.Op {
			case "write":
				off, length := r.Offset, r.Length
				a.Offset, a.Length = &off, &length
				fa.add(r.Path, writeRange{cmd: r.Command, off: r.Offset, end: r.Offset + r.Length})
			case "truncate":
				off := r.Offset
				a.Offset = &off
			case "rename":
				fa.move(r.Path, r.NewPath)
				cks = append(cks, ck{r.Path, r.Command}, ck{r.NewPath, r.Command})
			case "unlink":
				fa.drop(r.Path)
				cks = append(cks, ck{r.Path, r.Command})
			}
			if isStagingPath(r.Path) && r.Op == "rename" {
				// A staged file renamed into place: report the target only.
				a.Op, a.Path, a.NewPath = "create", r.NewPath, ""
			}
			acts = append(acts, a)
		}
		for _, r := range n.Released {
			cks = append(cks, ck{r.Path, r.Command})
		}
	}
	record(acts)
	for i := 0; i < len(cks); {
		j, seen := i, map[string]bool{}
		var paths []string
		// One pass per run of one command; a path twice in a run (written,
		// renamed away) ends the run so the order of its checkpoints holds.
		for ; j < len(cks) && cks[j].cmd == cks[i].cmd && !seen[cks[j].path]; j++ {
			seen[cks[j].path] = true
			paths = append(paths, cks[j].path)
		}
		t.fuseCheckpoint(ctx, w, cks[i].cmd, paths)
		i = j
	}
}

// isStagingPath: the FUSE overlay's own staging (never reported).
func isStagingPath(p string) bool {
	return p == fuseStagingDir || strings.HasPrefix(p, fuseStagingDir+"/")
}

// fuseCheckpoint checkpoints paths (nil: every path with pending ranges)
// crediting uncovered new lines to cmd as a guess.
func (t *Tracker) fuseCheckpoint(ctx context.Context, w Workspace, cmd string, paths []string) {
	t.fuseCheckpointSave(ctx, w, cmd, paths, true)
}

// fuseCheckpointSave is fuseCheckpoint; deferIndex false writes the index
// now (command end).
func (t *Tracker) fuseCheckpointSave(ctx context.Context, w Workspace, cmd string, paths []string, deferIndex bool) {
	fa := t.fuseState()
	ranges := fa.take(paths)
	if paths == nil {
		for p := range ranges {
			paths = append(paths, p)
		}
		sort.Strings(paths)
	}
	if len(paths) == 0 {
		// Nothing to examine (no paths means a whole-upper walk to
		// checkpointWith); only a deferred index may be due.
		if !deferIndex {
			t.mu.Lock()
			if t.dirty && t.idx != nil {
				if err := t.saveIndex(attrDir(w), t.idx); err != nil {
					w.Log.Warn("attribution.checkpoint_failed", "workspace_session_id", w.ID, "err", err)
				}
			}
			t.mu.Unlock()
		}
		return
	}
	t.checkpointWith(ctx, w, ckLine{Cmd: cmd, Guess: true}, ranges, deferIndex, nil, paths...)
}

// FuseCommandEnd is the command-end checkpoint of a FUSE session: the
// holder flushed the command's records before Done, so every path written
// since its last checkpoint has ranges here.
func (t *Tracker) FuseCommandEnd(ctx context.Context, w Workspace, cmd string) {
	t.fuseCheckpointSave(ctx, w, cmd, nil, false)
}
