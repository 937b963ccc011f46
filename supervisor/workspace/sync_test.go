package workspace

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// TestSettleSync: a crash between a sync's exchange of the upper dir and
// its completion is settled at start-up from the persisted record: a
// record still on the old base gets the old upper back, a record already
// on the target keeps the new one; no journal or staging tree is left.
func TestSettleSync(t *testing.T) {
	for _, tc := range []struct {
		name      string
		committed bool // the record names the target
		want      string
	}{
		{"record on the old base", false, "old\n"},
		{"record on the target", true, "old\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			root := t.TempDir()
			proj := filepath.Join(root, "proj")
			if err := os.MkdirAll(proj, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(proj, "f.txt"), []byte("base\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			st, _, err := layers.Create(ctx, filepath.Join(root, "layerstack"), proj, layers.SnapshotOptions{})
			if err != nil {
				t.Fatal(err)
			}
			base, err := st.Head()
			if err != nil {
				t.Fatal(err)
			}
			upper := filepath.Join(root, "sessions", "ws-1", "upper")
			if err := os.MkdirAll(upper, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(upper, "mine.txt"), []byte("old\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Publish(ctx, []layers.Change{{Kind: layers.ChangeWrite, Path: "head.txt", Mode: 0o644, Data: []byte("head\n")}}); err != nil {
				t.Fatal(err)
			}
			target, err := st.Head()
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := st.SyncUpper(ctx, layers.SyncOptions{Base: base, Target: target, Upper: upper}); err != nil {
				t.Fatal(err)
			}
			// Tell the two trees apart: the new upper gets a marker.
			if err := os.WriteFile(filepath.Join(upper, "new-tree"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			rec := SessionRecord{BaseRevision: base.Revision(), Lease: LeaseRecord{Layers: base.Layers}}
			if tc.committed {
				rec = SessionRecord{BaseRevision: target.Revision(), Lease: LeaseRecord{Layers: target.Layers}}
			}
			before := rec
			changed, err := settleSync(upper, &rec)
			if err != nil || changed || rec.BaseRevision != before.BaseRevision {
				t.Fatalf("settleSync: changed %v, err %v, record %+v", changed, err, rec)
			}
			_, newErr := os.Lstat(filepath.Join(upper, "new-tree"))
			if (newErr == nil) != tc.committed {
				t.Fatalf("upper holds the new tree: %v, want %v", newErr == nil, tc.committed)
			}
			if b, err := os.ReadFile(filepath.Join(upper, "mine.txt")); err != nil || string(b) != tc.want {
				t.Fatalf("mine.txt: %q %v", b, err)
			}
			left, _ := filepath.Glob(filepath.Join(filepath.Dir(upper), ".upper.sync*"))
			if len(left) != 0 {
				t.Fatalf("left behind: %v", left)
			}
		})
	}
}
