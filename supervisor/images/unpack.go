package images

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.podman.io/storage/pkg/archive"
)

// unsafeEntryError is a layer entry that would escape the root.
type unsafeEntryError struct{ name, why string }

func (e *unsafeEntryError) Error() string { return fmt.Sprintf("entry %q %s", e.name, e.why) }

// layerStats counts what the filter did to one layer.
type layerStats struct {
	entries, skippedDevices int
}

// escapes reports whether a tar name or hardlink target is absolute or
// climbs with "..": such an entry is rejected, never silently clamped.
func escapes(name string) bool {
	if strings.HasPrefix(name, "/") {
		return true
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return true
		}
	}
	return false
}

// filterLayer copies the tar stream in to w entry by entry, making it safe
// and ownerless for UnpackLayer (see the package doc).
func filterLayer(ctx context.Context, in io.Reader, w io.Writer, st *layerStats) error {
	tr := tar.NewReader(in)
	tw := tar.NewWriter(w)
	uid, gid := os.Getuid(), os.Getgid()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return tw.Close()
		}
		if err != nil {
			return fmt.Errorf("corrupt layer: %w", err)
		}
		st.entries++
		if escapes(h.Name) {
			return &unsafeEntryError{h.Name, "is absolute or contains .."}
		}
		switch h.Typeflag {
		case tar.TypeChar, tar.TypeBlock:
			st.skippedDevices++
			continue
		case tar.TypeLink:
			if escapes(h.Linkname) {
				return &unsafeEntryError{h.Name, fmt.Sprintf("is a hardlink to %q outside the root", h.Linkname)}
			}
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeFifo:
		default:
			return &unsafeEntryError{h.Name, fmt.Sprintf("has unsupported type %q", h.Typeflag)}
		}
		h.Uid, h.Gid, h.Uname, h.Gname = uid, gid, "", ""
		h.Mode &^= 0o6000 // setuid, setgid
		if h.Typeflag == tar.TypeDir {
			h.Mode |= 0o700
		}
		//lint:ignore SA1019 tar.Reader still fills the deprecated field and tar.Writer still writes it
		h.Xattrs = nil
		for k := range h.PAXRecords {
			if strings.HasPrefix(k, "SCHILY.xattr.") || strings.HasPrefix(k, "LIBARCHIVE.xattr.") {
				delete(h.PAXRecords, k)
			}
		}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return fmt.Errorf("corrupt layer: %s: %w", h.Name, err)
		}
	}
}

// applyLayer decompresses (gzip, zstd, xz, bzip2 or none) and applies one
// layer to dest.
func applyLayer(ctx context.Context, dest string, layer io.Reader) (layerStats, error) {
	var st layerStats
	dec, err := archive.DecompressStream(layer)
	if err != nil {
		return st, fmt.Errorf("corrupt layer: %w", err)
	}
	defer dec.Close()
	pr, pw := io.Pipe()
	ferr := make(chan error, 1)
	go func() {
		err := filterLayer(ctx, dec, pw, &st)
		pw.CloseWithError(err)
		ferr <- err
	}()
	// UnpackLayer (unlike ApplyLayer) leaves the process umask alone.
	_, uerr := archive.UnpackLayer(dest, pr, &archive.TarOptions{IgnoreChownErrors: true, InUserNS: true})
	pr.CloseWithError(errors.New("unpack stopped"))
	if err := <-ferr; err != nil {
		return st, err
	}
	if uerr != nil {
		return st, fmt.Errorf("apply layer: %w", uerr)
	}
	return st, nil
}
