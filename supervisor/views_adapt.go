package supervisor

// The one adapter between the supervisor's sandboxes and sessions and the
// plain inputs of package views. When the sandbox and session types move,
// only this file follows them.

import (
	"sort"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/views"
)

// sandboxesSorted returns the registered sandboxes ordered by ID.
func (s *Supervisor) sandboxesSorted() []*sandbox { return s.sandboxes.Sorted() }

// sessionsSorted returns the sandbox's live sessions ordered by ID.
func sessionsSorted(sb *sandbox) []*session {
	sb.Mu.Lock()
	all := make([]*session, 0, len(sb.Work.Sessions))
	for _, ss := range sb.Work.Sessions {
		all = append(all, ss)
	}
	sb.Mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].Rec.WorkspaceSessionID < all[j].Rec.WorkspaceSessionID })
	return all
}

// sessionView copies what the views show of one session.
func sessionView(ss *session) views.Session {
	r := ss.Record()
	return views.Session{ID: r.WorkspaceSessionID, Agent: r.Agent, State: r.State, NetworkProfile: r.NetworkProfile,
		FinalizePolicy: r.FinalizePolicy, OverlayDriver: r.OverlayDriver, Lease: r.Lease.Layers, HolderPid: ss.HolderPid()}
}

func sessionViews(sessions []*session) []views.Session {
	out := make([]views.Session, 0, len(sessions))
	for _, ss := range sessions {
		out = append(out, sessionView(ss))
	}
	return out
}

// holderViews lists the live holders of sbs' sessions, in order.
func holderViews(sbs []*sandbox) []views.Holder {
	var out []views.Holder
	for _, sb := range sbs {
		for _, ss := range sessionsSorted(sb) {
			if pid := ss.HolderPid(); pid > 0 {
				out = append(out, views.Holder{SandboxID: sb.Rec.ID, WorkspaceID: ss.ID(), Pid: pid})
			}
		}
	}
	return out
}

// snapshotSource is one sandbox as snapshot asks for it.
type snapshotSource struct {
	s  *Supervisor
	sb *sandbox
}

func (src snapshotSource) Sandbox() views.Sandbox {
	sb := src.sb
	sb.Mu.Lock()
	rec := sb.Rec
	cmds := make([]*command, 0, len(sb.Work.Commands))
	for _, cmd := range sb.Work.Commands {
		cmds = append(cmds, cmd)
	}
	sb.Mu.Unlock()
	out := views.Sandbox{ID: rec.ID, State: rec.State, Failed: rec.State == stateFailed, Error: rec.Error,
		RuntimeDir: sb.Dir, Stack: sb.Stack, Sessions: sessionViews(sessionsSorted(sb))}
	for _, cmd := range cmds {
		cmd.Mu.Lock()
		cr := cmd.Rec
		cmd.Mu.Unlock()
		if cr.Status != workspace.CmdRunning {
			continue // the status read_command_lines reports
		}
		out.Running = append(out.Running, views.Command{SessionID: cr.WorkspaceSessionID, ID: cr.CommandSessionID, Cmd: cr.Cmd})
	}
	return out
}

func (src snapshotSource) Resources() (map[string]any, map[string]map[string]any, error) {
	return snapshotResources(resourceView(src.s.cfg, src.s.obs), src.sb)
}

func (src snapshotSource) EventStore() any { return obsStats(src.s.obs, src.sb) }

func (src snapshotSource) NoSamples() string {
	return resourceView(src.s.cfg, src.s.obs).NoSamples("sandbox", snapshotWindowMs)
}

// buildTopology is the topology view of the given live sessions.
func buildTopology(procRoot string, sessions []*session) map[string]any {
	return views.BuildTopology(procRoot, sessionViews(sessions))
}
