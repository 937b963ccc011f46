package supervisor

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
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

const activitySchema = `CREATE TABLE IF NOT EXISTS file_activity (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		sandbox_id TEXT NOT NULL, session_id TEXT NOT NULL, ts_ms INTEGER NOT NULL,
		path TEXT NOT NULL, new_path TEXT NOT NULL, record TEXT NOT NULL);
	CREATE INDEX IF NOT EXISTS file_activity_by_sandbox ON file_activity (sandbox_id, seq)`

// activityMaxBytes caps one response (§10.1: 256 KiB, oldest dropped).
const activityMaxBytes = 256 << 10

// activityRecord is one record of §11.4.
type activityRecord struct {
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

	at time.Time
}

func (s *store) initActivity(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, activitySchema); err != nil {
		return fmt.Errorf("init file_activity table: %w", err)
	}
	return nil
}

// appendActivity inserts records and trims the sandbox's rows to max, in
// one transaction.
func (s *store) appendActivity(ctx context.Context, sandboxID string, recs []activityRecord, max int) error {
	tx, err := s.db.BeginTx(ctx, nil)
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
		if _, err := stmt.ExecContext(ctx, sandboxID, r.WorkspaceSessionID, r.at.UnixMilli(), r.Path, r.NewPath, string(b)); err != nil {
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

func (s *store) deleteSandboxActivity(ctx context.Context, sandboxID string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM file_activity WHERE sandbox_id = ?`, sandboxID); err != nil {
		return fmt.Errorf("delete file activity of %s: %w", sandboxID, err)
	}
	return nil
}

// activityQuery filters the file_activity view.
type activityQuery struct {
	sessionID string
	path      string // normalized workspace path, "" = all
	sinceMs   int64  // -1 = no bound
	limit     int
}

// queryActivity returns the newest matching records, oldest first, and
// whether older matching ones were left out (limit or byte cap).
func (s *store) queryActivity(ctx context.Context, sandboxID string, q activityQuery) ([]json.RawMessage, bool, error) {
	where, args := []string{"sandbox_id = ?"}, []any{sandboxID}
	if q.sessionID != "" {
		where, args = append(where, "session_id = ?"), append(args, q.sessionID)
	}
	if q.path != "" {
		// Prefix by component: the path itself or anything below it, as
		// source or rename target. LIKE would treat % and _ in names as
		// wildcards, so compare the prefix with substr.
		pfx := q.path + "/"
		where = append(where, "(path = ? OR substr(path, 1, ?) = ? OR new_path = ? OR substr(new_path, 1, ?) = ?)")
		args = append(args, q.path, len(pfx), pfx, q.path, len(pfx), pfx)
	}
	if q.sinceMs >= 0 {
		where, args = append(where, "ts_ms >= ?"), append(args, q.sinceMs)
	}
	args = append(args, q.limit+1)
	rows, err := s.db.QueryContext(ctx, `SELECT record FROM file_activity WHERE `+strings.Join(where, " AND ")+
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
		if len(newestFirst) == q.limit || bytes+len(text)+1 > activityMaxBytes {
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

// activityEnabled: observability.enabled and file_activity.enabled.
func (s *Supervisor) activityEnabled() bool {
	return s.cfg.Observability.Enabled && s.cfg.Observability.FileActivity.Enabled
}

// recordActivity stores records of one sandbox. Observability never fails
// a runtime operation: a storage error is logged and the records dropped.
func (s *Supervisor) recordActivity(ctx context.Context, sb *sandbox, recs []activityRecord) {
	if len(recs) == 0 || !s.activityEnabled() {
		return
	}
	// Detached from the request: a cancelled request must not lose what
	// already happened.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.store.appendActivity(ctx, sb.Rec.ID, recs, s.cfg.Observability.FileActivity.MaxRecords); err != nil {
		s.log.Warn("file_activity.dropped", "sandbox_id", sb.Rec.ID, "records", len(recs), "err", err)
	}
}

func (s *Supervisor) fileActivity(c *call) (any, error) {
	q := activityQuery{sessionID: c.args.String("workspace_session_id"), sinceMs: -1, limit: 200}
	if c.args.Has("path") {
		p, perr := catalog.WorkspacePath(c.args.String("path"), true)
		if perr != nil {
			return nil, perr
		}
		q.path = p
	}
	if c.args.Has("since_ms") {
		q.sinceMs = int64(c.args.Uint("since_ms"))
	}
	if v, explicit := c.req.Args["limit"]; explicit && v != nil {
		q.limit = int(c.args.Uint("limit"))
	}
	out := map[string]any{"view": "file_activity", "sandbox_id": c.sb.Rec.ID, "records": []json.RawMessage{}, "truncated": false}
	if !s.activityEnabled() {
		return out, nil
	}
	recs, truncated, err := s.store.queryActivity(c.ctx, c.sb.Rec.ID, q)
	if err != nil {
		return nil, err
	}
	if recs != nil {
		out["records"] = recs
	}
	out["truncated"] = truncated
	return out, nil
}

// ---- capture (kernel driver) ----

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

func loadUpperState(ss *session) map[string]upperState {
	st := map[string]upperState{}
	if b, err := os.ReadFile(filepath.Join(ss.dir, activityStateName)); err == nil {
		_ = json.Unmarshal(b, &st)
	}
	return st
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
		if isUpperWhiteout(root, rel, st) {
			return upperState{Kind: "whiteout"}, true
		}
		u.Kind = "file"
	case unix.S_IFDIR:
		u.Kind = "dir"
		if isOpaqueDir(root, rel) {
			u.Kind = "opaque"
		}
		u.Size, u.MtimeNs = 0, 0 // a directory's own size and mtime change with its entries
	case unix.S_IFLNK:
		u.Kind = "symlink"
		u.Target, _ = root.Readlink(rel)
		u.Mode = 0
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return upperState{}, false
		}
		return upperState{Kind: "whiteout"}, true
	default:
		return upperState{}, false
	}
	return u, true
}

func isOpaqueDir(root *layers.Root, rel string) bool {
	for _, name := range []string{"user.overlay.opaque", "trusted.overlay.opaque"} {
		if v, ok := root.Getxattr(rel, name); ok && v == "y" {
			return true
		}
	}
	return false
}

// walkUpper lists every entry of the upper dir (workspace-relative, slash
// separated), skipping overlay metadata and the FUSE overlay's staging.
func walkUpper(ctx context.Context, root *layers.Root) map[string]upperState {
	out := map[string]upperState{}
	_ = root.Walk(ctx, func(rel string, fi fs.FileInfo) error {
		if isStagingName(fi.Name()) || rel == fuseStagingDir {
			if fi.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if u, ok := upperStateOf(root, rel, fi); ok {
			out[rel] = u
		}
		return nil
	})
	return out
}

// fuseStagingDir is the FUSE overlay's copy-up staging directory in the
// upper root (only when it has no work directory); never reported.
const fuseStagingDir = ".esbx-tmp"

// isStagingName: overlay metadata names (.wh..wh.*), never reported.
func isStagingName(name string) bool {
	return strings.HasPrefix(name, ".wh..wh.")
}

// captureActivity records the upper-dir difference since the previous
// capture (§11.4 capture). cmd is the command credited ("" for a file
// operation), requestID the file operation's request; paths, when given,
// limit the comparison to those workspace paths (a file operation's
// target), else the whole upper is walked. source is "capture" for the
// kernel driver and "fuse" for file operations of a FUSE session.
func (s *Supervisor) captureActivity(ctx context.Context, sb *sandbox, ss *session, cmd, requestID, source string, paths ...string) {
	if !s.activityEnabled() {
		return
	}
	ss.actMu.Lock()
	defer ss.actMu.Unlock()
	if _, err := os.Stat(ss.dir); err != nil {
		return // destroyed
	}
	prev := loadUpperState(ss)
	root, err := layers.OpenRoot(ss.upper())
	if err != nil {
		return
	}
	defer root.Close()
	var cur map[string]upperState
	if len(paths) > 0 {
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
	} else {
		cur = walkUpper(ctx, root)
		if ctx.Err() != nil {
			return
		}
	}
	base, _ := sessionBase(ss)
	view := sb.Stack.View(base)
	now := time.Now()
	var cmdPtr *string
	if cmd != "" {
		cmdPtr = &cmd
	}
	rec := func(op, p string, length *int64) activityRecord {
		return activityRecord{TS: now.UTC().Format("2006-01-02T15:04:05.000Z"), WorkspaceSessionID: ss.id(), CommandSessionID: cmdPtr,
			Op: op, Path: p, Length: length, Source: source, RequestID: requestID, at: now}
	}
	var recs []activityRecord
	names := make([]string, 0, len(cur)+len(prev))
	for p := range cur {
		names = append(names, p)
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
		if inPrev && inCur && c == o {
			continue
		}
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
	if b, err := json.Marshal(cur); err == nil {
		if err := writeFileAtomic(filepath.Join(ss.dir, activityStateName), b); err != nil {
			s.log.Warn("file_activity.state", "workspace_session_id", ss.id(), "err", err)
		}
	}
	s.recordActivity(ctx, sb, recs)
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

// fileOpActivity records a session file operation (file_write, file_edit)
// with its request_id: for the kernel driver through capture of the one
// path, for the FUSE driver directly (the holder's own writes are not
// among the FUSE records).
func (s *Supervisor) fileOpActivity(ctx context.Context, sb *sandbox, ss *session, requestID, p string, created bool, size int) {
	if ss.rec.OverlayDriver != "fuse" {
		s.captureActivity(ctx, sb, ss, "", requestID, "capture", p)
		return
	}
	now := time.Now()
	op := "write"
	if created {
		op = "create"
	}
	n := int64(size)
	s.recordActivity(ctx, sb, []activityRecord{{TS: now.UTC().Format("2006-01-02T15:04:05.000Z"), WorkspaceSessionID: ss.id(),
		Op: op, Path: p, Length: &n, Source: "fuse", RequestID: requestID, at: now}})
}
