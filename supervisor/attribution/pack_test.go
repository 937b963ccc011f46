package attribution

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// attrFiles lists a session's attribution directory: its packs and every
// other file but index.json.
func attrFiles(t *testing.T, w Workspace) (packs, others []string) {
	t.Helper()
	ents, err := os.ReadDir(attrDir(w))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		switch n := e.Name(); {
		case isPackName(n):
			packs = append(packs, n)
		case n != attrIndexName:
			others = append(others, n)
		}
	}
	return packs, others
}

// TestCheckpointPacks: one checkpoint pass stores its checkpoints in one
// pack; a pack stays while the saved index names an entry of it and goes
// with the first save that names none; a lost index is rebuilt from the
// packs, newest record first; a damaged pack loses attribution, nothing
// else.
func TestCheckpointPacks(t *testing.T) {
	a := testAudit(t, map[string]string{})
	w, tr := testSession(t, a)
	ctx := context.Background()
	for i := range 300 {
		upperWrite(t, w, fmt.Sprintf("d/f%d.txt", i), fmt.Sprintf("line %d\n", i))
	}
	tr.Checkpoint(ctx, w, "cmd-1", false)
	packs, others := attrFiles(t, w)
	if len(packs) != 1 || len(others) != 0 {
		t.Fatalf("a pass over 300 new files stored %d packs and %v, want one pack", len(packs), others)
	}
	first := packs[0]

	upperWrite(t, w, "d/f0.txt", "line 0\nmore\n")
	tr.Checkpoint(ctx, w, "cmd-2", false)
	if packs, _ := attrFiles(t, w); len(packs) != 2 || !slices.Contains(packs, first) {
		t.Fatalf("after a second pass: packs %v, want the first (299 entries use it) and a new one", packs)
	}
	if got := cmdsOf(tr.LineOwners(w, "d/f0.txt", []byte("line 0\nmore\n"))); got != "cmd-1,cmd-2" {
		t.Fatalf("owners of the file changed twice: %s", got)
	}
	if got := cmdsOf(tr.LineOwners(w, "d/f7.txt", []byte("line 7\n"))); got != "cmd-1" {
		t.Fatalf("owners of a file of the first pack: %s", got)
	}

	for i := 1; i < 300; i++ {
		if err := os.Remove(filepath.Join(w.Upper, fmt.Sprintf("d/f%d.txt", i))); err != nil {
			t.Fatal(err)
		}
	}
	tr.Checkpoint(ctx, w, "cmd-3", false)
	packs, _ = attrFiles(t, w)
	if len(packs) != 1 || packs[0] == first {
		t.Fatalf("after every file of the first pack went: packs %v, want only the second", packs)
	}

	if err := os.Remove(filepath.Join(attrDir(w), attrIndexName)); err != nil {
		t.Fatal(err)
	}
	if got := cmdsOf((&Tracker{}).LineOwners(w, "d/f0.txt", []byte("line 0\nmore\n"))); got != "cmd-1,cmd-2" {
		t.Fatalf("owners from an index rebuilt from the packs: %s", got)
	}

	if err := os.Truncate(filepath.Join(attrDir(w), packs[0]), 20); err != nil {
		t.Fatal(err)
	}
	if got := cmdsOf((&Tracker{}).LineOwners(w, "d/f0.txt", []byte("line 0\nmore\n"))); got != "-,-" {
		t.Fatalf("owners from a damaged pack: %s", got)
	}
	// A header claiming huge lengths is refused before any allocation.
	bad := make([]byte, 64)
	binary.LittleEndian.PutUint64(bad[:8], 1<<40)
	binary.LittleEndian.PutUint64(bad[8:16], 1<<40)
	if _, _, err := readRecord(bytes.NewReader(bad), int64(len(bad)), 0); err == nil {
		t.Fatal("a record with a 1 TiB header was read")
	}
}

// TestCheckpointKeyFilesStillRead: a checkpoint stored as <key>.json and
// <key>.txt (a sync's merge, or a session of an older version) is read,
// and its files go once a pack holds the path's next checkpoint.
func TestCheckpointKeyFilesStillRead(t *testing.T) {
	a := testAudit(t, map[string]string{})
	w, _ := testSession(t, a)
	ctx := context.Background()
	content := "old 1\nold 2\n"
	upperWrite(t, w, "old.txt", content)
	dir, key := attrDir(w), ckKey("old.txt")
	lines := []ckLine{{Cmd: "cmd-old", TS: now3339()}, {Cmd: "cmd-old", TS: now3339()}}
	meta, err := json.Marshal(ckFile{V: 1, Path: "old.txt", Digest: ContentDigest([]byte(content)), Lines: encodeRuns(lines)})
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, key+".json"), meta, 0o600))
	must(os.WriteFile(filepath.Join(dir, key+".txt"), []byte(content), 0o600))
	var st unix.Stat_t
	must(unix.Lstat(filepath.Join(w.Upper, "old.txt"), &st))
	idx := &ckIndex{V: 1, Files: map[string]*ckEntry{"old.txt": {State: ckStored, Key: key,
		Digest: ContentDigest([]byte(content)), Bytes: int64(len(content)), ckIdentity: identityOf(&st)}}}
	b, err := json.Marshal(idx)
	must(err)
	must(os.WriteFile(filepath.Join(dir, attrIndexName), b, 0o600))

	tr := &Tracker{}
	if got := cmdsOf(tr.LineOwners(w, "old.txt", []byte(content))); got != "cmd-old,cmd-old" {
		t.Fatalf("owners of a key file checkpoint: %s", got)
	}
	upperWrite(t, w, "old.txt", content+"new 3\n")
	tr.Checkpoint(ctx, w, "cmd-new", false)
	if got := cmdsOf(tr.LineOwners(w, "old.txt", []byte(content+"new 3\n"))); got != "cmd-old,cmd-old,cmd-new" {
		t.Fatalf("owners after the next checkpoint: %s", got)
	}
	if packs, others := attrFiles(t, w); len(packs) != 1 || len(others) != 0 {
		t.Fatalf("after the next checkpoint: packs %v, other files %v; want one pack and no key files", packs, others)
	}
}
