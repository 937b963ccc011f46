package attribution

// File activity (§11.4): records of what changed inside workspace sessions,
// kept in the state database's file_activity table, bounded per sandbox by
// observability.file_activity.max_records (oldest rows deleted first), and
// served by the file_activity view.
//
// Sources:
//   - fuse: the FUSE overlay's provenance records, as the holder reports
//     them (Event.FS notices); the holder's own writes are not among them.
//   - capture (kernel driver): at each checkpoint the upper directory is
//     compared with the state remembered at the previous one
//     (sessions/<id>/activity.json: kind, mode, size, mtime, inode per
//     path), and every difference becomes a record.
//   - session file operations (file_write, file_edit) are recorded by the
//     supervisor itself with their request_id, source after the driver.

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

const activitySchema = `CREATE TABLE IF NOT EXISTS file_activity (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		sandbox_id TEXT NOT NULL, session_id TEXT NOT NULL, ts_ms INTEGER NOT NULL,
		path TEXT NOT NULL, new_path TEXT NOT NULL, record TEXT NOT NULL);
	CREATE INDEX IF NOT EXISTS file_activity_by_sandbox ON file_activity (sandbox_id, seq)`

// activityMaxBytes caps one response (§10.1: 256 KiB, oldest dropped).
const activityMaxBytes = 256 << 10

// ActivityRecord is one record of §11.4.
type ActivityRecord struct {
	TS                 string  `json:"ts"`
	WorkspaceSessionID string  `json:"workspace_session_id"`
	CommandSessionID   *string `json:"command_session_id"`
	Op                 string  `json:"op"`
	Path               string  `json:"path"`
	NewPath            string  `json:"new_path,omitempty"`
	Offset             *int64  `json:"offset,omitempty"`
	Length             *int64  `json:"length,omitempty"`
	Source             string  `json:"source"`
	RequestID          string  `json:"request_id,omitempty"`

	At time.Time `json:"-"` // ts as a time: the row's ts_ms
}

// InitActivity creates the file_activity table and its index (idempotent).
func (s Store) InitActivity(ctx context.Context) error {
	if _, err := s.DB.ExecContext(ctx, activitySchema); err != nil {
		return fmt.Errorf("init file_activity table: %w", err)
	}
	return nil
}

// AppendActivity inserts records and trims the sandbox's rows to max, in
// one transaction.
func (s Store) AppendActivity(ctx context.Context, sandboxID string, recs []ActivityRecord, max int) error {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("file activity: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO file_activity(sandbox_id, session_id, ts_ms, path, new_path, record) VALUES(?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return fmt.Errorf("file activity: %w", err)
	}
	defer stmt.Close()
	for _, r := range recs {
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("file activity: encode: %w", err)
		}
		if _, err := stmt.ExecContext(ctx, sandboxID, r.WorkspaceSessionID, r.At.UnixMilli(), r.Path, r.NewPath, string(b)); err != nil {
			return fmt.Errorf("file activity: insert: %w", err)
		}
	}
	if max > 0 {
		// Rows past the newest max are deleted (the index makes the OFFSET
		// a walk of max entries, not of the table).
		if _, err := tx.ExecContext(ctx, `DELETE FROM file_activity WHERE sandbox_id = ? AND seq <= (
			SELECT seq FROM file_activity WHERE sandbox_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`, sandboxID, sandboxID, max); err != nil {
			return fmt.Errorf("file activity: trim: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("file activity: commit: %w", err)
	}
	return nil
}

// DeleteSandboxActivity removes the file_activity rows of a destroyed sandbox.
func (s Store) DeleteSandboxActivity(ctx context.Context, sandboxID string) error {
	if _, err := s.DB.ExecContext(ctx, `DELETE FROM file_activity WHERE sandbox_id = ?`, sandboxID); err != nil {
		return fmt.Errorf("delete file activity of %s: %w", sandboxID, err)
	}
	return nil
}

// ActivityQuery filters the file_activity view.
type ActivityQuery struct {
	SessionID string
	Path      string // normalized workspace path, "" = all
	SinceMs   int64  // -1 = no bound
	Limit     int
}

// QueryActivity returns the newest matching records, oldest first, and
// whether older matching ones were left out (limit or byte cap).
func (s Store) QueryActivity(ctx context.Context, sandboxID string, q ActivityQuery) ([]json.RawMessage, bool, error) {
	where, args := []string{"sandbox_id = ?"}, []any{sandboxID}
	if q.SessionID != "" {
		where, args = append(where, "session_id = ?"), append(args, q.SessionID)
	}
	if q.Path != "" {
		// Prefix by component: the path itself or anything below it, as
		// source or rename target. LIKE would treat % and _ in names as
		// wildcards, so compare the prefix with substr.
		pfx := q.Path + "/"
		where = append(where, "(path = ? OR substr(path, 1, ?) = ? OR new_path = ? OR substr(new_path, 1, ?) = ?)")
		args = append(args, q.Path, len(pfx), pfx, q.Path, len(pfx), pfx)
	}
	if q.SinceMs >= 0 {
		where, args = append(where, "ts_ms >= ?"), append(args, q.SinceMs)
	}
	args = append(args, q.Limit+1)
	rows, err := s.DB.QueryContext(ctx, `SELECT record FROM file_activity WHERE `+strings.Join(where, " AND ")+
		` ORDER BY seq DESC LIMIT ?`, args...)
	if err != nil {
		return nil, false, fmt.Errorf("file activity: %w", err)
	}
	defer rows.Close()
	var newestFirst []json.RawMessage
	truncated, bytes := false, 0
	for rows.Next() {
		var text string
		if err := rows.Scan(&text); err != nil {
			return nil, false, err
		}
		if len(newestFirst) == q.Limit || bytes+len(text)+1 > activityMaxBytes {
			truncated = true
			break
		}
		bytes += len(text) + 1
		newestFirst = append(newestFirst, json.RawMessage(text))
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	out := make([]json.RawMessage, len(newestFirst))
	for i, r := range newestFirst {
		out[len(out)-1-i] = r
	}
	return out, truncated, nil
}

// upperState is what capture remembers of one upper-dir entry.
type upperState struct {
	Kind    string `json:"k"` // file, dir, symlink, whiteout, opaque (an opaque directory)
	Mode    uint32 `json:"m,omitempty"`
	Size    int64  `json:"s,omitempty"`
	MtimeNs int64  `json:"t,omitempty"`
	Ino     uint64 `json:"i,omitempty"`
	Target  string `json:"l,omitempty"` // symlink target
}

const activityStateName = "activity.json"

func loadUpperState(dir string) map[string]upperState {
	st := map[string]upperState{}
	if b, err := os.ReadFile(filepath.Join(dir, activityStateName)); err == nil {
		_ = json.Unmarshal(b, &st)
	}
	return st
}

// fileIdentity tells whether a file was replaced or rewritten since it
// was last read: index.json and activity.json are only ever replaced by a
// rename, which gives them a new inode.
type fileIdentity struct {
	ino, size, mtimeNs int64
}

func identityOfFile(p string) (fileIdentity, bool) {
	var st unix.Stat_t
	if unix.Stat(p, &st) != nil {
		return fileIdentity{}, false
	}
	return fileIdentity{int64(st.Ino), st.Size, st.Mtim.Nano()}, true
}

// prevActivity is the capture state of w's previous capture, parsed from
// activity.json only when that file changed since this tracker last read
// or wrote it (a sync or a fork rewrites it): parsing the state of a
// session with 10,000 changed files took about 13 ms of every command.
// The map returned is the cache itself: callers must not change it. The
// caller holds t.actMu.
func (t *Tracker) prevActivity(dir string) map[string]upperState {
	id, ok := identityOfFile(filepath.Join(dir, activityStateName))
	if ok && t.act != nil && id == t.actID {
		return t.act
	}
	st := loadUpperState(dir)
	t.act, t.actID = nil, fileIdentity{}
	if ok {
		t.act, t.actID = st, id
	}
	return st
}

// saveActivity writes cur as w's capture state, unless it equals prev (a
// command that changed nothing rewrote the whole state), and caches it.
// The caller holds t.actMu.
func (t *Tracker) saveActivity(w Workspace, prev, cur map[string]upperState) {
	p := filepath.Join(w.Dir, activityStateName)
	if _, ok := identityOfFile(p); ok && maps.Equal(prev, cur) {
		return
	}
	b, err := json.Marshal(cur)
	if err == nil {
		err = writeFileAtomic(p, b)
	}
	if err != nil {
		w.Log.Warn("file_activity.state", "workspace_session_id", w.ID, "err", err)
		t.act = nil
		return
	}
	if id, ok := identityOfFile(p); ok {
		t.act, t.actID = cur, id
	}
}

// statUpper describes the upper-dir entry rel, read beneath root (the
// session controls the tree: nothing is followed); ok is false for what
// capture ignores (sockets, FIFOs, devices other than whiteouts).
func statUpper(root *layers.Root, rel string) (upperState, bool) {
	fi, err := root.Lstat(rel)
	if err != nil {
		return upperState{}, false
	}
	return upperStateOf(root, rel, fi)
}

func upperStateOf(root *layers.Root, rel string, fi fs.FileInfo) (upperState, bool) {
	st, ok := fi.Sys().(*unix.Stat_t)
	if !ok {
		return upperState{}, false
	}
	u := upperState{Mode: st.Mode & 0o7777, Size: st.Size, MtimeNs: st.Mtim.Nano(), Ino: st.Ino}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if layers.IsUpperWhiteout(root, rel, st) {
			return upperState{Kind: "whiteout"}, true
		}
		u.Kind = "file"
	case unix.S_IFDIR:
		u.Kind = "dir"
		if layers.IsUpperOpaque(root, rel) {
			u.Kind = "opaque"
		}
		u.Size, u.MtimeNs = 0, 0 // a directory's own size and mtime change with its entries
	case unix.S_IFLNK:
		u.Kind = "symlink"
		u.Target, _ = root.Readlink(rel)
		u.Mode = 0
	case unix.S_IFCHR:
		if !layers.IsWhiteout(st, nil) {
			return upperState{}, false
		}
		return upperState{Kind: "whiteout"}, true
	default:
		return upperState{}, false
	}
	return u, true
}

// walkUpper lists every entry of the upper dir (workspace-relative, slash
// separated), skipping overlay metadata and the FUSE overlay's staging.
func (t *Tracker) walkUpper(ctx context.Context, root *layers.Root) map[string]upperState {
	return upperStates(root, t.scanUpper(ctx, root))
}

// upperStates is walkUpper from a scan of the upper dir.
func upperStates(root *layers.Root, sc []scanEntry) map[string]upperState {
	out := make(map[string]upperState, len(sc))
	for _, e := range sc {
		if isCaptureHidden(e.rel) {
			continue
		}
		if u, ok := upperStateOf(root, e.rel, e.fi); ok {
			out[e.rel] = u
		}
	}
	return out
}

// scanEntry is one entry of a walk of an upper dir.
type scanEntry struct {
	rel string
	fi  fs.FileInfo
}

// scanUpper walks the whole upper dir once (parents before children). A
// kernel session's command end checkpoints and captures file activity
// from one scan (CommandEnd).
func (t *Tracker) scanUpper(ctx context.Context, root *layers.Root) []scanEntry {
	t.walks.Add(1)
	var out []scanEntry
	_ = root.Walk(ctx, func(rel string, fi fs.FileInfo) error {
		out = append(out, scanEntry{rel, fi})
		return nil
	})
	return out
}

// isCaptureHidden: rel is overlay metadata or the FUSE overlay's staging
// directory, or below one; capture never reports those.
func isCaptureHidden(rel string) bool {
	first := true
	for c := range strings.SplitSeq(rel, "/") {
		if isStagingName(c) || (first && c == fuseStagingDir) {
			return true
		}
		first = false
	}
	return false
}

// fuseStagingDir is the FUSE overlay's copy-up staging directory in the
// upper root (only when it has no work directory); never reported.
const fuseStagingDir = ".esbx-tmp"

// isStagingName: overlay metadata names (.wh..wh.*), never reported.
func isStagingName(name string) bool {
	return strings.HasPrefix(name, ".wh..wh.")
}

// CaptureActivity returns the records of the upper-dir difference since
// the previous capture of w (§11.4 capture), remembering the new state. cmd is the command credited ("" for a file
// operation), requestID the file operation's request; paths, when given,
// limit the comparison to those workspace paths (a file operation's
// target), else the whole upper is walked. source is "capture" for the
// kernel driver and "fuse" for file operations of a FUSE session.
func (t *Tracker) CaptureActivity(ctx context.Context, w Workspace, cmd, requestID, source string, paths ...string) []ActivityRecord {
	return t.captureActivity(ctx, w, cmd, requestID, source, nil, paths...)
}

// captureActivity is CaptureActivity; without paths it compares the scan
// sc of the upper dir, or walks it when sc is nil.
func (t *Tracker) captureActivity(ctx context.Context, w Workspace, cmd, requestID, source string, sc []scanEntry, paths ...string) []ActivityRecord {
	t.actMu.Lock()
	defer t.actMu.Unlock()
	if _, err := os.Stat(w.Dir); err != nil {
		return nil // destroyed
	}
	prev := t.prevActivity(w.Dir)
	root, err := layers.OpenRoot(w.Upper)
	if err != nil {
		return nil
	}
	defer root.Close()
	var cur map[string]upperState
	switch {
	case len(paths) > 0:
		cur = map[string]upperState{}
		for p, u := range prev {
			cur[p] = u
		}
		for _, p := range paths {
			if u, ok := statUpper(root, p); ok {
				cur[p] = u
			} else {
				delete(cur, p)
			}
		}
	case sc != nil:
		cur = upperStates(root, sc)
	default:
		cur = t.walkUpper(ctx, root)
		if ctx.Err() != nil {
			return nil
		}
	}
	view := w.Base
	now := time.Now()
	var cmdPtr *string
	if cmd != "" {
		cmdPtr = &cmd
	}
	rec := func(op, p string, length *int64) ActivityRecord {
		return ActivityRecord{TS: now.UTC().Format("2006-01-02T15:04:05.000Z"), WorkspaceSessionID: w.ID, CommandSessionID: cmdPtr,
			Op: op, Path: p, Length: length, Source: source, RequestID: requestID, At: now}
	}
	var recs []ActivityRecord
	var names []string // the entries that changed: usually few of many
	for p, c := range cur {
		if o, ok := prev[p]; !ok || o != c {
			names = append(names, p)
		}
	}
	for p := range prev {
		if _, ok := cur[p]; !ok {
			names = append(names, p)
		}
	}
	sort.Strings(names) // parents before children
	for _, p := range names {
		c, inCur := cur[p]
		o, inPrev := prev[p]
		baseEntry, baseErr := view.Lstat(p)
		inBase := baseErr == nil
		switch {
		case !inCur: // gone from the upper: created and removed again in the session
			switch o.Kind {
			case "dir", "opaque":
				recs = append(recs, rec("rmdir", p, nil))
			case "whiteout":
				// A whiteout vanished: the name was recreated above or removed with its parent.
			default:
				recs = append(recs, rec("unlink", p, nil))
			}
		case c.Kind == "whiteout":
			if inPrev && o.Kind == "whiteout" {
				continue
			}
			if (inPrev && (o.Kind == "dir" || o.Kind == "opaque")) || (!inPrev && inBase && baseEntry.Kind == layers.KindDir) {
				recs = append(recs, rec("rmdir", p, nil))
			} else {
				recs = append(recs, rec("unlink", p, nil))
			}
		case c.Kind == "dir" || c.Kind == "opaque":
			fresh := !inPrev || o.Kind == "whiteout" || (o.Kind != "dir" && o.Kind != "opaque")
			if fresh && (c.Kind == "opaque" || !inBase || baseEntry.Kind != layers.KindDir) {
				recs = append(recs, rec("mkdir", p, nil))
			} else if !fresh && o.Kind == "dir" && c.Kind == "opaque" {
				recs = append(recs, rec("mkdir", p, nil)) // removed and recreated since
			} else if inPrev && o.Mode != c.Mode && !fresh {
				recs = append(recs, rec("chmod", p, nil))
			} else if fresh && inBase && baseEntry.Kind == layers.KindDir && uint32(baseEntry.Mode.Perm()) != c.Mode&0o777 {
				recs = append(recs, rec("chmod", p, nil))
			}
		case c.Kind == "symlink":
			recs = append(recs, rec("symlink", p, nil))
		case c.Kind == "file":
			size := c.Size
			switch {
			case !inPrev || o.Kind != "file":
				if inBase && baseEntry.Kind == layers.KindFile && (!inPrev || o.Kind != "whiteout") {
					// Copied up from the base: changed content or only its mode.
					switch {
					case baseEntry.Size == c.Size && baseEntry.Mode.Perm() != fs.FileMode(c.Mode&0o777) && sameBaseContent(view, p, root):
						recs = append(recs, rec("chmod", p, nil))
					case c.Size < baseEntry.Size:
						recs = append(recs, rec("truncate", p, &size))
					default:
						recs = append(recs, rec("write", p, &size))
					}
				} else {
					recs = append(recs, rec("create", p, &size))
				}
			case c.Size != o.Size || c.MtimeNs != o.MtimeNs || c.Ino != o.Ino:
				if c.Size < o.Size {
					recs = append(recs, rec("truncate", p, &size))
				} else {
					recs = append(recs, rec("write", p, &size))
				}
			case c.Mode != o.Mode:
				recs = append(recs, rec("chmod", p, nil))
			}
		}
	}
	t.saveActivity(w, prev, cur)
	return recs
}

// sameBaseContent reports whether the upper copy of p has the base's bytes.
func sameBaseContent(view *layers.View, p string, root *layers.Root) bool {
	b, err := view.ReadFile(p)
	if err != nil {
		return false
	}
	u, err := root.ReadFile(p)
	return err == nil && string(u) == string(b)
}
