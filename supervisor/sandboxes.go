package supervisor

import (
	"context"
	"os"
	"path/filepath"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	sbx "github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/workspace"
)

// Sandbox states (§4.1), named here for the files that predate the package.
const (
	stateCreating = sbx.StateCreating
	stateReady    = sbx.StateReady
	stateStopping = sbx.StateStopping
	stateStopped  = sbx.StateStopped
	stateFailed   = sbx.StateFailed
)

// The registry's types under the names the rest of the supervisor uses.
type (
	sandboxRecord      = sbx.Record
	resourceProfileRec = sbx.ResourceProfileRec
	// sandbox is a registry entry carrying the workspace's tables.
	sandbox = workspace.Sandbox
	// occupants are a sandbox's live sessions and commands.
	occupants = workspace.Tables
)

// The workspace's types under the names the handlers use.
type (
	session       = workspace.Session
	sessionRecord = workspace.SessionRecord
	command       = workspace.Command
	commandRecord = workspace.CommandRecord
)

func newSandbox(rec sandboxRecord, dir string) *sandbox {
	return sbx.New(rec, dir, workspace.NewTables())
}

func nowRFC3339() string { return sbx.NowRFC3339() }

func (s *Supervisor) sandboxDir(id string) string { return filepath.Join(s.dirs.Data, "sandboxes", id) }

// resolveSandbox is §2.4 step 7. Observability reads also work on failed sandboxes.
func (s *Supervisor) resolveSandbox(id string, readOnly bool) (*sandbox, *catalog.Error) {
	return s.sandboxes.Resolve(id, readOnly)
}

func (s *Supervisor) createSandbox(c *call) (any, error) {
	image := c.args.String("image")
	root, err := s.checkWorkspaceRoot(c.args.String("workspace_root"))
	if err != nil {
		return nil, err
	}
	count := c.args.Uint("count")
	if count > uint64(s.cfg.Manager.MaxCreateCount) {
		return nil, catalog.RangeError("count", 1, uint64(s.cfg.Manager.MaxCreateCount))
	}
	overlay := c.args.String("overlay")
	if overlay == "" {
		overlay = s.cfg.Sandbox.DefaultOverlay
	}
	driver, derr := s.probes.ResolveOverlay(overlay)
	if derr != nil {
		return nil, derr
	}
	live := s.sandboxes.Len()
	if live+int(count) > s.cfg.Manager.MaxSandboxes {
		return nil, catalog.Errorf(catalog.ServerBusy, "sandbox limit reached").With("max_sandboxes", s.cfg.Manager.MaxSandboxes)
	}
	var name *string
	if c.args.Has("name") {
		n := c.args.String("name")
		name = &n
	}

	// The git origin is read before the snapshot: a commit made meanwhile
	// is then newer than the recorded HEAD, never silently included in it.
	snapRoot, origin := root, sbx.ProbeGit(c.ctx, root)
	if !c.args.Has("git_ref") {
		if err := sbx.CheckGitLayout(root); err != nil {
			return nil, err
		}
	}
	if c.args.Has("git_ref") {
		tmp, o, err := sbx.GitRefSnapshot(c.ctx, root, c.args.String("git_ref"), s.dirs.Data)
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		snapRoot, origin = filepath.Join(tmp, "tree"), o
	}

	img, releaseImage, err := s.acquireImage(c, image, int(count))
	if err != nil {
		return nil, err
	}
	rootfs, imageEnv := "host", []string(nil)
	if img != nil {
		rootfs, imageEnv = img.ID, img.Env
	}
	created, err := s.sbm.Create(c.ctx, sbx.CreateSpec{
		Count: int(count), Name: name, WorkspaceRoot: c.args.String("workspace_root"), Root: root, SnapRoot: snapRoot,
		Git: origin, Image: image, Rootfs: rootfs, ImageEnv: imageEnv, OverlayDriver: driver,
		ResourceProfile: resourceProfileRec{Name: s.cfg.Sandbox.ResourceProfile, ResourceLimits: sbx.ResourceLimits(s.cfg.ResourceProfiles[s.cfg.Sandbox.ResourceProfile])},
		MaxEntries:      s.cfg.Manager.MaxWorkspaceEntries,
	}, c.progress)
	if err != nil {
		releaseImage()
		return nil, err
	}
	if count == 1 {
		return created[0].View(), nil
	}
	out := make([]sandboxRecord, len(created))
	for i, sb := range created {
		out[i] = sb.View()
	}
	return map[string]any{"sandboxes": out}, nil
}

// checkWorkspaceRoot applies create_sandbox's workspace_root rules and returns
// the path with symlinks resolved.
func (s *Supervisor) checkWorkspaceRoot(p string) (string, error) {
	return sbx.CheckWorkspaceRoot(p, []string{s.dirs.Data, s.dirs.Config, s.dirs.Runtime}, s.cfg.Manager.WorkspaceRoots)
}

func (s *Supervisor) lookupForManagement(id string) (*sandbox, *catalog.Error) {
	return s.sandboxes.Lookup(id)
}

func (s *Supervisor) listSandboxes(c *call) (any, error) {
	all := s.sandboxes.Sorted()
	out := make([]sandboxRecord, 0, len(all))
	for _, sb := range all {
		out = append(out, sb.View())
	}
	return map[string]any{"sandboxes": out}, nil
}

func (s *Supervisor) inspectSandbox(c *call) (any, error) {
	sb, e := s.lookupForManagement(c.args.String("sandbox_id"))
	if e != nil {
		return nil, e
	}
	return sb.View(), nil
}

func (s *Supervisor) listWorkspaceDirectories(c *call) (any, error) {
	type dirEntry struct {
		Name string `json:"name"`
		Path string `json:"path"`
	}
	roots := s.cfg.Manager.WorkspaceRoots
	if roots == nil {
		home, _ := os.UserHomeDir()
		roots = []string{home}
	}
	if !c.args.Has("path") {
		dirs := make([]dirEntry, 0, len(roots))
		for _, r := range roots {
			dirs = append(dirs, dirEntry{Name: filepath.Base(r), Path: r})
		}
		return map[string]any{"path": nil, "parent": nil, "truncated": false, "directories": dirs}, nil
	}
	p := c.args.String("path")
	bad := func(format string, a ...any) error {
		return catalog.Errorf(catalog.InvalidRequest, format, a...).With("path", p)
	}
	if !filepath.IsAbs(p) {
		return nil, bad("path must be absolute: %s", p)
	}
	p = filepath.Clean(p)
	st, err := os.Stat(p)
	if err != nil {
		return nil, bad("path does not exist: %s", p)
	}
	if !st.IsDir() {
		return nil, bad("path is not a directory: %s", p)
	}
	configured := s.cfg.Manager.WorkspaceRoots != nil
	if configured && !sbx.UnderAny(p, roots) {
		return nil, bad("path is not under a configured workspace root: %s", p)
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return nil, catalog.Errorf(catalog.InvalidRequest, "cannot read %s: %v", p, err).With("path", p)
	}
	dirs := []dirEntry{}
	truncated := false
	for _, e := range ents { // ReadDir sorts by name; DirEntry.Type does not follow symlinks
		if !e.IsDir() {
			continue
		}
		if len(dirs) == 500 {
			truncated = true
			break
		}
		dirs = append(dirs, dirEntry{Name: e.Name(), Path: filepath.Join(p, e.Name())})
	}
	var parent any = filepath.Dir(p)
	if p == "/" || (configured && sbx.IsRoot(p, roots)) {
		parent = nil
	}
	return map[string]any{"path": p, "parent": parent, "truncated": truncated, "directories": dirs}, nil
}

// recover loads every sandbox record at start (§4.5): creating ones are
// rolled back, stopping ones finished, the rest reopened and swept.
func (s *Supervisor) recover(ctx context.Context) error {
	recs, err := s.store.sandboxes(ctx)
	if err != nil {
		return catalog.Errorf(catalog.ConfigError, "%v", err)
	}
	var sum recoverySummary
	defer func() { s.recovered(&sum) }()
	s.sbm.Recover(ctx, recs, sbx.RecoverHooks[*occupants]{
		Leases: func(ctx context.Context, sb *sandbox) [][]layers.LayerRef {
			return workspace.PersistedLeases(ctx, s.store.DB, sb)
		},
		Removed: sum.removeSandbox,
		Swept: func(sb *sandbox, res layers.SweepResult) {
			s.bootSweepEvent(sb, res)
			sum.sweep(res)
		},
		Reopened: func(ctx context.Context, sb *sandbox) { s.reopenSandbox(ctx, sb, &sum) },
	})
	s.images.Prune() // every reference is known now
	return nil
}

// reopenSandbox restores what lives in a recovered sandbox: its image
// reference and environment, and when ready its commands and sessions.
func (s *Supervisor) reopenSandbox(ctx context.Context, sb *sandbox, sum *recoverySummary) {
	if sb.Rec.Rootfs != "host" {
		s.images.Hold(sb.Rec.Rootfs)
		if err := s.loadImageEnv(sb); err != nil {
			s.log.Error("recovery: image of sandbox", "sandbox", sb.Rec.ID, "err", err)
		}
	}
	if sb.Rec.State == stateFailed {
		sum.FailedSandboxes = append(sum.FailedSandboxes, sb.Rec.ID)
	}
	if sb.Rec.State == stateReady {
		sum.InterruptedCommands += s.cmds.Load(ctx, sb)
		sum.RemovedSessionDirs += workspace.RemoveOrphanSessionDirs(ctx, s.store.DB, s.log, sb)
		var rs workspace.RestoreSummary
		s.holders.Restore(ctx, sb, &rs)
		sum.FinalizedSessions = append(sum.FinalizedSessions, rs.Finalized...)
		sum.KeptFailedSessions = append(sum.KeptFailedSessions, rs.KeptFailed...)
		sum.RestoredSessions = append(sum.RestoredSessions, rs.Restored...)
		sum.RestoreFailedSessions = append(sum.RestoreFailedSessions, rs.RestoreFailed...)
		s.notifyAutosquash(sb, "startup")
	}
}

// allSandboxes lists every registered sandbox (admission's view).
func (s *Supervisor) allSandboxes() []*sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := make([]*sandbox, 0, s.sandboxes.Len())
	for _, sb := range s.sandboxes.All() {
		all = append(all, sb)
	}
	return all
}
