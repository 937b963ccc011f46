package supervisor

// Glue between the supervisor's sandboxes and sessions and
// supervisor/attribution, which works from plain values only: the names
// below turn a *sandbox or *session into those values, and keep the
// supervisor's callers (commands, files, finalize, git) unchanged.

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/attribution"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
)

type (
	lineOwner = attribution.LineOwner
	auditFile = attribution.AuditFile
	blameKey  = attribution.BlameKey
)

const ownerOriginal = attribution.OwnerOriginal

func nullable(s string) *string     { return attribution.Nullable(s) }
func deref(p *string) string        { return attribution.Deref(p) }
func rfc3339ms(t time.Time) string  { return attribution.RFC3339ms(t) }
func textLines(b []byte) []string   { return attribution.TextLines(b) }
func contentDigest(b []byte) string { return attribution.ContentDigest(b) }
func tileRanges(owners []lineOwner, wholesale bool) []attribution.OwnerRange {
	return attribution.TileRanges(owners, wholesale)
}

// attr is attribution's view of the state database (audit, file_activity).
func (s *store) attr() attribution.Store { return attribution.Store{DB: s.SQL()} }

func (s *store) initAudit(ctx context.Context) error    { return s.attr().InitAudit(ctx) }
func (s *store) initActivity(ctx context.Context) error { return s.attr().InitActivity(ctx) }
func (s *store) deleteSandboxAudit(ctx context.Context, sandboxID string) error {
	return s.attr().DeleteSandboxAudit(ctx, sandboxID)
}
func (s *store) deleteSandboxActivity(ctx context.Context, sandboxID string) error {
	return s.attr().DeleteSandboxActivity(ctx, sandboxID)
}

// attrGlue turns the supervisor's sandboxes and sessions into the plain
// values of supervisor/attribution; its methods are what workspace's
// SessionHooks and PublishHooks and the file handlers call.
type attrGlue struct {
	cfg   *config.Config
	store *store
	log   *slog.Logger
	// recordLayerOrigin is the git trace of a committed layer's owner.
	recordLayerOrigin func(ctx context.Context, sb *sandbox, res layers.PublishResult, owner lineOwner)
}

// audit is attribution's view of a sandbox.
func (s *attrGlue) audit(sb *sandbox) *attribution.Audit {
	return &attribution.Audit{SandboxID: sb.Rec.ID, Stack: sb.Stack, Store: s.store.attr(), Log: s.log}
}

// sessionBase returns the manifest a session was created on.
func sessionBase(ss *session) (layers.Manifest, sessionRecord) {
	ss.Mu.Lock()
	rec := ss.Rec
	ss.Mu.Unlock()
	return layers.Manifest{SchemaVersion: layers.SchemaVersion, Version: rec.BaseRevision.ManifestVersion, Layers: rec.Lease.Layers}, rec
}

// workspace is attribution's view of a session; sb may be nil where the
// base is not needed (line owners of a publish).
func (s *attrGlue) workspace(sb *sandbox, ss *session) attribution.Workspace {
	base, rec := sessionBase(ss)
	w := attribution.Workspace{ID: rec.WorkspaceSessionID, Agent: rec.Agent, Dir: ss.Dir, Upper: ss.Upper(), Log: s.log}
	if sb != nil {
		w.Base = sb.Stack.View(base)
	}
	return w
}

// checkpointSession takes an attribution checkpoint of a session (kernel
// driver and file operations; see attribution.Tracker.Checkpoint).
func (s *attrGlue) checkpointSession(ctx context.Context, sb *sandbox, ss *session, commandID string, approximate bool, paths ...string) {
	ss.Attr.Checkpoint(ctx, s.workspace(sb, ss), commandID, approximate, paths...)
}

// sessionLineOwners returns the owner of each line of content, the
// session's version of path, for publication. Call it before the session
// directory is removed.
func (s *attrGlue) sessionLineOwners(ss *session, path string, content []byte) []lineOwner {
	return ss.Attr.LineOwners(s.workspace(nil, ss), path, content)
}

// recordPublishAudit appends the audit records of a committed publish
// (attribution.Audit.RecordPublish).
func (s *attrGlue) recordPublishAudit(ctx context.Context, sb *sandbox, prev layers.Manifest, res layers.PublishResult, files []auditFile) error {
	return s.audit(sb).RecordPublish(ctx, prev, res, files)
}

// auditSessionless records a sessionless file_write/file_edit of path
// (owner operation:<request_id>, command_session_id null). Call it after a
// successful Update; a no-op is ignored. prev may be the zero Manifest.
func (s *attrGlue) auditSessionless(ctx context.Context, sb *sandbox, prev layers.Manifest, res layers.PublishResult, path, requestID string) {
	s.recordLayerOrigin(ctx, sb, res, attribution.OperationOwner(requestID))
	_ = s.recordPublishAudit(ctx, sb, prev, res, []auditFile{{Path: path, Owner: attribution.OperationOwner(requestID)}})
}

func (s *attrGlue) viewOwners(ctx context.Context, sb *sandbox, v *layers.View, version int, p string) (owners []lineOwner, content []byte, text, wholesale bool, err error) {
	return s.audit(sb).ViewOwners(ctx, v, version, p)
}

// ---- file activity ----

// activityEnabled: observability.enabled and file_activity.enabled.
func (s *attrGlue) activityEnabled() bool {
	return s.cfg.Observability.Enabled && s.cfg.Observability.FileActivity.Enabled
}

// recordActivity stores records of one sandbox. Observability never fails
// a runtime operation: a storage error is logged and the records dropped.
func (s *attrGlue) recordActivity(ctx context.Context, sb *sandbox, recs []attribution.ActivityRecord) {
	if len(recs) == 0 || !s.activityEnabled() {
		return
	}
	// Detached from the request: a cancelled request must not lose what
	// already happened.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.store.attr().AppendActivity(ctx, sb.Rec.ID, recs, s.cfg.Observability.FileActivity.MaxRecords); err != nil {
		s.log.Warn("file_activity.dropped", "sandbox_id", sb.Rec.ID, "records", len(recs), "err", err)
	}
}

// captureActivity records the upper-dir difference since the previous
// capture (§11.4 capture); see attribution.Tracker.CaptureActivity.
func (s *attrGlue) captureActivity(ctx context.Context, sb *sandbox, ss *session, cmd, requestID, source string, paths ...string) {
	if !s.activityEnabled() {
		return
	}
	s.recordActivity(ctx, sb, ss.Attr.CaptureActivity(ctx, s.workspace(sb, ss), cmd, requestID, source, paths...))
}

// kernelCommandEnd checkpoints a kernel session at a command's end and
// records its file activity, from one walk of the upper dir
// (attribution.Tracker.CommandEnd).
func (s *attrGlue) kernelCommandEnd(ctx context.Context, sb *sandbox, ss *session, commandID string, approximate bool) {
	s.recordActivity(ctx, sb, ss.Attr.CommandEnd(ctx, s.workspace(sb, ss), commandID, approximate, s.activityEnabled()))
}

// fileOpActivity records a session file operation (file_write, file_edit)
// with its request_id: for the kernel driver through capture of the one
// path, for the FUSE driver directly (the holder's own writes are not
// among the FUSE records).
func (s *attrGlue) fileOpActivity(ctx context.Context, sb *sandbox, ss *session, requestID, p string, created bool, size int) {
	if ss.Rec.OverlayDriver != "fuse" {
		s.captureActivity(ctx, sb, ss, "", requestID, "capture", p)
		return
	}
	now := time.Now()
	op := "write"
	if created {
		op = "create"
	}
	n := int64(size)
	s.recordActivity(ctx, sb, []attribution.ActivityRecord{{TS: now.UTC().Format("2006-01-02T15:04:05.000Z"), WorkspaceSessionID: ss.ID(),
		Op: op, Path: p, Length: &n, Source: "fuse", RequestID: requestID, At: now}})
}

func (s *Supervisor) fileActivity(c *call) (any, error) {
	q := attribution.ActivityQuery{SessionID: c.args.String("workspace_session_id"), SinceMs: -1, Limit: 200}
	if c.args.Has("path") {
		p, perr := catalog.WorkspacePath(c.args.String("path"), true)
		if perr != nil {
			return nil, perr
		}
		q.Path = p
	}
	if c.args.Has("since_ms") {
		q.SinceMs = int64(c.args.Uint("since_ms"))
	}
	if v, explicit := c.req.Args["limit"]; explicit && v != nil {
		q.Limit = int(c.args.Uint("limit"))
	}
	out := map[string]any{"view": "file_activity", "sandbox_id": c.sb.Rec.ID, "records": []json.RawMessage{}, "truncated": false}
	if !s.glue.activityEnabled() {
		return out, nil
	}
	recs, truncated, err := s.store.attr().QueryActivity(c.ctx, c.sb.Rec.ID, q)
	if err != nil {
		return nil, err
	}
	if recs != nil {
		out["records"] = recs
	}
	out["truncated"] = truncated
	return out, nil
}

// ---- FUSE sessions ----

// fuseNotices applies notices of a FUSE session's holder, in order
// (attribution.Tracker.FuseNotices).
func (s *attrGlue) fuseNotices(sb *sandbox, ss *session, ns []*nsholder.FSNotice) {
	plain := make([]attribution.FSNotice, 0, len(ns))
	for _, n := range ns {
		var p attribution.FSNotice
		for _, r := range n.Records {
			p.Records = append(p.Records, attribution.FSRecord{TimeUnixNs: r.TimeUnixNs, Command: r.Command, Op: r.Op,
				Path: r.Path, NewPath: r.NewPath, Offset: r.Offset, Length: r.Length})
		}
		for _, r := range n.Released {
			p.Released = append(p.Released, attribution.FSReleased{Path: r.Path, Command: r.Command})
		}
		plain = append(plain, p)
	}
	ctx := context.Background()
	ss.Attr.FuseNotices(ctx, s.workspace(sb, ss), plain, func(recs []attribution.ActivityRecord) { s.recordActivity(ctx, sb, recs) })
}

// fuseCommandEnd is the command-end checkpoint of a FUSE session.
func (s *attrGlue) fuseCommandEnd(sb *sandbox, ss *session, cmd string) {
	ss.Attr.FuseCommandEnd(context.Background(), s.workspace(sb, ss), cmd)
}

// sessionHooks give workspace.Commands the root's attribution glue and
// implicit finalization until they move.
type sessionHooks struct{ s *Supervisor }

func (h sessionHooks) FuseCommandEnd(sb *sandbox, ss *session, cmd string) {
	h.s.glue.fuseCommandEnd(sb, ss, cmd)
}

func (h sessionHooks) KernelCommandEnd(ctx context.Context, sb *sandbox, ss *session, commandID string, approximate bool) {
	h.s.glue.kernelCommandEnd(ctx, sb, ss, commandID, approximate)
}

func (h sessionHooks) FinalizeImplicit(ctx context.Context, sb *sandbox, ss *session, drain *command) map[string]any {
	return h.s.publisher.FinalizeImplicit(ctx, sb, ss, drain)
}

// publishHooks give workspace.Publisher the root's attribution glue and
// the notices of a committed layer.
type publishHooks struct{ s *Supervisor }

func (h publishHooks) LayerCommitted(ctx context.Context, sb *sandbox, res layers.PublishResult, owner lineOwner) {
	h.s.notifyAutosquash(sb, "layer_committed")
	h.s.recordLayerOrigin(ctx, sb, res, owner)
}

func (h publishHooks) SessionLineOwners(ss *session, path string, content []byte) []lineOwner {
	return h.s.glue.sessionLineOwners(ss, path, content)
}

func (h publishHooks) RecordPublishAudit(ctx context.Context, sb *sandbox, prev layers.Manifest, res layers.PublishResult, files []auditFile) error {
	return h.s.glue.recordPublishAudit(ctx, sb, prev, res, files)
}

func (h publishHooks) SessionSynced(ctx context.Context, sb *sandbox, ss *session, res layers.SyncResult) {
	merged := map[string]bool{}
	for _, cf := range res.Committed {
		if cf.Merged {
			merged[cf.Path] = true
		}
	}
	ss.Attr.Synced(ctx, h.s.glue.workspace(sb, ss), merged)
}
