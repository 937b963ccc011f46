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
//   - dest is checked lexically and with the symlinks of its existing
//     ancestors resolved; the export writes to the resolved path. A dir dest
//     that is itself a symlink is refused (it is neither a directory nor
//     absent); an absent dir dest is created with its missing parents (0755)
//     once the caps have passed, and its nearest existing ancestor must be a
//     directory. An archive dest that is a symlink is replaced by the
//     rename, never followed.
//   - The sandbox must be ready (creating/stopping → operation_conflict,
//     failed → operation_failed); the export read-holds the sandbox gate so
//     destroy waits for it.
//   - Archives are written to ".esbx-export.tmp-<random>" beside dest, fsynced,
//     renamed over dest, and the directory fsynced; the temp file is removed
//     on any failure (an exceeded tar-zst stream cap included).
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
	// Dest was checked by CheckExportDest.
	Dest      string
	RequestID string
	Caps      layers.ExportCaps
	ZstdLevel int // runtime.layerstack.spool_zstd_level, for tar-zst
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
	sb.Mu.Unlock()

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
		if err := os.MkdirAll(dest, 0o755); err != nil {
			return nil, ExportError(err)
		}
		st, err := fold.ExportDir(ctx, dest, caps, progress)
		if err != nil {
			return nil, ExportError(err)
		}
		progress("export: applied to " + dest)
		return exportDirResult{
			ManifestVersion: m.Version, Format: format, LayersExported: fold.LayerIDs,
			FilesWritten: st.FilesWritten, DirectoriesWritten: st.DirectoriesWritten, SymlinksWritten: st.SymlinksWritten,
			DeletesApplied: st.DeletesApplied, OpaqueClears: st.OpaqueClears, SkippedUnchanged: st.SkippedUnchanged,
			BytesWritten: st.BytesWritten, LiveWorkspaceSessions: live,
		}, nil
	}

	level := 0
	if format == "tar-zst" {
		level = spec.ZstdLevel
	}
	if err := fold.CheckTarCaps(caps, level != 0); err != nil {
		return nil, ExportError(err)
	}
	st, err := writeArchive(ctx, fold, dest, level, caps, progress)
	if err != nil {
		return nil, ExportError(err)
	}
	progress("export: wrote " + dest)
	return exportTarResult{
		ManifestVersion: m.Version, Format: format, LayersExported: fold.LayerIDs,
		FilesWritten: st.FilesWritten, DirectoriesWritten: st.DirectoriesWritten, SymlinksWritten: st.SymlinksWritten,
		WhiteoutsEmitted: st.WhiteoutsEmitted, BytesWritten: st.BytesWritten, LiveWorkspaceSessions: live,
	}, nil
}

// writeArchive writes the archive to a temp file beside dest and renames it.
func writeArchive(ctx context.Context, fold *layers.Fold, dest string, level int, caps layers.ExportCaps, progress func(string)) (st layers.TarStats, err error) {
	dir := filepath.Dir(dest)
	tmp := filepath.Join(dir, ".esbx-export.tmp-"+strings.ToLower(rand.Text()))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return st, err
	}
	renamed := false
	defer func() {
		if !renamed {
			f.Close()
			os.Remove(tmp)
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
	if err := os.Rename(tmp, dest); err != nil {
		return st, err
	}
	renamed = true
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
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

// CheckExportDest applies §8.9's dest rules and returns the path to write
// (the existing ancestors' symlinks resolved).
// own are the supervisor's directories (data, config, runtime).
func CheckExportDest(dest, format string, own []string) (string, error) {
	bad := func(format string, a ...any) error {
		return catalog.Errorf(catalog.InvalidRequest, format, a...).With("dest", dest)
	}
	if dest == "" || strings.ContainsRune(dest, 0) {
		return "", bad("dest must be a non-empty path without NUL")
	}
	if !filepath.IsAbs(dest) {
		return "", bad("dest must be an absolute path: %s", dest)
	}
	clean := filepath.Clean(dest)
	if clean == "/" {
		return "", bad("dest must not be /")
	}
	resolved, err := resolveAncestors(clean)
	if err != nil {
		return "", bad("dest: %v", err)
	}
	if resolved == "/" {
		return "", bad("dest must not be /")
	}
	if home, err := os.UserHomeDir(); err == nil && home != "" {
		h := filepath.Clean(home)
		rh, rerr := filepath.EvalSymlinks(h)
		if rerr != nil {
			rh = h
		}
		if clean == h || resolved == h || clean == rh || resolved == rh {
			return "", bad("dest must not be $HOME itself")
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
					return "", bad("dest must not be inside, equal to or contain the supervisor's directory %s", d)
				}
			}
		}
	}
	fi, lerr := os.Lstat(resolved)
	switch format {
	case "dir":
		switch {
		case lerr == nil && fi.Mode()&fs.ModeSymlink != 0:
			return "", bad("dest is a symlink: %s", dest)
		case lerr == nil && !fi.IsDir():
			return "", bad("dest exists and is not a directory: %s", dest)
		case lerr != nil && !errors.Is(lerr, fs.ErrNotExist):
			return "", bad("dest: %v", lerr)
		case lerr != nil:
			anc := filepath.Dir(resolved)
			for {
				ai, err := os.Lstat(anc)
				if err == nil {
					if !ai.IsDir() {
						return "", bad("dest cannot be created: %s is not a directory", anc)
					}
					break
				}
				if !errors.Is(err, fs.ErrNotExist) {
					return "", bad("dest: %v", err)
				}
				anc = filepath.Dir(anc)
			}
		}
	default:
		if st, err := os.Stat(resolved); err == nil && st.IsDir() {
			return "", bad("dest is a directory: %s (format %s writes an archive file)", dest, format)
		}
		if lerr != nil && !errors.Is(lerr, fs.ErrNotExist) {
			return "", bad("dest: %v", lerr)
		}
		if pi, err := os.Stat(filepath.Dir(resolved)); err != nil || !pi.IsDir() {
			return "", bad("the parent directory of dest does not exist: %s", filepath.Dir(dest))
		}
	}
	return resolved, nil
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
