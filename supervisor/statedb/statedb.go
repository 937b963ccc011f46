package statedb

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"

	_ "modernc.org/sqlite" // registers the "sqlite" driver (pure Go, no cgo)
)

// DB is the state database (§8.1): WAL, synchronous=FULL. Records are
// JSON documents keyed by (kind, id) with the sandbox they belong to; their
// logical shape is the contract's, the table layout is ours.
type DB struct {
	db *sql.DB
}

// Record kinds.
const (
	KindSandbox = "sandbox"
	KindSession = "session"
	KindCommand = "command"
	KindEvicted = "evicted_command" // IDs remembered after eviction (§6.7)
	// KindLayerOrigin records who published a layer (id <sandbox>/<layer>).
	KindLayerOrigin = "layer_origin"
)

// Open opens (creating when absent) dataDir/state.db and its records table.
func Open(ctx context.Context, dataDir string) (*DB, error) {
	path := filepath.Join(dataDir, "state.db")
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(5000)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open state database %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one writer; SQLite serializes anyway and this avoids SQLITE_BUSY storms
	const schema = `CREATE TABLE IF NOT EXISTS records (
		kind TEXT NOT NULL, id TEXT NOT NULL, sandbox_id TEXT NOT NULL, record TEXT NOT NULL,
		PRIMARY KEY (kind, id));
	CREATE INDEX IF NOT EXISTS records_by_sandbox ON records (sandbox_id, kind, id)`
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("init state database %s: %w", path, err)
	}
	return &DB{db: db}, nil
}

func (s *DB) Close() error { return s.db.Close() }

// SQL is the database handle for the code that keeps its own tables in
// the same file (attribution's audit and file activity): that code owns
// its schema and deletes its rows of a destroyed sandbox itself, next to
// the caller's DeleteSandbox.
func (s *DB) SQL() *sql.DB { return s.db }

// Put stores rec as the record (kind, id) of sandboxID, replacing it.
func (s *DB) Put(ctx context.Context, kind, id, sandboxID string, rec any) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode %s %s: %w", kind, id, err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO records(kind, id, sandbox_id, record) VALUES(?, ?, ?, ?)
		ON CONFLICT(kind, id) DO UPDATE SET record = excluded.record, sandbox_id = excluded.sandbox_id`, kind, id, sandboxID, string(b))
	if err != nil {
		return fmt.Errorf("save %s %s: %w", kind, id, err)
	}
	return nil
}

// Row is one record of a PutRows batch: Rec stored as (Kind, ID) of
// SandboxID, or with Delete the record (Kind, ID) removed.
type Row struct {
	Kind, ID, SandboxID string
	Rec                 any
	Delete              bool
}

// PutRows stores and deletes rows in one transaction, in order. Each
// commit costs a WAL fsync (synchronous=FULL), so records that change
// together — a command's record and its sandbox's activity revision — are
// written with one, and a crash keeps all of them or none.
func (s *DB) PutRows(ctx context.Context, rows ...Row) error {
	enc := make([]string, len(rows))
	for i, r := range rows {
		if r.Delete {
			continue
		}
		b, err := json.Marshal(r.Rec)
		if err != nil {
			return fmt.Errorf("encode %s %s: %w", r.Kind, r.ID, err)
		}
		enc[i] = string(b)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("save %d records: %w", len(rows), err)
	}
	defer tx.Rollback()
	for i, r := range rows {
		if r.Delete {
			if _, err := tx.ExecContext(ctx, `DELETE FROM records WHERE kind = ? AND id = ?`, r.Kind, r.ID); err != nil {
				return fmt.Errorf("delete %s %s: %w", r.Kind, r.ID, err)
			}
			continue
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO records(kind, id, sandbox_id, record) VALUES(?, ?, ?, ?)
		ON CONFLICT(kind, id) DO UPDATE SET record = excluded.record, sandbox_id = excluded.sandbox_id`, r.Kind, r.ID, r.SandboxID, enc[i]); err != nil {
			return fmt.Errorf("save %s %s: %w", r.Kind, r.ID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("save %d records: %w", len(rows), err)
	}
	return nil
}

// Delete removes the record (kind, id); an absent one is no error.
func (s *DB) Delete(ctx context.Context, kind, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM records WHERE kind = ? AND id = ?`, kind, id); err != nil {
		return fmt.Errorf("delete %s %s: %w", kind, id, err)
	}
	return nil
}

// DeleteSandbox removes every record of a sandbox, the sandbox's own
// included (rows of other packages' tables are theirs to delete).
func (s *DB) DeleteSandbox(ctx context.Context, sandboxID string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM records WHERE sandbox_id = ? OR (kind = ? AND id = ?)`, sandboxID, KindSandbox, sandboxID); err != nil {
		return fmt.Errorf("delete records of %s: %w", sandboxID, err)
	}
	return nil
}

// List decodes every record of a kind (of one sandbox when sandboxID is
// non-empty), ordered by id, calling decode with each JSON document.
func (s *DB) List(ctx context.Context, kind, sandboxID string, decode func([]byte) error) error {
	q, args := `SELECT record FROM records WHERE kind = ? ORDER BY id`, []any{kind}
	if sandboxID != "" {
		q, args = `SELECT record FROM records WHERE kind = ? AND sandbox_id = ? ORDER BY id`, []any{kind, sandboxID}
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("load %s records: %w", kind, err)
	}
	defer rows.Close()
	for rows.Next() {
		var text string
		if err := rows.Scan(&text); err != nil {
			return fmt.Errorf("load %s records: %w", kind, err)
		}
		if err := decode([]byte(text)); err != nil {
			return fmt.Errorf("load %s records: corrupt record: %w", kind, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load %s records: %w", kind, err)
	}
	return nil
}

// Exists reports whether the record (kind, id) is stored.
func (s *DB) Exists(ctx context.Context, kind, id string) (bool, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM records WHERE kind = ? AND id = ?`, kind, id).Scan(&n); err != nil {
		return false, fmt.Errorf("look up %s %s: %w", kind, id, err)
	}
	return n > 0, nil
}

// Ping checks that the database answers (health).
func (s *DB) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }
