package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	sbx "github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
)

func obsSupervisor(t *testing.T, mutate func(*Config)) *Supervisor {
	t.Helper()
	cfg := DefaultConfig()
	if mutate != nil {
		mutate(cfg)
	}
	data := t.TempDir()
	return &Supervisor{cfg: cfg, dirs: catalog.Dirs{Data: data}, ids: newIDSource(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), obs: newObsRegistry(cfg, data), sandboxes: sbx.NewRegistry[*occupants]()}
}

func obsSandbox(t *testing.T, s *Supervisor, id string) *sandbox {
	t.Helper()
	dir := filepath.Join(s.dirs.Data, "sandboxes", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return newSandbox(sandboxRecord{ID: id}, dir)
}

// query runs an observability handler the way dispatch does (validated args).
func query(t *testing.T, s *Supervisor, sb *sandbox, opID string, raw map[string]any) (map[string]any, error) {
	t.Helper()
	op, ok := catalog.Lookup(opID)
	if !ok {
		t.Fatalf("no op %s", opID)
	}
	args, verr := op.Validate(raw)
	if verr != nil {
		return nil, verr
	}
	c := &call{ctx: context.Background(), req: &catalog.Request{Op: opID, RequestID: "req-q"}, op: op, args: args, sb: sb}
	res, err := handlers[opID](s, c)
	if err != nil {
		return nil, err
	}
	// Round-trip through JSON as the wire does.
	var m map[string]any
	if err := json.Unmarshal(catalog.CompactJSON(res), &m); err != nil {
		t.Fatal(err)
	}
	return m, nil
}

func mustQuery(t *testing.T, s *Supervisor, sb *sandbox, opID string, raw map[string]any) map[string]any {
	t.Helper()
	m, err := query(t, s, sb, opID, raw)
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
	if fi, err := os.Stat(filepath.Join(dir, obsLogName)); err == nil {
		cur = fi.Size()
	}
	if fi, err := os.Stat(filepath.Join(dir, obsLogName+".1")); err == nil {
		rot = fi.Size()
	}
	return cur, rot
}

func TestObsCapsHoldUnder10000Events(t *testing.T) {
	s := obsSupervisor(t, nil)
	sb := obsSandbox(t, s, "sbx-caps")
	dir := filepath.Join(sb.Dir, obsDirName)
	pad := strings.Repeat("x", 900)
	limit := int64(s.cfg.Observability.MaxDiskBytes)
	for i := 0; i < 10000; i++ {
		s.event(sb, "", "test.event", map[string]any{"seq": i, "pad": pad})
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
	if st := s.obsStats(sb); st != (SinkStats{}) {
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
	evs := eventList(t, mustQuery(t, s, sb, "events", nil))
	if len(evs) == 0 || len(evs) > obsMaxRecords || seqOf(evs[len(evs)-1]) != 9999 {
		t.Fatalf("got %d events, last %v", len(evs), evs[len(evs)-1])
	}
	if b, _ := json.Marshal(evs); len(b) > obsMaxBytes {
		t.Fatalf("response %d bytes", len(b))
	}
	for i := 1; i < len(evs); i++ {
		if seqOf(evs[i]) != seqOf(evs[i-1])+1 {
			t.Fatalf("not chronological/contiguous at %d: %d then %d", i, seqOf(evs[i-1]), seqOf(evs[i]))
		}
	}
}

func TestObsTruncationAndDrops(t *testing.T) {
	s := obsSupervisor(t, nil)
	big := strings.Repeat("y", 20000)
	s.event(nil, "", "big.attrs", map[string]any{"blob": big})
	evs := eventList(t, mustQuery(t, s, nil, "events", nil))
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
	if st := s.obsStats(nil); st.TruncatedRecords != 1 || st.DroppedOversized != 0 {
		t.Fatalf("stats: %+v", st)
	}
	// A name too long for the line cap even without attrs: dropped.
	s.event(nil, "", strings.Repeat("n", 17000), nil)
	if st := s.obsStats(nil); st.DroppedOversized != 1 {
		t.Fatalf("stats: %+v", st)
	}
	// A storage error (the sandbox directory is gone) drops and counts,
	// and does not recreate the sandbox directory.
	sb := newSandbox(sandboxRecord{ID: "sbx-gone"}, filepath.Join(s.dirs.Data, "sandboxes", "sbx-gone"))
	s.event(sb, "", "lease.released", nil)
	sp := s.startSpan(sb, "req-x", "", "supervisor.dispatch", nil)
	sp.end(spanCompleted, nil)
	if st := s.obsStats(sb); st.DroppedStorage != 2 {
		t.Fatalf("sandbox stats: %+v", st)
	}
	if _, err := os.Stat(sb.Dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("sandbox dir recreated: %v", err)
	}
	if st := s.obsStats(nil); st != (SinkStats{DroppedStorage: 2, DroppedOversized: 1, TruncatedRecords: 1}) {
		t.Fatalf("totals: %+v", st)
	}
}

func TestObsRotationKeepsOrder(t *testing.T) {
	s := obsSupervisor(t, func(c *Config) { c.Observability.MaxDiskBytes = 8192 })
	sb := obsSandbox(t, s, "sbx-rot")
	dir := filepath.Join(sb.Dir, obsDirName)
	for i := 0; i < 200; i++ {
		s.event(sb, "", "tick", map[string]any{"seq": i})
		cur, rot := segSizes(t, dir)
		if cur > 4096 || rot > 4096 {
			t.Fatalf("segment over half: %d %d", cur, rot)
		}
	}
	cur, rot := segSizes(t, dir)
	if rot == 0 || cur == 0 {
		t.Fatalf("expected both segments: %d %d", cur, rot)
	}
	evs := eventList(t, mustQuery(t, s, sb, "events", nil))
	if seqOf(evs[len(evs)-1]) != 199 {
		t.Fatalf("newest missing: %v", evs[len(evs)-1])
	}
	// Records from the rotated segment come first.
	b, _ := os.ReadFile(filepath.Join(dir, obsLogName+".1"))
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
	s.event(sb, "", "huge", map[string]any{"pad": strings.Repeat("z", 5000)})
	if st := s.obsStats(sb); st.DroppedOversized != 1 || st.TruncatedRecords != 0 {
		t.Fatalf("stats: %+v", st)
	}
}

func TestObsEventFilters(t *testing.T) {
	s := obsSupervisor(t, nil)
	sb := obsSandbox(t, s, "sbx-f")
	for i := 0; i < 30; i++ {
		name := "a"
		if i%3 == 0 {
			name = "b"
		}
		s.event(sb, "", name, map[string]any{"seq": i})
		if i == 19 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	all := eventList(t, mustQuery(t, s, sb, "events", nil))
	if len(all) != 30 {
		t.Fatalf("all: %d", len(all))
	}
	last := eventList(t, mustQuery(t, s, sb, "events", map[string]any{"last_n": float64(4)}))
	if len(last) != 4 || seqOf(last[0]) != 26 || seqOf(last[3]) != 29 {
		t.Fatalf("last_n: %v", last)
	}
	bs := eventList(t, mustQuery(t, s, sb, "events", map[string]any{"name": "b", "last_n": float64(2)}))
	if len(bs) != 2 || seqOf(bs[0]) != 24 || seqOf(bs[1]) != 27 {
		t.Fatalf("name+last_n: %v", bs)
	}
	ts := all[20]["ts"].(float64)
	since := eventList(t, mustQuery(t, s, sb, "events", map[string]any{"since_ms": ts}))
	if len(since) == 0 || seqOf(since[0]) > 20 || seqOf(since[len(since)-1]) != 29 {
		t.Fatalf("since_ms: %v", since)
	}
	for _, e := range since {
		if e["ts"].(float64) < ts {
			t.Fatalf("since_ms not inclusive lower bound: %v", e)
		}
	}
	if n := len(eventList(t, mustQuery(t, s, sb, "events", map[string]any{"name": "nope"}))); n != 0 {
		t.Fatalf("unknown name: %d", n)
	}
	for _, bad := range []map[string]any{{"last_n": float64(0)}, {"last_n": float64(501)}, {"since_ms": float64(-1)}, {"bogus": "x"}} {
		if _, err := query(t, s, sb, "events", bad); err == nil || err.(*catalog.Error).Kind != catalog.InvalidRequest {
			t.Fatalf("%v: %v", bad, err)
		}
	}
	// System scope reads the system store: none of the sandbox's events.
	if n := len(eventList(t, mustQuery(t, s, nil, "events", nil))); n != 0 {
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
	s := obsSupervisor(t, func(c *Config) { c.Observability.MaxDiskBytes = 4096 })
	sb := obsSandbox(t, s, "sbx-ro")
	// A store never written: queries create nothing.
	mustQuery(t, s, sb, "events", nil)
	mustQuery(t, s, sb, "trace", nil)
	mustQuery(t, s, nil, "events", nil)
	if _, err := os.Stat(filepath.Join(sb.Dir, obsDirName)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("read created the store: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.dirs.Data, "supervisor")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("read created the system store: %v", err)
	}
	for i := 0; i < 60; i++ {
		sp := s.startSpan(sb, fmt.Sprintf("req-%d", i), "", "supervisor.dispatch", map[string]any{"op": "file_read"})
		sp.event("x", map[string]any{"seq": i})
		sp.end(spanCompleted, nil)
	}
	before := fileStates(t, s.dirs.Data)
	time.Sleep(20 * time.Millisecond)
	mustQuery(t, s, sb, "events", nil)
	mustQuery(t, s, sb, "events", map[string]any{"last_n": float64(3), "name": "x"})
	mustQuery(t, s, sb, "trace", nil)
	mustQuery(t, s, sb, "trace", map[string]any{"trace_id": "req-59"})
	if _, err := query(t, s, sb, "trace", map[string]any{"trace_id": "req-unknown"}); err == nil {
		t.Fatal("unknown trace found")
	}
	mustQuery(t, s, nil, "trace", nil)
	after := fileStates(t, s.dirs.Data)
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("reads changed files:\n%v\n%v", before, after)
	}
}

func TestObsTraceTree(t *testing.T) {
	s := obsSupervisor(t, nil)
	sb := obsSandbox(t, s, "sbx-tr")
	if m := mustQuery(t, s, sb, "trace", nil); m["trace"] != nil || len(m["spans"].([]any)) != 0 || m["view"] != "trace" {
		t.Fatalf("empty store: %v", m)
	}
	// One request: root, two children (the second one with a grandchild), events.
	root := s.startSpan(sb, "req-one", "", "supervisor.dispatch", map[string]any{"op": "exec_command"})
	ctx := withSpan(context.Background(), root)
	s.eventCtx(ctx, sb, "lease.acquired", map[string]any{"workspace_session_id": "ws-1", "revision": 3})
	a := root.child("workspace_session.create", nil)
	time.Sleep(3 * time.Millisecond)
	a.end(spanCompleted, nil)
	b := root.child("command.exec", map[string]any{"session_created": true})
	g := b.child("holder.exec", nil)
	g.event("inner", nil)
	time.Sleep(2 * time.Millisecond)
	g.end(spanError, nil)
	b.end(spanCompleted, map[string]any{"finalize_policy": "publish"})
	root.finish(nil)
	// Another, later request in the same store.
	time.Sleep(2 * time.Millisecond)
	other := s.startSpan(sb, "req-two", "", "supervisor.dispatch", map[string]any{"op": "file_read"})
	other.finish(catalog.Errorf(catalog.NotFound, "x"))

	m := mustQuery(t, s, sb, "trace", map[string]any{"trace_id": "req-one"})
	if m["trace"] != "req-one" {
		t.Fatalf("trace: %v", m)
	}
	roots := m["spans"].([]any)
	if len(roots) != 1 {
		t.Fatalf("roots: %v", roots)
	}
	r := roots[0].(map[string]any)
	rs := r["span"].(map[string]any)
	if rs["name"] != "supervisor.dispatch" || rs["attrs"].(map[string]any)["op"] != "exec_command" || rs["status"] != "completed" || rs["kind"] != "span" || rs["parent"] != nil {
		t.Fatalf("root: %v", rs)
	}
	if r["offset_ms"].(float64) != 0 {
		t.Fatalf("root offset: %v", r["offset_ms"])
	}
	kids := r["children"].([]any)
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
	revs := r["events"].([]any)
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
	walk(r)
	if len(ids) != 4 {
		t.Fatalf("ids: %v", ids)
	}
	// "last" is the trace whose root started last.
	if m := mustQuery(t, s, sb, "trace", nil); m["trace"] != "req-two" {
		t.Fatalf("last: %v", m["trace"])
	} else if st := m["spans"].([]any)[0].(map[string]any)["span"].(map[string]any); st["status"] != "error" || st["attrs"].(map[string]any)["error_kind"] != "not_found" {
		t.Fatalf("error root: %v", st)
	}
	_, err := query(t, s, sb, "trace", map[string]any{"trace_id": "req-nope"})
	var ce *catalog.Error
	if !errors.As(err, &ce) || ce.Kind != catalog.NotFound {
		t.Fatalf("unknown trace: %v", err)
	}
	if _, err := query(t, s, sb, "trace", map[string]any{"trace_id": "  "}); err == nil {
		t.Fatal("blank trace_id accepted")
	}
	// Events outside requests get synthetic trace ids by origin.
	s.eventCtx(context.Background(), sb, "workspace_session.restored", map[string]any{"workspace_session_id": "ws-1"})
	s.event(sb, "", "holder.exited", map[string]any{"workspace_session_id": "ws-1", "pid": 1, "status": "x"})
	evs := eventList(t, mustQuery(t, s, sb, "events", map[string]any{"last_n": float64(2)}))
	if !strings.HasPrefix(evs[0]["trace"].(string), "recovery-") || !strings.HasPrefix(evs[1]["trace"].(string), "holder-") {
		t.Fatalf("synthetic ids: %v", evs)
	}
	// Spans are not listed by events.
	for _, e := range eventList(t, mustQuery(t, s, sb, "events", nil)) {
		if e["kind"] != "event" {
			t.Fatalf("events lists %v", e)
		}
	}
}

func TestObsTraceCaps(t *testing.T) {
	s := obsSupervisor(t, func(c *Config) { c.Observability.MaxDiskBytes = 16 << 20 })
	root := s.startSpan(nil, "req-big", "", "supervisor.dispatch", nil)
	pad := strings.Repeat("p", 2000)
	for i := 0; i < 700; i++ {
		root.child("holder.file_op", map[string]any{"seq": i, "pad": pad}).end(spanCompleted, nil)
	}
	root.end(spanCompleted, nil)
	m := mustQuery(t, s, nil, "trace", map[string]any{"trace_id": "req-big"})
	if b := catalog.CompactJSON(m); len(b) > obsMaxBytes {
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
		s.event(nil, "", "many", map[string]any{"seq": i})
	}
	evs := eventList(t, mustQuery(t, s, nil, "events", nil))
	if len(evs) != obsMaxRecords || seqOf(evs[0]) != 100 || seqOf(evs[499]) != 599 {
		t.Fatalf("events cap: %d, first %v", len(evs), evs[0])
	}
}

func TestObsDisabled(t *testing.T) {
	s := obsSupervisor(t, func(c *Config) { c.Observability.Enabled = false })
	sb := obsSandbox(t, s, "sbx-off")
	s.event(sb, "", "lease.acquired", nil)
	s.event(nil, "", "supervisor.boot", nil)
	sp := s.startSpan(sb, "req-1", "", "supervisor.dispatch", nil)
	sp.child("x", nil).end(spanCompleted, nil)
	sp.event("y", nil)
	sp.finish(nil)
	if _, err := os.Stat(filepath.Join(sb.Dir, obsDirName)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("store created: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.dirs.Data, "supervisor")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("system store created: %v", err)
	}
	if n := len(eventList(t, mustQuery(t, s, sb, "events", nil))); n != 0 {
		t.Fatalf("events: %d", n)
	}
	if m := mustQuery(t, s, sb, "trace", map[string]any{"trace_id": "req-1"}); m["trace"] != nil || len(m["spans"].([]any)) != 0 {
		t.Fatalf("trace: %v", m)
	}
	// A Supervisor without any registry (unit tests elsewhere) is safe too.
	bare := &Supervisor{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	bare.event(nil, "", "x", nil)
	bare.startSpan(nil, "t", "", "n", nil).end(spanCompleted, nil)
	if bare.obsStats(nil) != (SinkStats{}) {
		t.Fatal("bare stats")
	}
}

// TestSealStopsSandboxWrites: once a sandbox's stores are sealed for its
// removal, nothing recreates observability/ below its directory — neither a
// span started before the seal and ended after it, nor a new event or
// resource sample (issue 13 item 4: destroy failed "still present").
func TestSealStopsSandboxWrites(t *testing.T) {
	s := obsSupervisor(t, nil)
	sb := obsSandbox(t, s, "sbx-sealed")
	s.event(sb, "", "before.seal", nil)
	sp := s.startSpan(sb, "", "", "late.span", nil)
	if err := os.RemoveAll(filepath.Join(sb.Dir, obsDirName)); err != nil {
		t.Fatal(err)
	}
	s.obs.seal(sb.Dir)
	sp.done(nil, nil)
	s.event(sb, "", "after.seal", nil)
	s.obs.resources(sb).appendRecord(map[string]any{"kind": "sample"}, nil)
	if _, err := os.Lstat(filepath.Join(sb.Dir, obsDirName)); !os.IsNotExist(err) {
		t.Fatalf("observability/ after the seal: %v", err)
	}
	// Another sandbox is unaffected.
	other := obsSandbox(t, s, "sbx-other")
	s.event(other, "", "still.recorded", nil)
	if _, err := os.Stat(filepath.Join(other.Dir, obsDirName, obsLogName)); err != nil {
		t.Fatalf("other sandbox's store: %v", err)
	}
}
