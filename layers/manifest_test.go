package layers

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestManifestRoundTrip(t *testing.T) {
	tests := []Manifest{
		{SchemaVersion: 1, Version: 0, Layers: []LayerRef{}},
		{SchemaVersion: 1, Version: 1, Layers: []LayerRef{{LayerID: BaseLayerID, Path: "layers/" + BaseLayerID}}},
		{SchemaVersion: 1, Version: 42, Layers: []LayerRef{
			{LayerID: "L000042-0123abcd", Path: "layers/L000042-0123abcd"},
			{LayerID: "S000040-deadbeef", Path: "layers/S000040-deadbeef"},
			{LayerID: BaseLayerID, Path: "layers/" + BaseLayerID},
		}},
	}
	for _, m := range tests {
		dir := tempDir(t)
		if err := writeManifest(dir, m, nil); err != nil {
			t.Fatal(err)
		}
		raw, _ := os.ReadFile(filepath.Join(dir, manifestName))
		if !strings.HasPrefix(string(raw), `{"schema_version":1,"version":`) {
			t.Errorf("manifest text %s", raw)
		}
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		got := mustHead(t, s)
		if !reflect.DeepEqual(got, m) {
			t.Errorf("round trip: got %+v, want %+v", got, m)
		}
		if r := got.Revision(); r.ManifestVersion != m.Version || r.LayerCount != len(m.Layers) || r.RootHash != ManifestRootHash(m.Layers) {
			t.Errorf("revision %+v", r)
		}
	}
}

func TestManifestParse(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		wantErr string
	}{
		{"ok", `{"schema_version":1,"version":3,"layers":[{"layer_id":"B000001-base","path":"layers/B000001-base"}],"extra":true}`, ""},
		{"null_layers", `{"schema_version":1,"version":0,"layers":null}`, ""},
		{"schema_2_refused", `{"schema_version":2,"version":3,"layers":[]}`, "newer than supported"},
		{"schema_0", `{"schema_version":0,"version":3,"layers":[]}`, "unsupported schema_version"},
		{"schema_missing", `{"version":3,"layers":[]}`, "schema_version missing"},
		{"version_missing", `{"schema_version":1,"layers":[]}`, "version missing"},
		{"negative_version", `{"schema_version":1,"version":-1,"layers":[]}`, "negative"},
		{"garbage", `{"schema_version":`, "parse manifest"},
		{"dotdot", `{"schema_version":1,"version":1,"layers":[{"layer_id":"x","path":"../x"}]}`, "invalid path"},
		{"absolute", `{"schema_version":1,"version":1,"layers":[{"layer_id":"x","path":"/x"}]}`, "invalid path"},
		{"bad_id", `{"schema_version":1,"version":1,"layers":[{"layer_id":"a/b","path":"layers/a"}]}`, "invalid layer_id"},
		{"duplicate", `{"schema_version":1,"version":1,"layers":[{"layer_id":"x","path":"layers/x"},{"layer_id":"x","path":"layers/x"}]}`, "duplicate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseManifest([]byte(tc.text))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			// Open refuses a stack whose manifest does not parse.
			dir := tempDir(t)
			os.WriteFile(filepath.Join(dir, manifestName), []byte(tc.text), 0o644)
			if _, err := Open(dir); err == nil {
				t.Error("Open accepted the manifest")
			}
		})
	}
}

func TestOpenMissingManifest(t *testing.T) {
	dir := tempDir(t)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := mustHead(t, s)
	if m.Version != 0 || len(m.Layers) != 0 || m.Layers == nil {
		t.Errorf("missing manifest = %+v, want version 0 without layers", m)
	}
	if m.RootHash() != "c824a9aa7d2e3471306648c6d4baa1abbcb97ff0276181ab4722ca27127cdba0" {
		t.Errorf("empty root hash %s", m.RootHash())
	}
	if _, err := Open(filepath.Join(dir, "nope")); err == nil {
		t.Error("Open of a missing directory succeeded")
	}
	if s.Dir() != dir {
		t.Errorf("Dir() = %s", s.Dir())
	}
}
