package layers

// Squash (§8.6 steps 1-3): runs of consecutive layers become one S layer
// each. The merged view of every manifest that can still be named — head and
// every live lease — is unchanged, because a block never extends above a
// lease's newest layer (a boundary) and never contains a B* layer.
//
// Decisions where the contract is silent:
//
//   - A boundary (the newest layer of a live lease) may be the newest layer of
//     a block but never lies below another layer of the same block, so every
//     lease's chain contains each block either wholly or not at all and can
//     be rewritten by substitution (Substitute).
//   - The S layer's digest is the layer digest of §8.3 over the folded
//     changeset (every surviving directory as "directory" or "opaque_dir",
//     files as "write" with their content, symlinks, surviving whiteouts as
//     "delete").
//   - Regular files are hard links of the source layer's file (same inode, so
//     mode and mtime are preserved and no data is copied); symlinks are
//     recreated with their mtime.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// SquashedBlock is one run of layers replaced by one S layer.
type SquashedBlock struct {
	SquashedLayerID  string
	ReplacedLayerIDs []string // newest first
	// Leased names the owners of live leases that still pin replaced layers
	// after the squash; empty when they were all reclaimed.
	Leased []string
}

// SquashResult reports a squash.
type SquashResult struct {
	Manifest Manifest // head after the squash (unchanged when no block)
	Blocks   []SquashedBlock
}

// Substitute rewrites a manifest's layer chain by the squash's substitutions:
// each block that the chain contains wholly and contiguously is replaced by
// its S layer. It reports whether anything changed. The version is kept.
func (r SquashResult) Substitute(m Manifest) (Manifest, bool) {
	out := cloneManifest(m)
	changed := false
	for _, b := range r.Blocks {
		n := len(b.ReplacedLayerIDs)
		for i := 0; i+n <= len(out.Layers); i++ {
			if out.Layers[i].LayerID != b.ReplacedLayerIDs[0] {
				continue
			}
			match := true
			for j, id := range b.ReplacedLayerIDs {
				if out.Layers[i+j].LayerID != id {
					match = false
					break
				}
			}
			if !match {
				break
			}
			s := LayerRef{LayerID: b.SquashedLayerID, Path: layersDirName + "/" + b.SquashedLayerID}
			out.Layers = slices.Concat(out.Layers[:i], []LayerRef{s}, out.Layers[i+n:])
			changed = true
			break
		}
	}
	return out, changed
}

// planBlocks splits head's layers (newest first) into blocks of at least two
// consecutive layers without B* layers, cutting above every boundary.
func planBlocks(head Manifest, boundaries map[string]bool) [][]LayerRef {
	var blocks [][]LayerRef
	var run []LayerRef
	flush := func() {
		if len(run) >= 2 {
			blocks = append(blocks, run)
		}
		run = nil
	}
	for _, l := range head.Layers {
		if strings.HasPrefix(l.LayerID, "B") {
			flush()
			continue
		}
		if boundaries[l.LayerID] {
			flush()
		}
		run = append(run, l)
	}
	flush()
	return blocks
}

// Squash folds every block of head into one S layer and commits the new
// manifest (version + 1) atomically. A failure before the manifest rename
// leaves the old manifest valid and removes the S directories; a crash
// leaves them for Sweep.
func (s *Stack) Squash(ctx context.Context) (SquashResult, error) {
	head, err := s.Head()
	if err != nil {
		return SquashResult{}, fmt.Errorf("squash: %w", err)
	}
	// 1. Plan under a plan lease: its layers stay while flattening.
	boundaries := map[string]bool{}
	for _, l := range s.Leases() {
		if m := l.Manifest(); len(m.Layers) > 0 {
			boundaries[m.Layers[0].LayerID] = true
		}
	}
	blocks := planBlocks(head, boundaries)
	if len(blocks) == 0 {
		return SquashResult{Manifest: head}, nil
	}
	plan := s.AcquireAt(head, "squash-plan")
	defer func() {
		if _, err := plan.Release(); err != nil {
			slog.Warn("layerstack: squash plan lease release", "err", err)
		}
	}()
	for _, d := range []string{stagingDirName, layersDirName, metaDirName} {
		if err := os.MkdirAll(filepath.Join(s.dir, d), 0o755); err != nil {
			return SquashResult{}, fmt.Errorf("squash: %w", err)
		}
	}

	// 2. Flatten each block in staging, without the writer lock.
	version := head.Version + 1
	type built struct {
		id, staging string
		digest      string
		bytes       int64
		rootMode    uint32
		block       []LayerRef
	}
	var out []built
	committed := false
	defer func() {
		if committed {
			return
		}
		for _, b := range out {
			_ = forceRemoveAll(b.staging)
			_ = forceRemoveAll(filepath.Join(s.dir, layersDirName, b.id))
			_ = os.Remove(filepath.Join(s.dir, metaDirName, b.id+digestSuffix))
		}
	}()
	for _, blk := range blocks {
		id, err := s.pickLayerID('S', version)
		if err != nil {
			return SquashResult{}, fmt.Errorf("squash: %w", err)
		}
		b := built{id: id, staging: filepath.Join(s.dir, stagingDirName, id+stagingSuffix), block: blk}
		out = append(out, b)
		below := head.Layers[slices.IndexFunc(head.Layers, func(l LayerRef) bool { return l.LayerID == blk[len(blk)-1].LayerID })+1:]
		f := &squasher{s: s, root: b.staging, below: s.View(Manifest{Layers: below})}
		if err := f.fold(ctx, blk); err != nil {
			return SquashResult{}, fmt.Errorf("squash %s: %w", id, err)
		}
		digest, err := ComputeLayerDigest(f.changes)
		if err != nil {
			return SquashResult{}, fmt.Errorf("squash %s: %w", id, err)
		}
		out[len(out)-1].digest = digest
		out[len(out)-1].bytes = f.bytes
		out[len(out)-1].rootMode = f.rootMode
	}

	// 3. Commit under the writer lock.
	unlock, err := s.lockWriter(ctx)
	if err != nil {
		return SquashResult{}, fmt.Errorf("squash: %w", err)
	}
	defer unlock()
	cur, err := s.Head()
	if err != nil {
		return SquashResult{}, fmt.Errorf("squash: %w", err)
	}
	res := SquashResult{}
	for _, b := range out {
		res.Blocks = append(res.Blocks, SquashedBlock{SquashedLayerID: b.id, ReplacedLayerIDs: Manifest{Layers: b.block}.LayerIDs()})
	}
	next, changed := res.Substitute(cur)
	if !changed || len(next.Layers) != len(cur.Layers)-countReplaced(res)+len(res.Blocks) {
		return SquashResult{}, errors.New("squash: the layer stack changed below a planned block; nothing committed")
	}
	for _, b := range out {
		dst := filepath.Join(s.dir, layersDirName, b.id)
		if err := os.Rename(b.staging, dst); err != nil {
			return SquashResult{}, fmt.Errorf("squash %s: %w", b.id, err)
		}
		if err := chmodDir(dst, b.rootMode); err != nil {
			return SquashResult{}, fmt.Errorf("squash %s: %w", b.id, err)
		}
		if err := writeFileAtomic(filepath.Join(s.dir, metaDirName), b.id+digestSuffix, []byte(b.digest), 0o644, nil); err != nil {
			return SquashResult{}, fmt.Errorf("squash %s: %w", b.id, err)
		}
	}
	if err := syncFS(filepath.Join(s.dir, layersDirName)); err != nil {
		return SquashResult{}, fmt.Errorf("squash: %w", err)
	}
	next.Version = cur.Version + 1
	next.SchemaVersion = SchemaVersion
	if err := writeManifest(s.dir, next, nil); err != nil {
		return SquashResult{}, fmt.Errorf("squash: %w", err)
	}
	committed = true
	res.Manifest = next
	for _, b := range out {
		if err := writeFileAtomic(filepath.Join(s.dir, metaDirName), b.id+bytesSuffix, []byte(strconv.FormatInt(b.bytes, 10)), 0o644, nil); err != nil {
			slog.Warn("layerstack: write bytes sidecar", "layer_id", b.id, "err", err)
		}
	}
	return res, nil
}

// LeasedBy fills each block's Leased with the owners of live leases other
// than the squash's own that still pin one of its replaced layers; call it
// after the callers have rewritten (or kept) their leases.
func (s *Stack) LeasedBy(res *SquashResult) {
	for i := range res.Blocks {
		b := &res.Blocks[i]
		b.Leased = nil
		for _, l := range s.Leases() {
			for _, r := range l.Manifest().Layers {
				if slices.Contains(b.ReplacedLayerIDs, r.LayerID) {
					b.Leased = append(b.Leased, l.Owner())
					break
				}
			}
		}
	}
}

func countReplaced(r SquashResult) int {
	n := 0
	for _, b := range r.Blocks {
		n += len(b.ReplacedLayerIDs)
	}
	return n
}

// squasher writes the newest-wins fold of one block into root.
type squasher struct {
	s        *Stack
	root     string
	below    *View // the chain below the block
	changes  []Change
	dirs     []string
	modes    map[string]uint32
	rootMode uint32
	bytes    int64
}

// layerEntry is what one layer holds at one name.
type layerEntry struct {
	host     string
	fi       fs.FileInfo
	whiteout bool
}

// readLayerDir lists one layer's directory: entries by name, OCI whiteout
// markers turned into whiteouts, and whether the directory is opaque.
func readLayerDir(host string) (map[string]layerEntry, bool, error) {
	d, err := os.Open(host)
	if err != nil {
		return nil, false, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, false, err
	}
	out := make(map[string]layerEntry, len(names))
	for _, n := range names {
		if kind, target := ParseName(LayerFormat, n); kind != NamePlain {
			if kind == NameOCIWhiteout {
				out[target] = layerEntry{whiteout: true}
			}
			continue
		}
		p := filepath.Join(host, n)
		fi, err := os.Lstat(p)
		if err != nil {
			return nil, false, err
		}
		out[n] = layerEntry{host: p, fi: fi, whiteout: isWhiteoutFile(p, fi)}
	}
	return out, isOpaqueDir(host), nil
}

func (f *squasher) fold(ctx context.Context, block []LayerRef) error {
	f.modes = map[string]uint32{}
	hosts := make([]string, len(block))
	for i, l := range block {
		hosts[i] = f.s.LayerDir(l)
	}
	fi, err := os.Lstat(hosts[0])
	if err != nil {
		return err
	}
	f.rootMode = uint32(fi.Mode().Perm())
	if fi.Mode()&fs.ModeSticky != 0 {
		f.rootMode |= unix.S_ISVTX
	}
	if err := os.Mkdir(f.root, 0o700); err != nil {
		return err
	}
	if err := f.dir(ctx, "", hosts, true); err != nil {
		return err
	}
	for i := len(f.dirs) - 1; i >= 0; i-- {
		if err := chmodDir(filepath.Join(f.root, f.dirs[i]), f.modes[f.dirs[i]]); err != nil {
			return err
		}
	}
	return syncFS(f.root)
}

// dir folds directory rel, present as a directory in hosts (newest first,
// already cut where the block hides older content). visibleBelow says
// whether the chain below the block can still show content at rel.
func (f *squasher) dir(ctx context.Context, rel string, hosts []string, visibleBelow bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	lists := make([]map[string]layerEntry, len(hosts))
	for i, h := range hosts {
		l, _, err := readLayerDir(h)
		if err != nil {
			return err
		}
		lists[i] = l
	}
	names := map[string]bool{}
	for _, l := range lists {
		for n := range l {
			names[n] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)
	for _, n := range sorted {
		child := joinRel(rel, n)
		first := slices.IndexFunc(lists, func(l map[string]layerEntry) bool { _, ok := l[n]; return ok })
		e := lists[first][n]
		switch {
		case e.whiteout:
			if visibleBelow {
				if _, err := f.below.Lstat(child); err == nil {
					if err := f.emit(Change{Kind: ChangeDelete, Path: child}, nil); err != nil {
						return err
					}
				} else if !errors.Is(err, fs.ErrNotExist) {
					return err
				}
			}
		case e.fi.IsDir():
			sub := []string{e.host}
			cut := isOpaqueDir(e.host)
			for j := first + 1; j < len(lists) && !cut; j++ {
				o, ok := lists[j][n]
				switch {
				case !ok:
				case o.whiteout || !o.fi.IsDir():
					cut = true
				default:
					sub = append(sub, o.host)
					cut = isOpaqueDir(o.host)
				}
			}
			kind := ChangeDirectory
			if cut {
				kind = ChangeOpaqueDir
			}
			if err := f.emit(Change{Kind: kind, Path: child, Mode: dirMode(e.fi.Mode())}, e.fi); err != nil {
				return err
			}
			if err := f.dir(ctx, child, sub, visibleBelow && !cut); err != nil {
				return err
			}
		case e.fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(e.host)
			if err != nil {
				return err
			}
			if err := f.emit(Change{Kind: ChangeSymlink, Path: child, Target: target, MTime: e.fi.ModTime()}, e.fi); err != nil {
				return err
			}
		case e.fi.Mode().IsRegular():
			if err := f.emit(Change{Kind: ChangeWrite, Path: child, Source: e.host, Mode: e.fi.Mode().Perm()}, e.fi); err != nil {
				return err
			}
		default:
			// Layers hold no other kinds (capture refuses them); skip defensively.
			slog.Warn("layerstack: squash skips a special file", "path", child)
		}
	}
	return nil
}

// emit writes one entry into the S layer and keeps it for the digest.
func (f *squasher) emit(c Change, fi fs.FileInfo) error {
	p := filepath.Join(f.root, filepath.FromSlash(c.Path))
	switch c.Kind {
	case ChangeDirectory, ChangeOpaqueDir:
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		f.dirs = append(f.dirs, c.Path)
		f.modes[c.Path] = unixMode(c.Mode)
		if c.Kind == ChangeOpaqueDir {
			if err := makeOpaque(p); err != nil {
				return err
			}
		}
	case ChangeDelete:
		if err := makeWhiteout(filepath.Dir(p), path.Base(c.Path)); err != nil {
			return err
		}
	case ChangeSymlink:
		if err := os.Symlink(c.Target, p); err != nil {
			return err
		}
		ts := unix.NsecToTimespec(c.MTime.UnixNano())
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
	case ChangeWrite:
		if err := os.Link(c.Source, p); err != nil {
			return err
		}
		f.bytes += fi.Size()
	}
	f.changes = append(f.changes, c)
	return nil
}
