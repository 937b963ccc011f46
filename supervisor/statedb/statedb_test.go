package statedb

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

type rec struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

func ids(t *testing.T, db *DB, kind, sandboxID string) []string {
	t.Helper()
	var out []string
	if err := db.List(context.Background(), kind, sandboxID, func(b []byte) error {
		var r rec
		if err := json.Unmarshal(b, &r); err != nil {
			return err
		}
		out = append(out, r.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRecords: put replaces, list is per kind and sandbox in id order,
// DeleteSandbox removes a sandbox's records and its own, and everything
// survives closing and reopening the file.
func TestRecords(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	put := func(kind, id, sb string, n int) {
		t.Helper()
		if err := db.Put(ctx, kind, id, sb, rec{ID: id, N: n}); err != nil {
			t.Fatal(err)
		}
	}
	put(KindSandbox, "sbx-a", "sbx-a", 1)
	put(KindSandbox, "sbx-b", "sbx-b", 1)
	put(KindSession, "ws-2", "sbx-a", 1)
	put(KindSession, "ws-1", "sbx-a", 1)
	put(KindSession, "ws-3", "sbx-b", 1)
	put(KindSession, "ws-1", "sbx-a", 2) // replaces

	if got := ids(t, db, KindSession, "sbx-a"); !slices.Equal(got, []string{"ws-1", "ws-2"}) {
		t.Errorf("sessions of sbx-a = %v", got)
	}
	if got := ids(t, db, KindSession, ""); !slices.Equal(got, []string{"ws-1", "ws-2", "ws-3"}) {
		t.Errorf("all sessions = %v", got)
	}
	if err := db.Delete(ctx, KindSession, "ws-2"); err != nil {
		t.Fatal(err)
	}
	if err := db.Delete(ctx, KindSession, "ws-absent"); err != nil {
		t.Errorf("deleting an absent record: %v", err)
	}
	for _, tc := range []struct {
		kind, id string
		want     bool
	}{{KindSession, "ws-1", true}, {KindSession, "ws-2", false}, {KindCommand, "ws-1", false}} {
		if ok, err := db.Exists(ctx, tc.kind, tc.id); err != nil || ok != tc.want {
			t.Errorf("Exists(%s, %s) = %v, %v; want %v", tc.kind, tc.id, ok, err, tc.want)
		}
	}
	if err := db.DeleteSandbox(ctx, "sbx-a"); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db, err = Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got := ids(t, db, KindSandbox, ""); !slices.Equal(got, []string{"sbx-b"}) {
		t.Errorf("sandboxes after DeleteSandbox and reopen = %v", got)
	}
	if got := ids(t, db, KindSession, ""); !slices.Equal(got, []string{"ws-3"}) {
		t.Errorf("sessions after DeleteSandbox and reopen = %v", got)
	}
	var n int
	if err := db.List(ctx, KindSession, "sbx-b", func(b []byte) error { n++; return json.Unmarshal(b, &rec{}) }); err != nil || n != 1 {
		t.Errorf("List sbx-b: %d, %v", n, err)
	}
	if err := db.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

// TestCorruptRecord: a record that does not decode is an error naming the
// kind that keeps the decoder's cause.
func TestCorruptRecord(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.SQL().ExecContext(ctx, `INSERT INTO records(kind, id, sandbox_id, record) VALUES('command', 'cmd-1', 'sbx-a', '{')`); err != nil {
		t.Fatal(err)
	}
	err = db.List(ctx, KindCommand, "", func(b []byte) error { return json.Unmarshal(b, &rec{}) })
	var se *json.SyntaxError
	if err == nil || !strings.Contains(err.Error(), "load command records: corrupt record") || !errors.As(err, &se) {
		t.Fatalf("List over a corrupt record: %v", err)
	}
}

// TestIDs: prefixed, lowercase, unique and in creation order.
func TestIDs(t *testing.T) {
	src := NewIDs()
	var got []string
	for range 1000 {
		got = append(got, src.New("cmd-"))
	}
	for _, id := range got {
		if !strings.HasPrefix(id, "cmd-") || len(id) != len("cmd-")+26 || strings.ToLower(id) != id {
			t.Fatalf("id %q", id)
		}
	}
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Fatal("ids are not unique and in creation order")
	}
}

// TestPutRows: rows written together are all stored (or deleted), replacing earlier
// versions; a batch with a row that cannot be stored stores none of them.
func TestPutRows(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Put(ctx, KindSandbox, "sbx-a", "sbx-a", rec{ID: "sbx-a", N: 1}); err != nil {
		t.Fatal(err)
	}
	if err := db.PutRows(ctx, Row{Kind: KindCommand, ID: "cmd-1", SandboxID: "sbx-a", Rec: rec{ID: "cmd-1"}}, Row{Kind: KindSandbox, ID: "sbx-a", SandboxID: "sbx-a", Rec: rec{ID: "sbx-a", N: 2}}); err != nil {
		t.Fatal(err)
	}
	var n []int
	_ = db.List(ctx, KindSandbox, "", func(b []byte) error {
		var r rec
		err := json.Unmarshal(b, &r)
		n = append(n, r.N)
		return err
	})
	if got := ids(t, db, KindCommand, "sbx-a"); !slices.Equal(got, []string{"cmd-1"}) || !slices.Equal(n, []int{2}) {
		t.Fatalf("after PutRows: commands %v, sandbox versions %v", got, n)
	}
	err = db.PutRows(ctx, Row{Kind: KindCommand, ID: "cmd-2", SandboxID: "sbx-a", Rec: rec{ID: "cmd-2"}}, Row{Kind: KindCommand, ID: "cmd-3", SandboxID: "sbx-a", Rec: make(chan int)})
	if err == nil || !strings.Contains(err.Error(), "cmd-3") {
		t.Fatalf("unencodable row: err %v", err)
	}
	if got := ids(t, db, KindCommand, "sbx-a"); !slices.Equal(got, []string{"cmd-1"}) {
		t.Errorf("after a failed batch: %v", got)
	}
	if err := db.PutRows(ctx, Row{Kind: KindCommand, ID: "cmd-4", SandboxID: "sbx-a", Rec: rec{ID: "cmd-4"}}, Row{Kind: KindCommand, ID: "cmd-1", Delete: true}); err != nil {
		t.Fatal(err)
	}
	if got := ids(t, db, KindCommand, "sbx-a"); !slices.Equal(got, []string{"cmd-4"}) {
		t.Errorf("after a put and a delete: %v", got)
	}
}
