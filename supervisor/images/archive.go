package images

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strings"
)

// archiveImage is the one image of a docker-archive or oci-archive tar
// (`docker save` writes either, depending on the Engine's image store).
type archiveImage struct {
	id     string // sha256:<hex> of the config blob
	config imageConfig
	layers []string // entry names in the tar, bottom first
	tar    *tarIndex
}

// imageConfig is the part of the image config JSON the sandbox uses.
type imageConfig struct {
	Config struct {
		Env        []string `json:"Env"`
		WorkingDir string   `json:"WorkingDir"`
	} `json:"config"`
}

// tarIndex gives random access to the entries of an uncompressed tar file.
type tarIndex struct {
	f       *os.File
	entries map[string]tarEntry
}

type tarEntry struct {
	off, size int64
	typ       byte
	link      string
}

const maxMetaBytes = 16 << 20 // manifest.json, index.json, config and manifest blobs

func entryName(n string) string { return path.Clean(strings.TrimPrefix(n, "./")) }

// indexTar reads every header of f and records where each entry's data is.
func indexTar(f *os.File) (*tarIndex, error) {
	ix := &tarIndex{f: f, entries: map[string]tarEntry{}}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("not a readable tar archive: %w", err)
		}
		// tar.Reader reads exactly the header blocks and seeks over data,
		// so the file offset now is the start of this entry's data.
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, err
		}
		ix.entries[entryName(h.Name)] = tarEntry{off: off, size: h.Size, typ: h.Typeflag, link: h.Linkname}
	}
	if len(ix.entries) == 0 {
		return nil, errors.New("not a readable tar archive: no entries")
	}
	return ix, nil
}

// open returns the data of a regular entry, following symlink entries
// (older `docker save` links identical layers to each other).
func (ix *tarIndex) open(name string) (*io.SectionReader, error) {
	name = entryName(name)
	for range 8 {
		e, ok := ix.entries[name]
		if !ok {
			return nil, fmt.Errorf("archive has no entry %q", name)
		}
		switch e.typ {
		case tar.TypeReg:
			return io.NewSectionReader(ix.f, e.off, e.size), nil
		case tar.TypeSymlink:
			if path.IsAbs(e.link) {
				return nil, fmt.Errorf("archive entry %q links outside the archive", name)
			}
			name = entryName(path.Join(path.Dir(name), e.link))
		case tar.TypeLink:
			name = entryName(e.link)
		default:
			return nil, fmt.Errorf("archive entry %q is not a file", name)
		}
	}
	return nil, fmt.Errorf("archive entry %q: too many links", name)
}

func (ix *tarIndex) readAll(name string) ([]byte, error) {
	r, err := ix.open(name)
	if err != nil {
		return nil, err
	}
	if r.Size() > maxMetaBytes {
		return nil, fmt.Errorf("archive entry %q is too large (%d bytes)", name, r.Size())
	}
	return io.ReadAll(r)
}

// openArchive reads the image of a docker-archive (manifest.json) or, for
// oci-archive or when manifest.json is absent, an OCI layout (index.json).
// All errors are about the archive's shape; the caller decides their kind.
func openArchive(p, kind string) (*archiveImage, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	ix, err := indexTar(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	var img *archiveImage
	if _, ok := ix.entries["manifest.json"]; ok && kind != srcOCIArchive {
		img, err = dockerManifest(ix)
	} else {
		img, err = ociIndex(ix)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	img.tar = ix
	return img, nil
}

func (a *archiveImage) close() { a.tar.f.Close() }

func dockerManifest(ix *tarIndex) (*archiveImage, error) {
	b, err := ix.readAll("manifest.json")
	if err != nil {
		return nil, err
	}
	var m []struct {
		Config string   `json:"Config"`
		Layers []string `json:"Layers"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest.json: %w", err)
	}
	if len(m) != 1 {
		return nil, fmt.Errorf("archive holds %d images, want exactly one", len(m))
	}
	cfg, err := ix.readAll(m[0].Config)
	if err != nil {
		return nil, err
	}
	return withConfig(cfg, m[0].Layers)
}

type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Platform  *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

func blobName(digest string) (string, error) {
	alg, hexd, ok := strings.Cut(digest, ":")
	if !ok || alg == "" || hexd == "" || strings.ContainsAny(digest, "/\\") {
		return "", fmt.Errorf("malformed digest %q", digest)
	}
	return "blobs/" + alg + "/" + hexd, nil
}

func (ix *tarIndex) blob(digest string) ([]byte, error) {
	n, err := blobName(digest)
	if err != nil {
		return nil, err
	}
	return ix.readAll(n)
}

// ociIndex walks index.json (and nested indexes) to the image manifests
// for this platform; exactly one must remain.
func ociIndex(ix *tarIndex) (*archiveImage, error) {
	b, err := ix.readAll("index.json")
	if err != nil {
		return nil, fmt.Errorf("neither manifest.json nor index.json: %w", err)
	}
	var found []ociDescriptor
	var walk func(b []byte, depth int) error
	walk = func(b []byte, depth int) error {
		var idx struct {
			Manifests []ociDescriptor `json:"manifests"`
		}
		if err := json.Unmarshal(b, &idx); err != nil {
			return fmt.Errorf("image index: %w", err)
		}
		for _, d := range idx.Manifests {
			if d.Platform != nil && (d.Platform.OS != "linux" || d.Platform.Architecture != runtime.GOARCH) {
				continue
			}
			switch d.MediaType {
			case "application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json":
				if depth > 4 {
					return errors.New("image indexes nested too deeply")
				}
				nb, err := ix.blob(d.Digest)
				if err != nil {
					return err
				}
				if err := walk(nb, depth+1); err != nil {
					return err
				}
			default:
				found = append(found, d)
			}
		}
		return nil
	}
	if err := walk(b, 0); err != nil {
		return nil, err
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("archive holds %d images for linux/%s, want exactly one", len(found), runtime.GOARCH)
	}
	mb, err := ix.blob(found[0].Digest)
	if err != nil {
		return nil, err
	}
	var man struct {
		Config ociDescriptor   `json:"config"`
		Layers []ociDescriptor `json:"layers"`
	}
	if err := json.Unmarshal(mb, &man); err != nil {
		return nil, fmt.Errorf("image manifest: %w", err)
	}
	cfg, err := ix.blob(man.Config.Digest)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(cfg); man.Config.Digest != "sha256:"+hex.EncodeToString(sum[:]) {
		return nil, fmt.Errorf("config blob does not match its digest %s", man.Config.Digest)
	}
	layers := make([]string, len(man.Layers))
	for i, l := range man.Layers {
		if layers[i], err = blobName(l.Digest); err != nil {
			return nil, err
		}
	}
	return withConfig(cfg, layers)
}

func withConfig(cfg []byte, layers []string) (*archiveImage, error) {
	var c imageConfig
	if err := json.Unmarshal(cfg, &c); err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	sum := sha256.Sum256(cfg)
	return &archiveImage{id: "sha256:" + hex.EncodeToString(sum[:]), config: c, layers: layers}, nil
}
