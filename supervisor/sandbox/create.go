package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// CreateSpec is one create_sandbox request, its arguments checked and
// resolved by the caller.
type CreateSpec struct {
	Count         int
	Name          *string
	WorkspaceRoot string // as the client gave it (the record's workspace_root)
	Root          string // WorkspaceRoot with symlinks resolved
	// SnapRoot is the directory snapshotted: Root, or a checkout of a git
	// ref made from it.
	SnapRoot        string
	Git             *GitOrigin
	Image, Rootfs   string
	ImageEnv        []string
	OverlayDriver   string
	ResourceProfile ResourceProfileRec
	MaxEntries      int // manager.max_workspace_entries
}

// Create makes spec.Count sandboxes sharing one snapshot of spec.SnapRoot
// (the second and later link the first one's base). On failure every
// sandbox it made is removed again.
func (m *Manager[W]) Create(ctx context.Context, spec CreateSpec, progress func(string)) ([]*Sandbox[W], error) {
	var created []*Sandbox[W]
	rollback := func() {
		for i := len(created) - 1; i >= 0; i-- {
			_ = m.Remove(ctx, created[i])
		}
	}
	var first *layers.Stack
	for range spec.Count {
		id := m.NewID("sbx-")
		sb := New(Record{
			ID: id, Name: spec.Name, WorkspaceRoot: spec.WorkspaceRoot, Image: spec.Image, Rootfs: spec.Rootfs,
			OverlayDriver: spec.OverlayDriver, State: StateCreating, CreatedAt: NowRFC3339(),
			LiveWorkspaceSessions: []string{}, RecoveryArtifacts: []RecoveryArtifact{},
			ResourceProfile: spec.ResourceProfile,
			Git:             spec.Git,
		}, m.Dir(id), m.NewWork())
		sb.ImageEnv = spec.ImageEnv
		// The record is persisted as creating first so a crash mid-snapshot is rolled back at start.
		if err := m.Store.PutSandbox(ctx, &sb.Rec); err != nil {
			rollback()
			return nil, err
		}
		m.Reg.Put(sb)
		created = append(created, sb)
		stackDir := filepath.Join(sb.Dir, "layerstack")
		var st *layers.Stack
		var serr error
		if first == nil {
			progress(fmt.Sprintf("snapshotting %s into %s", spec.Root, id))
			var stats layers.SnapshotStats
			sp, _ := m.Span(ctx, nil, "", "workspace.snapshot", map[string]any{"sandbox_id": id, "workspace_root": spec.Root})
			st, stats, serr = layers.Create(ctx, stackDir, spec.SnapRoot, layers.SnapshotOptions{
				MaxEntries: spec.MaxEntries,
				Progress:   throttledProgress(progress),
			})
			sp.Done(serr, map[string]any{"files": stats.Files, "dirs": stats.Dirs, "symlinks": stats.Symlinks, "bytes": stats.Bytes})
			if serr == nil {
				progress(fmt.Sprintf("snapshot done: %d files, %d directories, %d symlinks, %d bytes", stats.Files, stats.Dirs, stats.Symlinks, stats.Bytes))
			}
			first = st
		} else {
			progress(fmt.Sprintf("linking the base of %s", id))
			st, serr = layers.CreateSibling(ctx, stackDir, first)
		}
		if serr != nil {
			rollback()
			return nil, fmt.Errorf("snapshot workspace %s: %w", spec.Root, serr)
		}
		sb.Stack = st
		head, err := st.Head()
		if err != nil {
			rollback()
			return nil, err
		}
		base, err := os.ReadFile(filepath.Join(stackDir, ".layer-metadata", "B000001-base.digest"))
		if err != nil {
			rollback()
			return nil, fmt.Errorf("read base root hash: %w", err)
		}
		sb.Mu.Lock()
		sb.Rec.SharedBase = SharedBase{Source: sb.Rec.WorkspaceRoot, Target: "/workspace", RootHash: strings.TrimSpace(string(base)), Readonly: true}
		sb.Rec.LayerCount = len(head.Layers)
		sb.Rec.State = StateReady
		rec := sb.Rec
		sb.Mu.Unlock()
		if err := m.Store.PutSandbox(ctx, &rec); err != nil {
			rollback()
			return nil, err
		}
	}
	return created, nil
}

// throttledProgress reports snapshot counts at most about once per second.
func throttledProgress(progress func(string)) func(files, dirs int) {
	var last time.Time
	return func(files, dirs int) {
		if time.Since(last) < time.Second {
			return
		}
		last = time.Now()
		progress(fmt.Sprintf("snapshot: %d files, %d directories so far", files, dirs))
	}
}
