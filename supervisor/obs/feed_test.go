package obs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// A subscriber that stops reading is dropped (its channel closed) once its
// buffer is full; the others, and the store, are not held up.
func TestEventFeedDropsSlowSubscriber(t *testing.T) {
	dir := t.TempDir()
	r := New(testOptions(), dir)
	id := func(rec Record) Record { return rec }
	slow, cancelSlow := Subscribe(r, 2, id)
	defer cancelSlow()
	fast, cancelFast := Subscribe(r, 16, id)
	defer cancelFast()
	for i := range 5 {
		rec := eventRecord{Kind: "event", TS: int64(i), Trace: "t", Name: "test", Attrs: map[string]any{}}
		r.system.AppendRecord(&rec, &rec.Attrs)
	}
	var got []uint64
	for rec := range slow {
		got = append(got, rec.Seq)
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("slow subscriber got %v before being dropped", got)
	}
	for want := uint64(1); want <= 5; want++ {
		rec := <-fast
		if rec.Seq != want || rec.Kind != "event" || rec.SandboxID != "" {
			t.Fatalf("fast subscriber: %+v, want seq %d", rec, want)
		}
		var h struct{ Seq uint64 }
		if json.Unmarshal(rec.Line, &h) != nil || h.Seq != want {
			t.Fatalf("line %s does not carry seq %d", rec.Line, want)
		}
	}
	// The sequence continues after a restart from the highest stored.
	if f := newEventFeed(dir); f.seq != 5 {
		t.Fatalf("restarted feed starts after %d, want 5", f.seq)
	}
	if _, err := os.Stat(filepath.Join(dir, "supervisor", DirName, LogName)); err != nil {
		t.Fatal(err)
	}
}
