package obs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartCarriesTheSpan: obs.Start opens the root of a synthetic trace
// in the scope ctx names, children under the span ctx carries, and
// nothing without either; events follow the same rule.
func TestStartCarriesTheSpan(t *testing.T) {
	r := obsRegistry(t, nil)
	sb := obsSandbox(t, r, "sbx-ctx")

	if ctx, sp := Start(context.Background(), "holder.spawn", nil); sp != nil || From(ctx) != nil {
		t.Fatalf("a span without scope or parent: %v", sp)
	}
	Event(context.Background(), "lease.acquired", nil) // recorded nowhere, no panic

	ctx := WithScope(context.Background(), r.Registry, sb)
	rctx, root := Start(ctx, "workspace_session.restore", map[string]any{"workspace_session_id": "ws-1"})
	if root == nil || From(rctx) != root || !strings.HasPrefix(root.Trace(), "recovery-") {
		t.Fatalf("root: %+v", root)
	}
	cctx, child := Start(rctx, "holder.spawn", nil)
	if child.Trace() != root.Trace() || child.parent != root.ID() || From(cctx) != child {
		t.Fatalf("child %+v of %+v", child, root)
	}
	Event(cctx, "workspace_session.restored", nil)
	child.Done(errors.New("boom"), nil)
	root.Done(context.Canceled, nil)

	tr := mustQuery(t, r, sb, "trace", map[string]any{"trace_id": root.Trace()})
	top := tr["spans"].([]any)[0].(map[string]any)
	if s := top["span"].(map[string]any); s["name"] != "workspace_session.restore" || s["status"] != Cancelled {
		t.Fatalf("root record: %v", s)
	}
	kid := top["children"].([]any)[0].(map[string]any)
	if s := kid["span"].(map[string]any); s["status"] != Error || s["attrs"].(map[string]any)["error"] != "boom" {
		t.Fatalf("child record: %v", s)
	}
	if evs := kid["events"].([]any); len(evs) != 1 || evs[0].(map[string]any)["event"].(map[string]any)["name"] != "workspace_session.restored" {
		t.Fatalf("child events: %v", evs)
	}
	// Outside any span, an event in the scope gets a synthetic trace.
	Event(ctx, "holder.exited", nil)
	evs := eventList(t, mustQuery(t, r, sb, "events", map[string]any{"name": "holder.exited"}))
	if len(evs) != 1 || !strings.HasPrefix(evs[0]["trace"].(string), "holder-") {
		t.Fatalf("scoped event: %v", evs)
	}
}

// TestQueriesStopWhenCancelled: a query over a store stops with the
// context's error once the context ends, instead of reading to the end.
func TestQueriesStopWhenCancelled(t *testing.T) {
	r := obsRegistry(t, nil)
	sb := obsSandbox(t, r, "sbx-cancel")
	for i := 0; i < 3000; i++ {
		r.Event(sb, "", "tick", map[string]any{"seq": i})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Store(sb).Events(ctx, EventFilter{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("events after cancel: %v", err)
	}
	if _, _, err := r.Store(sb).Trace(ctx, "last"); !errors.Is(err, context.Canceled) {
		t.Fatalf("trace after cancel: %v", err)
	}
	if _, _, err := r.Replay(ctx, []Scope{sb}, 0, 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("replay after cancel: %v", err)
	}
	// A live context reads everything.
	recs, err := r.Store(sb).Events(context.Background(), EventFilter{LastN: 1})
	if err != nil || len(recs) != 1 || !strings.Contains(string(recs[0]), `"seq":2999`) {
		t.Fatalf("events: %s %v", recs, err)
	}
}

// BenchmarkSpan is the cost of one span record (start + end) in a sandbox
// store: what tracing adds per span to a request.
func BenchmarkSpan(b *testing.B) {
	r := obsRegistry(b, nil)
	sb := Scope{ID: "sbx-bench", Dir: filepath.Join(r.data, "sbx-bench")}
	if err := os.MkdirAll(sb.Dir, 0o700); err != nil {
		b.Fatal(err)
	}
	root := r.StartSpan(sb, "req-bench", "", "supervisor.dispatch", map[string]any{"op": "exec_command"})
	for b.Loop() {
		sp := root.Child("holder.exec", map[string]any{"workspace_session_id": "ws-x", "command_session_id": "cmd-y"})
		sp.Done(nil, nil)
	}
}
