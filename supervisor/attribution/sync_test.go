package attribution

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// TestSyncedKeepsActivityAndOwners: after a sync rebuilt the upper dir over
// a newer head, the next capture reports nothing the session did not do
// (the rebuilt files and the head's merge are nobody's activity), and blame
// of the merged file keeps the head's line with its owner and the
// session's line with the command that wrote it.
func TestSyncedKeepsActivityAndOwners(t *testing.T) {
	base10 := "1\n2 base\n3\n4\n5\n6\n7\n8\n9 base\n10\n"
	a := testAudit(t, map[string]string{"f.txt": base10, "g.txt": "g\n"})
	ctx := context.Background()
	w, tr := testSession(t, a)
	base := w.Base.Manifest()
	upperWrite(t, w, "f.txt", strings.Replace(base10, "9 base", "9 session", 1))
	upperWrite(t, w, "own.txt", "mine\n")
	tr.Checkpoint(ctx, w, "cmd-1", false)
	if recs := tr.CaptureActivity(ctx, w, "cmd-1", "", "capture"); len(recs) != 2 {
		t.Fatalf("capture before the sync: %+v", recs)
	}
	write(t, a, "f.txt", strings.Replace(base10, "2 base", "2 head", 1), "req-1")
	write(t, a, "g.txt", "g head\n", "req-2")
	head, err := a.Stack.Head()
	if err != nil {
		t.Fatal(err)
	}
	_, res, err := a.Stack.SyncUpper(ctx, layers.SyncOptions{Base: base, Target: head, Upper: w.Upper})
	if err != nil {
		t.Fatal(err)
	}
	if err := layers.CompleteSync(w.Upper); err != nil {
		t.Fatal(err)
	}
	merged := map[string]bool{}
	for _, cf := range res.Committed {
		merged[cf.Path] = cf.Merged
	}
	if !merged["f.txt"] {
		t.Fatalf("f.txt was not merged: %+v", res.Committed)
	}
	w.Base = a.Stack.View(head)
	tr.Synced(ctx, w, merged)

	if recs := tr.CaptureActivity(ctx, w, "cmd-2", "", "capture"); len(recs) != 0 {
		t.Fatalf("a command after the sync is credited with what the sync did: %+v", recs)
	}
	tr.Checkpoint(ctx, w, "cmd-2", false)
	content, err := os.ReadFile(filepath.Join(w.Upper, "f.txt"))
	if err != nil {
		t.Fatal(err)
	}
	owners, _, err := a.SessionBlameOwners(ctx, tr, w, "f.txt", int64(len(content)), func() ([]byte, error) { return content, nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(owners) != 10 || owners[1].Owner != "operation:req-1" || owners[8].Owner != "workspace_session:ws-t" ||
		owners[8].CommandSessionID != "cmd-1" || owners[0].Owner != OwnerOriginal {
		t.Fatalf("owners after the sync: %+v", owners)
	}
	// A change after the sync is the session's, reported once.
	upperWrite(t, w, "own.txt", "mine again\n")
	if recs := tr.CaptureActivity(ctx, w, "cmd-3", "", "capture"); len(recs) != 1 || recs[0].Path != "own.txt" {
		t.Fatalf("capture of a change after the sync: %+v", recs)
	}
}
