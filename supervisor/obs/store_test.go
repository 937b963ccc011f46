package obs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// testOptions are the configuration defaults of observability.*.
func testOptions() Options {
	return Options{Enabled: true, MaxDiskBytes: 4 << 20, MaxLineBytes: 16384, ResourcesEnabled: true, ResourcesMaxDiskBytes: 1 << 20,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// testRegistry is a registry over a fresh data directory.
type testRegistry struct {
	*Registry
	data string
}

func obsRegistry(t testing.TB, mutate func(*Options)) *testRegistry {
	t.Helper()
	opt := testOptions()
	if mutate != nil {
		mutate(&opt)
	}
	data := t.TempDir()
	return &testRegistry{New(opt, data), data}
}

// obsSandbox is the scope of a sandbox whose directory exists.
func obsSandbox(t testing.TB, r *testRegistry, id string) Scope {
	t.Helper()
	dir := filepath.Join(r.data, "sandboxes", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return Scope{ID: id, Dir: dir}
}

// query runs an events or trace query the way the supervisor's handlers
// do (arguments validated by the catalog), round-tripped through JSON.
func query(t *testing.T, r *testRegistry, sc Scope, opID string, raw map[string]any) (map[string]any, error) {
	t.Helper()
	op, ok := catalog.Lookup(opID)
	if !ok {
		t.Fatalf("no op %s", opID)
	}
	args, verr := op.Validate(raw)
	if verr != nil {
		return nil, verr
	}
	st := r.Store(sc)
	var res any
	switch opID {
	case "events":
		f := EventFilter{Name: args.String("name"), HasName: args.Has("name"),
			SinceMs: math.MaxInt64, HasSince: args.Has("since_ms"), LastN: int(args.Uint("last_n")),
			AfterSeq: args.Uint("after_seq"), HasAfter: args.Has("after_seq")}
		if u := args.Uint("since_ms"); u <= math.MaxInt64 {
			f.SinceMs = int64(u)
		}
		page, err := st.EventsPage(context.Background(), f)
		if err != nil {
			return nil, err
		}
		m := map[string]any{"view": "events", "events": page.Events}
		if page.Paged {
			m["truncated"] = page.Truncated
			if page.Truncated {
				m["next_after_seq"] = page.NextAfterSeq
			}
		}
		res = m
	case "trace":
		trace, roots, err := st.Trace(context.Background(), args.String("trace_id"))
		if err != nil {
			return nil, err
		}
		if trace == "" {
			res = map[string]any{"view": "trace", "trace": nil, "spans": []any{}}
		} else {
			res = map[string]any{"view": "trace", "trace": trace, "spans": roots}
		}
	default:
		t.Fatalf("not an obs query: %s", opID)
	}
	var m map[string]any
	if err := json.Unmarshal(catalog.CompactJSON(res), &m); err != nil {
		t.Fatal(err)
	}
	return m, nil
}

func mustQuery(t *testing.T, r *testRegistry, sc Scope, opID string, raw map[string]any) map[string]any {
	t.Helper()
	m, err := query(t, r, sc, opID, raw)
	if err != nil {
		t.Fatalf("%s %v: %v", opID, raw, err)
	}
	return m
}

func eventList(t *testing.T, m map[string]any) []map[string]any {
	t.Helper()
	if m["view"] != "events" {
		t.Fatalf("view: %v", m)
	}
	raw, ok := m["events"].([]any)
	if !ok {
		t.Fatalf("events is not an array: %v", m)
	}
	out := make([]map[string]any, len(raw))
	for i, e := range raw {
		out[i] = e.(map[string]any)
	}
	return out
}

func seqOf(e map[string]any) int {
	return int(e["attrs"].(map[string]any)["seq"].(float64))
}

func segSizes(t *testing.T, dir string) (cur, rot int64) {
	t.Helper()
	if fi, err := os.Stat(filepath.Join(dir, LogName)); err == nil {
		cur = fi.Size()
	}
	if fi, err := os.Stat(filepath.Join(dir, LogName+".1")); err == nil {
		rot = fi.Size()
	}
	return cur, rot
}

func TestObsCapsHoldUnder10000Events(t *testing.T) {
	r := obsRegistry(t, nil)
	sb := obsSandbox(t, r, "sbx-caps")
	dir := filepath.Join(sb.Dir, DirName)
	pad := strings.Repeat("x", 900)
	limit := r.maxDisk
	for i := 0; i < 10000; i++ {
		r.Event(sb, "", "test.event", map[string]any{"seq": i, "pad": pad})
		if i%500 == 0 || i == 9999 {
			cur, rot := segSizes(t, dir)
			if cur > limit/2 || rot > limit/2 || cur+rot > limit {
				t.Fatalf("after %d events: segments %d + %d exceed %d", i+1, cur, rot, limit)
			}
		}
	}
	if _, rot := segSizes(t, dir); rot == 0 {
		t.Fatal("no rotation after 10,000 events of ~1 KiB")
	}
	if st := r.Store(sb).Stats(); st != (SinkStats{}) {
		t.Fatalf("counters: %+v", st)
	}
	// Nothing but the two segments and the lock.
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != ".lock,observability.ndjson,observability.ndjson.1" {
		t.Fatalf("store files: %v", names)
	}
	// The newest 500 come back, oldest first, ending with the last one.
	evs := eventList(t, mustQuery(t, r, sb, "events", nil))
	if len(evs) == 0 || len(evs) > MaxRecords || seqOf(evs[len(evs)-1]) != 9999 {
		t.Fatalf("got %d events, last %v", len(evs), evs[len(evs)-1])
	}
	if b, _ := json.Marshal(evs); len(b) > MaxBytes {
		t.Fatalf("response %d bytes", len(b))
	}
	for i := 1; i < len(evs); i++ {
		if seqOf(evs[i]) != seqOf(evs[i-1])+1 {
			t.Fatalf("not chronological/contiguous at %d: %d then %d", i, seqOf(evs[i-1]), seqOf(evs[i]))
		}
	}
}

func TestObsTruncationAndDrops(t *testing.T) {
	r := obsRegistry(t, nil)
	big := strings.Repeat("y", 20000)
	r.Event(Scope{}, "", "big.attrs", map[string]any{"blob": big})
	evs := eventList(t, mustQuery(t, r, Scope{}, "events", nil))
	if len(evs) != 1 {
		t.Fatalf("events: %v", evs)
	}
	orig, _ := json.Marshal(map[string]any{"blob": big})
	if got := evs[0]["attrs"]; fmt.Sprint(got) != fmt.Sprint(map[string]any{"_truncated": float64(len(orig))}) {
		t.Fatalf("attrs: %v", got)
	}
	if evs[0]["name"] != "big.attrs" || evs[0]["kind"] != "event" || !strings.HasPrefix(evs[0]["trace"].(string), "boot-") {
		t.Fatalf("record: %v", evs[0])
	}
	if st := r.Totals(); st.TruncatedRecords != 1 || st.DroppedOversized != 0 {
		t.Fatalf("stats: %+v", st)
	}
	// A name too long for the line cap even without attrs: dropped.
	r.Event(Scope{}, "", strings.Repeat("n", 17000), nil)
	if st := r.Totals(); st.DroppedOversized != 1 {
		t.Fatalf("stats: %+v", st)
	}
	// A storage error (the sandbox directory is gone) drops and counts,
	// and does not recreate the sandbox directory.
	sb := Scope{ID: "sbx-gone", Dir: filepath.Join(r.data, "sandboxes", "sbx-gone")}
	r.Event(sb, "", "lease.released", nil)
	sp := r.StartSpan(sb, "req-x", "", "supervisor.dispatch", nil)
	sp.End(Completed, nil)
	if st := r.Store(sb).Stats(); st.DroppedStorage != 2 {
		t.Fatalf("sandbox stats: %+v", st)
	}
	if _, err := os.Stat(sb.Dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("sandbox dir recreated: %v", err)
	}
	if st := r.Totals(); st != (SinkStats{DroppedStorage: 2, DroppedOversized: 1, TruncatedRecords: 1}) {
		t.Fatalf("totals: %+v", st)
	}
}

func TestObsRotationKeepsOrder(t *testing.T) {
	r := obsRegistry(t, func(o *Options) { o.MaxDiskBytes = 8192 })
	sb := obsSandbox(t, r, "sbx-rot")
	dir := filepath.Join(sb.Dir, DirName)
	for i := 0; i < 200; i++ {
		r.Event(sb, "", "tick", map[string]any{"seq": i})
		cur, rot := segSizes(t, dir)
		if cur > 4096 || rot > 4096 {
			t.Fatalf("segment over half: %d %d", cur, rot)
		}
	}
	cur, rot := segSizes(t, dir)
	if rot == 0 || cur == 0 {
		t.Fatalf("expected both segments: %d %d", cur, rot)
	}
	evs := eventList(t, mustQuery(t, r, sb, "events", nil))
	if seqOf(evs[len(evs)-1]) != 199 {
		t.Fatalf("newest missing: %v", evs[len(evs)-1])
	}
	// Records from the rotated segment come first.
	b, _ := os.ReadFile(filepath.Join(dir, LogName+".1"))
	rotated := strings.Count(string(b), "\n")
	if rotated == 0 || len(evs) <= rotated {
		t.Fatalf("rotated %d, listed %d", rotated, len(evs))
	}
	for i := 1; i < len(evs); i++ {
		if seqOf(evs[i]) != seqOf(evs[i-1])+1 {
			t.Fatalf("order broken across segments at %d", i)
		}
	}
	// A line that can never fit half the store is dropped, not rotated in.
	r.Event(sb, "", "huge", map[string]any{"pad": strings.Repeat("z", 5000)})
	if st := r.Store(sb).Stats(); st.DroppedOversized != 1 || st.TruncatedRecords != 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestObsEventsPaged (issue #27 item 10): last_n above one response's
// worth is accepted; the selection comes in pages, oldest first, each
// naming the after_seq of the next, and the pages together are exactly the
// newest last_n events.
func TestObsEventsPaged(t *testing.T) {
	r := obsRegistry(t, nil)
	sb := obsSandbox(t, r, "sbx-pages")
	pad := strings.Repeat("p", 200)
	for i := 0; i < 3000; i++ {
		r.Event(sb, "", "test.page", map[string]any{"seq": i, "pad": pad})
	}
	var got []int
	args := map[string]any{"last_n": float64(2000)}
	for pages := 1; ; pages++ {
		m := mustQuery(t, r, sb, "events", args)
		evs := eventList(t, m)
		if len(evs) == 0 || len(evs) > MaxRecords {
			t.Fatalf("page %d: %d events", pages, len(evs))
		}
		if b, _ := json.Marshal(m); len(b) > MaxBytes {
			t.Fatalf("page %d: %d bytes", pages, len(b))
		}
		for _, e := range evs {
			got = append(got, seqOf(e))
		}
		if m["truncated"] == false {
			if _, ok := m["next_after_seq"]; ok {
				t.Fatalf("last page names a next one: %v", m["next_after_seq"])
			}
			if pages < 4 {
				t.Fatalf("2000 events of ~300 bytes in %d pages", pages)
			}
			break
		}
		next := m["next_after_seq"].(float64)
		if last := evs[len(evs)-1]["seq"].(float64); next != last {
			t.Fatalf("next_after_seq %v is not the last event's seq %v", next, last)
		}
		args["after_seq"] = next
	}
	if len(got) != 2000 || got[0] != 1000 || got[1999] != 2999 {
		t.Fatalf("pages hold %d events, %v … %v", len(got), got[0], got[len(got)-1])
	}
	for i := 1; i < len(got); i++ {
		if got[i] != got[i-1]+1 {
			t.Fatalf("pages not contiguous at %d: %d then %d", i, got[i-1], got[i])
		}
	}
	// Without last_n or after_seq: the newest within the caps, unpaged.
	if m := mustQuery(t, r, sb, "events", nil); m["truncated"] != nil || seqOf(eventList(t, m)[len(eventList(t, m))-1]) != 2999 {
		t.Fatalf("unpaged query: truncated=%v", m["truncated"])
	}
}

func TestObsEventFilters(t *testing.T) {
	r := obsRegistry(t, nil)
	sb := obsSandbox(t, r, "sbx-f")
	for i := 0; i < 30; i++ {
		name := "a"
		if i%3 == 0 {
			name = "b"
		}
		r.Event(sb, "", name, map[string]any{"seq": i})
		if i == 19 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	all := eventList(t, mustQuery(t, r, sb, "events", nil))
	if len(all) != 30 {
		t.Fatalf("all: %d", len(all))
	}
	last := eventList(t, mustQuery(t, r, sb, "events", map[string]any{"last_n": float64(4)}))
	if len(last) != 4 || seqOf(last[0]) != 26 || seqOf(last[3]) != 29 {
		t.Fatalf("last_n: %v", last)
	}
	bs := eventList(t, mustQuery(t, r, sb, "events", map[string]any{"name": "b", "last_n": float64(2)}))
	if len(bs) != 2 || seqOf(bs[0]) != 24 || seqOf(bs[1]) != 27 {
		t.Fatalf("name+last_n: %v", bs)
	}
	ts := all[20]["ts"].(float64)
	since := eventList(t, mustQuery(t, r, sb, "events", map[string]any{"since_ms": ts}))
	if len(since) == 0 || seqOf(since[0]) > 20 || seqOf(since[len(since)-1]) != 29 {
		t.Fatalf("since_ms: %v", since)
	}
	for _, e := range since {
		if e["ts"].(float64) < ts {
			t.Fatalf("since_ms not inclusive lower bound: %v", e)
		}
	}
	if n := len(eventList(t, mustQuery(t, r, sb, "events", map[string]any{"name": "nope"}))); n != 0 {
		t.Fatalf("unknown name: %d", n)
	}
	for _, bad := range []map[string]any{{"last_n": float64(0)}, {"last_n": float64(catalog.MaxEventsLastN + 1)}, {"since_ms": float64(-1)}, {"bogus": "x"}} {
		if _, err := query(t, r, sb, "events", bad); err == nil || err.(*catalog.Error).Kind != catalog.InvalidRequest {
			t.Fatalf("%v: %v", bad, err)
		}
	}
	// System scope reads the system store: none of the sandbox's events.
	if n := len(eventList(t, mustQuery(t, r, Scope{}, "events", nil))); n != 0 {
		t.Fatalf("system store has %d events", n)
	}
}

// fileStates records size and mtime of everything under dir.
func fileStates(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	_ = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil {
			out[p] = fmt.Sprintf("%d/%d", info.Size(), info.ModTime().UnixNano())
		}
		return nil
	})
	return out
}

func TestObsReadsDoNotWrite(t *testing.T) {
	r := obsRegistry(t, func(o *Options) { o.MaxDiskBytes = 4096 })
	sb := obsSandbox(t, r, "sbx-ro")
	// A store never written: queries create nothing.
	mustQuery(t, r, sb, "events", nil)
	mustQuery(t, r, sb, "trace", nil)
	mustQuery(t, r, Scope{}, "events", nil)
	if _, err := os.Stat(filepath.Join(sb.Dir, DirName)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("read created the store: %v", err)
	}
	if _, err := os.Stat(filepath.Join(r.data, "supervisor")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("read created the system store: %v", err)
	}
	for i := 0; i < 60; i++ {
		sp := r.StartSpan(sb, fmt.Sprintf("req-%d", i), "", "supervisor.dispatch", map[string]any{"op": "file_read"})
		sp.Event("x", map[string]any{"seq": i})
		sp.End(Completed, nil)
	}
	before := fileStates(t, r.data)
	time.Sleep(20 * time.Millisecond)
	mustQuery(t, r, sb, "events", nil)
	mustQuery(t, r, sb, "events", map[string]any{"last_n": float64(3), "name": "x"})
	mustQuery(t, r, sb, "trace", nil)
	mustQuery(t, r, sb, "trace", map[string]any{"trace_id": "req-59"})
	if _, err := query(t, r, sb, "trace", map[string]any{"trace_id": "req-unknown"}); err == nil {
		t.Fatal("unknown trace found")
	}
	mustQuery(t, r, Scope{}, "trace", nil)
	after := fileStates(t, r.data)
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("reads changed files:\n%v\n%v", before, after)
	}
}

func TestObsTraceTree(t *testing.T) {
	r := obsRegistry(t, nil)
	sb := obsSandbox(t, r, "sbx-tr")
	if m := mustQuery(t, r, sb, "trace", nil); m["trace"] != nil || len(m["spans"].([]any)) != 0 || m["view"] != "trace" {
		t.Fatalf("empty store: %v", m)
	}
	// One request: root, two children (the second one with a grandchild), events.
	root := r.StartSpan(sb, "req-one", "", "supervisor.dispatch", map[string]any{"op": "exec_command"})
	ctx := With(context.Background(), root)
	Event(ctx, "lease.acquired", map[string]any{"workspace_session_id": "ws-1", "revision": 3})
	a := root.Child("workspace_session.create", nil)
	time.Sleep(3 * time.Millisecond)
	a.End(Completed, nil)
	b := root.Child("command.exec", map[string]any{"session_created": true})
	g := b.Child("holder.exec", nil)
	g.Event("inner", nil)
	time.Sleep(2 * time.Millisecond)
	g.End(Error, nil)
	b.End(Completed, map[string]any{"finalize_policy": "publish"})
	root.End(Completed, nil)
	// Another, later request in the same store.
	time.Sleep(2 * time.Millisecond)
	other := r.StartSpan(sb, "req-two", "", "supervisor.dispatch", map[string]any{"op": "file_read"})
	other.End(Error, map[string]any{"error_kind": "not_found"})

	m := mustQuery(t, r, sb, "trace", map[string]any{"trace_id": "req-one"})
	if m["trace"] != "req-one" {
		t.Fatalf("trace: %v", m)
	}
	roots := m["spans"].([]any)
	if len(roots) != 1 {
		t.Fatalf("roots: %v", roots)
	}
	rt := roots[0].(map[string]any)
	rs := rt["span"].(map[string]any)
	if rs["name"] != "supervisor.dispatch" || rs["attrs"].(map[string]any)["op"] != "exec_command" || rs["status"] != "completed" || rs["kind"] != "span" || rs["parent"] != nil {
		t.Fatalf("root: %v", rs)
	}
	if rt["offset_ms"].(float64) != 0 {
		t.Fatalf("root offset: %v", rt["offset_ms"])
	}
	kids := rt["children"].([]any)
	if len(kids) != 2 {
		t.Fatalf("children: %v", kids)
	}
	k0, k1 := kids[0].(map[string]any), kids[1].(map[string]any)
	if k0["span"].(map[string]any)["name"] != "workspace_session.create" || k1["span"].(map[string]any)["name"] != "command.exec" {
		t.Fatalf("children order: %v", kids)
	}
	if k1["offset_ms"].(float64) < k0["offset_ms"].(float64)+2 {
		t.Fatalf("offsets: %v %v", k0["offset_ms"], k1["offset_ms"])
	}
	if k1["span"].(map[string]any)["attrs"].(map[string]any)["finalize_policy"] != "publish" {
		t.Fatalf("end attrs not merged: %v", k1)
	}
	gk := k1["children"].([]any)
	if len(gk) != 1 || gk[0].(map[string]any)["span"].(map[string]any)["status"] != "error" {
		t.Fatalf("grandchild: %v", gk)
	}
	if evs := gk[0].(map[string]any)["events"].([]any); len(evs) != 1 || evs[0].(map[string]any)["event"].(map[string]any)["name"] != "inner" {
		t.Fatalf("grandchild events: %v", evs)
	}
	revs := rt["events"].([]any)
	if len(revs) != 1 {
		t.Fatalf("root events: %v", revs)
	}
	ev := revs[0].(map[string]any)["event"].(map[string]any)
	if ev["name"] != "lease.acquired" || ev["parent"] != rs["span"] || ev["trace"] != "req-one" {
		t.Fatalf("root event: %v", ev)
	}
	// Span ids are unique within the trace.
	ids := map[string]bool{}
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		id := n["span"].(map[string]any)["span"].(string)
		if ids[id] || !strings.HasPrefix(id, "s-") {
			t.Fatalf("span id %q", id)
		}
		ids[id] = true
		for _, c := range n["children"].([]any) {
			walk(c.(map[string]any))
		}
	}
	walk(rt)
	if len(ids) != 4 {
		t.Fatalf("ids: %v", ids)
	}
	// "last" is the trace whose root started last.
	if m := mustQuery(t, r, sb, "trace", nil); m["trace"] != "req-two" {
		t.Fatalf("last: %v", m["trace"])
	} else if st := m["spans"].([]any)[0].(map[string]any)["span"].(map[string]any); st["status"] != "error" || st["attrs"].(map[string]any)["error_kind"] != "not_found" {
		t.Fatalf("error root: %v", st)
	}
	_, err := query(t, r, sb, "trace", map[string]any{"trace_id": "req-nope"})
	if !errors.Is(err, ErrTraceNotFound) {
		t.Fatalf("unknown trace: %v", err)
	}
	if _, err := query(t, r, sb, "trace", map[string]any{"trace_id": "  "}); err == nil {
		t.Fatal("blank trace_id accepted")
	}
	// Events outside requests get synthetic trace ids by origin.
	Event(WithScope(context.Background(), r.Registry, sb), "workspace_session.restored", map[string]any{"workspace_session_id": "ws-1"})
	r.Event(sb, "", "holder.exited", map[string]any{"workspace_session_id": "ws-1", "pid": 1, "status": "x"})
	evs := eventList(t, mustQuery(t, r, sb, "events", map[string]any{"last_n": float64(2)}))
	if !strings.HasPrefix(evs[0]["trace"].(string), "recovery-") || !strings.HasPrefix(evs[1]["trace"].(string), "holder-") {
		t.Fatalf("synthetic ids: %v", evs)
	}
	// Spans are not listed by events.
	for _, e := range eventList(t, mustQuery(t, r, sb, "events", nil)) {
		if e["kind"] != "event" {
			t.Fatalf("events lists %v", e)
		}
	}
}

func TestObsTraceCaps(t *testing.T) {
	r := obsRegistry(t, func(o *Options) { o.MaxDiskBytes = 16 << 20 })
	root := r.StartSpan(Scope{}, "req-big", "", "supervisor.dispatch", nil)
	pad := strings.Repeat("p", 2000)
	for i := 0; i < 700; i++ {
		root.Child("holder.file_op", map[string]any{"seq": i, "pad": pad}).End(Completed, nil)
	}
	root.End(Completed, nil)
	m := mustQuery(t, r, Scope{}, "trace", map[string]any{"trace_id": "req-big"})
	if b := catalog.CompactJSON(m); len(b) > MaxBytes {
		t.Fatalf("trace response %d bytes", len(b))
	}
	// The newest records are kept: the root (written last) is among them.
	var names []string
	for _, n := range m["spans"].([]any) {
		names = append(names, n.(map[string]any)["span"].(map[string]any)["name"].(string))
	}
	sort.Strings(names)
	if i := sort.SearchStrings(names, "supervisor.dispatch"); i == len(names) || names[i] != "supervisor.dispatch" {
		t.Fatalf("root dropped: %d roots", len(names))
	}
	for i := 0; i < 600; i++ {
		r.Event(Scope{}, "", "many", map[string]any{"seq": i})
	}
	evs := eventList(t, mustQuery(t, r, Scope{}, "events", nil))
	if len(evs) != MaxRecords || seqOf(evs[0]) != 100 || seqOf(evs[499]) != 599 {
		t.Fatalf("events cap: %d, first %v", len(evs), evs[0])
	}
}

func TestObsDisabled(t *testing.T) {
	r := obsRegistry(t, func(o *Options) { o.Enabled = false })
	sb := obsSandbox(t, r, "sbx-off")
	r.Event(sb, "", "lease.acquired", nil)
	r.Event(Scope{}, "", "supervisor.boot", nil)
	sp := r.StartSpan(sb, "req-1", "", "supervisor.dispatch", nil)
	sp.Child("x", nil).End(Completed, nil)
	sp.Event("y", nil)
	sp.End(Completed, nil)
	if _, err := os.Stat(filepath.Join(sb.Dir, DirName)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("store created: %v", err)
	}
	if _, err := os.Stat(filepath.Join(r.data, "supervisor")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("system store created: %v", err)
	}
	if n := len(eventList(t, mustQuery(t, r, sb, "events", nil))); n != 0 {
		t.Fatalf("events: %d", n)
	}
	if m := mustQuery(t, r, sb, "trace", map[string]any{"trace_id": "req-1"}); m["trace"] != nil || len(m["spans"].([]any)) != 0 {
		t.Fatalf("trace: %v", m)
	}
	// No registry at all (a supervisor built without one) is safe too.
	var bare *Registry
	bare.Event(Scope{}, "", "x", nil)
	bare.StartSpan(Scope{}, "t", "", "n", nil).End(Completed, nil)
	if bare.Totals() != (SinkStats{}) {
		t.Fatal("bare stats")
	}
}

// TestSealStopsSandboxWrites: once a sandbox's stores are sealed for its
// removal, nothing recreates observability/ below its directory — neither a
// span started before the seal and ended after it, nor a new event or
// resource sample (issue 13 item 4: destroy failed "still present").
func TestSealStopsSandboxWrites(t *testing.T) {
	r := obsRegistry(t, nil)
	sb := obsSandbox(t, r, "sbx-sealed")
	r.Event(sb, "", "before.seal", nil)
	sp := r.StartSpan(sb, "", "", "late.span", nil)
	if err := os.RemoveAll(filepath.Join(sb.Dir, DirName)); err != nil {
		t.Fatal(err)
	}
	r.Seal(sb.Dir)
	sp.Done(nil, nil)
	r.Event(sb, "", "after.seal", nil)
	r.Resources(sb).AppendRecord(map[string]any{"kind": "sample"}, nil)
	if _, err := os.Lstat(filepath.Join(sb.Dir, DirName)); !os.IsNotExist(err) {
		t.Fatalf("observability/ after the seal: %v", err)
	}
	// Another sandbox is unaffected.
	other := obsSandbox(t, r, "sbx-other")
	r.Event(other, "", "still.recorded", nil)
	if _, err := os.Stat(filepath.Join(other.Dir, DirName, LogName)); err != nil {
		t.Fatalf("other sandbox's store: %v", err)
	}
}
