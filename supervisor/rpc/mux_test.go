package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// TestMuxRegistry: a handler for an undeclared operation, or one
// registered twice, is refused, and Missing names each declared operation
// without a handler — the checks the supervisor's TestRegistry relies on.
func TestMuxRegistry(t *testing.T) {
	m := New(Config{})
	ok := func(*Request) (any, error) { return nil, nil }
	if err := m.Handle("no_such_op", ok); err == nil {
		t.Fatal("a handler without a declaration was registered")
	}
	ops := catalog.Ops()
	for _, op := range ops[1:] {
		if err := m.Handle(op.ID, ok); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Handle(ops[1].ID, ok); err == nil {
		t.Fatal("a second handler for one operation was registered")
	}
	if got := m.Missing(); !slices.Equal(got, []string{ops[0].ID}) {
		t.Fatalf("missing: %v, want [%s]", got, ops[0].ID)
	}
	// An operation without a handler answers unknown_op, like an
	// undeclared one.
	out := m.Serve(fmt.Appendf(nil, `{"op":%q,"scope":{"kind":"system"},"args":{}}`, ops[0].ID), Origin{Conn: noHangup(t)})
	if e, ok := out.(*catalog.Error); !ok || e.Kind != catalog.UnknownOp {
		t.Fatalf("op without a handler: %#v", out)
	}
}

func noHangup(t *testing.T) func() (context.Context, func()) {
	return func() (context.Context, func()) { return context.WithCancel(t.Context()) }
}

// domainError is a typed error of some domain package, with its cause.
type domainError struct {
	reason string
	err    error
}

func (e *domainError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *domainError) Unwrap() error { return e.err }

// TestErrorMapping: a cause's kind survives to the envelope, and errors.Is
// and errors.As see the cause through the mapped error, whichever way the
// error reached the mux.
func TestErrorMapping(t *testing.T) {
	cause := errors.New("the disk said no")
	translated := func(e *domainError) *catalog.Error {
		return catalog.Errorf(catalog.InvalidRequest, "bad workspace: %s", e.reason).With("reason", e.reason)
	}
	m := New(Config{Errors: []func(error) *catalog.Error{As(translated)}})
	cases := []struct {
		name string
		err  error
		kind string
	}{
		{"wrapped catalog error", fmt.Errorf("publish ws-1: %w", catalog.Wrap(catalog.OperationConflict, cause, "session busy")), catalog.OperationConflict},
		{"catalog.Errorf with %w", fmt.Errorf("squash: %w", catalog.Errorf(catalog.NotFound, "layer gone: %w", cause)), catalog.NotFound},
		{"translated domain error", fmt.Errorf("create: %w", &domainError{"special_file", cause}), catalog.InvalidRequest},
		{"missing file", fmt.Errorf("read a: %w", &fs.PathError{Op: "open", Path: "a", Err: errors.Join(fs.ErrNotExist, cause)}), catalog.NotFound},
		{"cancelled", fmt.Errorf("walk: %w (%w)", context.Canceled, cause), catalog.OperationFailed},
		{"anything else", fmt.Errorf("write: %w", cause), catalog.OperationFailed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Through Serve, as a handler's error reaches the client.
			mm := New(Config{Errors: m.cfg.Errors})
			if err := mm.Handle("health", func(*Request) (any, error) { return nil, c.err }); err != nil {
				t.Fatal(err)
			}
			out := mm.Serve([]byte(`{"op":"health","scope":{"kind":"system"},"args":{}}`), Origin{Conn: noHangup(t)})
			e, ok := out.(*catalog.Error)
			if !ok {
				t.Fatalf("result %#v, want an error", out)
			}
			if e.Kind != c.kind {
				t.Fatalf("kind %s, want %s (%v)", e.Kind, c.kind, e)
			}
			if !errors.Is(e, cause) {
				t.Fatalf("errors.Is does not see the cause through %v", e)
			}
			var env map[string]map[string]any
			if err := json.Unmarshal(e.MarshalEnvelope(), &env); err != nil || env["error"]["kind"] != c.kind {
				t.Fatalf("envelope %s (%v)", e.MarshalEnvelope(), err)
			}
			if len(env["error"]) != 3 {
				t.Fatalf("the envelope carries more than kind, message, details: %s", e.MarshalEnvelope())
			}
		})
	}
	var de *domainError
	if e := m.Error("create_sandbox", fmt.Errorf("x: %w", &domainError{"r", cause})); !errors.As(e, &de) || e.Details["reason"] != "r" {
		t.Fatalf("errors.As does not find the domain error in %v (%v)", e, e.Details)
	}
}

// TestRequestContext: a request's context derives from its connection and
// carries the request ID. When the client hangs up, the operations the
// catalog declares cancellable see their context cancelled with cause
// ErrClientGone and the failure is reported as the cancellation; the others
// run on, their context never cancelled by the client (§2.4).
func TestRequestContext(t *testing.T) {
	requests := map[string]string{
		"file_list":                 `{}`,
		"export_changes":            `{"sandbox_id":"sb-1","dest":"/tmp/out.tar","format":"tar"}`,
		"diff_workspace_session":    `{"workspace_session_id":"ws-1"}`,
		"file_write":                `{"path":"a.txt","content":"x"}`,
		"publish_workspace_session": `{"workspace_session_id":"ws-1"}`,
		"exec_command":              `{"cmd":"true"}`,
	}
	for op, args := range requests {
		t.Run(op, func(t *testing.T) {
			decl, _ := catalog.Lookup(op)
			ours, peer := unixPair(t)
			peer.Close() // the client is gone before its request runs
			var seen context.Context
			m := New(Config{})
			if err := m.Handle(op, func(r *Request) (any, error) {
				seen = r.Ctx
				if err := r.Ctx.Err(); err != nil {
					return nil, fmt.Errorf("walk stopped: %v", err) // flattened on purpose: ClientGone still says why
				}
				return map[string]any{"ok": true}, nil
			}); err != nil {
				t.Fatal(err)
			}
			scope := `{"kind":"sandbox","sandbox_id":"sb-1"}`
			if decl.Scope == catalog.ScopeSystem {
				scope = `{"kind":"system"}`
			}
			line := fmt.Appendf(nil, `{"op":%q,"request_id":"req-ctx","scope":%s,"args":%s}`, op, scope, args)
			out := m.Serve(line, Origin{Conn: func() (context.Context, func()) { return WatchHangup(t.Context(), ours) }})
			if seen == nil {
				t.Fatalf("handler not run: %#v", out)
			}
			if got := RequestID(seen); got != "req-ctx" {
				t.Fatalf("request ID in the context: %q", got)
			}
			cancelled := errors.Is(context.Cause(seen), ErrClientGone)
			if cancelled != decl.Cancellable {
				t.Fatalf("context cancelled by the hang-up: %v, declared cancellable: %v", cancelled, decl.Cancellable)
			}
			e, failed := out.(*catalog.Error)
			if failed != decl.Cancellable {
				t.Fatalf("result %#v", out)
			}
			if failed && (!errors.Is(e, ErrClientGone) || !errors.Is(e, context.Canceled) || !strings.Contains(e.Message, "walk stopped")) {
				t.Fatalf("a cancelled walk's error %v does not say the client went away", e)
			}
		})
	}
}
