package attribution

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// Audit store (§11.1): one append-only row per written file path and
// committed publish, in the state database. The record column holds the
// contract's logical record; the other columns index it.

const auditSchema = `CREATE TABLE IF NOT EXISTS audit (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		sandbox_id TEXT NOT NULL, path TEXT NOT NULL, manifest_version INTEGER NOT NULL,
		layer_id TEXT NOT NULL, record TEXT NOT NULL);
	CREATE INDEX IF NOT EXISTS audit_by_path ON audit (sandbox_id, path, manifest_version)`

// Store is attribution's part of the state database: the audit and
// file_activity tables. The state database's opener calls InitAudit and
// InitActivity once; the other methods expect the tables.
type Store struct{ DB *sql.DB }

// InitAudit creates the audit table and its index (idempotent).
func (s Store) InitAudit(ctx context.Context) error {
	if _, err := s.DB.ExecContext(ctx, auditSchema); err != nil {
		return fmt.Errorf("init audit table: %w", err)
	}
	return nil
}

// Audit is one sandbox's attribution: its audit rows in Store, its layer
// stack, and where warnings go.
type Audit struct {
	SandboxID string
	Stack     *layers.Stack
	Store     Store
	Log       *slog.Logger
}

// auditMeta is a record's default_meta.
type auditMeta struct {
	CommandSessionID *string `json:"command_session_id"`
	Agent            *string `json:"agent"`
	LayerID          *string `json:"layer_id"`
	TS               *string `json:"ts"`
}

// AuditRecord is the record of §11.1.
type AuditRecord struct {
	V               int          `json:"v"`
	TS              string       `json:"ts"`
	ManifestVersion int          `json:"manifest_version"`
	LayerID         string       `json:"layer_id"`
	Path            string       `json:"path"`
	LineCount       int          `json:"line_count"`
	ContentDigest   string       `json:"content_digest"`
	Wholesale       bool         `json:"wholesale"`
	DefaultOwner    string       `json:"default_owner"`
	DefaultMeta     auditMeta    `json:"default_meta"`
	OwnerRanges     []OwnerRange `json:"owner_ranges"`
}

func (r *AuditRecord) defaultOwner() LineOwner {
	m := r.DefaultMeta
	return LineOwner{Owner: r.DefaultOwner, CommandSessionID: Deref(m.CommandSessionID), Agent: Deref(m.Agent),
		LayerID: Deref(m.LayerID), TS: Deref(m.TS)}
}

// LineOwners expands the record to one owner per line.
func (r *AuditRecord) LineOwners() []LineOwner {
	out := RepeatOwner(r.defaultOwner(), r.LineCount)
	for _, rg := range r.OwnerRanges {
		for k := max(rg.StartLine, 1); k < rg.StartLine+rg.LineCount && k <= r.LineCount; k++ {
			out[k-1] = rg.LineOwner
		}
	}
	return out
}

// SetOwners fills default_owner, default_meta and owner_ranges from one
// owner per line: the owner of the most lines (ties: the first seen; never
// an approximate one) becomes the default, every other run a sparse range.
// A wholesale record gets one range covering all its lines. fallback is
// the default when no line qualifies.
func (r *AuditRecord) SetOwners(owners []LineOwner, fallback LineOwner) {
	r.LineCount = len(owners)
	def := fallback
	if r.Wholesale && len(owners) > 0 {
		def = owners[0]
	} else {
		count := map[LineOwner]int{}
		best := 0
		for _, o := range owners {
			if o.Approximate {
				continue
			}
			count[o]++
			if n := count[o]; n > best {
				best, def = n, o
			}
		}
		// The first seen among equally frequent owners.
		for _, o := range owners {
			if !o.Approximate && count[o] == best && best > 0 {
				def = o
				break
			}
		}
	}
	r.DefaultOwner = def.Owner
	r.DefaultMeta = auditMeta{}
	if def.HasMeta() {
		r.DefaultMeta = auditMeta{Nullable(def.CommandSessionID), Nullable(def.Agent), Nullable(def.LayerID), Nullable(def.TS)}
	}
	r.OwnerRanges = []OwnerRange{}
	if r.Wholesale {
		r.OwnerRanges = append(r.OwnerRanges, OwnerRange{StartLine: 1, LineCount: len(owners), LineOwner: def})
		return
	}
	for i, o := range owners {
		if o == def {
			continue
		}
		if n := len(r.OwnerRanges); n > 0 {
			last := &r.OwnerRanges[n-1]
			if last.LineOwner == o && last.StartLine+last.LineCount == i+1 {
				last.LineCount++
				continue
			}
		}
		r.OwnerRanges = append(r.OwnerRanges, OwnerRange{StartLine: i + 1, LineCount: 1, LineOwner: o})
	}
}

// AppendAudit inserts records in one transaction.
func (s Store) AppendAudit(ctx context.Context, sandboxID string, recs []AuditRecord) error {
	if len(recs) == 0 {
		return nil
	}
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("append audit: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, r := range recs {
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encode audit record %s: %w", r.Path, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO audit(sandbox_id, path, manifest_version, layer_id, record) VALUES(?, ?, ?, ?, ?)`,
			sandboxID, r.Path, r.ManifestVersion, r.LayerID, string(b)); err != nil {
			return fmt.Errorf("append audit %s: %w", r.Path, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("append audit: %w", err)
	}
	return nil
}

// LatestAudit returns the newest record of a path with manifest_version ≤
// maxVersion (any version when maxVersion < 0), or nil.
func (s Store) LatestAudit(ctx context.Context, sandboxID, path string, maxVersion int) (*AuditRecord, error) {
	if maxVersion < 0 {
		maxVersion = int(^uint(0) >> 1)
	}
	var text string
	err := s.DB.QueryRowContext(ctx, `SELECT record FROM audit WHERE sandbox_id = ? AND path = ? AND manifest_version <= ?
		ORDER BY manifest_version DESC, seq DESC LIMIT 1`, sandboxID, path, maxVersion).Scan(&text)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read audit %s: %w", path, err)
	}
	rec := &AuditRecord{}
	if err := json.Unmarshal([]byte(text), rec); err != nil {
		return nil, fmt.Errorf("read audit %s: corrupt record: %w", path, err)
	}
	return rec, nil
}

// LayerAudit returns the audit records a layer's publication wrote, in
// order; records that do not decode are skipped (the audit is best effort).
func (s Store) LayerAudit(ctx context.Context, sandboxID, layerID string) ([]AuditRecord, error) {
	rows, err := s.DB.QueryContext(ctx, `SELECT record FROM audit WHERE sandbox_id = ? AND layer_id = ? ORDER BY seq`, sandboxID, layerID)
	if err != nil {
		return nil, fmt.Errorf("read audit of layer %s: %w", layerID, err)
	}
	defer rows.Close()
	var out []AuditRecord
	for rows.Next() {
		var text string
		var rec AuditRecord
		if rows.Scan(&text) != nil || json.Unmarshal([]byte(text), &rec) != nil {
			continue
		}
		out = append(out, rec)
	}
	return out, rows.Err()
}

// DeleteSandboxAudit removes the audit rows of a destroyed sandbox.
func (s Store) DeleteSandboxAudit(ctx context.Context, sandboxID string) error {
	if _, err := s.DB.ExecContext(ctx, `DELETE FROM audit WHERE sandbox_id = ?`, sandboxID); err != nil {
		return fmt.Errorf("delete audit of %s: %w", sandboxID, err)
	}
	return nil
}

// AuditFile is one written path of a committed publish.
type AuditFile struct {
	Path string
	// Wholesale marks an ignored-route file (§9.2): one range, all lines,
	// owned by Owner. Non-text files are wholesale anyway.
	Wholesale bool
	// Owner is the publisher: workspace_session:<id> (with Agent and, when
	// known, CommandSessionID) or operation:<request_id>. LayerID and TS
	// default to the new layer and the record time.
	Owner LineOwner
	// Session holds per-line attributions of the session's version of the
	// file (Tracker.LineOwners); nil = every new line is Owner's.
	Session []LineOwner
	// SessionContent is the content Session describes. When nil, Session
	// must describe the committed content line by line (else it is ignored).
	SessionContent []byte
	// Committed, when non-nil, is the content the layer holds at Path (the
	// bytes publication staged), so the record need not read it back.
	Committed []byte
}

// committedManifests returns the head before the commit and the head the
// commit produced. prev is used when the new layer sits directly on it
// (the root hash agrees); otherwise, or when prev is the zero Manifest,
// both are derived from the current head by finding the new layer in it.
func committedManifests(st *layers.Stack, prev layers.Manifest, res layers.PublishResult) (layers.Manifest, layers.Manifest, error) {
	if len(prev.Layers) > 0 {
		layersNext := append([]layers.LayerRef{{LayerID: res.LayerID, Path: "layers/" + res.LayerID}}, prev.Layers...)
		if layers.ManifestRootHash(layersNext) == res.Revision.RootHash {
			return prev, layers.Manifest{SchemaVersion: layers.SchemaVersion, Version: res.Revision.ManifestVersion, Layers: layersNext}, nil
		}
	}
	head, err := st.Head()
	if err != nil {
		return layers.Manifest{}, layers.Manifest{}, err
	}
	for i, l := range head.Layers {
		if l.LayerID != res.LayerID {
			continue
		}
		refs := head.Layers[i:]
		if layers.ManifestRootHash(refs) != res.Revision.RootHash {
			break
		}
		next := layers.Manifest{SchemaVersion: layers.SchemaVersion, Version: res.Revision.ManifestVersion, Layers: refs}
		before := layers.Manifest{SchemaVersion: layers.SchemaVersion, Version: res.Revision.ManifestVersion - 1, Layers: refs[1:]}
		return before, next, nil
	}
	return layers.Manifest{}, layers.Manifest{}, fmt.Errorf("layer %s is no longer in head", res.LayerID)
}

// RecordPublish appends one audit record per committed regular file of
// a publish (§11.1, §11.2). prev is the head the layer was committed on
// (the zero Manifest: derive it from the current head). Lines kept from
// prev's content keep their owners; other lines are the session's
// (f.Session) or the publisher's. Failures are logged and returned, never
// fatal to the publish.
func (a *Audit) RecordPublish(ctx context.Context, prev layers.Manifest, res layers.PublishResult, files []AuditFile) error {
	if res.NoOp || len(files) == 0 {
		return nil
	}
	before, next, err := committedManifests(a.Stack, prev, res)
	if err != nil {
		a.Log.Warn("audit.append_failed", "sandbox", a.SandboxID, "layer_id", res.LayerID, "err", err)
		return err
	}
	prevView, nextView := a.Stack.View(before), a.Stack.View(next)
	ts := now3339()
	recs := make([]AuditRecord, 0, len(files))
	var firstErr error
	for _, f := range files {
		rec, ok, err := a.recordFor(ctx, prevView, nextView, f, res, ts)
		if err != nil {
			a.Log.Warn("audit.append_failed", "sandbox", a.SandboxID, "path", f.Path, "layer_id", res.LayerID, "err", err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if ok {
			recs = append(recs, rec)
		}
	}
	if err := a.Store.AppendAudit(ctx, a.SandboxID, recs); err != nil {
		a.Log.Warn("audit.append_failed", "sandbox", a.SandboxID, "layer_id", res.LayerID, "err", err)
		return err
	}
	return firstErr
}

func (a *Audit) recordFor(ctx context.Context, prevView, nextView *layers.View, f AuditFile, res layers.PublishResult, ts string) (AuditRecord, bool, error) {
	e, err := nextView.Lstat(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return AuditRecord{}, false, nil // deleted: nothing to attribute
	}
	if err != nil {
		return AuditRecord{}, false, err
	}
	if e.Kind != layers.KindFile {
		return AuditRecord{}, false, nil
	}
	var content []byte
	var digest string
	var text bool
	if f.Committed != nil && int64(len(f.Committed)) == e.Size && e.Size <= TextMax {
		content, digest, text = f.Committed, ContentDigest(f.Committed), IsText(f.Committed)
	} else if content, digest, text, err = ReadViewFile(nextView, f.Path); err != nil {
		return AuditRecord{}, false, err
	}
	owner := f.Owner
	if owner.LayerID == "" {
		owner.LayerID = res.LayerID
	}
	if owner.TS == "" {
		owner.TS = ts
	}
	rec := AuditRecord{V: 1, TS: ts, ManifestVersion: res.Revision.ManifestVersion, LayerID: res.LayerID, Path: f.Path, ContentDigest: digest}
	if f.Wholesale || !text {
		rec.Wholesale = true
		rec.SetOwners(RepeatOwner(owner, max(BlameLineCount(content, text, e.Size), 1)), owner)
		return rec, true, nil
	}
	lines := TextLines(content)
	var fromSession []LineOwner // per committed line, zero Owner = none
	if f.Session != nil {
		switch {
		case f.SessionContent != nil:
			fromSession = make([]LineOwner, len(lines))
			for i, o := range lineOrigins(f.SessionContent, content) {
				if o >= 0 && o < len(f.Session) {
					fromSession[i] = f.Session[o]
				}
			}
		case len(f.Session) == len(lines):
			fromSession = f.Session
		}
	}
	prevOwners, prevContent := a.prevOwners(ctx, prevView, f.Path)
	owners := make([]LineOwner, len(lines))
	for i, o := range lineOrigins(prevContent, content) {
		switch {
		case o >= 0:
			owners[i] = prevOwners[o]
		case fromSession != nil && fromSession[i].Owner != "":
			so := fromSession[i]
			if so.Owner == owner.Owner {
				so.LayerID, so.TS = owner.LayerID, owner.TS
				if so.Agent == "" {
					so.Agent = owner.Agent
				}
			}
			owners[i] = so
		default:
			owners[i] = owner
		}
	}
	rec.SetOwners(owners, owner)
	return rec, true, nil
}

// prevOwners returns the owners and content of a path in the head before a
// commit; nil when it was absent or not text. When the file there was
// written by a recent layer whose record is not stored yet (a concurrent
// publish still recording it) it waits for that record a little.
func (a *Audit) prevOwners(ctx context.Context, v *layers.View, p string) ([]LineOwner, []byte) {
	version := v.Manifest().Version
	owners, content, text, _, err := a.ViewOwners(ctx, v, version, p)
	if err != nil || !text {
		return nil, nil
	}
	if len(owners) == 0 || owners[0].Owner == OwnerUnknown || owners[0].Owner == OwnerOriginal {
		if a.awaitAudit(ctx, v, version, p) {
			owners, content, _, _, _ = a.ViewOwners(ctx, v, version, p)
		}
	}
	return owners, content
}

// awaitAudit waits up to a second for the record of the layer that wrote p
// in v, when that layer was committed in the last few seconds and its
// record is missing. It reports whether a matching record appeared.
func (a *Audit) awaitAudit(ctx context.Context, v *layers.View, version int, p string) bool {
	e, err := v.Lstat(p)
	if err != nil || !strings.HasPrefix(e.LayerID, "L") {
		return false
	}
	lv, err := strconv.Atoi(strings.SplitN(e.LayerID[1:], "-", 2)[0])
	if err != nil || lv > version {
		return false
	}
	if fi, err := os.Stat(a.Stack.LayerDir(layers.LayerRef{LayerID: e.LayerID, Path: "layers/" + e.LayerID})); err != nil || time.Since(fi.ModTime()) > 5*time.Second {
		return false
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		rec, err := a.Store.LatestAudit(ctx, a.SandboxID, p, version)
		if err != nil {
			return false
		}
		if rec != nil && rec.ManifestVersion >= lv {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	return false
}
