package layers

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"unicode/utf16"
)

// On-disk names below the layerstack directory (contract §8.1).
const (
	// SchemaVersion is the only manifest schema this package reads and writes.
	SchemaVersion = 1
	// BaseLayerID is the fixed ID of the base layer.
	BaseLayerID = "B000001-base"
	// FailpointEnv enables the fail-next-publish test failpoint when set to "1".
	FailpointEnv = "SANDBOX_LAYERSTACK_ENABLE_TEST_FAILPOINTS"
	// FailNextPublishMarker is the marker file name inside .layer-metadata/.
	FailNextPublishMarker = "fail-next-publish"

	manifestName   = "manifest.json"
	workspaceName  = "workspace.json"
	layersDirName  = "layers"
	stagingDirName = "staging"
	metaDirName    = ".layer-metadata"
	lockName       = ".storage-writer.lock"
	stagingSuffix  = ".staging"
	digestSuffix   = ".digest"
	bytesSuffix    = ".bytes"
	tmpInfix       = ".tmp-"
)

// LayerRef names one layer of a manifest; Path is relative to the layerstack
// directory ("layers/<layer_id>").
type LayerRef struct {
	LayerID string `json:"layer_id"`
	Path    string `json:"path"`
}

// Manifest is the content of manifest.json. Layers are newest first; the last
// one is normally B000001-base.
type Manifest struct {
	SchemaVersion int        `json:"schema_version"`
	Version       int        `json:"version"`
	Layers        []LayerRef `json:"layers"`
}

// Revision identifies a manifest: (manifest_version, root_hash, layer_count).
type Revision struct {
	ManifestVersion int    `json:"manifest_version"`
	RootHash        string `json:"root_hash"`
	LayerCount      int    `json:"layer_count"`
}

// RootHash is the manifest root hash of §8.3 (it covers the ordered layer list
// only, not the version).
func (m Manifest) RootHash() string { return ManifestRootHash(m.Layers) }

// Revision returns the revision triple of m.
func (m Manifest) Revision() Revision {
	return Revision{ManifestVersion: m.Version, RootHash: m.RootHash(), LayerCount: len(m.Layers)}
}

// LayerIDs returns the layer IDs of m, newest first.
func (m Manifest) LayerIDs() []string {
	ids := make([]string, len(m.Layers))
	for i, l := range m.Layers {
		ids[i] = l.LayerID
	}
	return ids
}

// ManifestRootHash hashes the compact, ASCII-only JSON text
// {"layers":[{"layer_id":"…","path":"…"},…]} with SHA-256 (§8.3).
func ManifestRootHash(layers []LayerRef) string {
	var b strings.Builder
	b.WriteString(`{"layers":[`)
	for i, l := range layers {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"layer_id":`)
		writeASCIIJSONString(&b, l.LayerID)
		b.WriteString(`,"path":`)
		writeASCIIJSONString(&b, l.Path)
		b.WriteByte('}')
	}
	b.WriteString(`]}`)
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:])
}

// writeASCIIJSONString writes s as a JSON string the way Python's
// json.dumps(ensure_ascii=True) does: short escapes for " \ \b \f \n \r \t,
// \u00xx for other control characters (DEL included), \uxxxx (lowercase) for
// every non-ASCII character and surrogate pairs beyond the BMP. '/', '<', '>'
// and '&' are kept. Invalid UTF-8 is encoded as U+FFFD.
func writeASCIIJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			switch {
			case r < 0x20 || r == 0x7f:
				fmt.Fprintf(b, `\u%04x`, r)
			case r < 0x80:
				b.WriteRune(r)
			case r <= 0xffff:
				fmt.Fprintf(b, `\u%04x`, r)
			default:
				r1, r2 := utf16.EncodeRune(r)
				fmt.Fprintf(b, `\u%04x\u%04x`, r1, r2)
			}
		}
	}
	b.WriteByte('"')
}

// ParseManifest decodes and validates manifest.json content: schema_version
// must be 1 (a higher one is refused), version ≥ 0, every layer has a plain ID
// and a relative path without "..", and no ID appears twice.
func ParseManifest(data []byte) (Manifest, error) {
	var raw struct {
		SchemaVersion *int       `json:"schema_version"`
		Version       *int       `json:"version"`
		Layers        []LayerRef `json:"layers"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Manifest{}, fmt.Errorf("parse manifest: %w", err)
	}
	if raw.SchemaVersion == nil {
		return Manifest{}, errors.New("parse manifest: schema_version missing")
	}
	if *raw.SchemaVersion > SchemaVersion {
		return Manifest{}, fmt.Errorf("parse manifest: schema_version %d is newer than supported version %d", *raw.SchemaVersion, SchemaVersion)
	}
	if *raw.SchemaVersion != SchemaVersion {
		return Manifest{}, fmt.Errorf("parse manifest: unsupported schema_version %d", *raw.SchemaVersion)
	}
	if raw.Version == nil {
		return Manifest{}, errors.New("parse manifest: version missing")
	}
	if *raw.Version < 0 {
		return Manifest{}, fmt.Errorf("parse manifest: negative version %d", *raw.Version)
	}
	m := Manifest{SchemaVersion: SchemaVersion, Version: *raw.Version, Layers: raw.Layers}
	if m.Layers == nil {
		m.Layers = []LayerRef{}
	}
	if err := validateLayerRefs(m.Layers); err != nil {
		return Manifest{}, fmt.Errorf("parse manifest: %w", err)
	}
	return m, nil
}

func validateLayerRefs(refs []LayerRef) error {
	seen := make(map[string]bool, len(refs))
	for i, l := range refs {
		if err := validLayerID(l.LayerID); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		if seen[l.LayerID] {
			return fmt.Errorf("layer %d: duplicate layer_id %q", i, l.LayerID)
		}
		seen[l.LayerID] = true
		if l.Path == "" || path.IsAbs(l.Path) || path.Clean(l.Path) != l.Path || l.Path == "." ||
			strings.HasPrefix(l.Path, "../") || l.Path == ".." || strings.ContainsRune(l.Path, 0) {
			return fmt.Errorf("layer %d (%s): invalid path %q", i, l.LayerID, l.Path)
		}
	}
	return nil
}

func validLayerID(id string) error {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\x00") {
		return fmt.Errorf("invalid layer_id %q", id)
	}
	return nil
}

// EncodeManifest returns the manifest.json text of m (compact, no HTML
// escaping, trailing newline).
func EncodeManifest(m Manifest) ([]byte, error) {
	if m.Layers == nil {
		m.Layers = []LayerRef{}
	}
	if m.SchemaVersion == 0 {
		m.SchemaVersion = SchemaVersion
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	return buf.Bytes(), nil
}

// readManifest reads dir/manifest.json. A missing file is version 0 without
// layers (exists=false).
func readManifest(dir string) (m Manifest, exists bool, err error) {
	data, err := os.ReadFile(filepath.Join(dir, manifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{SchemaVersion: SchemaVersion, Layers: []LayerRef{}}, false, nil
	}
	if err != nil {
		return Manifest{}, false, fmt.Errorf("read manifest: %w", err)
	}
	m, err = ParseManifest(data)
	if err != nil {
		return Manifest{}, true, fmt.Errorf("%s: %w", filepath.Join(dir, manifestName), err)
	}
	return m, true, nil
}

// writeManifest replaces dir/manifest.json atomically (temp file, fsync,
// rename, fsync dir). beforeRename, when set, runs between the temp file's
// fsync and the rename.
func writeManifest(dir string, m Manifest, beforeRename func() error) error {
	if err := validateLayerRefs(m.Layers); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	data, err := EncodeManifest(m)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(dir, manifestName, data, 0o644, beforeRename); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

// WorkspaceInfo is the content of workspace.json.
type WorkspaceInfo struct {
	WorkspaceRoot  string `json:"workspace_root"`
	LayerStackRoot string `json:"layer_stack_root"`
	BaseRootHash   string `json:"base_root_hash"`
}

func writeWorkspaceInfo(dir string, w WorkspaceInfo) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(w); err != nil {
		return fmt.Errorf("encode workspace.json: %w", err)
	}
	if err := writeFileAtomic(dir, workspaceName, buf.Bytes(), 0o644, nil); err != nil {
		return fmt.Errorf("write workspace.json: %w", err)
	}
	return nil
}
