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
// kept as JSON documents keyed by ID; their logical shape is the contract's,
// the table layout is ours.
type store struct {
	db *sql.DB
}

func openStore(ctx context.Context, dataDir string) (*store, error) {
	path := filepath.Join(dataDir, "state.db")
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(ON)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open state database %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one writer; SQLite serializes anyway and this avoids SQLITE_BUSY storms
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS sandboxes (id TEXT PRIMARY KEY, record TEXT NOT NULL)`); err != nil {
		db.Close()
		return nil, fmt.Errorf("init state database %s: %w", path, err)
	}
	return &store{db: db}, nil
}

func (s *store) close() error { return s.db.Close() }

func (s *store) putSandbox(ctx context.Context, rec *sandboxRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO sandboxes(id, record) VALUES(?, ?) ON CONFLICT(id) DO UPDATE SET record = excluded.record`, rec.ID, string(b))
	if err != nil {
		return fmt.Errorf("save sandbox %s: %w", rec.ID, err)
	}
	return nil
}

func (s *store) deleteSandbox(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

func (s *store) sandboxes(ctx context.Context) ([]*sandboxRecord, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT record FROM sandboxes ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("load sandboxes: %w", err)
	}
	defer rows.Close()
	var out []*sandboxRecord
	for rows.Next() {
		var text string
		if err := rows.Scan(&text); err != nil {
			return nil, err
		}
		rec := &sandboxRecord{}
		if err := json.Unmarshal([]byte(text), rec); err != nil {
			return nil, fmt.Errorf("load sandboxes: corrupt record: %w", err)
		}
		out = append(out, rec)
	}
	return out, rows.Err()
}

func (s *store) ping(ctx context.Context) error { return s.db.PingContext(ctx) }
