package supervisor

import (
	"io/fs"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// File operations (§7). Without workspace_session_id they work on the
// published head: reads see its merged view, writes are a read-modify-write
// under the LayerStack's writer lock that publishes exactly one layer.

// fileSession returns the session a file operation names, admitted and
// with its gate held (release with the returned func), or nil for a
// sessionless operation.
func (s *Supervisor) fileSession(c *call) (*session, func(), error) {
	if !c.args.Has("workspace_session_id") {
		return nil, func() {}, nil
	}
	ss, e := workspace.LookupSession(c.sb, c.args.String("workspace_session_id"))
	if e != nil {
		return nil, nil, e
	}
	_, release, e := ss.Enter()
	if e != nil {
		return nil, nil, e
	}
	return ss, release, nil
}

// viewFor returns the read view of a file operation and a release func.
func (s *Supervisor) viewFor(c *call) (workspace.FileView, *session, func(), error) {
	ss, release, err := s.fileSession(c)
	if err != nil {
		return nil, nil, nil, err
	}
	if ss != nil {
		h := ss.CurrentHolder()
		return workspace.SessionFiles{H: h}, ss, release, nil
	}
	// A lease, not a bare read of head: a squash may replace head's layers
	// and collect them while this read still walks them.
	lease, err := c.sb.Stack.Acquire("read")
	if err != nil {
		release()
		return nil, nil, nil, err
	}
	return workspace.HeadFiles{V: c.sb.Stack.View(lease.Manifest())}, nil, func() {
		if _, err := lease.Release(); err != nil {
			s.log.Warn("release read lease", "err", err)
		}
		release()
	}, nil
}

func (s *Supervisor) fileWrite(c *call) (any, error) {
	p, perr := catalog.WorkspacePath(c.args.String("path"), false)
	if perr != nil {
		return nil, perr
	}
	content := []byte(c.args.String("content"))
	ss, release, err := s.fileSession(c)
	if err != nil {
		return nil, err
	}
	defer release()
	if ss != nil {
		created, err := workspace.SessionWrite(c.ctx, ss, p, content)
		if err != nil {
			return nil, err
		}
		s.glue.checkpointSession(c.ctx, c.sb, ss, "", false, p)
		s.glue.fileOpActivity(c.ctx, c.sb, ss, c.req.RequestID, p, created, len(content))
		s.bump(c.ctx, c.sb)
		return map[string]any{"type": workspace.WriteType(created), "path": p, "bytes_written": len(content)}, nil
	}
	if err := workspace.CheckProtected(p, s.protected); err != nil {
		return nil, err
	}
	created := false
	var prev layers.Manifest // the head this write is based on, for line attribution
	res, err := c.sb.Stack.Update(c.ctx, func(v *layers.View) ([]layers.Change, error) {
		prev = v.Manifest()
		old, err := workspace.WriteTarget(v, p)
		if err != nil {
			return nil, err
		}
		mode := fs.FileMode(0o644)
		if created = old == nil; !created {
			mode = old.Mode.Perm()
		}
		return []layers.Change{{Kind: layers.ChangeWrite, Path: p, Mode: mode, Data: content}}, nil
	})
	if err != nil {
		return nil, err
	}
	s.glue.auditSessionless(c.ctx, c.sb, prev, res, p, c.req.RequestID)
	s.bump(c.ctx, c.sb)
	if !res.NoOp {
		s.notifyAutosquash(c.sb, "layer_committed")
	}
	return map[string]any{"type": workspace.WriteType(created), "path": p, "bytes_written": len(content), "revision": res.Revision, "layer_id": workspace.LayerID(res)}, nil
}

func (s *Supervisor) fileEdit(c *call) (any, error) {
	p, perr := catalog.WorkspacePath(c.args.String("path"), false)
	if perr != nil {
		return nil, perr
	}
	edits, err := workspace.ParseEdits(c.args.Array("edits"))
	if err != nil {
		return nil, err
	}
	v, ss, release, err := s.viewFor(c)
	if err != nil {
		return nil, err
	}
	defer release()
	result := func(written, replacements int) map[string]any {
		return map[string]any{"type": "edit", "path": p, "edits_applied": len(edits), "replacements": replacements, "bytes_written": written}
	}
	if ss != nil {
		raw, _, err := workspace.ReadText(c.ctx, v, p, s.cfg.Runtime.File.MaxEditBytes)
		if err != nil {
			return nil, err
		}
		out, n, err := workspace.EditText(raw, edits, p)
		if err != nil {
			return nil, err
		}
		created, err := workspace.SessionWrite(c.ctx, ss, p, out)
		if err != nil {
			return nil, err
		}
		s.glue.checkpointSession(c.ctx, c.sb, ss, "", false, p)
		s.glue.fileOpActivity(c.ctx, c.sb, ss, c.req.RequestID, p, created, len(out))
		s.bump(c.ctx, c.sb)
		return result(len(out), n), nil
	}
	if err := workspace.CheckProtected(p, s.protected); err != nil {
		return nil, err
	}
	var written, replacements int
	var prev layers.Manifest
	res, err := c.sb.Stack.Update(c.ctx, func(head *layers.View) ([]layers.Change, error) {
		prev = head.Manifest()
		raw, e, err := workspace.ReadText(c.ctx, workspace.HeadFiles{V: head}, p, s.cfg.Runtime.File.MaxEditBytes)
		if err != nil {
			return nil, err
		}
		out, n, err := workspace.EditText(raw, edits, p)
		if err != nil {
			return nil, err
		}
		written, replacements = len(out), n
		return []layers.Change{{Kind: layers.ChangeWrite, Path: p, Mode: e.Mode.Perm(), Data: out}}, nil
	})
	if err != nil {
		return nil, err
	}
	s.glue.auditSessionless(c.ctx, c.sb, prev, res, p, c.req.RequestID)
	s.bump(c.ctx, c.sb)
	if !res.NoOp {
		s.notifyAutosquash(c.sb, "layer_committed")
	}
	r := result(written, replacements)
	r["revision"], r["layer_id"] = res.Revision, workspace.LayerID(res)
	return r, nil
}

func (s *Supervisor) fileRead(c *call) (any, error) {
	p, perr := catalog.WorkspacePath(c.args.String("path"), false)
	if perr != nil {
		return nil, perr
	}
	v, _, release, err := s.viewFor(c)
	if err != nil {
		return nil, err
	}
	defer release()
	res, err := workspace.Read(c.ctx, s.cfg, v, p, c.args.Uint("offset"), c.args.Uint("limit"))
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (s *Supervisor) fileList(c *call) (any, error) {
	p, perr := catalog.WorkspacePath(c.args.String("path"), true)
	if perr != nil {
		return nil, perr
	}
	v, _, release, err := s.viewFor(c)
	if err != nil {
		return nil, err
	}
	defer release()
	res, err := workspace.List(c.ctx, s.cfg, v, p, c.args.Uint("limit"))
	if err != nil {
		return nil, err
	}
	return res, nil
}
