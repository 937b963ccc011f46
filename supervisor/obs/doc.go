// Package obs owns the supervisor's spans and events (contract §10.2) and
// their bounded disk stores (§10.1): one event log per sandbox and one for
// the supervisor, the resource-sample stores beside them, the
// supervisor-wide record sequence with its live subscribers (the HTTP
// event stream), and the events and trace queries (§10.3).
//
// It must never fail or block a runtime operation: every storage error is
// counted and swallowed, and it imports nothing of the supervisor above it.
//
// A span travels in the context: Start(ctx, name, attrs) opens a child of
// the span ctx carries (a request's supervisor.dispatch root, see
// (*Registry).StartSpan) or, for work outside a request, the root of a
// synthetic trace in the store WithScope put in ctx. Code below a handler
// therefore needs neither a sandbox nor a trace id to record its work.
package obs
