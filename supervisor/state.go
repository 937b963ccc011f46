package supervisor

import (
	"context"
	"encoding/json"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
)

// store is the state database as the supervisor wires it: statedb's
// records plus the audit and file activity tables, which package
// attribution owns and reads through attr() on the same database.
type store struct {
	*statedb.DB
}

// openStore opens the state database and creates the audit and file
// activity tables beside the records.
func openStore(ctx context.Context, dataDir string) (*store, error) {
	d, err := statedb.Open(ctx, dataDir)
	if err != nil {
		return nil, err
	}
	st := &store{DB: d}
	if err := st.initAudit(ctx); err != nil {
		d.Close()
		return nil, err
	}
	if err := st.initActivity(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return st, nil
}

// deleteSandboxRows removes every row of a sandbox: its records, the
// sandbox's own included, its file activity and its audit.
func (s *store) deleteSandboxRows(ctx context.Context, sandboxID string) error {
	if err := s.DeleteSandbox(ctx, sandboxID); err != nil {
		return err
	}
	if err := s.deleteSandboxActivity(ctx, sandboxID); err != nil {
		return err
	}
	return s.deleteSandboxAudit(ctx, sandboxID)
}

func (s *store) putSandbox(ctx context.Context, rec *sandboxRecord) error {
	return s.Put(ctx, statedb.KindSandbox, rec.ID, rec.ID, rec)
}

func (s *store) sandboxes(ctx context.Context) ([]*sandboxRecord, error) {
	var out []*sandboxRecord
	err := s.List(ctx, statedb.KindSandbox, "", func(b []byte) error {
		rec := &sandboxRecord{}
		if err := json.Unmarshal(b, rec); err != nil {
			return err
		}
		out = append(out, rec)
		return nil
	})
	return out, err
}
