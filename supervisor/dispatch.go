package supervisor

import (
	"context"
	"fmt"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/rpc"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
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

// handlers maps operation IDs to their implementation; newMux registers
// them against the catalog's declarations.
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
	"fork_workspace_session":     (*Supervisor).forkWorkspaceSession,
	"list_workspace_sessions":    (*Supervisor).listWorkspaceSessions,
	"forward_port":               (*Supervisor).forwardPort,
	"diff_workspace_session":     (*Supervisor).diffWorkspaceSession,
	"publish_workspace_session":  (*Supervisor).publishWorkspaceSession,
	"sync_workspace_session":     (*Supervisor).syncWorkspaceSession,
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

// newMux registers every handler against its operation's catalog
// declaration; a handler without a declaration or a declaration without a
// handler refuses the start (TestRegistry keeps both from landing).
func (s *Supervisor) newMux() (*rpc.Mux, error) {
	m := rpc.New(rpc.Config{Log: s.log, Authorize: s.authorize, NewRequestID: func() string { return s.ids.New("req-") },
		Bind: s.bindScope, Errors: errorTranslators})
	for id, h := range handlers {
		if err := m.Handle(id, s.run(h)); err != nil {
			return nil, err
		}
	}
	if missing := m.Missing(); len(missing) > 0 {
		return nil, fmt.Errorf("operations declared in the catalog without a handler: %v", missing)
	}
	return m, nil
}

// errorTranslators give rpc the contract kinds of the domain errors it
// cannot import.
var errorTranslators = []func(error) *catalog.Error{rpc.As(snapshotError), rpc.As(imageError), workspace.SymlinkComponentError,
	rpc.As((*workspace.ChainDepthError).Envelope)}

// bindScope resolves a sandbox-scoped request's sandbox and holds its gate
// for the request, which keeps destroy from tearing it down under us.
func (s *Supervisor) bindScope(r *rpc.Request) (func(), error) {
	if r.Req.Scope.Kind != "sandbox" {
		return func() {}, nil
	}
	sb, e := s.resolveSandbox(r.Req.Scope.SandboxID, r.Op.Group == catalog.Observability)
	if e != nil {
		return nil, e
	}
	if !sb.Gate.TryRLock() {
		return nil, sb.BusyError()
	}
	r.State = sb
	return sb.Gate.RUnlock, nil
}

// run adapts a handler to rpc: the call it sees, and the request's
// supervisor.dispatch span around it.
func (s *Supervisor) run(h handler) rpc.Handler {
	return func(r *rpc.Request) (any, error) {
		c := &call{ctx: r.Ctx, req: r.Req, op: r.Op, args: r.Args, progress: r.Progress}
		c.sb, _ = r.State.(*sandbox)
		c.span = requestSpan(s.obs, c) // root span of non-observability ops; c.ctx carries it
		res, err := s.runTraced(c, h)
		err = rpc.ClientGone(c.ctx, err)
		c.span.finish(err)
		return res, err
	}
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
		e = catalog.Errorf(catalog.OperationFailed, "workspace snapshot failed: %w", se)
	}
	return e.With("path", se.Path).With("reason", se.Reason)
}
