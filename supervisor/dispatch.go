package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"runtime/debug"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/images"
)

// call is one request on its way through a handler.
type call struct {
	ctx      context.Context
	req      *catalog.Request
	op       *catalog.Op
	args     catalog.Args
	sb       *sandbox // resolved for sandbox-scoped operations
	span     *span    // the request's supervisor.dispatch span (nil: not traced)
	progress func(string)
}

type handler func(s *Supervisor, c *call) (any, error)

// handlers maps operation IDs to their implementation. An operation declared
// in the catalog without an entry here is unknown_op, exactly like an
// undeclared one.
var handlers = map[string]handler{
	"create_sandbox":             (*Supervisor).createSandbox,
	"list_docker_images":         (*Supervisor).listDockerImages,
	"list_workspace_directories": (*Supervisor).listWorkspaceDirectories,
	"destroy_sandbox":            (*Supervisor).destroySandbox,
	"list_sandboxes":             (*Supervisor).listSandboxes,
	"inspect_sandbox":            (*Supervisor).inspectSandbox,
	"export_changes":             (*Supervisor).exportChanges,
	"squash_layerstacks":         (*Supervisor).squashLayerstacks,
	"file_read":                  (*Supervisor).fileRead,
	"file_write":                 (*Supervisor).fileWrite,
	"file_edit":                  (*Supervisor).fileEdit,
	"file_list":                  (*Supervisor).fileList,
	"file_blame":                 (*Supervisor).fileBlame,
	"health":                     (*Supervisor).health,
	"exec_command":               (*Supervisor).execCommand,
	"write_command_stdin":        (*Supervisor).writeCommandStdin,
	"read_command_lines":         (*Supervisor).readCommandLines,
	"list_commands":              (*Supervisor).listCommands,
	"create_workspace_session":   (*Supervisor).createWorkspaceSession,
	"destroy_workspace_session":  (*Supervisor).destroyWorkspaceSession,
	"list_workspace_sessions":    (*Supervisor).listWorkspaceSessions,
	"forward_port":               (*Supervisor).forwardPort,
	"diff_workspace_session":     (*Supervisor).diffWorkspaceSession,
	"publish_workspace_session":  (*Supervisor).publishWorkspaceSession,
	"events":                     (*Supervisor).eventsView,
	"resources":                  (*Supervisor).resources,
	"cgroup":                     (*Supervisor).cgroupView,
	"trace":                      (*Supervisor).traceView,
	"snapshot":                   (*Supervisor).snapshot,
	"daemon":                     (*Supervisor).daemon,
	"topology":                   (*Supervisor).topology,
	"layerstack":                 (*Supervisor).layerstack,
	"file_activity":              (*Supervisor).fileActivity,
}

// cancellableOps only read (export writes only its destination, files via
// temp + rename): when their client disconnects they stop early (the
// request context is cancelled). Every other operation completes even then
// (§2.4: a command keeps running, a publish still commits).
var cancellableOps = map[string]bool{"export_changes": true, "diff_workspace_session": true, "file_read": true,
	"file_list": true, "file_blame": true, "list_workspace_directories": true}

func cancellable(op *catalog.Op) bool {
	return cancellableOps[op.ID] || op.Group == catalog.Observability
}

// streamingOps may send progress lines (§2.5).
var streamingOps = map[string]bool{"create_sandbox": true, "destroy_sandbox": true, "squash_layerstacks": true, "export_changes": true}

// requester is where a request came from, as handleLine needs it.
type requester struct {
	tcp bool // the TCP RPC listener: the gateway token is required
	// hangup returns the context of a cancellable operation, cancelled
	// with cause errClientGone when the client goes away, and its stop.
	hangup   func() (context.Context, func())
	progress func(string) // _stream_logs lines (§2.5)
}

// handleLine runs §2.4 steps 3-9 for one request line and returns the
// response value (a result or a *catalog.Error).
func (s *Supervisor) handleLine(line []byte, w requester) (out any) {
	raw, perr := catalog.ParseLine(line)
	if perr != nil {
		return perr
	}
	if e := s.authorize(raw, w.tcp); e != nil { // §2.4 step 4; strips the token
		return e
	}
	req, perr := catalog.DecodeRequest(raw)
	if perr != nil {
		return perr
	}
	if req.RequestID == "" {
		req.RequestID = s.ids.new("req-")
	}
	op, known := catalog.Lookup(req.Op)
	h := handlers[req.Op]
	if !known || h == nil {
		return catalog.Errorf(catalog.UnknownOp, "unknown operation: %s", req.Op).With("op", req.Op)
	}
	if e := normalizeScope(op, req); e != nil {
		return e
	}
	ctx := context.Background()
	if cancellable(op) {
		var stop func()
		ctx, stop = w.hangup()
		defer stop()
	}
	c := &call{ctx: ctx, req: req, op: op, progress: func(string) {}}
	if req.StreamLogs && streamingOps[op.ID] {
		c.progress = w.progress
	}
	if req.Scope.Kind == "sandbox" {
		sb, e := s.resolveSandbox(req.Scope.SandboxID, op.Group == catalog.Observability)
		if e != nil {
			return e
		}
		c.sb = sb
		// The sandbox's gate keeps destroy from tearing it down under us.
		if !sb.Gate.TryRLock() {
			return sb.BusyError()
		}
		defer sb.Gate.RUnlock()
	}
	args, verr := op.Validate(req.Args)
	if verr != nil {
		return verr
	}
	c.args = args
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("handler panic", "op", op.ID, "panic", r, "stack", string(debug.Stack()))
			out = catalog.Errorf(catalog.InternalError, "internal error in %s", op.ID)
		}
	}()
	c.span = s.requestSpan(c) // root span of non-observability ops; c.ctx carries it
	res, err := s.runTraced(c, h)
	if err = clientGone(c.ctx, err); errors.Is(err, errClientGone) {
		s.log.Info("request cancelled: the client disconnected", "op", op.ID, "request_id", req.RequestID)
	}
	c.span.finish(err)
	if err != nil {
		return s.toError(op.ID, err)
	}
	return res
}

// clientGone attributes a handler's failure to its client's disconnect when
// that cancelled the request, whatever error the interrupted work returned
// (some wrap it without %w), so the request's span says "cancelled".
func clientGone(ctx context.Context, err error) error {
	if err == nil || !errors.Is(context.Cause(ctx), errClientGone) {
		return err
	}
	if errors.Is(err, errClientGone) {
		return err
	}
	return fmt.Errorf("%w (%w): %v", context.Canceled, errClientGone, err)
}

// normalizeScope applies §2.3's sandbox_id placement rules and §2.4 step 6.
func normalizeScope(op *catalog.Op, req *catalog.Request) *catalog.Error {
	if op.Group != catalog.Management {
		if v, present := req.Args["sandbox_id"]; present && v != nil {
			id, ok := v.(string)
			if !ok {
				return catalog.Errorf(catalog.InvalidRequest, "sandbox_id must be a string")
			}
			if req.Scope.Kind == "sandbox" && req.Scope.SandboxID != id {
				return catalog.Errorf(catalog.InvalidRequest, "sandbox_id in args does not match scope")
			}
			if req.Scope.Kind == "system" && op.Scope != catalog.ScopeSystem {
				req.Scope = catalog.RequestScope{Kind: "sandbox", SandboxID: id}
			}
			if op.Arg("sandbox_id") == nil {
				delete(req.Args, "sandbox_id")
			}
		}
	}
	switch {
	case op.Scope == catalog.ScopeSandbox && req.Scope.Kind != "sandbox":
		return catalog.Errorf(catalog.InvalidRequest, "operation %s requires sandbox scope", op.ID)
	case op.Scope == catalog.ScopeSystem && req.Scope.Kind != "system":
		return catalog.Errorf(catalog.InvalidRequest, "operation %s requires system scope", op.ID)
	}
	return nil
}

// toError maps a handler error to the contract's error kinds. This is the
// one place where domain errors become wire errors.
func (s *Supervisor) toError(op string, err error) *catalog.Error {
	var ce *catalog.Error
	if errors.As(err, &ce) {
		return ce
	}
	var se *layers.SnapshotError
	if errors.As(err, &se) {
		return snapshotError(se)
	}
	var ie *images.Error
	if errors.As(err, &ie) {
		return imageError(ie)
	}
	if ce := symlinkComponentError(err); ce != nil {
		return ce
	}
	if errors.Is(err, fs.ErrNotExist) {
		return catalog.Errorf(catalog.NotFound, "%v", err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return catalog.Errorf(catalog.OperationFailed, "%s: %v", op, err)
	}
	s.log.Warn("operation failed", "op", op, "err", err)
	return catalog.Errorf(catalog.OperationFailed, "%s failed: %v", op, err)
}

func snapshotError(se *layers.SnapshotError) *catalog.Error {
	var e *catalog.Error
	switch se.Reason {
	case "special_file":
		e = catalog.Errorf(catalog.InvalidRequest, "workspace contains a FIFO, socket or device node: %s", se.Path)
	case "invalid_name":
		e = catalog.Errorf(catalog.InvalidRequest, "workspace contains a non-UTF-8 name: %s", se.Path)
	case "too_many_entries":
		e = catalog.Errorf(catalog.InvalidRequest, "workspace has more than the maximum number of entries")
	case "changed":
		e = catalog.Errorf(catalog.OperationFailed, "workspace changed during snapshot: %s", se.Path)
	default:
		e = catalog.Errorf(catalog.OperationFailed, "workspace snapshot failed: %v", se)
	}
	return e.With("path", se.Path).With("reason", se.Reason)
}
