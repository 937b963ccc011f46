package supervisor

import (
	"context"
	"errors"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// TestRequestSpan: a request's supervisor.dispatch root is traced under
// its request_id in its sandbox's store, carries the error kind it ended
// with, and parents what the handler records through the context;
// observability operations are not traced (§3.7).
func TestRequestSpan(t *testing.T) {
	s := obsSupervisor(t, nil)
	sb := obsSandbox(t, s, "sbx-req")
	call := func(opID, reqID string) *call {
		op, ok := catalog.Lookup(opID)
		if !ok {
			t.Fatalf("no op %s", opID)
		}
		return &call{ctx: context.Background(), req: &catalog.Request{Op: opID, RequestID: reqID}, op: op, sb: sb}
	}
	if c := call("events", "req-obs"); requestSpan(s.obs, c) != nil || spanFrom(c.ctx) != nil {
		t.Fatal("an observability operation was traced")
	}
	c := call("file_read", "req-fail")
	sp := requestSpan(s.obs, c)
	if sp == nil || spanFrom(c.ctx) != sp {
		t.Fatal("no root span in the request context")
	}
	eventCtxIn(s.obs, c.ctx, sb, "lease.acquired", nil)
	child, _ := spanIn(s.obs, c.ctx, sb, "", "holder.file_op", nil)
	child.done(errors.New("gone"), nil)
	sp.finish(catalog.Errorf(catalog.NotFound, "no such file"))

	m := mustQuery(t, s, sb, "trace", map[string]any{"trace_id": "req-fail"})
	root := m["spans"].([]any)[0].(map[string]any)
	rs := root["span"].(map[string]any)
	if rs["name"] != "supervisor.dispatch" || rs["status"] != spanError || rs["attrs"].(map[string]any)["error_kind"] != catalog.NotFound {
		t.Fatalf("root: %v", rs)
	}
	if kids := root["children"].([]any); len(kids) != 1 || kids[0].(map[string]any)["span"].(map[string]any)["name"] != "holder.file_op" {
		t.Fatalf("children: %v", kids)
	}
	if evs := root["events"].([]any); len(evs) != 1 {
		t.Fatalf("events: %v", evs)
	}
	if _, err := query(t, s, sb, "trace", map[string]any{"trace_id": "req-nope"}); !isKind(err, catalog.NotFound) {
		t.Fatalf("unknown trace: %v", err)
	}
}

func isKind(err error, kind string) bool {
	var ce *catalog.Error
	return errors.As(err, &ce) && ce.Kind == kind
}
