package supervisor

// file_blame: the handler and its two views (head, session), from
// supervisor/attribution's owners.

import (
	"errors"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/attribution"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

func (s *Supervisor) fileBlame(c *call) (any, error) {
	p, perr := catalog.WorkspacePath(c.args.String("path"), false)
	if perr != nil {
		return nil, perr
	}
	if c.args.Has("workspace_session_id") {
		return s.blameSession(c, p)
	}
	return s.blameHead(c, p)
}

func notRegular(p string, k layers.EntryKind) error {
	return catalog.Errorf(catalog.InvalidRequest, "path is not a regular file (%s)", workspace.KindName(k)).With("path", p)
}

// blameError maps attribution's typed errors to the contract's.
func blameError(err error) error {
	var nr *attribution.NotRegularError
	if errors.As(err, &nr) {
		return notRegular(nr.Path, nr.Kind)
	}
	return err
}

func blameResult(p, view string, ws any, rev layers.Revision, owners []lineOwner, wholesale bool) map[string]any {
	return map[string]any{"path": p, "view": view, "workspace_session_id": ws, "revision": rev,
		"line_count": len(owners), "ranges": tileRanges(owners, wholesale)}
}

func (s *Supervisor) blameHead(c *call, p string) (any, error) {
	lease, err := c.sb.Stack.Acquire("read") // a squash may collect head's layers meanwhile
	if err != nil {
		return nil, err
	}
	defer func() {
		if _, err := lease.Release(); err != nil {
			s.log.Warn("release read lease", "err", err)
		}
	}()
	head := lease.Manifest()
	owners, content, text, wholesale, err := s.glue.viewOwners(c.ctx, c.sb, c.sb.Stack.View(head), head.Version, p)
	if workspace.Absent(err) {
		nf := workspace.FileNotFound(p)
		if rec, rerr := s.store.attr().LatestAudit(c.ctx, c.sb.Rec.ID, p, head.Version); rerr == nil && rec != nil {
			nf = nf.With("last_record_layer_id", rec.LayerID)
		}
		return nil, nf
	}
	if err != nil {
		return nil, blameError(err)
	}
	if c.args.String("format") == "agent-trace" {
		var lines []string
		if text {
			lines = textLines(content)
		}
		return s.blameTrace(c, p, nil, head.Revision(), owners, lines, wholesale), nil
	}
	return blameResult(p, "head", nil, head.Revision(), owners, wholesale), nil
}

func (s *Supervisor) blameSession(c *call, p string) (any, error) {
	v, ss, release, err := s.viewFor(c)
	if err != nil {
		return nil, err
	}
	defer release()
	e, err := v.Lstat(c.ctx, p)
	if workspace.Absent(err) {
		return nil, workspace.FileNotFound(p)
	}
	if err != nil {
		return nil, err
	}
	if e.Kind != layers.KindFile {
		return nil, notRegular(p, e.Kind)
	}
	_, rec := sessionBase(ss)
	owners, wholesale, err := s.glue.audit(c.sb).SessionBlameOwners(c.ctx, &ss.Attr, s.glue.workspace(c.sb, ss), p, e.Size, func() ([]byte, error) {
		b, err := v.ReadFile(c.ctx, p, attribution.TextMax)
		if errors.Is(err, nsholder.ErrTooLarge) {
			return nil, nil
		}
		return b, err
	})
	if workspace.Absent(err) {
		return nil, workspace.FileNotFound(p)
	}
	if err != nil {
		return nil, blameError(err)
	}
	if c.args.String("format") == "agent-trace" {
		var lines []string
		if b, err := v.ReadFile(c.ctx, p, attribution.TextMax); err == nil && attribution.IsText(b) {
			lines = textLines(b)
		}
		return s.blameTrace(c, p, ss.ID(), rec.BaseRevision, owners, lines, wholesale), nil
	}
	return blameResult(p, "session", ss.ID(), rec.BaseRevision, owners, wholesale), nil
}

// blameTrace is file_blame's Agent Trace form: one record with the file's
// ranges grouped by owner; vcs.revision is the sandbox's recorded git HEAD
// (the view itself is no commit), metadata names the view.
func (s *Supervisor) blameTrace(c *call, p string, ws any, rev layers.Revision, owners []lineOwner, lines []string, wholesale bool) atRecord {
	view := "head"
	if ws != nil {
		view = "session"
	}
	rec := newTraceRecord(gitHeadRevision(c.sb), nowRFC3339(), map[string]any{"sandbox_id": c.sb.Rec.ID, "view": view,
		"workspace_session_id": ws, "revision": rev})
	rec.Files = append(rec.Files, traceFile(p, owners, lines, wholesale))
	return rec
}
