package workspace

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/resources"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
)

// Teardown ends sessions (§5.7, §4.5): one session's destroy (holder,
// lease, directory, record) and the stop of every session of a sandbox.
type Teardown struct {
	Cfg     *config.Config
	DB      *statedb.DB
	Log     *slog.Logger
	Obs     *obs.Registry
	Cgroups *resources.Cgroups
	Cmds    *Commands
	// Bump records a client-visible change of sb (§4.4).
	Bump func(ctx context.Context, sb *Sandbox)
	// FinalizeImplicit publishes an implicit session and destroys it
	// (§6.6); the result is what the draining command reports.
	FinalizeImplicit func(ctx context.Context, sb *Sandbox, ss *Session, drain *Command) map[string]any
	// RefillSpare starts sb's next spare holder (Holders.RefillSpare):
	// called once a finalized implicit session's holder is gone.
	RefillSpare func(sb *Sandbox)
}

// scope names sb's observability stores.
func scope(sb *Sandbox) obs.Scope { return obs.Scope{ID: sb.Rec.ID, Dir: sb.Dir} }

// DestroySession tears a session down (§5.7) inside a
// workspace_session.destroy span.
func (t *Teardown) DestroySession(ctx context.Context, sb *Sandbox, ss *Session, grace time.Duration) (int64, error) {
	return t.destroy(ctx, sb, ss, grace, nil, nil)
}

// destroy is DestroySession that also writes rows in the transaction that
// removes the session's record (an implicit session's finalization stores
// its command's end and the sandbox's activity revision there, in one
// commit with the removal), and that ends quiesced, the session's holder
// already taken from it with every session process gone, after the
// session is removed and in the background, before its directory goes.
func (t *Teardown) destroy(ctx context.Context, sb *Sandbox, ss *Session, grace time.Duration, quiesced Holder, rows []statedb.Row) (int64, error) {
	ctx, sp := obs.Start(obs.WithScope(ctx, t.Obs, scope(sb)), "workspace_session.destroy", map[string]any{"workspace_session_id": ss.ID()})
	n, err := t.closeSession(ctx, sb, ss, grace, quiesced, rows)
	sp.Done(err, map[string]any{"evicted_upperdir_bytes": n})
	return n, err
}

// closeSession tears a session down: holder, lease, directory, record.
func (t *Teardown) closeSession(ctx context.Context, sb *Sandbox, ss *Session, grace time.Duration, quiesced Holder, rows []statedb.Row) (int64, error) {
	upperBytes := DirBytes(ctx, ss.Upper())
	ss.Mu.Lock()
	h := ss.Holder
	ss.Holder = nil
	ss.Gone = true
	ss.Mu.Unlock()
	ss.CloseForwards()
	if h != nil {
		if err := h.Close(grace); err != nil {
			t.Log.Warn("close holder", "workspace_session_id", ss.ID(), "err", err)
		}
	}
	// The record goes first: a crash after it leaves only an orphan
	// directory (removed at the next start; a quiesced holder dies with
	// the supervisor) and layers no persisted lease pins (swept), so a
	// destroy cut short completes at restart instead of leaving a record
	// whose upper dir is half gone (restore_failed).
	if err := t.DB.PutRows(ctx, append(rows, statedb.Row{Kind: statedb.KindSession, ID: ss.ID(), Delete: true})...); err != nil {
		if quiesced != nil {
			_ = quiesced.Close(0)
		}
		return upperBytes, err
	}
	if ss.Lease != nil {
		if _, err := ss.Lease.Release(); err != nil {
			t.Log.Warn("release lease", "workspace_session_id", ss.ID(), "err", err)
		}
	}
	// Moved to the sandbox's trash at once, removed in the background:
	// deleting a large upper dir and its attribution copies took longer
	// than publishing it. sessions/ only ever holds live sessions; a crash
	// before the removal ends leaves trash that the next start empties
	// (RemoveOrphanSessionDirs). A quiesced holder still mounts the
	// directory: it is closed first, and the session's cgroup, which it
	// is in, is removed after it.
	trash := filepath.Join(sb.Dir, SessionTrashDir)
	gone := filepath.Join(trash, ss.ID())
	if err := os.MkdirAll(trash, 0o700); err != nil {
		gone = ss.Dir
	} else if err := os.Rename(ss.Dir, gone); err != nil {
		gone = ss.Dir
	}
	remove := func() {
		if quiesced != nil {
			if err := quiesced.Close(0); err != nil {
				t.Log.Warn("close holder", "workspace_session_id", ss.ID(), "err", err)
			}
			t.Cgroups.RemoveSession(ss.ID())
			if ss.Implicit() && t.RefillSpare != nil {
				t.RefillSpare(sb)
			}
		}
		RemoveTree(gone)
	}
	if quiesced == nil {
		t.Cgroups.RemoveSession(ss.ID())
	}
	if gone == ss.Dir || !sb.GoBackground(remove) {
		remove()
	}
	sb.Mu.Lock()
	delete(sb.Work.Sessions, ss.ID())
	live := sb.Rec.LiveWorkspaceSessions[:0]
	for _, id := range sb.Rec.LiveWorkspaceSessions {
		if id != ss.ID() {
			live = append(live, id)
		}
	}
	sb.Rec.LiveWorkspaceSessions = live
	sb.Mu.Unlock()
	event(ctx, t.Obs, sb, "lease.released", map[string]any{"workspace_session_id": ss.ID(), "revision": ss.Rec.BaseRevision})
	return upperBytes, nil
}

// StopSessions ends every session of a sandbox: running commands are
// signalled (SIGTERM, exit grace, SIGKILL). With destroy, every session is
// destroyed (destroy_sandbox: nothing is published); without, implicit
// sessions are finalized and explicit ones left persisted with their holder
// stopped (supervisor shutdown, §4.5).
func (t *Teardown) StopSessions(ctx context.Context, sb *Sandbox, destroy bool, progress func(string)) {
	CloseSpare(sb)
	sb.Mu.Lock()
	all := make([]*Session, 0, len(sb.Work.Sessions))
	for _, ss := range sb.Work.Sessions {
		all = append(all, ss)
	}
	sb.Mu.Unlock()
	grace := time.Duration(t.Cfg.Runtime.Workspace.ExitGraceS * float64(time.Second))
	for _, ss := range all {
		progress("stopping workspace session " + ss.ID())
		for _, id := range ss.Running() {
			ss.Mu.Lock()
			cmd := ss.Ledger[id]
			ss.Mu.Unlock()
			if cmd != nil {
				t.interrupt(sb, ss, cmd, grace)
			}
		}
		switch {
		case destroy:
			// The gate waits for a background finalization of this
			// session to end; then there is nothing left to destroy.
			ss.Gate.Lock()
			if !ss.IsGone() {
				_, _ = t.DestroySession(ctx, sb, ss, grace)
			}
			ss.Gate.Unlock()
		case ss.Implicit():
			t.FinalizeImplicit(ctx, sb, ss, nil)
		default:
			ss.Mu.Lock()
			h := ss.Holder
			ss.Holder = nil
			ss.Mu.Unlock()
			if h != nil {
				_ = h.Close(grace)
			}
		}
	}
}

// interrupt ends a running command because its session is going away: it
// is reported with interrupted:true (supervisor_restart).
func (t *Teardown) interrupt(sb *Sandbox, ss *Session, cmd *Command, grace time.Duration) {
	ss.Mu.Lock()
	h := ss.Holder
	delete(ss.Ledger, cmd.Rec.CommandSessionID)
	ss.Mu.Unlock()
	if h != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = h.Signal(ctx, cmd.Proc.ID, syscall.SIGTERM)
		select {
		case <-cmd.Done:
		case <-time.After(grace):
			_ = h.Signal(ctx, cmd.Proc.ID, syscall.SIGKILL)
		}
		cancel()
	}
	t.Cmds.Finish(sb, cmd, "supervisor_restart", nil)
}

// event records an event in sb's store, in the trace of the span ctx
// carries (as its child), or outside any request when there is none.
func event(ctx context.Context, r *obs.Registry, sb *Sandbox, name string, attrs map[string]any) {
	sp := obs.From(ctx)
	r.Record(scope(sb), sp.Trace(), sp.ID(), name, attrs)
}

// KeepRecoveryArtifact moves a rejected implicit session's upper dir (a
// rename, not a copy) to workspace_recovery/<id>/upper beside a manifest,
// keeping the newest runtime.max_recovery_artifacts.
func (t *Teardown) KeepRecoveryArtifact(ctx context.Context, sb *Sandbox, ss *Session, reason string, rejection map[string]any) string {
	if t.Cfg.Runtime.Workspace.MaxRecoveryArtifacts == 0 {
		return ""
	}
	dir := filepath.Join(sb.Dir, "workspace_recovery", ss.ID())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Log.Warn("recovery artifact", "err", err)
		return ""
	}
	bytes, entries := DirBytes(ctx, ss.Upper()), CountEntries(ctx, ss.Upper())
	if err := os.Rename(ss.Upper(), filepath.Join(dir, "upper")); err != nil {
		t.Log.Warn("recovery artifact", "err", err)
		return ""
	}
	art := sandbox.RecoveryArtifact{WorkspaceSessionID: ss.ID(), CreatedAt: sandbox.NowRFC3339(), Reason: reason, Bytes: bytes}
	man, _ := json.Marshal(map[string]any{"workspace_session_id": ss.ID(), "created_at": art.CreatedAt, "reason": reason,
		"publish_rejection": rejection, "bytes": bytes, "entries": entries})
	_ = os.WriteFile(filepath.Join(dir, "manifest.json"), man, 0o600)
	sb.Mu.Lock()
	sb.Rec.RecoveryArtifacts = append(sb.Rec.RecoveryArtifacts, art)
	var drop []sandbox.RecoveryArtifact
	for len(sb.Rec.RecoveryArtifacts) > t.Cfg.Runtime.Workspace.MaxRecoveryArtifacts {
		drop = append(drop, sb.Rec.RecoveryArtifacts[0])
		sb.Rec.RecoveryArtifacts = sb.Rec.RecoveryArtifacts[1:]
	}
	rec := sb.Rec
	sb.Mu.Unlock()
	for _, d := range drop {
		RemoveTree(filepath.Join(sb.Dir, "workspace_recovery", d.WorkspaceSessionID))
	}
	_ = t.DB.Put(ctx, statedb.KindSandbox, rec.ID, rec.ID, &rec)
	return filepath.Join("workspace_recovery", ss.ID())
}

// Destroy is destroy_workspace_session (§5.7): session id of sb, if no
// command runs in it, with grace for its holder's processes.
func (t *Teardown) Destroy(ctx context.Context, sb *Sandbox, id string, grace time.Duration) (map[string]any, error) {
	ss, e := LookupSession(sb, id)
	if e != nil {
		return nil, e
	}
	ss.Gate.Lock()
	defer ss.Gate.Unlock()
	if ss.IsGone() {
		return nil, NotFoundSession(ss.ID()) // published or destroyed while we waited
	}
	if st := ss.State(); st == SessFinalizing || st == SessRestoring {
		return nil, catalog.Errorf(catalog.OperationConflict, "workspace session %s is %s", ss.ID(), st).
			With("workspace_session_id", ss.ID()).With("session_state", st)
	}
	ss.Mu.Lock()
	alive := ss.Holder != nil
	ss.Mu.Unlock()
	if running := ss.Running(); alive && len(running) > 0 {
		return nil, catalog.Errorf(catalog.OperationFailed, "workspace session has active command sessions").
			With("workspace_session_id", ss.ID()).With("active_command_session_ids", running)
	}
	bytes, err := t.DestroySession(ctx, sb, ss, grace)
	if err != nil {
		return nil, err
	}
	t.Bump(ctx, sb)
	return map[string]any{"workspace_session_id": ss.ID(), "destroyed": true, "evicted_upperdir_bytes": bytes,
		"active_leases_after": len(sb.Stack.Leases())}, nil
}
