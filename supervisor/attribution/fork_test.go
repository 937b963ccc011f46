package attribution

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// forkOf makes a fork of w the way fork_workspace_session does: the upper
// dir copied, then the tracker's state.
func forkOf(t *testing.T, w Workspace, tr *Tracker, id string, agent *string) (Workspace, *Tracker) {
	t.Helper()
	dir := filepath.Join(filepath.Dir(w.Dir), id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f := Workspace{ID: id, Agent: agent, Dir: dir, Upper: filepath.Join(dir, "upper"), Base: w.Base, Log: w.Log}
	if err := layers.CopyUpper(context.Background(), w.Upper, f.Upper); err != nil {
		t.Fatal(err)
	}
	ft := &Tracker{}
	if err := tr.Fork(context.Background(), w, ft, f); err != nil {
		t.Fatal(err)
	}
	return f, ft
}

func ownersOf(owners []LineOwner) string {
	var parts []string
	for _, o := range owners {
		s := strings.TrimPrefix(o.Owner, "workspace_session:")
		if o.CommandSessionID != "" {
			s += ":" + o.CommandSessionID
		}
		if o.Agent != "" {
			s += "(" + o.Agent + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ",")
}

func TestForkKeepsOwners(t *testing.T) {
	a := testAudit(t, map[string]string{"f.txt": "a\nb\n"})
	ctx := context.Background()
	w, tr := testSession(t, a) // ws-t, agent bob
	upperWrite(t, w, "f.txt", "a\nX\nb\n")
	upperWrite(t, w, "n.txt", "n1\n")
	tr.Checkpoint(ctx, w, "cmd-1", false)
	// Captured: the fork's activity must not report these again.
	if recs := tr.CaptureActivity(ctx, w, "cmd-1", "", "capture"); len(recs) == 0 {
		t.Fatal("no activity in the source")
	}

	f, ft := forkOf(t, w, tr, "ws-f", ptr("carol"))
	read := func(b []byte) func() ([]byte, error) { return func() ([]byte, error) { return b, nil } }
	content := []byte("a\nX\nb\n")
	got, _, err := a.SessionBlameOwners(ctx, ft, f, "f.txt", int64(len(content)), read(content))
	if err != nil {
		t.Fatal(err)
	}
	if s := ownersOf(got); s != "original,ws-t:cmd-1(bob),original" {
		t.Fatalf("fork's blame: %s", s)
	}
	// The identities moved to the copies: nothing to re-read.
	idx := loadIndex(attrDir(f))
	for p, e := range idx.Files {
		if e.ckIdentity != identityAt(mustRoot(t, f.Upper), p) {
			t.Errorf("%s: identity not moved to the copy", p)
		}
	}
	if recs := ft.CaptureActivity(ctx, f, "cmd-2", "", "capture"); len(recs) != 0 {
		b, _ := json.Marshal(recs)
		t.Fatalf("fork's first capture reports the source's changes: %s", b)
	}

	// The fork edits: its new lines are its own, the source's stay the source's.
	upperWrite(t, f, "f.txt", "a\nX\nb\nY\n")
	ft.Checkpoint(ctx, f, "cmd-2", false)
	content = []byte("a\nX\nb\nY\n")
	if s := ownersOf(ft.LineOwners(f, "f.txt", content)); s != "ws-f(carol),ws-t:cmd-1(bob),ws-f(carol),ws-f:cmd-2(carol)" {
		t.Fatalf("fork's publish owners: %s", s)
	}
	// The source is unaffected by the fork's checkpoint.
	if s := ownersOf(tr.LineOwners(w, "f.txt", []byte("a\nX\nb\n"))); s != "ws-t(bob),ws-t:cmd-1(bob),ws-t(bob)" {
		t.Fatalf("source's owners: %s", s)
	}
	// A fork of the fork keeps the first source's lines.
	g, gt := forkOf(t, f, ft, "ws-g", nil)
	if s := ownersOf(gt.LineOwners(g, "f.txt", content)); s != "ws-g,ws-t:cmd-1(bob),ws-g,ws-f:cmd-2(carol)" {
		t.Fatalf("second fork's owners: %s", s)
	}
}

func mustRoot(t *testing.T, dir string) *layers.Root {
	t.Helper()
	r, err := layers.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
