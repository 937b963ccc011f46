package layers

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type casCase struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"`
	Input struct {
		Layers  []LayerRef `json:"layers"`
		Changes []struct {
			Kind       string  `json:"kind"`
			Path       string  `json:"path"`
			SourcePath string  `json:"source_path"`
			Content    *string `json:"write_content_b64"`
		} `json:"changes"`
	} `json:"input"`
	Literal  string `json:"json_dumps_literal"`
	Expected string `json:"expected"`
}

func TestConformanceVectors(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "cas-cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []casCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) != 18 {
		t.Fatalf("got %d vectors, want 18", len(cases))
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			switch c.Kind {
			case "manifest_root_hash":
				m := Manifest{SchemaVersion: 1, Version: 7, Layers: c.Input.Layers}
				if got := m.RootHash(); got != c.Expected {
					t.Errorf("root hash = %s, want %s", got, c.Expected)
				}
				var b strings.Builder
				b.WriteString(`{"layers":[`)
				for i, l := range c.Input.Layers {
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
				if b.String() != c.Literal {
					t.Errorf("json text = %s, want %s", b.String(), c.Literal)
				}
			case "layer_digest":
				var changes []Change
				for _, in := range c.Input.Changes {
					ch := Change{Kind: ChangeKind(in.Kind), Path: in.Path}
					switch ch.Kind {
					case ChangeSymlink:
						ch.Target = in.SourcePath
					case ChangeWrite:
						b, err := base64.StdEncoding.DecodeString(*in.Content)
						if err != nil {
							t.Fatal(err)
						}
						ch.Data = b
					}
					changes = append(changes, ch)
				}
				if got := LayerDigest(changes); got != c.Expected {
					t.Errorf("layer digest = %s, want %s", got, c.Expected)
				}
			default:
				t.Fatalf("unknown vector kind %q", c.Kind)
			}
		})
	}
}

func TestASCIIJSONEscaping(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain/path-1_2.x", `"plain/path-1_2.x"`},
		{`q"b\`, `"q\"b\\"`},
		{"\b\f\n\r\t", `"\b\f\n\r\t"`},
		{"\x00\x01\x1f\x7f", `"\u0000\u0001\u001f\u007f"`},
		{"<a>&b", `"<a>&b"`},
		{"é", `"\u00e9"`},
		{"\u2028", `"\u2028"`},
		{"🚀", `"\ud83d\ude80"`},
		{"\xff", `"\ufffd"`},
	}
	for _, tc := range tests {
		var b strings.Builder
		writeASCIIJSONString(&b, tc.in)
		if b.String() != tc.want {
			t.Errorf("escape(%q) = %s, want %s", tc.in, b.String(), tc.want)
		}
	}
}

func TestBaseRootHashExamples(t *testing.T) {
	tests := []struct {
		name  string
		build func(t *testing.T, root string)
		want  string
	}{
		{"empty", func(*testing.T, string) {}, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"contract_example", func(t *testing.T, root string) {
			writeFile(t, filepath.Join(root, "src", "a.txt"), "hello\n", 0o644)
			symlink(t, "src/a.txt", filepath.Join(root, "link"))
		}, "0ea54f5cab6f2b77de300577cc34791f16fa6ac2130653998a1a411f98e0aed5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := tempDir(t)
			tc.build(t, root)
			got, err := BaseRootHash(root)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("BaseRootHash = %s, want %s", got, tc.want)
			}
			// The snapshot computes the same hash while copying.
			s, stats, err := Create(t.Context(), filepath.Join(tempDir(t), "ls"), root, SnapshotOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if stats.BaseRootHash != tc.want {
				t.Errorf("snapshot hash = %s, want %s", stats.BaseRootHash, tc.want)
			}
			if d, err := s.StoredDigest(BaseLayerID); err != nil || d != tc.want {
				t.Errorf("stored base digest = %q, %v", d, err)
			}
		})
	}
}

func TestBaseRootHashRefusesSpecialFiles(t *testing.T) {
	root := tempDir(t)
	if err := mkfifo(filepath.Join(root, "fifo")); err != nil {
		t.Skip(err)
	}
	if _, err := BaseRootHash(root); err == nil {
		t.Fatal("BaseRootHash accepted a FIFO")
	}
}

func TestLayerDigestSourceMatchesData(t *testing.T) {
	src := filepath.Join(tempDir(t), "src")
	writeFile(t, src, "anchor content \x00\xff bytes", 0o644)
	withData := LayerDigest([]Change{{Kind: ChangeWrite, Path: "anchor.txt", Data: []byte("anchor content \x00\xff bytes")}, {Kind: ChangeDelete, Path: "removed.txt"}})
	withSource := LayerDigest([]Change{{Kind: ChangeWrite, Path: "anchor.txt", Source: src}, {Kind: ChangeDelete, Path: "removed.txt"}})
	const want = "1d84a47b1812ed06e09840099db88ae72b8077a89d719e1c02922f8396cac340"
	if withData != want || withSource != want {
		t.Errorf("digests %s / %s, want %s", withData, withSource, want)
	}
	if got := LayerDigest([]Change{{Kind: ChangeWrite, Path: "x", Source: filepath.Join(tempDir(t), "missing")}}); got != "" {
		t.Errorf("missing source: digest %q, want empty", got)
	}
	if _, err := ComputeLayerDigest([]Change{{Kind: "rename", Path: "x"}}); err == nil {
		t.Error("unknown kind accepted")
	}
}
