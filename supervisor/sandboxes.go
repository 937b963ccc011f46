package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// Sandbox states (§4.1).
const (
	stateCreating = "creating"
	stateReady    = "ready"
	stateStopping = "stopping"
	stateStopped  = "stopped"
	stateFailed   = "failed"
)

// sandboxRecord is the persisted record; its JSON is the contract's shape (§4.1).
type sandboxRecord struct {
	ID                    string             `json:"id"`
	Name                  *string            `json:"name"`
	WorkspaceRoot         string             `json:"workspace_root"`
	Image                 string             `json:"image"`
	Rootfs                string             `json:"rootfs"`
	OverlayDriver         string             `json:"overlay_driver"`
	State                 string             `json:"state"`
	ActivityRevision      int64              `json:"activity_revision"`
	CreatedAt             string             `json:"created_at"`
	LayerCount            int                `json:"layer_count"`
	LiveWorkspaceSessions []string           `json:"live_workspace_sessions"`
	SharedBase            sharedBase         `json:"shared_base"`
	ResourceProfile       resourceProfileRec `json:"resource_profile"`
	RecoveryArtifacts     []recoveryArtifact `json:"recovery_artifacts"`
	// Git is where the snapshot came from when the workspace is a git work
	// tree (A5); absent otherwise.
	Git   *gitOrigin `json:"git,omitempty"`
	Error string     `json:"error,omitempty"`
}

type sharedBase struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	RootHash string `json:"root_hash"`
	Readonly bool   `json:"readonly"`
}

type resourceProfileRec struct {
	Name string `json:"name"`
	ResourceProfile
	Enforced bool `json:"enforced"`
}

// sandbox is a live registry entry. gate is read-held by every request that
// works on the sandbox and write-held by destroy, so teardown never races a
// write; mu guards rec.
type sandbox struct {
	Gate  sync.RWMutex
	Mu    sync.Mutex
	Rec   sandboxRecord
	Dir   string
	Stack *layers.Stack
	// imageEnv is the image config's Env (nil for "host"), loaded at
	// creation and recovery.
	ImageEnv []string

	sessions      map[string]*session // live sessions
	commands      map[string]*command // running and retained terminal commands
	terminalOrder []string            // retained terminal commands, oldest first
	evicted       map[string]bool     // IDs evicted from retention
	// Admission slots reserved by requests still starting their command
	// or session (admission.go).
	pendingCommands, pendingSessions int

	// Background work that writes below dir without holding gate (holder
	// event loops, implicit finalization): removal waits for it (goBackground).
	bgMu          sync.Mutex
	bgClosed      bool
	bg            sync.WaitGroup
	squashing     atomic.Bool  // a squash (manual or automatic) runs
	autoQueued    atomic.Bool  // an autosquash evaluation is queued
	autoCoalesced atomic.Int64 // notifications folded into the queued one
}

func newSandbox(rec sandboxRecord, dir string) *sandbox {
	return &sandbox{Rec: rec, Dir: dir, sessions: map[string]*session{}, commands: map[string]*command{}, evicted: map[string]bool{}}
}

// goBackground runs f on its own goroutine unless the sandbox is being
// removed; stopBackground waits for every f started.
func (sb *sandbox) GoBackground(f func()) bool {
	sb.bgMu.Lock()
	defer sb.bgMu.Unlock()
	if sb.bgClosed {
		return false
	}
	sb.bg.Go(f)
	return true
}

// stopBackground refuses new background work and waits for the running
// work to end, so nothing writes below the sandbox's directory while it is
// removed. The callers have stopped the sessions first (their holders
// closed, which ends the holder event loops).
func (sb *sandbox) StopBackground() {
	sb.bgMu.Lock()
	sb.bgClosed = true
	sb.bgMu.Unlock()
	sb.bg.Wait()
}

func (sb *sandbox) BusyError() *catalog.Error {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	return catalog.Errorf(catalog.OperationConflict, "sandbox %s is %s", sb.Rec.ID, sb.Rec.State).
		With("sandbox_id", sb.Rec.ID).With("state", sb.Rec.State)
}

// view returns a copy of the record with layer_count read from the head.
func (sb *sandbox) View() sandboxRecord {
	sb.Mu.Lock()
	rec := sb.Rec
	sb.Mu.Unlock()
	rec.LiveWorkspaceSessions = append([]string{}, rec.LiveWorkspaceSessions...)
	if sb.Stack != nil {
		if m, err := sb.Stack.Head(); err == nil {
			rec.LayerCount = len(m.Layers)
		}
	}
	return rec
}

func nowRFC3339() string { return time.Now().UTC().Format("2006-01-02T15:04:05.000Z") }

func (s *Supervisor) sandboxDir(id string) string { return filepath.Join(s.dirs.Data, "sandboxes", id) }

func notFoundSandbox(id string) *catalog.Error {
	return catalog.Errorf(catalog.NotFound, "sandbox not found: %s", id).With("sandbox_id", id)
}

// resolveSandbox is §2.4 step 7. Observability reads also work on failed sandboxes.
func (s *Supervisor) resolveSandbox(id string, readOnly bool) (*sandbox, *catalog.Error) {
	if !catalog.ValidID(id) {
		return nil, catalog.Errorf(catalog.InvalidRequest, "sandbox_id must match [A-Za-z0-9._:-]{1,128}")
	}
	s.mu.Lock()
	sb := s.sandboxes[id]
	s.mu.Unlock()
	if sb == nil {
		return nil, notFoundSandbox(id)
	}
	sb.Mu.Lock()
	state := sb.Rec.State
	sb.Mu.Unlock()
	switch state {
	case stateCreating, stateStopping:
		return nil, sb.BusyError()
	case stateFailed:
		if !readOnly {
			return nil, catalog.Errorf(catalog.OperationFailed, "sandbox %s failed: %s", id, sb.Rec.Error).With("sandbox_id", id)
		}
	}
	return sb, nil
}

// bump records a client-visible change (§4.4).
func (s *Supervisor) bump(ctx context.Context, sb *sandbox) {
	sb.Mu.Lock()
	sb.Rec.ActivityRevision++
	rec := sb.Rec
	sb.Mu.Unlock()
	if err := s.store.putSandbox(ctx, &rec); err != nil {
		s.log.Warn("persist activity revision", "sandbox", rec.ID, "err", err)
	}
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
	driver, derr := s.probes.resolveOverlay(overlay)
	if derr != nil {
		return nil, derr
	}
	s.mu.Lock()
	live := len(s.sandboxes)
	s.mu.Unlock()
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
	snapRoot, origin := root, probeGit(c.ctx, root)
	if c.args.Has("git_ref") {
		tmp, o, err := gitRefSnapshot(c.ctx, root, c.args.String("git_ref"), s.dirs.Data)
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
	var created []*sandbox
	rollback := func() {
		for i := len(created) - 1; i >= 0; i-- {
			s.removeSandbox(c.ctx, created[i])
		}
		releaseImage()
	}
	var first *layers.Stack
	for i := uint64(0); i < count; i++ {
		id := s.ids.new("sbx-")
		sb := newSandbox(sandboxRecord{
			ID: id, Name: name, WorkspaceRoot: c.args.String("workspace_root"), Image: image, Rootfs: rootfs,
			OverlayDriver: driver, State: stateCreating, CreatedAt: nowRFC3339(),
			LiveWorkspaceSessions: []string{}, RecoveryArtifacts: []recoveryArtifact{},
			ResourceProfile: resourceProfileRec{Name: s.cfg.Sandbox.ResourceProfile, ResourceProfile: s.cfg.ResourceProfiles[s.cfg.Sandbox.ResourceProfile]},
			Git:             origin,
		}, s.sandboxDir(id))
		sb.ImageEnv = imageEnv
		// The record is persisted as creating first so a crash mid-snapshot is rolled back at start.
		if err := s.store.putSandbox(c.ctx, &sb.Rec); err != nil {
			rollback()
			return nil, err
		}
		s.mu.Lock()
		s.sandboxes[id] = sb
		s.mu.Unlock()
		created = append(created, sb)
		stackDir := filepath.Join(sb.Dir, "layerstack")
		var st *layers.Stack
		var serr error
		if first == nil {
			c.progress(fmt.Sprintf("snapshotting %s into %s", root, id))
			var stats layers.SnapshotStats
			sp, _ := s.spanCtx(c.ctx, nil, "", "workspace.snapshot", map[string]any{"sandbox_id": id, "workspace_root": root})
			st, stats, serr = layers.Create(c.ctx, stackDir, snapRoot, layers.SnapshotOptions{
				MaxEntries: s.cfg.Manager.MaxWorkspaceEntries,
				Progress:   throttledProgress(c.progress),
			})
			sp.done(serr, map[string]any{"files": stats.Files, "dirs": stats.Dirs, "symlinks": stats.Symlinks, "bytes": stats.Bytes})
			if serr == nil {
				c.progress(fmt.Sprintf("snapshot done: %d files, %d directories, %d symlinks, %d bytes", stats.Files, stats.Dirs, stats.Symlinks, stats.Bytes))
			}
			first = st
		} else {
			c.progress(fmt.Sprintf("linking the base of %s", id))
			st, serr = layers.CreateSibling(c.ctx, stackDir, first)
		}
		if serr != nil {
			rollback()
			return nil, fmt.Errorf("snapshot workspace %s: %w", root, serr)
		}
		sb.Stack = st
		m, err := st.Head()
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
		sb.Rec.SharedBase = sharedBase{Source: sb.Rec.WorkspaceRoot, Target: "/workspace", RootHash: strings.TrimSpace(string(base)), Readonly: true}
		sb.Rec.LayerCount = len(m.Layers)
		sb.Rec.State = stateReady
		rec := sb.Rec
		sb.Mu.Unlock()
		if err := s.store.putSandbox(c.ctx, &rec); err != nil {
			rollback()
			return nil, err
		}
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

// checkWorkspaceRoot applies create_sandbox's workspace_root rules and returns
// the path with symlinks resolved.
func (s *Supervisor) checkWorkspaceRoot(p string) (string, error) {
	bad := func(format string, a ...any) error {
		return catalog.Errorf(catalog.InvalidRequest, format, a...).With("workspace_root", p)
	}
	if !filepath.IsAbs(p) {
		return "", bad("workspace_root must be an absolute path: %s", p)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", bad("workspace_root does not exist: %s", p)
	}
	st, err := os.Stat(real)
	if err != nil || !st.IsDir() {
		return "", bad("workspace_root is not a directory: %s", p)
	}
	if real == "/" {
		return "", bad("workspace_root must not be /")
	}
	for _, d := range []string{s.dirs.Data, s.dirs.Config, s.dirs.Runtime} {
		rd, err := filepath.EvalSymlinks(d)
		if err != nil {
			rd = d
		}
		if within(real, rd) || within(rd, real) {
			return "", bad("workspace_root must not be inside, equal to or contain the supervisor's directory %s", d)
		}
	}
	if roots := s.cfg.Manager.WorkspaceRoots; roots != nil && !underAny(real, roots) {
		return "", bad("workspace_root is not under a configured workspace root")
	}
	return real, nil
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

func underAny(p string, roots []string) bool {
	for _, r := range roots {
		rr, err := filepath.EvalSymlinks(r)
		if err != nil {
			rr = filepath.Clean(r)
		}
		if within(p, rr) {
			return true
		}
	}
	return false
}

// removeSandbox deletes everything a sandbox owns: directory, command
// transcripts, records, registry entry.
func (s *Supervisor) removeSandbox(ctx context.Context, sb *sandbox) error {
	s.cgroups.removeSandbox(sb.Rec.ID)
	sb.StopBackground()
	s.obs.seal(sb.Dir)
	removeTree(sb.Dir)
	if _, err := os.Stat(sb.Dir); err == nil {
		return fmt.Errorf("remove %s: still present", sb.Dir)
	}
	sb.Mu.Lock()
	ids := make([]string, 0, len(sb.commands))
	for id := range sb.commands {
		ids = append(ids, id)
	}
	sb.Mu.Unlock()
	for _, id := range ids {
		os.RemoveAll(filepath.Join(s.dirs.Data, "commands", id))
	}
	if err := s.store.deleteSandboxRows(ctx, sb.Rec.ID); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.sandboxes, sb.Rec.ID)
	s.mu.Unlock()
	return nil
}

func (s *Supervisor) lookupForManagement(id string) (*sandbox, *catalog.Error) {
	s.mu.Lock()
	sb := s.sandboxes[id]
	s.mu.Unlock()
	if sb == nil {
		return nil, notFoundSandbox(id)
	}
	return sb, nil
}

func (s *Supervisor) destroySandbox(c *call) (any, error) {
	sb, e := s.lookupForManagement(c.args.String("sandbox_id"))
	if e != nil {
		return nil, e
	}
	sb.Mu.Lock()
	state := sb.Rec.State
	if state == stateCreating || state == stateStopping {
		sb.Mu.Unlock()
		return nil, sb.BusyError()
	}
	sb.Rec.State = stateStopping
	rec := sb.Rec
	sb.Mu.Unlock()
	if err := s.store.putSandbox(c.ctx, &rec); err != nil {
		return nil, err
	}
	c.progress("waiting for in-flight operations of " + rec.ID)
	sb.Gate.Lock() // new requests already see stopping; wait for the running ones
	defer sb.Gate.Unlock()
	s.stopSessions(c.ctx, sb, true, c.progress)
	final := sb.View()
	c.progress("removing " + sb.Dir)
	if err := s.removeSandbox(c.ctx, sb); err != nil {
		sb.Mu.Lock()
		sb.Rec.State, sb.Rec.Error = stateFailed, err.Error()
		rec := sb.Rec
		sb.Mu.Unlock()
		_ = s.store.putSandbox(c.ctx, &rec)
		return nil, catalog.Errorf(catalog.OperationFailed, "destroy sandbox %s: %v", rec.ID, err).With("sandbox_id", rec.ID)
	}
	if rec.Rootfs != "host" {
		s.images.Release(rec.Rootfs) // §4.3: the image rootfs reference is released
	}
	final.State = stateStopped
	final.LiveWorkspaceSessions = []string{}
	final.Error = ""
	return final, nil
}

func (s *Supervisor) listSandboxes(c *call) (any, error) {
	s.mu.Lock()
	all := make([]*sandbox, 0, len(s.sandboxes))
	for _, sb := range s.sandboxes {
		all = append(all, sb)
	}
	s.mu.Unlock()
	out := make([]sandboxRecord, 0, len(all))
	for _, sb := range all {
		out = append(out, sb.View())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
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
	if configured && !underAny(p, roots) {
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
	if p == "/" || (configured && isRoot(p, roots)) {
		parent = nil
	}
	return map[string]any{"path": p, "parent": parent, "truncated": truncated, "directories": dirs}, nil
}

func isRoot(p string, roots []string) bool {
	for _, r := range roots {
		if filepath.Clean(r) == p {
			return true
		}
	}
	return false
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
	for _, rec := range recs {
		sb := newSandbox(*rec, s.sandboxDir(rec.ID))
		sb.Rec.LiveWorkspaceSessions = []string{} // rebuilt from the session records
		switch rec.State {
		case stateCreating, stateStopping, stateStopped:
			s.log.Info("recovery: removing sandbox", "sandbox", rec.ID, "state", rec.State)
			if err := s.removeSandbox(ctx, sb); err != nil {
				s.log.Error("recovery: remove sandbox", "sandbox", rec.ID, "err", err)
			}
			sum.removeSandbox(rec.ID, rec.State)
			continue
		}
		st, err := layers.Open(filepath.Join(sb.Dir, "layerstack"))
		if err == nil {
			if m, herr := st.Head(); herr != nil || len(m.Layers) == 0 {
				err = fmt.Errorf("layerstack manifest of %s is missing or empty", rec.ID)
			}
		}
		if err == nil {
			sb.Stack = st
			var res layers.SweepResult
			res, err = st.Sweep(s.persistedLeases(ctx, sb))
			if err == nil {
				s.bootSweepEvent(sb, res)
				sum.sweep(res)
			}
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			sb.Rec.State, sb.Rec.Error = stateFailed, err.Error()
			_ = s.store.putSandbox(ctx, &sb.Rec)
			s.log.Error("recovery: sandbox failed", "sandbox", rec.ID, "err", err)
		}
		s.sandboxes[rec.ID] = sb
		if sb.Rec.Rootfs != "host" {
			s.images.Hold(sb.Rec.Rootfs)
			if err := s.loadImageEnv(sb); err != nil {
				s.log.Error("recovery: image of sandbox", "sandbox", rec.ID, "err", err)
			}
		}
		if sb.Rec.State == stateFailed {
			sum.FailedSandboxes = append(sum.FailedSandboxes, rec.ID)
		}
		if sb.Rec.State == stateReady {
			sum.InterruptedCommands += s.loadCommands(ctx, sb)
			sum.RemovedSessionDirs += s.removeOrphanSessionDirs(ctx, sb)
			s.restoreSessions(ctx, sb, &sum)
			s.notifyAutosquash(sb, "startup")
		}
	}
	s.images.Prune() // every reference is known now
	return nil
}
