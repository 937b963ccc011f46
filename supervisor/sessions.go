package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// newSession runs §5.2 inside a workspace_session.create span.
func (s *Supervisor) newSession(ctx context.Context, sb *sandbox, policy, network string, agent *string) (*session, error) {
	sp, ctx := s.spanCtx(ctx, sb, "", "workspace_session.create", map[string]any{"finalize_policy": policy, "network_profile": network})
	ss, err := s.openSession(ctx, sb, policy, network, agent)
	var attrs map[string]any
	if ss != nil {
		attrs = map[string]any{"workspace_session_id": ss.ID(), "layer_count": len(ss.Rec.Lease.Layers)}
	}
	sp.done(err, attrs)
	return ss, err
}

// openSession runs §5.2: reserve the ID, lease the head, create the
// directories, start the holder, persist the record. Any failure rolls back
// every step.
func (s *Supervisor) openSession(ctx context.Context, sb *sandbox, policy, network string, agent *string) (*session, error) {
	sl, e := s.admission.Session(sb)
	if e != nil {
		return nil, e
	}
	defer sl.Release() // a no-op once the session is in sb.Work.sessions
	id := s.ids.New("ws-")
	lease, err := sb.Stack.Acquire("workspace-session:" + id)
	if err != nil {
		return nil, fmt.Errorf("lease head: %w", err)
	}
	m := lease.Manifest()
	if len(m.Layers) > s.cfg.Runtime.Workspace.MaxChainDepth {
		_, _ = lease.Release()
		return nil, catalog.Errorf(catalog.OperationFailed, "layer chain too deep: run squash_layerstacks").
			With("layer_count", len(m.Layers)).With("max_chain_depth", s.cfg.Runtime.Workspace.MaxChainDepth)
	}
	ss := &session{
		Dir:    filepath.Join(sb.Dir, "sessions", id),
		Lease:  lease,
		Ledger: map[string]*command{},
		Rec: sessionRecord{
			WorkspaceSessionID: id, SandboxID: sb.Rec.ID, Agent: agent, NetworkProfile: network, FinalizePolicy: policy,
			State: workspace.SessActive, CreatedAt: nowRFC3339(), BaseRevision: m.Revision(),
			Lease:         leaseRecord{LeaseID: lease.ID(), Layers: m.Layers},
			OverlayDriver: sb.Rec.OverlayDriver,
		},
	}
	rollback := func() {
		workspace.RemoveTree(ss.Dir)
		_, _ = lease.Release()
	}
	for _, d := range []string{"upper", "scratch", "attribution"} {
		if err := os.MkdirAll(filepath.Join(ss.Dir, d), 0o700); err != nil {
			rollback()
			return nil, catalog.Errorf(catalog.OperationFailed, "workspace setup failed at directories: %v", err).With("stage", "directories")
		}
	}
	if err := s.startHolder(ctx, sb, ss); err != nil {
		rollback()
		return nil, err
	}
	if err := s.store.Put(ctx, statedb.KindSession, id, sb.Rec.ID, ss.Rec); err != nil {
		_ = ss.Holder.Close(0)
		rollback()
		return nil, err
	}
	sb.Mu.Lock()
	sb.Work.Sessions[id] = ss
	sl.ReleaseLocked()
	sb.Rec.LiveWorkspaceSessions = append(sb.Rec.LiveWorkspaceSessions, id)
	sb.Mu.Unlock()
	s.eventCtx(ctx, sb, "lease.acquired", map[string]any{"workspace_session_id": id, "revision": ss.Rec.BaseRevision})
	return ss, nil
}

// startHolder starts the session's holder over its persisted lease and
// upper dir with a fresh work dir, and watches it.
func (s *Supervisor) startHolder(ctx context.Context, sb *sandbox, ss *session) error {
	work := filepath.Join(ss.Dir, "work")
	workspace.RemoveTree(work) // the kernel wants a fresh, empty work dir per mount
	if err := os.MkdirAll(work, 0o700); err != nil {
		return catalog.Errorf(catalog.OperationFailed, "workspace setup failed at directories: %v", err).With("stage", "directories")
	}
	m := ss.Base()
	cfg := nsholder.Config{
		SessionID:       ss.ID(),
		Lowers:          sb.Stack.LayerDirs(m),
		Upper:           ss.Upper(),
		Work:            work,
		Scratch:         filepath.Join(ss.Dir, "scratch"),
		HostPaths:       s.cfg.Sandbox.HostPaths,
		HiddenPaths:     append([]string{s.dirs.Data, s.dirs.Config, s.dirs.Runtime}, s.cfg.Sandbox.HiddenPaths...),
		IsolatedNetwork: ss.Rec.NetworkProfile == workspace.NetIsolated || ss.Rec.NetworkProfile == workspace.NetOffline,
		BlockPrivate:    ss.Rec.NetworkProfile == workspace.NetIsolated && !s.cfg.Network.Isolated.AllowPrivate,
		IDMapping:       s.cfg.Sandbox.IDMapping,
		Shim:            s.shimPath,
		Overlay:         ss.Rec.OverlayDriver,
		CoalesceMs:      s.cfg.Observability.FileActivity.CoalesceMs,
	}
	egress, err := s.egressFor(ss)
	if err != nil {
		return err
	}
	if egress != nil {
		cfg.Egress, cfg.ResolvConf = egress, nsholder.ResolvConf
	}
	if sb.Rec.Rootfs != "host" {
		if s.shimPath == "" {
			// The fallback shim is this binary, dynamically linked: an image need not have its loader.
			return catalog.Errorf(catalog.OperationFailed, "workspace setup failed at spawn: an image sandbox needs sandbox-exec-shim next to %s", s.self).With("stage", "spawn")
		}
		img, err := s.images.Lookup(sb.Rec.Rootfs)
		if err != nil {
			return catalog.Errorf(catalog.OperationFailed, "workspace setup failed at mount_root: image rootfs %s: %v", sb.Rec.Rootfs, err).With("stage", "mount_root")
		}
		cfg.HostPaths = nil
		cfg.Image = &nsholder.ImageRoot{Rootfs: img.Rootfs, Files: imageFiles(ss.ID(), ss.Rec.NetworkProfile)}
	}
	setup := time.Duration(s.cfg.Runtime.Workspace.SetupTimeoutS * float64(time.Second))
	hctx, cancel := context.WithTimeout(ctx, setup)
	defer cancel()
	sp, _ := s.spanCtx(ctx, sb, "holder", "holder.spawn", map[string]any{"workspace_session_id": ss.ID(),
		"overlay_driver": ss.Rec.OverlayDriver, "lowers": len(cfg.Lowers), "network_profile": ss.Rec.NetworkProfile})
	h, err := nsholder.Start(hctx, s.self, cfg)
	if err == nil {
		// Measured by the holder during its setup, which ended just now.
		sp.measured("holder.mount_overlay", h.OverlayMountTime(), map[string]any{"workspace_session_id": ss.ID(),
			"driver": ss.Rec.OverlayDriver, "lowers": len(cfg.Lowers)})
		sp.done(nil, map[string]any{"pid": h.Pid()})
	} else {
		sp.done(err, nil)
	}
	if err != nil {
		var se *nsholder.SetupError
		if errors.As(err, &se) {
			return catalog.Errorf(catalog.OperationFailed, "%s", se.Error()).With("stage", se.Stage)
		}
		return catalog.Errorf(catalog.OperationFailed, "workspace setup failed at spawn: %v", err).With("stage", "spawn")
	}
	ss.Mu.Lock()
	ss.Holder = h
	ss.Mu.Unlock()
	if err := s.cgroups.Attach(sb.Rec.ID, ss.ID(), h.Pid()); err != nil {
		// Samples then come from /proc; nothing else depends on the cgroup.
		s.log.Warn("attach holder to its cgroup", "workspace_session_id", ss.ID(), "err", err)
	}
	if !sb.GoBackground(func() { s.watchHolder(sb, ss, h) }) {
		ss.Mu.Lock()
		ss.Holder = nil
		ss.Mu.Unlock()
		_ = h.Close(0)
		return catalog.Errorf(catalog.OperationConflict, "sandbox %s is being destroyed", sb.Rec.ID).With("sandbox_id", sb.Rec.ID)
	}
	return nil
}

// watchHolder routes the holder's command events and notices its death.
func (s *Supervisor) watchHolder(sb *sandbox, ss *session, h holder) {
	events := h.Events()
	for ev := range events {
		if ev.FS == nil {
			s.cmds.Event(sb, ss, ev)
			continue
		}
		// FUSE notices come in bursts (a release per written file): the
		// ones already queued are applied together, so their checkpoints
		// share one pass over the session's checkpoint index.
		batch := []*nsholder.FSNotice{ev.FS}
		var next *nsholder.Event
	gather:
		for len(batch) < 1024 {
			select {
			case e, ok := <-events:
				if !ok {
					break gather
				}
				if e.FS == nil {
					next = &e
					break gather
				}
				batch = append(batch, e.FS)
			default:
				break gather
			}
		}
		s.fuseNotices(sb, ss, batch)
		if next != nil {
			s.cmds.Event(sb, ss, *next)
		}
	}
	<-h.Done()
	ss.Mu.Lock()
	current := ss.Holder == h
	ss.Mu.Unlock()
	if !current {
		return // replaced or closed on purpose
	}
	s.holderExited(sb, ss)
}

// holderExited handles an unexpected holder death (§5.6): running commands
// become terminal with interrupted:true; an implicit session keeps its work
// as a recovery artifact and is destroyed; an explicit one gets one new
// holder, else it is restore_failed with its data intact.
func (s *Supervisor) holderExited(sb *sandbox, ss *session) {
	// One synthetic holder-<ulid> trace holds the death and what follows.
	trace := ""
	if s.obs.Store(scopeOf(sb)) != nil {
		trace = s.syntheticTrace("holder")
	}
	s.event(sb, trace, "holder.exited", map[string]any{"workspace_session_id": ss.ID(), "pid": ss.HolderPid(), "status": "exited_unexpectedly"})
	ss.Mu.Lock()
	ss.Holder = nil // the session refuses new work from here on
	cmds := make([]*command, 0, len(ss.Ledger))
	for _, c := range ss.Ledger {
		cmds = append(cmds, c)
	}
	ss.Ledger = map[string]*command{}
	ss.Mu.Unlock()
	for _, c := range cmds {
		s.cmds.Finish(sb, c, "holder_exited", nil)
	}
	ctx := context.Background()
	defer s.bump(ctx, sb)
	ss.Gate.Lock()
	defer ss.Gate.Unlock()
	if ss.IsGone() {
		return
	}
	if ss.Implicit() {
		// Its work is kept (a rename of the upper dir), then it is destroyed (§5.6).
		msg := "the session's holder exited unexpectedly"
		sp := s.startSpan(sb, trace, "", "workspace_session.finalize", map[string]any{"workspace_session_id": ss.ID(), "reason": "holder_exited"})
		fctx := withSpan(ctx, sp)
		artifact := s.teardown.KeepRecoveryArtifact(fctx, sb, ss, "holder_exited", map[string]any{"path": nil, "reason": "holder_exited",
			"source_conflict": nil, "protected_drop": nil, "message": msg, "conflicts": []any{}})
		_, err := s.teardown.DestroySession(fctx, sb, ss, 0)
		sp.done(err, map[string]any{"recovery_artifact": artifact})
		return
	}
	if ss.State() == workspace.SessActive {
		// One automatic re-creation over the same lease and upper dir.
		ss.SetState(workspace.SessRestoring)
		sp := s.startSpan(sb, trace, "", "workspace_session.restore", map[string]any{"workspace_session_id": ss.ID(), "reason": "holder_exited"})
		rctx := withSpan(ctx, sp)
		err := s.startHolder(rctx, sb, ss)
		sp.done(err, nil)
		if err != nil {
			ss.SetState(workspace.SessRestoreFailed)
			s.eventCtx(rctx, sb, "workspace_session.restore_failed", map[string]any{"workspace_session_id": ss.ID(), "error": err.Error()})
		} else {
			ss.SetState(workspace.SessActive)
			s.eventCtx(rctx, sb, "workspace_session.restored", map[string]any{"workspace_session_id": ss.ID()})
		}
	}
	ss.Mu.Lock()
	rec := ss.Rec
	ss.Mu.Unlock()
	_ = s.store.Put(ctx, statedb.KindSession, rec.WorkspaceSessionID, sb.Rec.ID, rec)
}

func (s *Supervisor) createWorkspaceSession(c *call) (any, error) {
	var agent *string
	if c.args.Has("agent") {
		a := c.args.String("agent")
		agent = &a
	}
	ss, err := s.newSession(c.ctx, c.sb, workspace.PolicyNoOp, c.args.String("network_profile"), agent)
	if err != nil {
		return nil, err
	}
	s.bump(c.ctx, c.sb)
	rec := ss.Rec
	return map[string]any{
		"workspace_session_id": rec.WorkspaceSessionID, "network_profile": rec.NetworkProfile, "finalize_policy": rec.FinalizePolicy,
		"agent": rec.Agent, "created_at": rec.CreatedAt, "base_revision": rec.BaseRevision, "overlay_driver": rec.OverlayDriver,
	}, nil
}

// restoreSessions brings a sandbox's persisted sessions back at start (§4.5,
// §5.5): explicit ones get a new holder over their lease and upper dir,
// implicit ones are finalized from their upper dir.
func (s *Supervisor) restoreSessions(ctx context.Context, sb *sandbox, sum *recoverySummary) {
	var recs []sessionRecord
	_ = s.store.List(ctx, statedb.KindSession, sb.Rec.ID, func(b []byte) error {
		var r sessionRecord
		if err := json.Unmarshal(b, &r); err != nil {
			return err
		}
		recs = append(recs, r)
		return nil
	})
	var restoring sync.WaitGroup
	var sumMu sync.Mutex
	slots := make(chan struct{}, 4)
	for _, rec := range recs {
		m := layers.Manifest{SchemaVersion: layers.SchemaVersion, Layers: rec.Lease.Layers}
		ss := &session{Rec: rec, Dir: filepath.Join(sb.Dir, "sessions", rec.WorkspaceSessionID), Ledger: map[string]*command{},
			Lease: sb.Stack.Restore(rec.Lease.LeaseID, m, "workspace-session:"+rec.WorkspaceSessionID)}
		sb.Mu.Lock()
		sb.Work.Sessions[rec.WorkspaceSessionID] = ss
		sb.Rec.LiveWorkspaceSessions = append(sb.Rec.LiveWorkspaceSessions, rec.WorkspaceSessionID)
		sb.Mu.Unlock()
		if ss.Implicit() {
			s.attachOutcome(ctx, sb, rec.WorkspaceSessionID, s.finalizeImplicit(ctx, sb, ss, nil))
			sum.FinalizedSessions = append(sum.FinalizedSessions, rec.WorkspaceSessionID)
			continue
		}
		if rec.State == workspace.SessRestoreFailed || rec.State == workspace.SessFinalizeFailed {
			sum.KeptFailedSessions = append(sum.KeptFailedSessions, rec.WorkspaceSessionID)
			continue // data stays until destroyed
		}
		ss.SetState(workspace.SessRestoring)
		restoring.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			s.restoreHolder(ctx, sb, ss, sum, &sumMu)
		})
	}
	restoring.Wait()
}

// restoreHolder gives one restoring explicit session a new holder over its
// persisted lease and upper dir; several run at once (holder set-up is
// mostly waiting on the kernel), so a restart with many sessions is quick.
func (s *Supervisor) restoreHolder(ctx context.Context, sb *sandbox, ss *session, sum *recoverySummary, sumMu *sync.Mutex) {
	id := ss.ID()
	sp, rctx := s.spanCtx(ctx, sb, "recovery", "workspace_session.restore", map[string]any{"workspace_session_id": id, "reason": "supervisor_start"})
	err := s.startHolder(rctx, sb, ss)
	sp.done(err, nil)
	sumMu.Lock()
	if err != nil {
		ss.SetState(workspace.SessRestoreFailed)
		sum.RestoreFailedSessions = append(sum.RestoreFailedSessions, id)
	} else {
		ss.SetState(workspace.SessActive)
		sum.RestoredSessions = append(sum.RestoredSessions, id)
	}
	sumMu.Unlock()
	if err != nil {
		s.eventCtx(ctx, sb, "workspace_session.restore_failed", map[string]any{"workspace_session_id": id, "error": err.Error()})
	} else {
		s.eventCtx(ctx, sb, "workspace_session.restored", map[string]any{"workspace_session_id": id})
	}
	ss.Mu.Lock()
	r := ss.Rec
	ss.Mu.Unlock()
	_ = s.store.Put(ctx, statedb.KindSession, r.WorkspaceSessionID, sb.Rec.ID, r)
}

func (s *Supervisor) listWorkspaceSessions(c *call) (any, error) {
	return workspace.ListSessions(c.ctx, c.sb), nil
}

func (s *Supervisor) destroyWorkspaceSession(c *call) (any, error) {
	res, err := s.teardown.Destroy(c.ctx, c.sb, c.args.String("workspace_session_id"),
		time.Duration(c.args.Float("grace_s")*float64(time.Second)))
	if err != nil {
		return nil, err
	}
	return res, nil
}
