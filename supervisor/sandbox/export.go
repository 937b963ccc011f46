package sandbox

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// export_changes (§3.2, §8.9): fold every non-base layer of head under a
// snapshot lease and write the delta to a host directory or archive.
//
// Decisions beyond the contract's text:
//
//   - dest (#27 item 2) must be below the sandbox's workspace root or a
//     directory of manager.export.allowed_roots (CheckExportDest), spelled
//     through the root as configured or with the root's own symlinks
//     resolved; below the root no existing component may be a symlink and
//     no component may be .git. The export opens the root and walks to dest
//     descriptor-relative (layers.OpenDestBeneath), creating a dir dest's
//     missing components (0755) once the caps have passed; an archive's
//     parent must exist. An archive dest that is a symlink is replaced by
//     the rename, never followed. The rule covers archives too: an archive
//     is agent-controlled bytes (file names and contents), as able to
//     become ~/.ssh/authorized_keys or ~/.bashrc as a directory export.
//     Refusals are invalid_request before anything is written; the
//     sandbox is resolved first (not_found wins).
//   - The sandbox must be ready (creating/stopping → operation_conflict,
//     failed → operation_failed); the export read-holds the sandbox gate so
//     destroy waits for it.
//   - Archives are written to ".esbx-export.tmp-<random>" beside dest, fsynced,
//     renamed over dest, and the directory fsynced; the temp file is removed
//     on any failure (an exceeded tar-zst stream cap included).
//   - kept_out (the first 100) and kept_out_count name the git-private and
//     git-protected paths of the folded layers that the export left out
//     (layers' export decisions); both are absent when there are none.
//   - Progress: the fold's size, then the layers package's per-1000-entries
//     or per-second counts, then the final line.

// exportGate serializes the exports of one sandbox. The zero value is ready.
type exportGate struct {
	mu    sync.Mutex
	slots map[string]*exportSlot
}

type exportSlot struct {
	mu   sync.Mutex
	refs int
}

// lock waits until no other export of sandboxID runs and returns the unlock
// function.
func (g *exportGate) lock(sandboxID string) (unlock func()) {
	g.mu.Lock()
	if g.slots == nil {
		g.slots = map[string]*exportSlot{}
	}
	sl := g.slots[sandboxID]
	if sl == nil {
		sl = &exportSlot{}
		g.slots[sandboxID] = sl
	}
	sl.refs++
	g.mu.Unlock()
	sl.mu.Lock()
	return func() {
		sl.mu.Unlock()
		g.mu.Lock()
		sl.refs--
		if sl.refs == 0 {
			delete(g.slots, sandboxID)
		}
		g.mu.Unlock()
	}
}

type exportDirResult struct {
	ManifestVersion       int      `json:"manifest_version"`
	Format                string   `json:"format"`
	LayersExported        []string `json:"layers_exported"`
	FilesWritten          int64    `json:"files_written"`
	DirectoriesWritten    int64    `json:"directories_written"`
	SymlinksWritten       int64    `json:"symlinks_written"`
	DeletesApplied        int64    `json:"deletes_applied"`
	OpaqueClears          int64    `json:"opaque_clears"`
	SkippedUnchanged      int64    `json:"skipped_unchanged"`
	BytesWritten          int64    `json:"bytes_written"`
	LiveWorkspaceSessions []string `json:"live_workspace_sessions,omitempty"`
	// KeptOut are git-private and git-protected paths the export left out
	// (the first 100), KeptOutCount all of them (#27 item 1).
	KeptOut      []string `json:"kept_out,omitempty"`
	KeptOutCount int      `json:"kept_out_count,omitempty"`
}

type exportTarResult struct {
	ManifestVersion       int      `json:"manifest_version"`
	Format                string   `json:"format"`
	LayersExported        []string `json:"layers_exported"`
	FilesWritten          int64    `json:"files_written"`
	DirectoriesWritten    int64    `json:"directories_written"`
	SymlinksWritten       int64    `json:"symlinks_written"`
	WhiteoutsEmitted      int64    `json:"whiteouts_emitted"`
	BytesWritten          int64    `json:"bytes_written"`
	LiveWorkspaceSessions []string `json:"live_workspace_sessions,omitempty"`
	// KeptOut are git-private and git-protected paths the export left out
	// (the first 100), KeptOutCount all of them (#27 item 1).
	KeptOut      []string `json:"kept_out,omitempty"`
	KeptOutCount int      `json:"kept_out_count,omitempty"`
}

// Exporter runs export_changes in the dir and tar formats and serializes
// the exports of each sandbox.
type Exporter[W any] struct {
	Reg     *Registry[W]
	Log     *slog.Logger
	exports exportGate
}

// ExportSpec is one export_changes request in a file format.
type ExportSpec struct {
	SandboxID string
	Format    string // dir, tar, tar-zst
	// Dest is checked by Export (CheckExportDest) against Own and the
	// sandbox's workspace root plus AllowedRoots.
	Dest         string
	Own          []string
	AllowedRoots []string
	RequestID    string
	Caps         layers.ExportCaps
	ZstdLevel    int // runtime.layerstack.spool_zstd_level, for tar-zst
}

// Export writes head's changes (every layer above the base, folded) to
// spec.Dest.
func (x *Exporter[W]) Export(ctx context.Context, spec ExportSpec, progress func(string)) (any, error) {
	id, format, dest := spec.SandboxID, spec.Format, spec.Dest
	sb, done, e := x.Reg.ReadStack(id)
	if e != nil {
		return nil, e
	}
	defer done()
	sb.Mu.Lock()
	live := append([]string{}, sb.Rec.LiveWorkspaceSessions...)
	wsRoot := sb.Rec.WorkspaceRoot
	sb.Mu.Unlock()
	target, err := CheckExportDest(dest, format, spec.Own, append([]string{wsRoot}, spec.AllowedRoots...))
	if err != nil {
		return nil, err
	}
	dest = target.Path

	lease, release, err := x.Lease(sb, id, spec.RequestID)
	if err != nil {
		return nil, err
	}
	defer release()
	m := lease.Manifest()
	progress(fmt.Sprintf("export %s: folding %d layers of manifest version %d", id, max(len(m.Layers)-1, 0), m.Version))
	fold, err := sb.Stack.FoldContext(ctx, m)
	if err != nil {
		return nil, ExportError(err)
	}
	progress(fmt.Sprintf("export: %d entries (%d files, %d directories, %d symlinks, %d deletions, %d opaque directories)",
		fold.Entries(), len(fold.Files), len(fold.Dirs), len(fold.Symlinks), len(fold.Deletions), len(fold.OpaqueClears)))
	caps := spec.Caps
	if len(live) == 0 {
		live = nil
	}

	if format == "dir" {
		if err := fold.CheckDirCaps(caps); err != nil {
			return nil, ExportError(err)
		}
		fd, err := layers.OpenDestBeneath(target.Root, target.Rel, true)
		if err != nil {
			return nil, ExportError(err)
		}
		st, err := fold.ExportDirFD(ctx, fd, dest, caps, progress)
		if err != nil {
			return nil, ExportError(err)
		}
		progress("export: applied to " + dest)
		kept, keptN := keptOut(fold)
		return exportDirResult{
			ManifestVersion: m.Version, Format: format, LayersExported: fold.LayerIDs,
			FilesWritten: st.FilesWritten, DirectoriesWritten: st.DirectoriesWritten, SymlinksWritten: st.SymlinksWritten,
			DeletesApplied: st.DeletesApplied, OpaqueClears: st.OpaqueClears, SkippedUnchanged: st.SkippedUnchanged,
			BytesWritten: st.BytesWritten, LiveWorkspaceSessions: live, KeptOut: kept, KeptOutCount: keptN,
		}, nil
	}

	level := 0
	if format == "tar-zst" {
		level = spec.ZstdLevel
	}
	if err := fold.CheckTarCaps(caps, level != 0); err != nil {
		return nil, ExportError(err)
	}
	st, err := writeArchive(ctx, fold, target, level, caps, progress)
	if err != nil {
		return nil, ExportError(err)
	}
	progress("export: wrote " + dest)
	kept, keptN := keptOut(fold)
	return exportTarResult{
		ManifestVersion: m.Version, Format: format, LayersExported: fold.LayerIDs,
		FilesWritten: st.FilesWritten, DirectoriesWritten: st.DirectoriesWritten, SymlinksWritten: st.SymlinksWritten,
		WhiteoutsEmitted: st.WhiteoutsEmitted, BytesWritten: st.BytesWritten, LiveWorkspaceSessions: live,
		KeptOut: kept, KeptOutCount: keptN,
	}, nil
}

// maxKeptOut bounds the kept_out list of a result; kept_out_count is exact.
const maxKeptOut = 100

// keptOut is the result's view of fold.KeptOut: the first maxKeptOut paths
// and the count, both empty when nothing was kept out.
func keptOut(f *layers.Fold) ([]string, int) {
	k := f.KeptOut
	if len(k) > maxKeptOut {
		k = k[:maxKeptOut]
	}
	return k, len(f.KeptOut)
}

// writeArchive writes the archive to a temp file beside dest and renames it,
// descriptor-relative from dest's parent (opened beneath the allowed root).
func writeArchive(ctx context.Context, fold *layers.Fold, dest ExportDest, level int, caps layers.ExportCaps, progress func(string)) (st layers.TarStats, err error) {
	dirRel, name := path.Split(dest.Rel)
	dfd, err := layers.OpenDestBeneath(dest.Root, strings.TrimSuffix(dirRel, "/"), false)
	if err != nil {
		return st, err
	}
	dirf := os.NewFile(uintptr(dfd), filepath.Dir(dest.Path))
	defer dirf.Close()
	tmp := ".esbx-export.tmp-" + strings.ToLower(rand.Text())
	tfd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return st, &fs.PathError{Op: "create", Path: filepath.Join(filepath.Dir(dest.Path), tmp), Err: err}
	}
	f := os.NewFile(uintptr(tfd), tmp)
	renamed := false
	defer func() {
		if !renamed {
			f.Close()
			_ = unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	st, err = fold.ExportTar(ctx, bw, level, caps, progress)
	if err != nil {
		return st, err
	}
	if err := bw.Flush(); err != nil {
		return st, err
	}
	if err := f.Sync(); err != nil {
		return st, err
	}
	if err := f.Close(); err != nil {
		return st, err
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		return st, &fs.PathError{Op: "rename", Path: dest.Path, Err: err}
	}
	renamed = true
	_ = dirf.Sync()
	return st, nil
}

// Lease serializes exports of one sandbox and pins head's layers for
// the export; release undoes both.
func (x *Exporter[W]) Lease(sb *Sandbox[W], id, requestID string) (*layers.Lease, func(), error) {
	unlock := x.exports.lock(id)
	lease, err := sb.Stack.Acquire("export:" + requestID)
	if err != nil {
		unlock()
		return nil, nil, ExportError(err)
	}
	return lease, func() {
		if _, err := lease.Release(); err != nil {
			x.Log.Warn("export: release lease", "sandbox", id, "err", err)
		}
		unlock()
	}, nil
}

// ExportError maps export failures to the contract's kinds.
func ExportError(err error) error {
	var ce *catalog.Error
	if errors.As(err, &ce) {
		return ce
	}
	var capErr *layers.CapError
	if errors.As(err, &capErr) {
		return catalog.Errorf(catalog.OperationFailed, "export exceeds manager.export.%s: needs %d, limit %d; nothing was written",
			capErr.Cap, capErr.Need, capErr.Limit).With("cap", "manager.export."+capErr.Cap).With("limit", capErr.Limit).With("required", capErr.Need)
	}
	var dse *layers.DestSymlinkError
	if errors.As(err, &dse) {
		return catalog.Errorf(catalog.OperationFailed, "%s", dse.Error()).With("path", dse.Path)
	}
	return catalog.Errorf(catalog.OperationFailed, "export_changes failed: %v", err)
}

// ExportDest is a checked destination: Path is Root/Rel, Root one of the
// allowed roots with its own symlinks resolved, Rel slash-separated below it
// ("" is Root itself) with no symlink in any existing component.
type ExportDest struct {
	Root, Rel, Path string
}

// CheckExportDest applies the dest rules (§8.9 and #27 item 2) and returns
// where to write. own are the supervisor's directories (data, config,
// runtime); roots are the directories below which an export may write: the
// sandbox's workspace root and manager.export.allowed_roots.
//
// The rule is positive: dest must be spelled below one of roots (as
// configured or with the root's own symlinks resolved), no existing
// component below the root may be a symlink, and no component may be a git
// directory (.git, in any case: writing workspace paths below one would
// plant hooks). The export then walks from the root descriptor-relative
// (layers.OpenDestBeneath), so a symlink swapped in after this check is
// refused too.
func CheckExportDest(dest, format string, own, roots []string) (ExportDest, error) {
	bad := func(format string, a ...any) error {
		return catalog.Errorf(catalog.InvalidRequest, format, a...).With("dest", dest)
	}
	if dest == "" || strings.ContainsRune(dest, 0) {
		return ExportDest{}, bad("dest must be a non-empty path without NUL")
	}
	if !filepath.IsAbs(dest) {
		return ExportDest{}, bad("dest must be an absolute path: %s", dest)
	}
	clean := filepath.Clean(dest)
	if clean == "/" {
		return ExportDest{}, bad("dest must not be /")
	}
	for _, c := range strings.Split(clean, "/") {
		if strings.EqualFold(c, ".git") {
			return ExportDest{}, bad("dest must not be a git directory or inside one: %s", dest)
		}
	}
	resolved, err := resolveAncestors(clean)
	if err != nil {
		return ExportDest{}, bad("dest: %v", err)
	}
	if home, err := os.UserHomeDir(); err == nil && home != "" {
		h := filepath.Clean(home)
		rh, rerr := filepath.EvalSymlinks(h)
		if rerr != nil {
			rh = h
		}
		if clean == h || resolved == h || clean == rh || resolved == rh {
			return ExportDest{}, bad("dest must not be $HOME itself")
		}
	}
	for _, d := range own {
		if d == "" {
			continue
		}
		cands := []string{filepath.Clean(d)}
		if rd, err := filepath.EvalSymlinks(d); err == nil {
			cands = append(cands, rd)
		}
		for _, dd := range cands {
			for _, p := range []string{clean, resolved} {
				if Within(p, dd) || Within(dd, p) {
					return ExportDest{}, bad("dest must not be inside, equal to or contain the supervisor's directory %s", d)
				}
			}
		}
	}
	var out ExportDest
	found := false
	for _, r := range roots {
		if r == "" || !filepath.IsAbs(r) {
			continue
		}
		rc := filepath.Clean(r)
		rr, err := filepath.EvalSymlinks(rc)
		if err != nil {
			continue // an absent root allows nothing
		}
		for _, base := range []string{rc, rr} {
			if Within(clean, base) {
				rel, _ := filepath.Rel(base, clean)
				if rel == "." {
					rel = ""
				}
				out, found = ExportDest{Root: rr, Rel: filepath.ToSlash(rel), Path: filepath.Join(rr, rel)}, true
				break
			}
		}
		if found {
			break
		}
	}
	if !found {
		return ExportDest{}, catalog.Errorf(catalog.InvalidRequest,
			"dest must be below the sandbox's workspace root or a directory of manager.export.allowed_roots (%s): %s",
			strings.Join(roots, ", "), dest).With("dest", dest).With("allowed_roots", roots)
	}
	// The existing components below the root: no symlink, directories
	// except the last.
	comps := []string{}
	if out.Rel != "" {
		comps = strings.Split(out.Rel, "/")
	}
	p := out.Root
	var last fs.FileInfo
	var lastErr error = fs.ErrNotExist
	if len(comps) == 0 {
		last, lastErr = os.Lstat(p)
	}
	for i, c := range comps {
		p = filepath.Join(p, c)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			if i < len(comps)-1 && format != "dir" {
				return ExportDest{}, bad("the parent directory of dest does not exist: %s", filepath.Dir(dest))
			}
			break
		}
		if err != nil {
			return ExportDest{}, bad("dest: %v", err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return ExportDest{}, bad("dest: %s is a symlink; an export never follows one", p)
		}
		if i == len(comps)-1 {
			last, lastErr = fi, nil
		} else if !fi.IsDir() {
			return ExportDest{}, bad("dest cannot be created: %s is not a directory", p)
		}
	}
	switch format {
	case "dir":
		if lastErr == nil && !last.IsDir() {
			return ExportDest{}, bad("dest exists and is not a directory: %s", dest)
		}
	default:
		if out.Rel == "" || (lastErr == nil && last.IsDir()) {
			return ExportDest{}, bad("dest is a directory: %s (format %s writes an archive file)", dest, format)
		}
	}
	return out, nil
}

// resolveAncestors resolves the symlinks of p's longest existing proper
// ancestor and appends the rest (the last component is never resolved).
func resolveAncestors(p string) (string, error) {
	dir, rest := filepath.Dir(p), []string{filepath.Base(p)}
	for {
		r, err := filepath.EvalSymlinks(dir)
		if err == nil {
			return filepath.Join(append([]string{r}, rest...)...), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		if dir == "/" {
			return p, nil
		}
		rest = append([]string{filepath.Base(dir)}, rest...)
		dir = filepath.Dir(dir)
	}
}
