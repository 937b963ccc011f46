package supervisor

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

	"github.com/ephemeral-ai-lab/sandbox/nsholder"
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
}

// fuseAttr is a FUSE session's pending write ranges.
type fuseAttr struct {
	mu     sync.Mutex
	ranges map[string][]writeRange
}

func (ss *session) fuseState() *fuseAttr {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.fuse == nil {
		ss.fuse = &fuseAttr{ranges: map[string][]writeRange{}}
	}
	return ss.fuse
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
		fa.ranges[to] = rs // the destination's content is now the source's
	}
}

func (fa *fuseAttr) drop(p string) {
	fa.mu.Lock()
	delete(fa.ranges, p)
	fa.mu.Unlock()
}

// rangeWriter returns the writer of the latest range overlapping span.
func rangeWriter(rs []writeRange, span [2]int64) (string, bool) {
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i]
		if r.off < span[1] && span[0] < r.end {
			return r.cmd, r.cmd != ""
		}
	}
	return "", false
}

// lineSpans returns the byte range [start, end) of each text line of b
// (end includes its newline), or nil when they cannot be matched with
// textLines (lone CR line ends).
func lineSpans(b []byte) [][2]int64 {
	var out [][2]int64
	start := int64(0)
	for i, c := range b {
		if c == '\n' {
			out = append(out, [2]int64{start, int64(i) + 1})
			start = int64(i) + 1
		}
	}
	if start < int64(len(b)) {
		out = append(out, [2]int64{start, int64(len(b))})
	}
	if len(out) != len(textLines(b)) {
		return nil
	}
	return out
}

// fuseNotices applies notices of a FUSE session's holder, in order: every
// record is stored and its ranges kept, then the checkpoints they call for
// are taken, consecutive ones of one command in one pass.
func (s *Supervisor) fuseNotices(sb *sandbox, ss *session, ns []*nsholder.FSNotice) {
	ctx := context.Background()
	fa := ss.fuseState()
	var acts []activityRecord
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
			a := activityRecord{TS: at.UTC().Format("2006-01-02T15:04:05.000Z"), WorkspaceSessionID: ss.id(),
				Op: r.Op, Path: r.Path, NewPath: r.NewPath, Source: "fuse", at: at}
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
	s.recordActivity(ctx, sb, acts)
	for i := 0; i < len(cks); {
		j, seen := i, map[string]bool{}
		var paths []string
		// One pass per run of one command; a path twice in a run (written,
		// renamed away) ends the run so the order of its checkpoints holds.
		for ; j < len(cks) && cks[j].cmd == cks[i].cmd && !seen[cks[j].path]; j++ {
			seen[cks[j].path] = true
			paths = append(paths, cks[j].path)
		}
		s.fuseCheckpoint(ctx, sb, ss, cks[i].cmd, paths)
		i = j
	}
}

// isStagingPath: the FUSE overlay's own staging (never reported).
func isStagingPath(p string) bool {
	return p == fuseStagingDir || strings.HasPrefix(p, fuseStagingDir+"/")
}

// fuseCheckpoint checkpoints paths (nil: every path with pending ranges)
// crediting uncovered new lines to cmd as a guess.
func (s *Supervisor) fuseCheckpoint(ctx context.Context, sb *sandbox, ss *session, cmd string, paths []string) {
	s.fuseCheckpointSave(ctx, sb, ss, cmd, paths, true)
}

// fuseCheckpointSave is fuseCheckpoint; deferIndex false writes the index
// now (command end).
func (s *Supervisor) fuseCheckpointSave(ctx context.Context, sb *sandbox, ss *session, cmd string, paths []string, deferIndex bool) {
	fa := ss.fuseState()
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
			ss.attrMu.Lock()
			if ss.attrDirty && ss.attrIdx != nil {
				if err := ss.saveIndex(attrDir(ss), ss.attrIdx); err != nil {
					s.log.Warn("attribution.checkpoint_failed", "workspace_session_id", ss.id(), "err", err)
				}
			}
			ss.attrMu.Unlock()
		}
		return
	}
	s.checkpointWith(ctx, sb, ss, ckLine{Cmd: cmd, Guess: true}, ranges, deferIndex, paths...)
}

// fuseCommandEnd is the command-end checkpoint of a FUSE session: the
// holder flushed the command's records before Done, so every path written
// since its last checkpoint has ranges here.
func (s *Supervisor) fuseCommandEnd(sb *sandbox, ss *session, cmd string) {
	s.fuseCheckpointSave(context.Background(), sb, ss, cmd, nil, false)
}
