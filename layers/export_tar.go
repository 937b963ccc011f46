package layers

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
)

// ExportTar writes a Fold as a tar archive (§8.9); the decisions are listed in export.go.

// TarStats is the outcome of ExportTar.
type TarStats struct {
	FilesWritten       int64
	DirectoriesWritten int64
	SymlinksWritten    int64
	WhiteoutsEmitted   int64
	BytesWritten       int64 // bytes written to w (compressed for zstd)
}

type tarEntry struct {
	key  string
	hdr  tar.Header
	file int // index into Fold.Files, -1 otherwise
}

var epoch = time.Unix(0, 0)

func secs(t time.Time) time.Time {
	if t.IsZero() {
		return epoch
	}
	return time.Unix(t.Unix(), 0)
}

// tarEntries returns the archive entries in order.
func (f *Fold) tarEntries() []tarEntry {
	out := make([]tarEntry, 0, f.Entries())
	base := tar.Header{Uid: 0, Gid: 0, Uname: "", Gname: ""}
	for _, x := range f.Dirs {
		h := base
		h.Typeflag, h.Name, h.Mode, h.ModTime = tar.TypeDir, x.Path+"/", int64(unixPerm(x.Mode)), secs(x.MTime)
		out = append(out, tarEntry{key: x.Path, hdr: h, file: -1})
		if x.Opaque {
			h := base
			h.Typeflag, h.Name, h.Mode, h.ModTime = tar.TypeReg, x.Path+"/"+opaqueMarker, 0o644, secs(x.MTime)
			out = append(out, tarEntry{key: x.Path + "/", hdr: h, file: -1})
		}
	}
	for i, x := range f.Files {
		h := base
		h.Typeflag, h.Name, h.Mode, h.ModTime, h.Size = tar.TypeReg, x.Path, int64(x.Mode.Perm()), secs(x.MTime), x.Size
		out = append(out, tarEntry{key: x.Path, hdr: h, file: i})
	}
	for _, x := range f.Symlinks {
		h := base
		h.Typeflag, h.Name, h.Linkname, h.Mode, h.ModTime = tar.TypeSymlink, x.Path, x.Target, 0o777, secs(x.MTime)
		out = append(out, tarEntry{key: x.Path, hdr: h, file: -1})
	}
	for _, p := range f.Deletions {
		name := joinRel(parentOf(p), whPrefix+path.Base(p))
		h := base
		h.Typeflag, h.Name, h.Mode, h.ModTime = tar.TypeReg, name, 0o644, epoch
		out = append(out, tarEntry{key: name, hdr: h, file: -1})
	}
	slices.SortFunc(out, func(a, b tarEntry) int { return strings.Compare(a.key, b.key) })
	return out
}

type countWriter struct {
	w     io.Writer
	n     int64
	limit int64 // 0 = none
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.limit > 0 && c.n+int64(len(p)) > c.limit {
		return 0, &CapError{Cap: "max_stream_bytes", Limit: c.limit, Need: c.n + int64(len(p))}
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// tarSize is the exact size of the plain tar archive of entries.
func tarSize(entries []tarEntry) (int64, error) {
	var total int64
	for i := range entries {
		c := &countWriter{w: io.Discard}
		tw := tar.NewWriter(c)
		h := entries[i].hdr
		if err := tw.WriteHeader(&h); err != nil {
			return 0, fmt.Errorf("tar header %s: %w", h.Name, err)
		}
		total += c.n + (h.Size+511)/512*512
	}
	return total + 1024, nil
}

// CheckTarCaps fails with a *CapError when an archive of f exceeds caps
// (compressed: the stream cap is checked while writing).
func (f *Fold) CheckTarCaps(caps ExportCaps, compressed bool) error {
	_, err := f.checkTarCaps(f.tarEntries(), caps, compressed)
	return err
}

func (f *Fold) checkTarCaps(entries []tarEntry, caps ExportCaps, compressed bool) (int64, error) {
	if n := int64(len(entries)); caps.MaxApplyEntries > 0 && n > caps.MaxApplyEntries {
		return 0, &CapError{Cap: "max_apply_entries", Limit: caps.MaxApplyEntries, Need: n}
	}
	size, err := tarSize(entries)
	if err != nil {
		return 0, err
	}
	if caps.MaxDecompressedBytes > 0 && size > caps.MaxDecompressedBytes {
		return 0, &CapError{Cap: "max_decompressed_bytes", Limit: caps.MaxDecompressedBytes, Need: size}
	}
	if !compressed && caps.MaxStreamBytes > 0 && size > caps.MaxStreamBytes {
		return 0, &CapError{Cap: "max_stream_bytes", Limit: caps.MaxStreamBytes, Need: size}
	}
	return size, nil
}

// ExportTar writes the fold to w as a deterministic tar archive, compressed
// with zstd at zstdLevel (1..22) unless zstdLevel is 0. The caps are checked
// before anything is written, except max_stream_bytes of a compressed
// archive, which fails the write once exceeded.
func (f *Fold) ExportTar(ctx context.Context, w io.Writer, zstdLevel int, caps ExportCaps, progress func(string)) (TarStats, error) {
	var st TarStats
	entries := f.tarEntries()
	if _, err := f.checkTarCaps(entries, caps, zstdLevel != 0); err != nil {
		return st, err
	}
	roots, err := f.openRoots()
	if err != nil {
		return st, err
	}
	defer closeFDs(roots)
	cw := &countWriter{w: w, limit: caps.MaxStreamBytes}
	var out io.Writer = cw
	var zw *zstd.Encoder
	if zstdLevel != 0 {
		zw, err = zstd.NewWriter(cw, zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(zstdLevel)), zstd.WithEncoderConcurrency(1))
		if err != nil {
			return st, fmt.Errorf("zstd: %w", err)
		}
		defer func() {
			if zw != nil {
				_ = zw.Close()
			}
		}()
		out = zw
	}
	tw := tar.NewWriter(out)
	pr := newExportProgress(progress, "export", int64(len(entries)))
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			return st, fmt.Errorf("tar %s: %w", h.Name, err)
		}
		switch {
		case e.file >= 0:
			x := f.Files[e.file]
			src, err := f.openSource(roots, x)
			if err != nil {
				return st, err
			}
			n, err := io.Copy(tw, io.LimitReader(src, x.Size))
			src.Close()
			if err != nil {
				return st, fmt.Errorf("tar %s: %w", h.Name, err)
			}
			if n != x.Size {
				return st, fmt.Errorf("%s in layer %s changed during the export", x.Path, x.LayerID)
			}
			st.FilesWritten++
		case h.Typeflag == tar.TypeDir:
			st.DirectoriesWritten++
		case h.Typeflag == tar.TypeSymlink:
			st.SymlinksWritten++
		default:
			st.WhiteoutsEmitted++
		}
		pr.step()
	}
	if err := tw.Close(); err != nil {
		return st, fmt.Errorf("tar: %w", err)
	}
	if zw != nil {
		err := zw.Close()
		zw = nil
		if err != nil {
			return st, fmt.Errorf("zstd: %w", err)
		}
	}
	st.BytesWritten = cw.n
	if pr.done > 0 {
		pr.fn(fmt.Sprintf("export: %d/%d entries archived", pr.done, pr.total))
	}
	return st, nil
}
