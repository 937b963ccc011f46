package supervisor

import (
	"context"

	"os"
	"path/filepath"

	"github.com/ephemeral-ai-lab/sandbox/catalog"

	"github.com/ephemeral-ai-lab/sandbox/layers"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
	sbx "github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// Thin handlers and wiring of the sandbox package.

func (s *Supervisor) squashLayerstacks(c *call) (any, error) {
	return s.squasher.Run(c.ctx, s.sandboxes, c.args.String("sandbox_id"), c.progress)
}

// notifyAutosquash queues an autosquash evaluation of sb (§8.6): at start
// and after every committed layer.
func (s *Supervisor) notifyAutosquash(sb *sandbox, reason string) {
	s.squasher.Notify(sb, reason)
}

// newSquasher wires the squash of the sandbox package to the supervisor's
// spans, state and live sessions.
func (s *Supervisor) newSquasher() *sbx.Squasher[*occupants] {
	return &sbx.Squasher[*occupants]{
		Log:       s.log,
		Span:      s.sandboxSpan,
		Bump:      s.bump,
		Occupants: s.sweepOccupants,
		Width:     s.cfg.Runtime.Layerstack.RemountSweepWidth,
		Threshold: s.cfg.Runtime.Layerstack.Autosquash.SquashAtNLayers,
		Draining:  s.draining.Load,
		Track: func() func() {
			s.inflight.Add(1)
			return s.inflight.Done
		},
		Bounded: obs.BoundedError,
	}
}

// sandboxSpan opens a span for the sandbox package.
func (s *Supervisor) sandboxSpan(ctx context.Context, sb *sandbox, origin, name string, attrs map[string]any) (sbx.Span, context.Context) {
	sp, ctx := spanIn(s.obs, ctx, sb, origin, name, attrs)
	return stepSpan{sp}, ctx
}

// stepSpan is a span as the sandbox package records steps.
type stepSpan struct{ sp *span }

func (q stepSpan) Done(err error, attrs map[string]any)    { q.sp.done(err, attrs) }
func (q stepSpan) Event(name string, attrs map[string]any) { q.sp.event(name, attrs) }

// sweepOccupants lists sb's live sessions for the squash's remount sweep.
func (s *Supervisor) sweepOccupants(sb *sandbox) []sbx.Occupant {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	out := make([]sbx.Occupant, 0, len(sb.Work.Sessions))
	for _, ss := range sb.Work.Sessions {
		out = append(out, sweptSession{s.holders, sb, ss})
	}
	return out
}

// sweptSession is a session as the remount sweep sees it.
type sweptSession struct {
	h  *workspace.Holders
	sb *sandbox
	ss *session
}

func (o sweptSession) ID() string            { return o.ss.ID() }
func (o sweptSession) Base() layers.Manifest { return o.ss.Base() }
func (o sweptSession) Gone() bool            { return o.ss.IsGone() }
func (o sweptSession) Remount(ctx context.Context, res layers.SquashResult) sbx.RemountOutcome {
	return o.h.SweepRemount(ctx, o.sb, o.ss, res)
}

func (s *Supervisor) destroySandbox(c *call) (any, error) {
	return s.sbm.Destroy(c.ctx, c.args.String("sandbox_id"), c.progress)
}

// bump records a client-visible change (§4.4).
func (s *Supervisor) bump(ctx context.Context, sb *sandbox) { s.sbm.Bump(ctx, sb) }

// revise is bump without the write: the caller stores the row in its own
// transaction.
func (s *Supervisor) revise(sb *sandbox) statedb.Row {
	rec := s.sbm.Revise(sb)
	return statedb.Row{Kind: statedb.KindSandbox, ID: rec.ID, SandboxID: rec.ID, Rec: &rec}
}

// newSandboxManager wires the registry's lifecycle to the state database,
// the sessions, the cgroups, the observability stores and the image cache.
// The closures read s's fields when called: some are set after wiring.
func (s *Supervisor) newSandboxManager() *sbx.Manager[*occupants] {
	return &sbx.Manager[*occupants]{
		Reg:          s.sandboxes,
		Store:        sandboxStore{s.store},
		Log:          s.log,
		Occupants:    sandboxOccupants{s},
		NewID:        s.ids.New,
		Dir:          s.sandboxDir,
		NewWork:      workspace.NewTables,
		Span:         s.sandboxSpan,
		Detach:       func(id string) { s.cgroups.RemoveSandbox(id) },
		Seal:         func(dir string) { s.obs.Seal(dir) },
		RemoveDir:    workspace.RemoveTreeErr,
		ReleaseImage: func(rootfs string) { s.images.Release(rootfs) },
	}
}

// sandboxStore is the state database as the sandbox package uses it.
type sandboxStore struct{ st *store }

func (a sandboxStore) PutSandbox(ctx context.Context, rec *sbx.Record) error {
	return a.st.putSandbox(ctx, rec)
}

func (a sandboxStore) DeleteSandboxRows(ctx context.Context, id string) error {
	return a.st.deleteSandboxRows(ctx, id)
}

// sandboxOccupants are the sessions and commands of a sandbox as its
// lifecycle sees them.
type sandboxOccupants struct{ s *Supervisor }

func (o sandboxOccupants) Stop(ctx context.Context, sb *sandbox, progress func(string)) {
	o.s.teardown.StopSessions(ctx, sb, true, progress)
}

// Forget removes the transcripts of sb's commands.
func (o sandboxOccupants) Forget(sb *sandbox) {
	sb.Mu.Lock()
	ids := make([]string, 0, len(sb.Work.Commands))
	for id := range sb.Work.Commands {
		ids = append(ids, id)
	}
	sb.Mu.Unlock()
	for _, id := range ids {
		os.RemoveAll(filepath.Join(o.s.dirs.Data, "commands", id))
	}
}

func (s *Supervisor) exportChanges(c *call) (any, error) {
	format := c.args.String("format")
	if format == "" {
		format = "dir"
	}
	if format == "git" {
		return s.exportGit(c)
	}
	if !c.args.Has("dest") {
		return nil, catalog.Errorf(catalog.InvalidRequest, "format %s needs dest", format).With("argument", "dest")
	}
	ex := s.cfg.Manager.Export
	return s.exporter.Export(c.ctx, sbx.ExportSpec{
		SandboxID: c.args.String("sandbox_id"), Format: format, Dest: c.args.String("dest"), RequestID: c.req.RequestID,
		Own: []string{s.dirs.Data, s.dirs.Config, s.dirs.Runtime}, AllowedRoots: ex.AllowedRoots,
		Caps:      layers.ExportCaps{MaxStreamBytes: ex.MaxStreamBytes, MaxDecompressedBytes: ex.MaxDecompressedBytes, MaxApplyEntries: ex.MaxApplyEntries},
		ZstdLevel: s.cfg.Runtime.Layerstack.SpoolZstdLevel,
	}, c.progress)
}

// readStack resolves a ready sandbox for an operation that works on its
// layer stack and read-holds its gate, so destroy waits; done releases it.
func (s *Supervisor) readStack(id string) (sb *sandbox, done func(), e *catalog.Error) {
	return s.sandboxes.ReadStack(id)
}
