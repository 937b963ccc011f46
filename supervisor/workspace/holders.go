package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/doctor"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
)

// Holders owns a session's life (§5.2, §5.5, §5.6): creation over a lease
// of the head, its holder's start and watch, the holder's unexpected death,
// and the restore of persisted sessions at start. What it needs of the
// rest of the supervisor comes in as the small values below, set by the
// root.
type Holders struct {
	Cfg       *config.Config
	DB        *statedb.DB
	Log       *slog.Logger
	Obs       *obs.Registry
	IDs       *statedb.IDs
	Admission *Admission
	Cmds      *Commands
	Teardown  *Teardown
	// Self is the running binary (the holder mode); Shim is
	// sandbox-exec-shim next to it, "" when it is missing.
	Self, Shim string
	// ShimLoader, when Shim is "", starts Self's Go shim in image roots
	// (nil when Self is static); ShimErr says why Self, dynamically
	// linked, has none (image sandboxes then cannot run commands).
	ShimLoader *nsholder.ShimLoader
	ShimErr    error
	// Hidden are the supervisor's own directories, hidden from sessions
	// before the configured sandbox.hidden_paths.
	Hidden []string
	// Cgroups puts a holder in its session's cgroup (nil-safe behind it).
	Cgroups interface {
		Attach(sandboxID, sessionID string, pid int) error
	}
	// ImageRootfs is the extracted rootfs of an image reference (the
	// image cache).
	ImageRootfs func(ref string) (string, error)
	// FuseNotices applies a batch of the FUSE driver's write notices
	// (attribution).
	FuseNotices func(sb *Sandbox, ss *Session, ns []*nsholder.FSNotice)
	// FinalizeImplicit publishes an implicit session and destroys it
	// (§6.6); the result is what its commands report.
	FinalizeImplicit func(ctx context.Context, sb *Sandbox, ss *Session, drain *Command) map[string]any
	// Bump records a client-visible change of sb (§4.4).
	Bump func(ctx context.Context, sb *Sandbox)
}

// RestoreSummary is what a restore of a sandbox's sessions did (§4.5).
type RestoreSummary struct {
	Restored      []string // explicit sessions with a new holder
	RestoreFailed []string
	KeptFailed    []string // restore_failed/finalize_failed before the restart
	Finalized     []string // implicit sessions finalized
}

// event records an event in sb's store, in the trace of the span ctx
// carries (as its child), or outside any request when there is none.
func (h *Holders) event(ctx context.Context, sb *Sandbox, name string, attrs map[string]any) {
	sp := obs.From(ctx)
	h.Obs.Record(scope(sb), sp.Trace(), sp.ID(), name, attrs)
}

// spanCtx starts a span in sb's store for work inside or outside a request.
func (h *Holders) spanCtx(ctx context.Context, sb *Sandbox, name string, attrs map[string]any) (*obs.Span, context.Context) {
	ctx, sp := obs.Start(obs.WithScope(ctx, h.Obs, scope(sb)), name, attrs)
	return sp, ctx
}

// New runs §5.2 inside a workspace_session.create span.
func (h *Holders) New(ctx context.Context, sb *Sandbox, policy, network string, agent *string) (*Session, error) {
	ss, _, err := h.create(ctx, sb, policy, network, agent, true)
	return ss, err
}

// NewImplicit is New for the implicit session of an exec_command (§5.1)
// except that the session's record is not stored: it is returned for the
// caller to store in the commit of the session's first command's running
// record (Commands.Spawn), which comes before that command can write
// anything; a crash before it leaves an orphan directory that the next
// start removes. One fsynced commit fewer on every implicit command (#18).
func (h *Holders) NewImplicit(ctx context.Context, sb *Sandbox) (*Session, statedb.Row, error) {
	return h.create(ctx, sb, PolicyPublish, NetShared, nil, false)
}

func (h *Holders) create(ctx context.Context, sb *Sandbox, policy, network string, agent *string, persist bool) (*Session, statedb.Row, error) {
	sp, ctx := h.spanCtx(ctx, sb, "workspace_session.create", map[string]any{"finalize_policy": policy, "network_profile": network})
	ss, row, err := h.open(ctx, sb, policy, network, agent, nil, persist)
	var attrs map[string]any
	if ss != nil {
		attrs = map[string]any{"workspace_session_id": ss.ID(), "layer_count": len(ss.Rec.Lease.Layers)}
	}
	sp.Done(err, attrs)
	return ss, row, err
}

// open runs §5.2: reserve the ID, lease the head, create the
// directories, start the holder, persist the record (with persist; else
// the record's row is returned for the caller to store). Any failure rolls
// back every step. With from (a fork) the lease is of from's chain and the
// upper dir and attribution are from's, copied before the holder starts.
func (h *Holders) open(ctx context.Context, sb *Sandbox, policy, network string, agent *string, from *forkSource, persist bool) (*Session, statedb.Row, error) {
	sl, e := h.Admission.Session(sb)
	if e != nil {
		return nil, statedb.Row{}, e
	}
	defer sl.Release() // a no-op once the session is in sb.Work.sessions
	id := h.IDs.New("ws-")
	var lease *layers.Lease
	if from != nil {
		// The source's own lease pins these layers until this one exists.
		lease = sb.Stack.AcquireAt(from.base, "workspace-session:"+id)
	} else {
		var err error
		if lease, err = sb.Stack.Acquire("workspace-session:" + id); err != nil {
			return nil, statedb.Row{}, fmt.Errorf("lease head: %w", err)
		}
	}
	m := lease.Manifest()
	chain := "the head"
	if from != nil {
		chain = "the source session's chain"
	}
	if err := checkDepth(h.Cfg, len(m.Layers), chain); err != nil {
		_, _ = lease.Release()
		return nil, statedb.Row{}, err
	}
	ss := &Session{
		Dir:    filepath.Join(sb.Dir, "sessions", id),
		Lease:  lease,
		Ledger: map[string]*Command{},
		Rec: SessionRecord{
			WorkspaceSessionID: id, SandboxID: sb.Rec.ID, Agent: agent, NetworkProfile: network, FinalizePolicy: policy,
			State: SessActive, CreatedAt: sandbox.NowRFC3339(), BaseRevision: m.Revision(),
			Lease:         LeaseRecord{LeaseID: lease.ID(), Layers: m.Layers},
			OverlayDriver: sb.Rec.OverlayDriver,
		},
	}
	if from != nil {
		ss.Rec.BaseRevision, ss.Rec.OverlayDriver, ss.Rec.ForkedFrom = from.rec.BaseRevision, from.rec.OverlayDriver, from.rec.WorkspaceSessionID
	}
	rollback := func() {
		RemoveTree(ss.Dir)
		_, _ = lease.Release()
	}
	dirs := []string{"upper", "scratch", "attribution"}
	if from != nil {
		dirs = dirs[1:] // the copy makes the upper dir
	}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(ss.Dir, d), 0o700); err != nil {
			rollback()
			return nil, statedb.Row{}, catalog.Errorf(catalog.OperationFailed, "workspace setup failed at directories: %v", err).With("stage", "directories")
		}
	}
	if from != nil {
		if err := h.copyFrom(ctx, sb, from, ss); err != nil {
			rollback()
			return nil, statedb.Row{}, err
		}
	}
	if err := h.start(ctx, sb, ss); err != nil {
		rollback()
		return nil, statedb.Row{}, err
	}
	row := statedb.Row{Kind: statedb.KindSession, ID: id, SandboxID: sb.Rec.ID, Rec: ss.Rec}
	if persist {
		if err := h.DB.PutRows(ctx, row); err != nil {
			_ = ss.Holder.Close(0)
			rollback()
			return nil, statedb.Row{}, err
		}
	}
	sb.Mu.Lock()
	sb.Work.Sessions[id] = ss
	sl.ReleaseLocked()
	sb.Rec.LiveWorkspaceSessions = append(sb.Rec.LiveWorkspaceSessions, id)
	sb.Mu.Unlock()
	h.event(ctx, sb, "lease.acquired", map[string]any{"workspace_session_id": id, "revision": ss.Rec.BaseRevision})
	return ss, row, nil
}

// start starts the session's holder over its persisted lease and
// upper dir with a fresh work dir, and watches it.
func (h *Holders) start(ctx context.Context, sb *Sandbox, ss *Session) error {
	work := filepath.Join(ss.Dir, "work")
	RemoveTree(work) // the kernel wants a fresh, empty work dir per mount
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
		HostPaths:       h.Cfg.Sandbox.HostPaths,
		HiddenPaths:     append(append([]string{}, h.Hidden...), h.Cfg.Sandbox.HiddenPaths...),
		IsolatedNetwork: ss.Rec.NetworkProfile == NetIsolated || ss.Rec.NetworkProfile == NetOffline,
		BlockPrivate:    ss.Rec.NetworkProfile == NetIsolated && !h.Cfg.Network.Isolated.AllowPrivate,
		IDMapping:       h.Cfg.Sandbox.IDMapping,
		Shim:            h.Shim,
		Overlay:         ss.Rec.OverlayDriver,
		CoalesceMs:      h.Cfg.Observability.FileActivity.CoalesceMs,
	}
	if pm := sb.Rec.ResourceProfile.PidsMax; pm != nil && *pm > 0 {
		cfg.PidsMax = *pm // also where the pids cgroup enforces it: a second bound, never a looser one
	}
	egress, err := h.egressFor(ss)
	if err != nil {
		return err
	}
	if egress != nil {
		cfg.Egress, cfg.ResolvConf = egress, nsholder.ResolvConf
	}
	if sb.Rec.Rootfs != "host" {
		if h.Shim == "" && h.ShimErr != nil {
			// The fallback shim is this binary, dynamically linked, and its loader was not found: an image need not have one.
			return catalog.Errorf(catalog.OperationFailed, "workspace setup failed at spawn: an image sandbox needs sandbox-exec-shim next to %s (the Go shim cannot start there: %v)", h.Self, h.ShimErr).With("stage", "spawn")
		}
		cfg.Loader = h.ShimLoader
		rootfs, err := h.ImageRootfs(sb.Rec.Rootfs)
		if err != nil {
			return catalog.Errorf(catalog.OperationFailed, "workspace setup failed at mount_root: image rootfs %s: %v", sb.Rec.Rootfs, err).With("stage", "mount_root")
		}
		cfg.HostPaths = nil
		cfg.Image = &nsholder.ImageRoot{Rootfs: rootfs, Files: imageFiles(ss.ID(), ss.Rec.NetworkProfile)}
	}
	setup := time.Duration(h.Cfg.Runtime.Workspace.SetupTimeoutS * float64(time.Second))
	hctx, cancel := context.WithTimeout(ctx, setup)
	defer cancel()
	sp, _ := h.spanCtx(ctx, sb, "holder.spawn", map[string]any{"workspace_session_id": ss.ID(),
		"overlay_driver": ss.Rec.OverlayDriver, "lowers": len(cfg.Lowers), "network_profile": ss.Rec.NetworkProfile})
	var hl *nsholder.Client
	if ss.Implicit() {
		if spare := h.takeSpare(hctx, sb, cfg); spare != nil {
			if hl, err = spare.Setup(hctx, cfg); err != nil {
				// A spare that died or failed its setup: start afresh, which
				// also reports a setup error that is the session's own.
				h.Log.Warn("spare holder setup", "workspace_session_id", ss.ID(), "err", err)
				hl = nil
			}
		}
	}
	if hl == nil {
		hl, err = nsholder.Start(hctx, h.Self, cfg)
	}
	if err == nil {
		// Measured by the holder during its setup, which ended just now.
		sp.Measured("holder.mount_overlay", hl.OverlayMountTime(), map[string]any{"workspace_session_id": ss.ID(),
			"driver": ss.Rec.OverlayDriver, "lowers": len(cfg.Lowers)})
		sp.Done(nil, map[string]any{"pid": hl.Pid()})
	} else {
		sp.Done(err, nil)
	}
	if err != nil {
		var se *nsholder.SetupError
		if errors.As(err, &se) {
			return catalog.Errorf(catalog.OperationFailed, "%s", se.Error()).With("stage", se.Stage)
		}
		return catalog.Errorf(catalog.OperationFailed, "workspace setup failed at spawn: %v", err).With("stage", "spawn")
	}
	ss.Mu.Lock()
	ss.Holder = hl
	ss.Mu.Unlock()
	if err := h.Cgroups.Attach(sb.Rec.ID, ss.ID(), hl.Pid()); err != nil {
		// Samples then come from /proc; nothing else depends on the cgroup.
		h.Log.Warn("attach holder to its cgroup", "workspace_session_id", ss.ID(), "err", err)
	}
	if !sb.GoBackground(func() { h.watch(sb, ss, hl) }) {
		ss.Mu.Lock()
		ss.Holder = nil
		ss.Mu.Unlock()
		_ = hl.Close(0)
		return catalog.Errorf(catalog.OperationConflict, "sandbox %s is being destroyed", sb.Rec.ID).With("sandbox_id", sb.Rec.ID)
	}
	return nil
}

// watch routes the holder's command events and notices its death.
func (h *Holders) watch(sb *Sandbox, ss *Session, hl Holder) {
	events := hl.Events()
	for ev := range events {
		if ev.FS == nil {
			h.Cmds.Event(sb, ss, ev)
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
		h.FuseNotices(sb, ss, batch)
		if next != nil {
			h.Cmds.Event(sb, ss, *next)
		}
	}
	<-hl.Done()
	ss.Mu.Lock()
	current := ss.Holder == hl
	ss.Mu.Unlock()
	if !current {
		return // replaced or closed on purpose
	}
	h.exited(sb, ss)
}

// exited handles an unexpected holder death (§5.6): running commands
// become terminal with interrupted:true; an implicit session keeps its work
// as a recovery artifact and is destroyed; an explicit one gets one new
// holder, else it is restore_failed with its data intact.
func (h *Holders) exited(sb *Sandbox, ss *Session) {
	// One synthetic holder-<ulid> trace holds the death and what follows.
	trace := ""
	if h.Obs.Store(scope(sb)) != nil {
		trace = h.Obs.SyntheticTrace("holder")
	}
	h.Obs.Event(scope(sb), trace, "holder.exited", map[string]any{"workspace_session_id": ss.ID(), "pid": ss.HolderPid(), "status": "exited_unexpectedly"})
	ss.Mu.Lock()
	ss.Holder = nil // the session refuses new work from here on
	cmds := make([]*Command, 0, len(ss.Ledger))
	for _, c := range ss.Ledger {
		cmds = append(cmds, c)
	}
	ss.Ledger = map[string]*Command{}
	ss.Mu.Unlock()
	for _, c := range cmds {
		h.Cmds.Finish(sb, c, "holder_exited", nil)
	}
	ctx := context.Background()
	defer h.Bump(ctx, sb)
	ss.Gate.Lock()
	defer ss.Gate.Unlock()
	if ss.IsGone() {
		return
	}
	if ss.Implicit() {
		// Its work is kept (a rename of the upper dir), then it is destroyed (§5.6).
		msg := "the session's holder exited unexpectedly"
		sp := h.Obs.StartSpan(scope(sb), trace, "", "workspace_session.finalize", map[string]any{"workspace_session_id": ss.ID(), "reason": "holder_exited"})
		fctx := obs.With(ctx, sp)
		artifact := h.Teardown.KeepRecoveryArtifact(fctx, sb, ss, "holder_exited", map[string]any{"path": nil, "reason": "holder_exited",
			"source_conflict": nil, "protected_drop": nil, "message": msg, "conflicts": []any{}})
		_, err := h.Teardown.DestroySession(fctx, sb, ss, 0)
		sp.Done(err, map[string]any{"recovery_artifact": artifact})
		return
	}
	if ss.State() == SessActive {
		// One automatic re-creation over the same lease and upper dir.
		ss.SetState(SessRestoring)
		sp := h.Obs.StartSpan(scope(sb), trace, "", "workspace_session.restore", map[string]any{"workspace_session_id": ss.ID(), "reason": "holder_exited"})
		rctx := obs.With(ctx, sp)
		err := h.start(rctx, sb, ss)
		sp.Done(err, nil)
		if err != nil {
			ss.SetState(SessRestoreFailed)
			h.event(rctx, sb, "workspace_session.restore_failed", map[string]any{"workspace_session_id": ss.ID(), "error": err.Error()})
		} else {
			ss.SetState(SessActive)
			h.event(rctx, sb, "workspace_session.restored", map[string]any{"workspace_session_id": ss.ID()})
		}
	}
	ss.Mu.Lock()
	rec := ss.Rec
	ss.Mu.Unlock()
	_ = h.DB.Put(ctx, statedb.KindSession, rec.WorkspaceSessionID, sb.Rec.ID, rec)
}

// Restore brings a sandbox's persisted sessions back at start (§4.5,
// §5.5): explicit ones get a new holder over their lease and upper dir,
// implicit ones are finalized from their upper dir.
func (h *Holders) Restore(ctx context.Context, sb *Sandbox, sum *RestoreSummary) {
	var recs []SessionRecord
	_ = h.DB.List(ctx, statedb.KindSession, sb.Rec.ID, func(b []byte) error {
		var r SessionRecord
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
		upper := filepath.Join(sb.Dir, "sessions", rec.WorkspaceSessionID, "upper")
		if changed, err := settleSync(upper, &rec); err != nil {
			h.Log.Warn("settle interrupted sync", "workspace_session_id", rec.WorkspaceSessionID, "err", err)
		} else if changed {
			if err := h.DB.Put(ctx, statedb.KindSession, rec.WorkspaceSessionID, sb.Rec.ID, rec); err != nil {
				h.Log.Warn("persist session", "workspace_session_id", rec.WorkspaceSessionID, "err", err)
			}
		}
		m := layers.Manifest{SchemaVersion: layers.SchemaVersion, Layers: rec.Lease.Layers}
		ss := &Session{Rec: rec, Dir: filepath.Join(sb.Dir, "sessions", rec.WorkspaceSessionID), Ledger: map[string]*Command{},
			Lease: sb.Stack.Restore(rec.Lease.LeaseID, m, "workspace-session:"+rec.WorkspaceSessionID)}
		sb.Mu.Lock()
		sb.Work.Sessions[rec.WorkspaceSessionID] = ss
		sb.Rec.LiveWorkspaceSessions = append(sb.Rec.LiveWorkspaceSessions, rec.WorkspaceSessionID)
		sb.Mu.Unlock()
		if ss.Implicit() {
			h.attachOutcome(ctx, sb, rec.WorkspaceSessionID, h.FinalizeImplicit(ctx, sb, ss, nil))
			sum.Finalized = append(sum.Finalized, rec.WorkspaceSessionID)
			continue
		}
		if rec.State == SessRestoreFailed || rec.State == SessFinalizeFailed {
			sum.KeptFailed = append(sum.KeptFailed, rec.WorkspaceSessionID)
			continue // data stays until destroyed
		}
		ss.SetState(SessRestoring)
		restoring.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			h.restoreHolder(ctx, sb, ss, sum, &sumMu)
		})
	}
	restoring.Wait()
}

// restoreHolder gives one restoring explicit session a new holder over its
// persisted lease and upper dir; several run at once (holder set-up is
// mostly waiting on the kernel), so a restart with many sessions is quick.
func (h *Holders) restoreHolder(ctx context.Context, sb *Sandbox, ss *Session, sum *RestoreSummary, sumMu *sync.Mutex) {
	id := ss.ID()
	sp, rctx := h.spanCtx(ctx, sb, "workspace_session.restore", map[string]any{"workspace_session_id": id, "reason": "supervisor_start"})
	err := h.start(rctx, sb, ss)
	sp.Done(err, nil)
	sumMu.Lock()
	if err != nil {
		ss.SetState(SessRestoreFailed)
		sum.RestoreFailed = append(sum.RestoreFailed, id)
	} else {
		ss.SetState(SessActive)
		sum.Restored = append(sum.Restored, id)
	}
	sumMu.Unlock()
	if err != nil {
		h.event(ctx, sb, "workspace_session.restore_failed", map[string]any{"workspace_session_id": id, "error": err.Error()})
	} else {
		h.event(ctx, sb, "workspace_session.restored", map[string]any{"workspace_session_id": id})
	}
	ss.Mu.Lock()
	r := ss.Rec
	ss.Mu.Unlock()
	_ = h.DB.Put(ctx, statedb.KindSession, r.WorkspaceSessionID, sb.Rec.ID, r)
}

// attachOutcome gives the commands of an implicit session that a restart
// interrupted the outcome of its finalization at start-up (§4.5: "the
// outcome fields are attached to each of its interrupted commands"), so an
// agent polling its command learns whether its work was published.
func (h *Holders) attachOutcome(ctx context.Context, sb *Sandbox, wsID string, extra map[string]any) {
	if len(extra) == 0 {
		return
	}
	for _, cmd := range sb.Work.Commands {
		cmd.Mu.Lock()
		hit := cmd.Rec.WorkspaceSessionID == wsID && cmd.Rec.Interrupted && cmd.Rec.InterruptReason == "supervisor_restart"
		if hit {
			if cmd.Rec.Extra == nil {
				cmd.Rec.Extra = map[string]any{}
			}
			for k, v := range extra {
				cmd.Rec.Extra[k] = v
			}
		}
		rec := cmd.Rec
		cmd.Mu.Unlock()
		if hit {
			if err := h.DB.Put(ctx, statedb.KindCommand, rec.CommandSessionID, sb.Rec.ID, rec); err != nil {
				h.Log.Warn("persist command", "command", rec.CommandSessionID, "err", err)
			}
		}
	}
}

// imageFiles are the files the supervisor provides in an image session's
// root (§5.4): /etc/hosts and /etc/hostname for the session's hostname,
// and for a shared network the host's resolver configuration.
func imageFiles(hostname, network string) map[string]string {
	files := map[string]string{
		"/etc/hostname": hostname + "\n",
		"/etc/hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
			"127.0.1.1\t" + hostname + "\n",
	}
	switch network {
	case NetShared:
		if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
			files["/etc/resolv.conf"] = string(b)
		}
	case NetIsolated:
		files["/etc/resolv.conf"] = nsholder.ResolvConf
	}
	return files
}

// FindNetHelper resolves network.isolated.helper on PATH.
func FindNetHelper(want string) (nsholder.Egress, error) {
	names := []string{nsholder.HelperPasta, nsholder.HelperSlirp4netns}
	if want != "" && want != "auto" {
		names = []string{want}
	}
	var pkgs []string
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return nsholder.Egress{Helper: n, Path: p}, nil
		}
		pkgs = append(pkgs, doctor.HelperPackage(n))
	}
	if len(names) == 1 {
		return nsholder.Egress{}, fmt.Errorf("network_profile isolated needs %s (network.isolated.helper), which is not installed: install the Debian package %s", names[0], pkgs[0])
	}
	return nsholder.Egress{}, fmt.Errorf("network_profile isolated needs pasta or slirp4netns, and neither is installed: install the Debian package passt (or slirp4netns)")
}

// egressFor is the helper of a new isolated session, or the creation's
// error naming the missing package.
func (h *Holders) egressFor(ss *Session) (*nsholder.Egress, error) {
	if ss.Rec.NetworkProfile != NetIsolated {
		return nil, nil
	}
	e, err := FindNetHelper(h.Cfg.Network.Isolated.Helper)
	if err != nil {
		return nil, catalog.Errorf(catalog.OperationFailed, "workspace setup failed at network: %v", err).
			With("stage", "network").With("network_profile", NetIsolated)
	}
	e.StateDir = ss.Dir
	return &e, nil
}
