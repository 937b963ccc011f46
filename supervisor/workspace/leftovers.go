package workspace

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
)

// What a session leaves on disk and in the state database after it ends:
// the leases persisted sessions pin, orphan and trashed session directories.

// SessionTrashDir (below a sandbox's directory) holds the directories of
// closed sessions while they are removed in the background.
const SessionTrashDir = "trash"

// PersistedLeases are the layer lists pinned by persisted sessions; the
// boot sweep must keep them (§8.7).
func PersistedLeases(ctx context.Context, db *statedb.DB, sb *Sandbox) [][]layers.LayerRef {
	var out [][]layers.LayerRef
	_ = db.List(ctx, statedb.KindSession, sb.Rec.ID, func(b []byte) error {
		var r SessionRecord
		if json.Unmarshal(b, &r) == nil {
			out = append(out, r.Lease.Layers)
		}
		return nil
	})
	return out
}

// RemoveOrphanSessionDirs deletes session directories without a record
// (a crash during session creation) and empties the trash of closed
// sessions a crash left behind (the root's closeSession).
func RemoveOrphanSessionDirs(ctx context.Context, db *statedb.DB, log *slog.Logger, sb *Sandbox) (removed int) {
	RemoveTree(filepath.Join(sb.Dir, SessionTrashDir))
	ents, err := os.ReadDir(filepath.Join(sb.Dir, "sessions"))
	if err != nil {
		return 0
	}
	for _, e := range ents {
		if ok, err := db.Exists(ctx, statedb.KindSession, e.Name()); err == nil && !ok {
			log.Info("recovery: removing orphan session directory", "sandbox", sb.Rec.ID, "dir", e.Name())
			RemoveTree(filepath.Join(sb.Dir, "sessions", e.Name()))
			removed++
		}
	}
	return removed
}
