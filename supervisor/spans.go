package supervisor

// Spans of whole operations (§10.2). A handler whose operation declares a
// span (catalog.Op.Span) runs inside that span, a child of the request's supervisor.dispatch
// root; its attributes come from the arguments and the result, so the
// handlers stay free of tracing code. Spans of parts of operations
// (capture, layer publication, holder calls, …) are recorded where that
// work happens, under the span the context carries.

import (
	"errors"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/rpc"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// opSpan derives the attributes of an operation's span.
type opSpan struct {
	start func(c *call) map[string]any
	end   func(c *call, res any, err error) map[string]any
}

// opSpans are keyed by operation ID; an entry for an operation that
// declares no span is never used (TestRegistry refuses it).
var opSpans = map[string]opSpan{
	"create_sandbox": {
		start: func(c *call) map[string]any {
			return map[string]any{"image": c.args.String("image"), "count": c.args.Uint("count")}
		},
		end: func(_ *call, res any, _ error) map[string]any {
			if rec, ok := res.(sandboxRecord); ok {
				return map[string]any{"sandbox_id": rec.ID, "overlay_driver": rec.OverlayDriver}
			}
			return nil
		}},
	"destroy_sandbox": {
		start: func(c *call) map[string]any { return map[string]any{"sandbox_id": c.args.String("sandbox_id")} }},
	"squash_layerstacks": {
		start: func(c *call) map[string]any { return map[string]any{"sandbox_id": c.args.String("sandbox_id")} }},
	"export_changes": {
		start: func(c *call) map[string]any {
			return map[string]any{"sandbox_id": c.args.String("sandbox_id"), "format": c.args.String("format")}
		}},
	"exec_command": {
		start: func(c *call) map[string]any {
			created := !c.args.Has("workspace_session_id")
			policy := workspace.PolicyNoOp
			if created {
				policy = workspace.PolicyPublish
			}
			return map[string]any{"session_created": created, "finalize_policy": policy}
		},
		end: func(_ *call, res any, _ error) map[string]any {
			if m, ok := res.(map[string]any); ok {
				return map[string]any{"command_session_id": m["command_session_id"], "workspace_session_id": m["workspace_session_id"],
					"status": m["status"]}
			}
			return nil
		}},
	"fork_workspace_session": {
		start: func(c *call) map[string]any {
			return map[string]any{"workspace_session_id": c.args.String("workspace_session_id")}
		},
		end: func(_ *call, res any, _ error) map[string]any {
			if m, ok := res.(map[string]any); ok {
				return map[string]any{"fork_workspace_session_id": m["workspace_session_id"], "network_profile": m["network_profile"]}
			}
			return nil
		}},
	"publish_workspace_session": {
		start: func(c *call) map[string]any {
			return map[string]any{"workspace_session_id": c.args.String("workspace_session_id"), "dry_run": c.args.Bool("dry_run")}
		},
		end: publishSpanAttrs},
	"sync_workspace_session": {
		start: func(c *call) map[string]any {
			return map[string]any{"workspace_session_id": c.args.String("workspace_session_id"), "dry_run": c.args.Bool("dry_run")}
		},
		end: func(_ *call, res any, err error) map[string]any {
			a := map[string]any{"synced": false}
			if m, ok := res.(map[string]any); ok {
				if so, ok := m["sync"].(map[string]any); ok {
					a["no_op"], a["base_revision"], a["result"] = so["no_op"], so["base_revision"], so["result"]
					a["synced"] = m["dry_run"] == false && so["no_op"] == false
				}
			}
			var ce *catalog.Error
			if errors.As(err, &ce) {
				a["stage"], a["reason"] = ce.Details["stage"], ce.Details["reason"]
			}
			return a
		}},
}

// publishSpanAttrs are workspace_session.publish's attributes (§10.2) from
// a publish result or error.
func publishSpanAttrs(_ *call, res any, err error) map[string]any {
	a := map[string]any{"committed": false, "destroyed": false}
	if m, ok := res.(map[string]any); ok {
		pub, _ := m["publish"].(map[string]any)
		a["no_op"], a["revision"], a["destroyed"] = pub["no_op"], pub["revision"], m["destroyed"] == true
		if rs, ok := pub["route_summary"].(layers.RouteSummary); ok {
			a["source_count"], a["ignored_count"] = rs.SourceCount, rs.IgnoredCount
		}
		if dry, _ := m["dry_run"].(bool); dry {
			a["committed"] = false
		} else {
			a["committed"] = pub["no_op"] == false
		}
		a["stage"] = "done"
	}
	var ce *catalog.Error
	if errors.As(err, &ce) {
		if st, ok := ce.Details["stage"]; ok {
			a["stage"] = st
		}
	}
	return a
}

// runTraced runs the handler inside its operation's span, if it declares one.
func (s *Supervisor) runTraced(c *call, h handler) (any, error) {
	if c.op.Span == "" || c.span == nil {
		return h(s, c)
	}
	osp := opSpans[c.op.ID]
	var attrs map[string]any
	if osp.start != nil {
		attrs = osp.start(c)
	}
	sp, ctx := spanIn(s.obs, c.ctx, c.sb, "", c.op.Span, attrs)
	c.ctx = ctx
	res, err := h(s, c)
	err = rpc.ClientGone(c.ctx, err)
	var endAttrs map[string]any
	if osp.end != nil {
		endAttrs = osp.end(c, res, err)
	}
	sp.done(err, endAttrs)
	return res, err
}
