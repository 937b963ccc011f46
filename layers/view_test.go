package layers

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// whiteoutMaker writes a whiteout named name in dir in one encoding.
type whiteoutMaker func(t *testing.T, dir, name string)

func charWhiteout(t *testing.T, dir, name string) {
	t.Helper()
	if err := unix.Mknod(filepath.Join(dir, name), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
}

func xattrWhiteout(t *testing.T, dir, name string) {
	t.Helper()
	p := filepath.Join(dir, name)
	writeFile(t, p, "", 0o600)
	if err := unix.Setxattr(p, xattrUserWh, []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
}

func ociWhiteout(t *testing.T, dir, name string) {
	t.Helper()
	writeFile(t, filepath.Join(dir, whPrefix+name), "", 0o600)
}

// buildViewStack lays out four layers by hand (newest first L3, L2, L1, B)
// and returns the stack and its manifest.
func buildViewStack(t *testing.T, wh whiteoutMaker) (*Stack, Manifest) {
	dir := tempDir(t)
	lay := func(id string) string { return filepath.Join(dir, "layers", id) }
	b, l1, l2, l3 := lay(BaseLayerID), lay("L000002-00000001"), lay("L000003-00000002"), lay("L000004-00000003")
	for _, d := range []string{b, l1, l2, l3} {
		mkdir(t, d, 0o755)
	}
	// Base.
	writeFile(t, filepath.Join(b, "a", "x"), "base x", 0o644)
	writeFile(t, filepath.Join(b, "a", "y"), "base y", 0o644)
	writeFile(t, filepath.Join(b, "b", "z"), "base z", 0o644)
	writeFile(t, filepath.Join(b, "c"), "base c", 0o644)
	writeFile(t, filepath.Join(b, "d", "e", "f"), "base f", 0o644)
	writeFile(t, filepath.Join(b, "keep"), "keep", 0o644)
	writeFile(t, filepath.Join(b, "o", "p"), "p", 0o644)
	writeFile(t, filepath.Join(b, "o", "q"), "q", 0o644)
	writeFile(t, filepath.Join(b, "w", "1"), "1", 0o644)
	writeFile(t, filepath.Join(b, "oci", "gone"), "gone", 0o644)
	writeFile(t, filepath.Join(b, "oci", "stay"), "stay", 0o644)
	writeFile(t, filepath.Join(b, ".wh"), "lookalike", 0o644)
	writeFile(t, filepath.Join(b, "x.wh.y"), "lookalike", 0o644)
	symlink(t, "a/x", filepath.Join(b, "s"))
	// L1: overrides, whiteouts, opaque directories.
	writeFile(t, filepath.Join(l1, "a", "x"), "l1 x", 0o755)
	wh(t, filepath.Join(l1, "a"), "y")
	wh(t, l1, "c")
	wh(t, l1, "d")
	writeFile(t, filepath.Join(l1, "b", "new"), "l1 new", 0o644)
	if err := unix.Setxattr(filepath.Join(l1, "b"), xattrUserOpq, []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(l1, "o", "r"), "r", 0o644)
	writeFile(t, filepath.Join(l1, "o", opaqueMarker), "", 0o600) // OCI-only opaque marker
	ociWhiteout(t, filepath.Join(b, "..", "L000002-00000001", "oci"), "gone")
	// L2: a file replaces directory w; a non-opaque a/ with its own mode.
	writeFile(t, filepath.Join(l2, "w"), "w is a file", 0o644)
	writeFile(t, filepath.Join(l2, "a", "new2"), "new2", 0o644)
	mkdir(t, filepath.Join(l2, "a"), 0o700)
	// L3: empty.
	m := Manifest{SchemaVersion: 1, Version: 4, Layers: []LayerRef{
		{"L000004-00000003", "layers/L000004-00000003"},
		{"L000003-00000002", "layers/L000003-00000002"},
		{"L000002-00000001", "layers/L000002-00000001"},
		{BaseLayerID, "layers/" + BaseLayerID},
	}}
	if err := writeManifest(dir, m, nil); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s, mustHead(t, s)
}

func TestMergedView(t *testing.T) {
	encodings := []struct {
		name string
		wh   whiteoutMaker
		need func(dir string) bool
	}{
		{"chardev", charWhiteout, canMknodWhiteout},
		{"xattr", xattrWhiteout, canUserXattr},
		{"oci", ociWhiteout, func(string) bool { return true }},
	}
	for _, enc := range encodings {
		t.Run(enc.name, func(t *testing.T) {
			if !canUserXattr(t.TempDir()) {
				t.Skip("user xattrs unsupported here")
			}
			if !enc.need(t.TempDir()) {
				t.Skip("encoding unsupported here")
			}
			s, m := buildViewStack(t, enc.wh)
			v := s.View(m)
			lstat := []struct {
				path    string
				kind    EntryKind // "" = absent
				mode    fs.FileMode
				content string
				layer   string
			}{
				{"", KindDir, 0o755, "", "L000004-00000003"},
				{"a", KindDir, 0o700, "", "L000003-00000002"},
				{"a/x", KindFile, 0o755, "l1 x", "L000002-00000001"},
				{"a/y", "", 0, "", ""}, // whiteout
				{"a/new2", KindFile, 0o644, "new2", "L000003-00000002"},
				{"c", "", 0, "", ""},     // whiteout
				{"d", "", 0, "", ""},     // whiteout at the path
				{"d/e/f", "", 0, "", ""}, // whiteout at an ancestor
				{"b", KindDir, 0o755, "", "L000002-00000001"},
				{"b/z", "", 0, "", ""}, // opaque (xattr)
				{"b/new", KindFile, 0o644, "l1 new", "L000002-00000001"},
				{"o/p", "", 0, "", ""}, // opaque (OCI marker)
				{"o/r", KindFile, 0o644, "r", "L000002-00000001"},
				{"o/" + opaqueMarker, "", 0, "", ""}, // markers are hidden
				{"oci/gone", "", 0, "", ""},          // OCI whiteout
				{"oci/.wh.gone", "", 0, "", ""},
				{"oci/stay", KindFile, 0o644, "stay", BaseLayerID},
				{"w", KindFile, 0o644, "w is a file", "L000003-00000002"},
				{"w/1", "", 0, "", ""}, // file at an ancestor blocks
				{"keep", KindFile, 0o644, "keep", BaseLayerID},
				{".wh", KindFile, 0o644, "lookalike", BaseLayerID},
				{"x.wh.y", KindFile, 0o644, "lookalike", BaseLayerID},
				{"s", KindSymlink, 0o777, "", BaseLayerID},
				{"nothing/here", "", 0, "", ""},
			}
			// Twice: the second pass answers from the View's memoized
			// directory probes and must agree with the first.
			for pass := 0; pass < 2; pass++ {
				for _, c := range lstat {
					e, err := v.Lstat(c.path)
					if c.kind == "" {
						if !isNotExist(err) {
							t.Errorf("Lstat(%q) = %+v, %v; want not exist", c.path, e, err)
						}
						continue
					}
					if err != nil {
						t.Errorf("Lstat(%q): %v", c.path, err)
						continue
					}
					if e.Kind != c.kind || e.Mode != c.mode || e.LayerID != c.layer || e.Path != c.path {
						t.Errorf("Lstat(%q) = kind %s mode %v layer %s path %q; want %s %v %s", c.path, e.Kind, e.Mode, e.LayerID, e.Path, c.kind, c.mode, c.layer)
					}
					if c.content != "" {
						if got := readString(t, v, c.path); got != c.content {
							t.Errorf("ReadFile(%q) = %q, want %q", c.path, got, c.content)
						}
					}
				}
			}
			if e, _ := v.Lstat("s"); e.Target != "a/x" {
				t.Errorf("symlink target %q", e.Target)
			}
			if _, err := v.ReadFile("s"); !errors.Is(err, ErrNotRegular) {
				t.Errorf("ReadFile(symlink) = %v, want ErrNotRegular", err)
			}
			if _, err := v.ReadFile("a"); !errors.Is(err, ErrNotRegular) {
				t.Errorf("ReadFile(dir) = %v, want ErrNotRegular", err)
			}
			for _, bad := range []string{"/a", "a/", "./a", "a/../b", "a//x", "\x00"} {
				if _, err := v.Lstat(bad); !errors.Is(err, fs.ErrInvalid) {
					t.Errorf("Lstat(%q) = %v, want ErrInvalid", bad, err)
				}
			}
			readDir := []struct {
				path string
				want []string
			}{
				{"", []string{".wh", "a", "b", "keep", "o", "oci", "s", "w", "x.wh.y"}},
				{"a", []string{"new2", "x"}},
				{"b", []string{"new"}},
				{"o", []string{"r"}},
				{"oci", []string{"stay"}},
			}
			for _, c := range readDir {
				es, err := v.ReadDir(c.path)
				if err != nil {
					t.Errorf("ReadDir(%q): %v", c.path, err)
					continue
				}
				if got := entryNames(es); !equalStrings(got, c.want) {
					t.Errorf("ReadDir(%q) = %v, want %v", c.path, got, c.want)
				}
			}
			if _, err := v.ReadDir("a/x"); !errors.Is(err, syscall.ENOTDIR) {
				t.Errorf("ReadDir(file) = %v, want ENOTDIR", err)
			}
			if _, err := v.ReadDir("d/e"); !isNotExist(err) {
				t.Errorf("ReadDir(hidden) = %v, want not exist", err)
			}
			// An older snapshot of the same stack still shows the base.
			old := s.View(Manifest{SchemaVersion: 1, Version: 1, Layers: m.Layers[3:]})
			if got := readString(t, old, "a/y"); got != "base y" {
				t.Errorf("old view a/y = %q", got)
			}
		})
	}
}

func TestViewEmptyAndMissingLayer(t *testing.T) {
	s, err := Open(tempDir(t))
	if err != nil {
		t.Fatal(err)
	}
	v := s.View(mustHead(t, s))
	if _, err := v.Lstat(""); !isNotExist(err) {
		t.Errorf("empty stack root: %v", err)
	}
	gone := s.View(Manifest{SchemaVersion: 1, Version: 1, Layers: []LayerRef{{"L000001-deadbeef", "layers/L000001-deadbeef"}}})
	if _, err := gone.Lstat("x"); !errors.Is(err, ErrLayerMissing) || isNotExist(err) {
		t.Errorf("missing layer directory must be an error, got %v", err)
	}
	if err := os.MkdirAll(filepath.Join(s.Dir(), "layers"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestViewSymlinkParent: a path behind a visible symlink is a
// *SymlinkError naming the shortest such prefix (still "not exist" for
// callers that only ask whether the path is there); a symlink hidden by a
// newer directory or a whiteout decides nothing.
func TestViewSymlinkParent(t *testing.T) {
	dir := tempDir(t)
	b, l1 := filepath.Join(dir, "layers", BaseLayerID), filepath.Join(dir, "layers", "L000002-00000001")
	writeFile(t, filepath.Join(b, "a", "x"), "x", 0o644)
	writeFile(t, filepath.Join(b, "a", "sub", "y"), "y", 0o644)
	symlink(t, "a", filepath.Join(b, "sl"))
	symlink(t, ".", filepath.Join(b, "a", "self"))
	symlink(t, "a", filepath.Join(b, "hid")) // a directory in l1 hides it
	symlink(t, "a", filepath.Join(b, "gone"))
	writeFile(t, filepath.Join(b, "became", "f"), "f", 0o644) // a symlink in l1 replaces it
	writeFile(t, filepath.Join(b, "file"), "file", 0o644)
	writeFile(t, filepath.Join(l1, "hid", "own"), "own", 0o644)
	ociWhiteout(t, l1, "gone")
	symlink(t, "a", filepath.Join(l1, "became"))
	m := Manifest{SchemaVersion: 1, Version: 2, Layers: []LayerRef{
		{"L000002-00000001", "layers/L000002-00000001"},
		{BaseLayerID, "layers/" + BaseLayerID},
	}}
	if err := writeManifest(dir, m, nil); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	v := s.View(mustHead(t, s))
	for _, tc := range []struct {
		path, component string // component "": absent without a symlink to name
	}{
		{"sl/x", "sl"},
		{"sl/absent/deeper", "sl"},
		{"a/self/x", "a/self"},
		{"a/self/sub/y", "a/self"},
		{"became/f", "became"},
		{"hid/x", ""},
		{"gone/x", ""},
		{"file/x", ""},
		{"absent/x", ""},
	} {
		_, err := v.Lstat(tc.path)
		var se *SymlinkError
		isSym := errors.As(err, &se)
		switch {
		case !isNotExist(err):
			t.Errorf("lstat %q: %v, want an error matching fs.ErrNotExist", tc.path, err)
		case tc.component == "" && isSym:
			t.Errorf("lstat %q: %v, want plain not-exist", tc.path, err)
		case tc.component != "" && (!isSym || se.Component != tc.component || se.Path != tc.path):
			t.Errorf("lstat %q: %v, want component %q", tc.path, err, tc.component)
		}
	}
	if _, err := v.ReadDir("sl/sub"); !errors.As(err, new(*SymlinkError)) {
		t.Errorf("readdir sl/sub: %v", err)
	}
	// The last component is the entry itself: reported, not refused.
	if e, err := v.Lstat("sl"); err != nil || e.Kind != KindSymlink {
		t.Errorf("lstat sl = %+v, %v", e, err)
	}
	if got := readString(t, v, "hid/own"); got != "own" {
		t.Errorf("hid/own = %q", got)
	}
}
