package supervisor

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"

	_ "modernc.org/sqlite" // registers the "sqlite" driver (pure Go, no cgo)
)

// store is the state database (§8.1): WAL, synchronous=FULL. Records are
// JSON documents keyed by (kind, id) with the sandbox they belong to; their
// logical shape is the contract's, the table layout is ours.
type store struct {
	db *sql.DB
}

// Record kinds.
const (
	kindSandbox = "sandbox"
	kindSession = "session"
	kindCommand = "command"
	kindEvicted = "evicted_command" // IDs remembered after eviction (§6.7)
	// kindLayerOrigin records who published a layer (id <sandbox>/<layer>).
	kindLayerOrigin = "layer_origin"
)

func openStore(ctx context.Context, dataDir string) (*store, error) {
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
	st := &store{db: db}
	if err := st.initAudit(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if err := st.initActivity(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return st, nil
}

func (s *store) close() error { return s.db.Close() }

func (s *store) put(ctx context.Context, kind, id, sandboxID string, rec any) error {
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

func (s *store) delete(ctx context.Context, kind, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM records WHERE kind = ? AND id = ?`, kind, id); err != nil {
		return fmt.Errorf("delete %s %s: %w", kind, id, err)
	}
	return nil
}

// deleteSandboxRows removes every record of a sandbox, the sandbox's own included.
func (s *store) deleteSandboxRows(ctx context.Context, sandboxID string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM records WHERE sandbox_id = ? OR (kind = ? AND id = ?)`, sandboxID, kindSandbox, sandboxID); err != nil {
		return fmt.Errorf("delete records of %s: %w", sandboxID, err)
	}
	if err := s.deleteSandboxActivity(ctx, sandboxID); err != nil {
		return err
	}
	return s.deleteSandboxAudit(ctx, sandboxID)
}

// list decodes every record of a kind (of one sandbox when sandboxID is
// non-empty), ordered by id, calling decode with each JSON document.
func (s *store) list(ctx context.Context, kind, sandboxID string, decode func([]byte) error) error {
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
			return err
		}
		if err := decode([]byte(text)); err != nil {
			return fmt.Errorf("load %s records: corrupt record: %w", kind, err)
		}
	}
	return rows.Err()
}

func (s *store) exists(ctx context.Context, kind, id string) (bool, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM records WHERE kind = ? AND id = ?`, kind, id).Scan(&n)
	return n > 0, err
}

func (s *store) putSandbox(ctx context.Context, rec *sandboxRecord) error {
	return s.put(ctx, kindSandbox, rec.ID, rec.ID, rec)
}

func (s *store) sandboxes(ctx context.Context) ([]*sandboxRecord, error) {
	var out []*sandboxRecord
	err := s.list(ctx, kindSandbox, "", func(b []byte) error {
		rec := &sandboxRecord{}
		if err := json.Unmarshal(b, rec); err != nil {
			return err
		}
		out = append(out, rec)
		return nil
	})
	return out, err
}

func (s *store) ping(ctx context.Context) error { return s.db.PingContext(ctx) }
