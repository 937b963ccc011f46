package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/internal/beneath"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// copyTree copies src to dst preserving modes, mtimes and symlinks.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v %s", err, out)
	}
}

func mustFold(t *testing.T, s *Stack, m Manifest) *Fold {
	t.Helper()
	f, err := s.Fold(m)
	if err != nil {
		t.Fatalf("Fold: %v", err)
	}
	return f
}

func foldLines(f *Fold) []string {
	var out []string
	for _, d := range f.Dirs {
		out = append(out, fmt.Sprintf("dir %s %s opaque=%v", d.Path, describeMode(d.Mode), d.Opaque))
	}
	for _, x := range f.Files {
		b, _ := os.ReadFile(x.Source)
		out = append(out, fmt.Sprintf("file %s %s %q %s", x.Path, describeMode(x.Mode), b, x.LayerID))
	}
	for _, x := range f.Symlinks {
		out = append(out, fmt.Sprintf("symlink %s %s", x.Path, x.Target))
	}
	for _, p := range f.Deletions {
		out = append(out, "delete "+p)
	}
	for _, p := range f.OpaqueClears {
		out = append(out, "opaque "+p)
	}
	return out
}

func wsOf(s *Stack) string { return filepath.Join(filepath.Dir(filepath.Dir(s.Dir())), "ws") }

// TestFoldSemantics: newest wins, whiteouts, opaque cuts, directory modes,
// through Publish (so through the package's own writer).
func TestFoldSemantics(t *testing.T) {
	s := newTestStack(t)
	l2 := publish(t, s,
		write("a.txt", "v1", 0o644),
		Change{Kind: ChangeDelete, Path: "docs/a.md"},
		write("keep/k.txt", "k", 0o644),
		Change{Kind: ChangeDirectory, Path: "priv", Mode: 0o700},
		write("d/old.txt", "old", 0o644),
		Change{Kind: ChangeSymlink, Path: "ln", Target: "a.txt"},
	)
	l3 := publish(t, s,
		write("a.txt", "v2", 0o600),
		Change{Kind: ChangeOpaqueDir, Path: "d", Mode: 0o755},
		write("d/new.txt", "new", 0o644),
		Change{Kind: ChangeDelete, Path: "keep/k.txt"},
		Change{Kind: ChangeDirectory, Path: "priv", Mode: 0o750},
	)
	f := mustFold(t, s, mustHead(t, s))
	if !slices.Equal(f.LayerIDs, []string{l3.LayerID, l2.LayerID}) || f.Manifest.Version != 3 {
		t.Fatalf("layers %v version %d", f.LayerIDs, f.Manifest.Version)
	}
	want := []string{
		"dir d -rwxr-xr-x opaque=true",
		"dir docs -rwxr-xr-x opaque=false",
		"dir keep -rwxr-xr-x opaque=false",
		"dir priv -rwxr-x--- opaque=false",
		`file a.txt -rw------- "v2" ` + l3.LayerID,
		`file d/new.txt -rw-r--r-- "new" ` + l3.LayerID,
		"symlink ln a.txt",
		"delete docs/a.md",
		"delete keep/k.txt",
		"opaque d",
	}
	checkLines(t, "fold", foldLines(f), want)
	if f.Entries() != 10 || f.FileBytes() != 5 || f.Empty() {
		t.Errorf("entries %d bytes %d", f.Entries(), f.FileBytes())
	}

	// The previous snapshot folds to the older layer alone.
	old := mustFold(t, s, Manifest{SchemaVersion: 1, Version: 2, Layers: mustHead(t, s).Layers[1:]})
	if !slices.Equal(old.LayerIDs, []string{l2.LayerID}) || len(old.Files) != 3 || len(old.OpaqueClears) != 0 {
		t.Errorf("old fold: %v", foldLines(old))
	}

	// A manifest without a base layer is refused; so is an empty one.
	for _, m := range []Manifest{{SchemaVersion: 1, Version: 3, Layers: mustHead(t, s).Layers[:2]}, {SchemaVersion: 1}} {
		if _, err := s.Fold(m); err == nil || !strings.Contains(err.Error(), "no base layer") {
			t.Errorf("Fold without base: %v", err)
		}
	}

	// An empty delta: no layer above the base.
	e := newTestStack(t)
	ef := mustFold(t, e, mustHead(t, e))
	if !ef.Empty() || ef.LayerIDs == nil || len(ef.LayerIDs) != 0 {
		t.Fatalf("empty fold: %+v", ef)
	}
	dest := tempDir(t)
	before := hostTree(t, dest)
	if st, err := ef.ExportDir(context.Background(), dest, ExportCaps{}, nil); err != nil || st != (DirStats{}) {
		t.Fatalf("empty ExportDir: %+v %v", st, err)
	}
	diffTrees(t, hostTree(t, dest), before)
	var buf bytes.Buffer
	if st, err := ef.ExportTar(context.Background(), &buf, 0, ExportCaps{}, nil); err != nil || st != (TarStats{BytesWritten: 1024}) {
		t.Fatalf("empty ExportTar: %+v %v", st, err)
	}
	if !bytes.Equal(buf.Bytes(), make([]byte, 1024)) {
		t.Errorf("empty archive is not two zero blocks")
	}
}

// TestFoldMatchesMergedView exports the hand-made stack of the view tests
// (every whiteout encoding, opaque by xattr and by marker, a file replacing a
// directory, modes) onto a copy of its base: the result must be the merged
// view, file mtimes included.
func TestFoldMatchesMergedView(t *testing.T) {
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
			if !canUserXattr(t.TempDir()) || !enc.need(t.TempDir()) {
				t.Skip("encoding unsupported here")
			}
			s, m := buildViewStack(t, enc.wh)
			f := mustFold(t, s, m)
			checkLines(t, "fold", foldLines(f), []string{
				"dir a -rwx------ opaque=false",
				"dir b -rwxr-xr-x opaque=true",
				"dir o -rwxr-xr-x opaque=true",
				"dir oci -rwxr-xr-x opaque=false",
				`file a/new2 -rw-r--r-- "new2" L000003-00000002`,
				`file a/x -rwxr-xr-x "l1 x" L000002-00000001`,
				`file b/new -rw-r--r-- "l1 new" L000002-00000001`,
				`file o/r -rw-r--r-- "r" L000002-00000001`,
				`file w -rw-r--r-- "w is a file" L000003-00000002`,
				"delete a/y", "delete c", "delete d", "delete oci/gone",
				"opaque b", "opaque o",
			})
			dest := filepath.Join(tempDir(t), "dest")
			copyTree(t, s.LayerDir(m.Layers[len(m.Layers)-1]), dest)
			writeFile(t, filepath.Join(dest, "b", "host-added"), "inside an opaque dir: cleared", 0o644)
			writeFile(t, filepath.Join(dest, "untouched"), "never mentioned", 0o644)
			before := hostTree(t, dest)
			st, err := f.ExportDir(context.Background(), dest, ExportCaps{}, nil)
			if err != nil {
				t.Fatalf("ExportDir: %v", err)
			}
			want := keptDirModes(viewTree(t, s.View(m)), before)
			want["untouched"] = hostTree(t, dest)["untouched"]
			if !strings.HasPrefix(want["untouched"], `file -rw-r--r-- "never mentioned"`) {
				t.Errorf("untouched: %q", want["untouched"])
			}
			diffTrees(t, hostTree(t, dest), want)
			if st != (DirStats{FilesWritten: 5, DirectoriesWritten: 4, DeletesApplied: 4, OpaqueClears: 2, BytesWritten: 4 + 4 + 6 + 1 + 11}) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestExportDir: three passes on a copy of the workspace, unmentioned paths
// untouched, kinds replaced, a re-export skips unchanged files.
func TestExportDir(t *testing.T) {
	s := newTestStack(t)
	publish(t, s,
		write("src/main.go", "package main // v2\n", 0o755),
		write("new/deep/file.txt", "deep", 0o640),
		Change{Kind: ChangeDelete, Path: "docs/a.md"},
		Change{Kind: ChangeSymlink, Path: "link", Target: "src/main.go"},
		Change{Kind: ChangeDirectory, Path: "ro", Mode: 0o555},
		write("ro/inside", "in a read-only dir", 0o444),
	)
	publish(t, s,
		Change{Kind: ChangeOpaqueDir, Path: "docs", Mode: 0o711},
		write("docs/only.md", "only", 0o644),
		Change{Kind: ChangeDelete, Path: "src/lib"}, // a directory
	)
	publish(t, s,
		write("src/lib", "a file replaces the directory", 0o644),
		Change{Kind: ChangeDirectory, Path: "README.md.d", Mode: 0o755},
		Change{Kind: ChangeSymlink, Path: "new/deep/ln", Target: "../../README.md"},
		Change{Kind: ChangeDelete, Path: "README.md"},
	)
	head := mustHead(t, s)
	f := mustFold(t, s, head)
	dest := filepath.Join(tempDir(t), "copy")
	copyTree(t, wsOf(s), dest)
	writeFile(t, filepath.Join(dest, "host-only.txt"), "host", 0o600)
	writeFile(t, filepath.Join(dest, "src", "host-extra.go"), "extra", 0o644)
	writeFile(t, filepath.Join(dest, "docs", "host-doc.md"), "cleared by the opaque docs", 0o644)
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(dest, "src", "host-extra.go"), old, old); err != nil {
		t.Fatal(err)
	}
	untouched := hostTree(t, dest)

	var msgs []string
	st, err := f.ExportDir(context.Background(), dest, ExportCaps{MaxApplyEntries: f.Entries(), MaxDecompressedBytes: f.FileBytes()},
		func(m string) { msgs = append(msgs, m) })
	if err != nil {
		t.Fatalf("ExportDir: %v", err)
	}
	got := hostTree(t, dest)
	want := keptDirModes(viewTree(t, s.View(head)), untouched)
	if want["docs"] != "dir -rwxr-xr-x" {
		t.Errorf("the existing docs directory took the layer's mode: %q", want["docs"])
	}
	for _, p := range []string{"host-only.txt", "src/host-extra.go"} {
		if got[p] != untouched[p] {
			t.Errorf("unmentioned %s changed: %q → %q", p, untouched[p], got[p])
		}
		want[p] = untouched[p]
	}
	diffTrees(t, got, want)
	if _, err := os.Lstat(filepath.Join(dest, "docs", "host-doc.md")); !isNotExist(err) {
		t.Errorf("opaque clear kept host-doc.md: %v", err)
	}
	wantSt := DirStats{FilesWritten: 5, DirectoriesWritten: 6, SymlinksWritten: 2, DeletesApplied: 1, OpaqueClears: 1,
		BytesWritten: int64(len("package main // v2\n") + 4 + len("in a read-only dir") + 4 + len("a file replaces the directory"))}
	if st != wantSt {
		t.Errorf("stats %+v, want %+v", st, wantSt)
	}
	if len(msgs) == 0 || !strings.Contains(msgs[len(msgs)-1], "entries applied") {
		t.Errorf("progress %q", msgs)
	}
	if names, _ := os.ReadDir(filepath.Join(dest, "src")); len(names) != 3 {
		t.Errorf("src has %d entries (temp files left?)", len(names))
	}

	// Again: every file is unchanged.
	st, err = f.ExportDir(context.Background(), dest, ExportCaps{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.FilesWritten != 0 {
		t.Logf("rewritten: %v", hostTree(t, dest))
	}
	if st.FilesWritten != 0 || st.SkippedUnchanged != 5 || st.DeletesApplied != 0 || st.BytesWritten != 0 {
		t.Errorf("second export %+v", st)
	}
	diffTrees(t, hostTree(t, dest), want)

	// A mode-only or content-only difference is rewritten.
	if err := os.Chmod(filepath.Join(dest, "src", "main.go"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dest, "docs", "only.md"), []byte("ONLY"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err = f.ExportDir(context.Background(), dest, ExportCaps{}, nil)
	if err != nil || st.FilesWritten != 2 || st.SkippedUnchanged != 3 {
		t.Errorf("third export %+v %v", st, err)
	}
	diffTrees(t, hostTree(t, dest), want)

	// Into an empty directory: exactly the fold.
	empty := tempDir(t)
	if _, err := f.ExportDir(context.Background(), empty, ExportCaps{}, nil); err != nil {
		t.Fatal(err)
	}
	for p := range hostTree(t, empty) {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected %s in the empty dest", p)
		}
	}
	if _, err := os.Lstat(filepath.Join(empty, "docs", "a.md")); !isNotExist(err) {
		t.Errorf("deletion created something: %v", err)
	}
}

// keptDirModes: a directory that existed in dest before an export keeps
// its mode there (#27 item 2); want is the view, before the dest's tree.
func keptDirModes(want, before map[string]string) map[string]string {
	for p, v := range before {
		if strings.HasPrefix(v, "dir ") && strings.HasPrefix(want[p], "dir ") {
			want[p] = v
		}
	}
	return want
}

// TestExportDirSymlinks: a symlink where a directory is needed is refused
// before anything is written; a symlink at an opaque directory is replaced,
// never followed; dest itself must not be a symlink.
func TestExportDirSymlinks(t *testing.T) {
	s := newTestStack(t)
	publish(t, s,
		write("src/new.go", "new", 0o644),
		Change{Kind: ChangeDelete, Path: "docs/b.md"},
		write("zzz.txt", "written last", 0o644),
	)
	f := mustFold(t, s, mustHead(t, s))
	root := tempDir(t)
	outside := filepath.Join(root, "outside")
	writeFile(t, filepath.Join(outside, "victim"), "victim", 0o644)
	dest := filepath.Join(root, "dest")
	copyTree(t, wsOf(s), dest)
	if err := os.RemoveAll(filepath.Join(dest, "src")); err != nil {
		t.Fatal(err)
	}
	symlink(t, outside, filepath.Join(dest, "src"))
	before, outBefore := hostTree(t, dest), hostTree(t, outside)
	_, err := f.ExportDir(context.Background(), dest, ExportCaps{}, nil)
	var dse *DestSymlinkError
	if !errors.Is(err, ErrDestSymlink) || !errors.As(err, &dse) || err.Error() != "refusing to traverse a symlink in dest: "+filepath.Join(dest, "src") {
		t.Fatalf("ExportDir through a symlink: %v", err)
	}
	diffTrees(t, hostTree(t, dest), before)
	diffTrees(t, hostTree(t, outside), outBefore)

	// dest itself a symlink.
	ln := filepath.Join(root, "dest-link")
	symlink(t, dest, ln)
	if _, err := f.ExportDir(context.Background(), ln, ExportCaps{}, nil); !errors.Is(err, ErrDestSymlink) {
		t.Fatalf("dest symlink: %v", err)
	}

	// A symlink at an opaque directory: the sandbox replaced that entry.
	s2 := newTestStack(t)
	publish(t, s2, Change{Kind: ChangeOpaqueDir, Path: "docs", Mode: 0o755}, write("docs/fresh.md", "fresh", 0o644))
	f2 := mustFold(t, s2, mustHead(t, s2))
	dest2 := filepath.Join(root, "dest2")
	copyTree(t, wsOf(s2), dest2)
	if err := os.RemoveAll(filepath.Join(dest2, "docs")); err != nil {
		t.Fatal(err)
	}
	symlink(t, outside, filepath.Join(dest2, "docs"))
	if _, err := f2.ExportDir(context.Background(), dest2, ExportCaps{}, nil); err != nil {
		t.Fatalf("opaque over a symlink: %v", err)
	}
	if fi, err := os.Lstat(filepath.Join(dest2, "docs")); err != nil || !fi.IsDir() {
		t.Fatalf("docs: %v %v", fi, err)
	}
	if got := hostTree(t, filepath.Join(dest2, "docs")); len(got) != 1 {
		t.Errorf("docs: %v", got)
	}
	diffTrees(t, hostTree(t, outside), outBefore)
}

// makeLayer lays out a hand-made layer above the base of a fresh stack and
// returns the stack and the manifest naming it.
func makeLayer(t *testing.T, build func(layer string)) (*Stack, Manifest) {
	t.Helper()
	s := newTestStack(t)
	id := "L000002-0badf00d"
	layer := filepath.Join(s.Dir(), "layers", id)
	mkdir(t, layer, 0o755)
	build(layer)
	head := mustHead(t, s)
	return s, Manifest{SchemaVersion: 1, Version: 2, Layers: append([]LayerRef{{LayerID: id, Path: "layers/" + id}}, head.Layers...)}
}

// TestFoldHostileLayers: invalid names, special files and opaque roots are
// refused; symlinks in layers are never followed, also when a layer is
// tampered with between Fold and the export.
func TestFoldHostileLayers(t *testing.T) {
	cases := map[string]func(t *testing.T, layer string){
		"non-utf8 name":     func(t *testing.T, l string) { writeFile(t, filepath.Join(l, "bad\xff"), "x", 0o644) },
		"non-utf8 nested":   func(t *testing.T, l string) { writeFile(t, filepath.Join(l, "ok", "b\xc3"), "x", 0o644) },
		"whiteout of ..":    func(t *testing.T, l string) { writeFile(t, filepath.Join(l, ".wh..."), "", 0o644) },
		"whiteout of .":     func(t *testing.T, l string) { writeFile(t, filepath.Join(l, "d", ".wh.."), "", 0o644) },
		"empty whiteout":    func(t *testing.T, l string) { writeFile(t, filepath.Join(l, ".wh."), "", 0o644) },
		"whiteout of .wh.x": func(t *testing.T, l string) { writeFile(t, filepath.Join(l, ".wh..wh.x"), "", 0o644) },
		"fifo": func(t *testing.T, l string) {
			if err := mkfifo(filepath.Join(l, "pipe")); err != nil {
				t.Fatal(err)
			}
		},
		"non-utf8 symlink target": func(t *testing.T, l string) { symlink(t, "tar\xffget", filepath.Join(l, "ln")) },
		"opaque root":             func(t *testing.T, l string) { writeFile(t, filepath.Join(l, opaqueMarker), "", 0o644) },
	}
	for name, build := range cases {
		t.Run(name, func(t *testing.T) {
			s, m := makeLayer(t, func(l string) { build(t, l) })
			if _, err := s.Fold(m); !errors.Is(err, ErrHostileLayer) {
				t.Fatalf("Fold = %v, want ErrHostileLayer", err)
			}
		})
	}

	// A symlink to a directory in a layer is an entry, never a way in.
	outside := tempDir(t)
	writeFile(t, filepath.Join(outside, "secret"), "secret", 0o600)
	s, m := makeLayer(t, func(l string) {
		symlink(t, outside, filepath.Join(l, "evil"))
		writeFile(t, filepath.Join(l, "sub", "f"), "layer f", 0o644)
		writeFile(t, filepath.Join(l, "g"), "layer g", 0o644)
	})
	f := mustFold(t, s, m)
	checkLines(t, "fold", foldLines(f), []string{
		"dir sub -rwxr-xr-x opaque=false",
		`file g -rw-r--r-- "layer g" L000002-0badf00d`,
		`file sub/f -rw-r--r-- "layer f" L000002-0badf00d`,
		"symlink evil " + outside,
	})
	layer := s.LayerDir(m.Layers[0])

	for _, fallback := range []bool{false, true} {
		t.Run(fmt.Sprintf("tampered/fallback=%v", fallback), func(t *testing.T) {
			if fallback {
				prev := resolve
				resolve = beneath.Walk
				t.Cleanup(func() { resolve = prev })
			}
			// An intermediate directory swapped for a symlink.
			if err := os.Rename(filepath.Join(layer, "sub"), filepath.Join(layer, "sub2")); err != nil {
				t.Fatal(err)
			}
			symlink(t, "sub2", filepath.Join(layer, "sub"))
			dest := tempDir(t)
			if _, err := f.ExportDir(context.Background(), dest, ExportCaps{}, nil); !errors.Is(err, unix.ELOOP) {
				t.Errorf("ExportDir through a swapped layer dir: %v", err)
			}
			if _, err := f.ExportTar(context.Background(), io.Discard, 0, ExportCaps{}, nil); !errors.Is(err, unix.ELOOP) {
				t.Errorf("ExportTar through a swapped layer dir: %v", err)
			}
			os.Remove(filepath.Join(layer, "sub"))
			if err := os.Rename(filepath.Join(layer, "sub2"), filepath.Join(layer, "sub")); err != nil {
				t.Fatal(err)
			}
			// The file itself swapped for a symlink to a file of the same size.
			if err := os.Rename(filepath.Join(layer, "g"), filepath.Join(layer, "g.orig")); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(outside, "seven"), "SECRET!", 0o644)
			symlink(t, filepath.Join(outside, "seven"), filepath.Join(layer, "g"))
			dest = tempDir(t)
			if _, err := f.ExportDir(context.Background(), dest, ExportCaps{}, nil); !errors.Is(err, unix.ELOOP) {
				t.Errorf("ExportDir of a swapped file: %v", err)
			}
			if b, err := os.ReadFile(filepath.Join(dest, "g")); err == nil {
				t.Errorf("g written: %q", b)
			}
			os.Remove(filepath.Join(layer, "g"))
			if err := os.Rename(filepath.Join(layer, "g.orig"), filepath.Join(layer, "g")); err != nil {
				t.Fatal(err)
			}
			if _, err := f.ExportDir(context.Background(), tempDir(t), ExportCaps{}, nil); err != nil {
				t.Errorf("restored layer: %v", err)
			}
		})
	}
}

// TestExportCaps: every cap fails before anything is written.
func TestExportCaps(t *testing.T) {
	s := newTestStack(t)
	publish(t, s, write("a.txt", strings.Repeat("a", 3000), 0o644), write("b/c.txt", "c", 0o644), Change{Kind: ChangeDelete, Path: "README.md"})
	f := mustFold(t, s, mustHead(t, s))
	ctx := context.Background()
	for _, c := range []struct {
		caps ExportCaps
		cap  string
	}{
		{ExportCaps{MaxApplyEntries: f.Entries() - 1}, "max_apply_entries"},
		{ExportCaps{MaxDecompressedBytes: f.FileBytes() - 1}, "max_decompressed_bytes"},
	} {
		dest := filepath.Join(tempDir(t), "copy")
		copyTree(t, wsOf(s), dest)
		before := hostTree(t, dest)
		_, err := f.ExportDir(ctx, dest, c.caps, nil)
		var ce *CapError
		if !errors.As(err, &ce) || ce.Cap != c.cap {
			t.Errorf("ExportDir %+v: %v", c.caps, err)
		}
		diffTrees(t, hostTree(t, dest), before)
		if err := f.CheckDirCaps(c.caps); !errors.As(err, &ce) {
			t.Errorf("CheckDirCaps %+v: %v", c.caps, err)
		}
	}
	if _, err := f.ExportDir(ctx, tempDir(t), ExportCaps{MaxApplyEntries: f.Entries(), MaxDecompressedBytes: f.FileBytes(), MaxStreamBytes: 1}, nil); err != nil {
		t.Errorf("caps exactly met (stream cap is for archives): %v", err)
	}

	var plain bytes.Buffer
	if _, err := f.ExportTar(ctx, &plain, 0, ExportCaps{}, nil); err != nil {
		t.Fatal(err)
	}
	size := int64(plain.Len())
	for _, c := range []struct {
		caps  ExportCaps
		cap   string
		level int
	}{
		{ExportCaps{MaxStreamBytes: size - 1}, "max_stream_bytes", 0},
		{ExportCaps{MaxDecompressedBytes: size - 1}, "max_decompressed_bytes", 0},
		{ExportCaps{MaxDecompressedBytes: size - 1}, "max_decompressed_bytes", 3},
		{ExportCaps{MaxApplyEntries: f.Entries() - 1}, "max_apply_entries", 3},
	} {
		var buf bytes.Buffer
		_, err := f.ExportTar(ctx, &buf, c.level, c.caps, nil)
		var ce *CapError
		if !errors.As(err, &ce) || ce.Cap != c.cap || buf.Len() != 0 {
			t.Errorf("ExportTar %+v level %d: %v, %d bytes written", c.caps, c.level, err, buf.Len())
		}
	}
	if st, err := f.ExportTar(ctx, io.Discard, 0, ExportCaps{MaxStreamBytes: size, MaxDecompressedBytes: size, MaxApplyEntries: f.Entries()}, nil); err != nil || st.BytesWritten != size {
		t.Errorf("tar caps exactly met: %+v %v", st, err)
	}
	// tar-zst: the compressed size is only known while streaming.
	var ce *CapError
	if _, err := f.ExportTar(ctx, io.Discard, 3, ExportCaps{MaxStreamBytes: 16}, nil); !errors.As(err, &ce) || ce.Cap != "max_stream_bytes" {
		t.Errorf("zstd stream cap: %v", err)
	}
}

type tarItem struct {
	hdr  *tar.Header
	data string
}

func readTar(t *testing.T, r io.Reader) []tarItem {
	t.Helper()
	tr := tar.NewReader(r)
	var out []tarItem
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tarItem{h, string(b)})
	}
}

// TestExportTar: deterministic archives with the specified headers, plain and
// zstd.
func TestExportTar(t *testing.T) {
	if !canUserXattr(t.TempDir()) {
		t.Skip("user xattrs unsupported here")
	}
	s, m := buildViewStack(t, ociWhiteout)
	// A symlink, a sticky directory and a long non-ASCII name as well.
	l3 := s.LayerDir(m.Layers[0])
	symlink(t, "a/x", filepath.Join(l3, "sl"))
	mkdir(t, filepath.Join(l3, "tmp"), fs.ModeSticky|0o777)
	long := strings.Repeat("ü", 80) + "/" + strings.Repeat("long", 30)
	writeFile(t, filepath.Join(l3, long), "long", 0o644)
	when := time.Unix(1700000000, 987654321)
	if err := os.Chtimes(filepath.Join(l3, long), when, when); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var msgs []string
	archive := func(level int) ([]byte, TarStats) {
		t.Helper()
		f := mustFold(t, s, m) // a fresh fold each time
		var buf bytes.Buffer
		st, err := f.ExportTar(ctx, &buf, level, ExportCaps{}, func(m string) { msgs = append(msgs, m) })
		if err != nil {
			t.Fatalf("ExportTar: %v", err)
		}
		if st.BytesWritten != int64(buf.Len()) {
			t.Errorf("bytes_written %d, archive %d", st.BytesWritten, buf.Len())
		}
		return buf.Bytes(), st
	}
	a1, st := archive(0)
	a2, _ := archive(0)
	if !bytes.Equal(a1, a2) {
		t.Fatal("two plain archives differ")
	}
	if st != (TarStats{FilesWritten: 6, DirectoriesWritten: 6, SymlinksWritten: 1, WhiteoutsEmitted: 6, BytesWritten: int64(len(a1))}) {
		t.Errorf("stats %+v", st)
	}
	if len(msgs) == 0 || !strings.Contains(msgs[len(msgs)-1], "archived") {
		t.Errorf("progress %q", msgs)
	}
	items := readTar(t, bytes.NewReader(a1))
	var names []string
	for _, it := range items {
		h := it.hdr
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || h.ModTime.Nanosecond() != 0 ||
			h.Typeflag == tar.TypeLink || h.Linkname != "" && h.Typeflag != tar.TypeSymlink {
			t.Errorf("header %+v", h)
		}
		for k := range h.PAXRecords {
			if k != "path" {
				t.Errorf("%s: PAX record %s", h.Name, k)
			}
		}
	}
	want := []string{
		".wh.c", ".wh.d", "a/", "a/.wh.y", "a/new2", "a/x", "b/", "b/.wh..wh..opq", "b/new",
		"o/", "o/.wh..wh..opq", "o/r", "oci/", "oci/.wh.gone", "sl", "tmp/", "w",
		strings.Repeat("ü", 80) + "/", long,
	}
	checkLines(t, "entries", names, want)
	byName := map[string]tarItem{}
	for _, it := range items {
		byName[it.hdr.Name] = it
	}
	check := func(name string, typ byte, mode int64, data string) {
		t.Helper()
		it, ok := byName[name]
		if !ok {
			t.Errorf("%s missing", name)
			return
		}
		if it.hdr.Typeflag != typ || it.hdr.Mode != mode || it.data != data {
			t.Errorf("%s: type %c mode %o data %q", name, it.hdr.Typeflag, it.hdr.Mode, it.data)
		}
	}
	check("a/", tar.TypeDir, 0o700, "")
	check("a/x", tar.TypeReg, 0o755, "l1 x")
	check("a/.wh.y", tar.TypeReg, 0o644, "")
	check("b/.wh..wh..opq", tar.TypeReg, 0o644, "")
	check("tmp/", tar.TypeDir, 0o1777, "")
	check("w", tar.TypeReg, 0o644, "w is a file")
	check("sl", tar.TypeSymlink, 0o777, "")
	check(long, tar.TypeReg, 0o644, "long")
	if it := byName["sl"]; it.hdr.Linkname != "a/x" {
		t.Errorf("symlink target %q", it.hdr.Linkname)
	}
	if it := byName[long]; !it.hdr.ModTime.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("mtime %v", it.hdr.ModTime)
	}
	if it := byName["a/x"]; it.hdr.ModTime.Unix() != mtimeOf(t, filepath.Join(s.LayerDir(m.Layers[2]), "a", "x"))/1e9 {
		t.Errorf("a/x mtime %v", it.hdr.ModTime)
	}

	// zstd: deterministic, and it decompresses to the plain archive.
	z1, zst := archive(3)
	z2, _ := archive(3)
	if !bytes.Equal(z1, z2) {
		t.Fatal("two zstd archives differ")
	}
	if zst.FilesWritten != st.FilesWritten || zst.WhiteoutsEmitted != st.WhiteoutsEmitted || zst.BytesWritten != int64(len(z1)) {
		t.Errorf("zstd stats %+v", zst)
	}
	dec, err := zstd.NewReader(bytes.NewReader(z1))
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	plain, err := io.ReadAll(dec)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(plain, a1) {
		t.Error("zstd archive does not decompress to the plain archive")
	}
	if z19, _ := archive(19); bytes.Equal(z19, z1) {
		t.Error("the level is ignored")
	}
}

// TestExportProgress: at least one line per 1000 entries.
func TestExportProgress(t *testing.T) {
	s := newTestStack(t)
	var changes []Change
	for i := range 2100 {
		changes = append(changes, write(fmt.Sprintf("many/f%04d", i), "x", 0o644))
	}
	publish(t, s, changes...)
	f := mustFold(t, s, mustHead(t, s))
	var msgs []string
	if _, err := f.ExportDir(context.Background(), tempDir(t), ExportCaps{}, func(m string) { msgs = append(msgs, m) }); err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(msgs, "\n")
	for _, w := range []string{"1000/2101", "2000/2101", "2101/2101 entries applied"} {
		if !strings.Contains(joined, w) {
			t.Errorf("progress lacks %q: %q", w, msgs)
		}
	}
}
