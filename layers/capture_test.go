package layers

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// skipOrFail skips the test, or fails it when ESBX_REQUIRE_ALL=1.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("ESBX_REQUIRE_ALL") == "1" {
		t.Fatalf("ESBX_REQUIRE_ALL=1: "+format, args...)
	}
	t.Skipf(format, args...)
}

func requireOverlayFormat(t *testing.T) {
	t.Helper()
	d := tempDir(t)
	if !canMknodWhiteout(d) {
		skipOrFail(t, "mknod of a 0:0 whiteout is refused here")
	}
	if !canUserXattr(d) {
		skipOrFail(t, "user xattrs are unsupported here")
	}
}

func setx(t *testing.T, p, name, value string) {
	t.Helper()
	if err := unix.Lsetxattr(p, name, []byte(value), 0); err != nil {
		t.Fatalf("setxattr %s %s: %v", p, name, err)
	}
}

func chardev00(t *testing.T, p string) {
	t.Helper()
	if err := unix.Mknod(p, unix.S_IFCHR, 0); err != nil {
		t.Fatalf("mknod %s: %v", p, err)
	}
}

func chmodRaw(t *testing.T, p string, mode uint32) {
	t.Helper()
	if err := unix.Chmod(p, mode); err != nil {
		t.Fatalf("chmod %s: %v", p, err)
	}
}

// fmtChange renders a change without its Source and MTime.
func fmtChange(c Change) string {
	s := fmt.Sprintf("%s %s", c.Kind, c.Path)
	switch c.Kind {
	case ChangeWrite, ChangeDirectory, ChangeOpaqueDir:
		s += " " + c.Mode.String()
	case ChangeSymlink:
		s += " -> " + c.Target
	}
	return s
}

func fmtChanges(cs []Change) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, fmtChange(c))
	}
	return out
}

func fmtDrops(ds []Drop) []string {
	out := []string{}
	for _, d := range ds {
		out = append(out, d.Reason+" "+d.Path)
	}
	return out
}

func checkLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got  %q\n want %q", what, got, want)
	}
}

// checkWriteSources checks that every write streams from the upper file at
// its path and carries that file's mtime.
func checkWriteSources(t *testing.T, upper string, cs *Changeset) {
	t.Helper()
	for _, c := range cs.Changes {
		if c.Kind != ChangeWrite {
			if c.Source != "" {
				t.Errorf("%s %s has Source %q", c.Kind, c.Path, c.Source)
			}
			continue
		}
		if c.Source != c.Path || c.Root == nil || c.Root != cs.Root {
			t.Errorf("write %s: Source = %q (Root %v), want the path beneath the changeset's Root", c.Path, c.Source, c.Root)
		}
		fi, err := os.Lstat(filepath.Join(upper, filepath.FromSlash(c.Path)))
		if err != nil {
			t.Fatal(err)
		}
		if !c.MTime.Equal(fi.ModTime()) {
			t.Errorf("write %s: MTime = %v, want %v", c.Path, c.MTime, fi.ModTime())
		}
	}
}

func describeMode(m fs.FileMode) string { return (m.Perm() | m&fs.ModeSticky).String() }

// viewTree describes every entry of a merged view (root excluded): kind,
// mode, content and mtime of files, targets of symlinks.
func viewTree(t *testing.T, v *View) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(rel string)
	walk = func(rel string) {
		es, err := v.ReadDir(rel)
		if err != nil {
			t.Fatalf("ReadDir(%q): %v", rel, err)
		}
		for _, e := range es {
			switch e.Kind {
			case KindDir:
				out[e.Path] = "dir " + describeMode(e.Mode)
				walk(e.Path)
			case KindFile:
				out[e.Path] = fmt.Sprintf("file %s %q %d", describeMode(e.Mode), readString(t, v, e.Path), e.ModTime.UnixNano())
			case KindSymlink:
				out[e.Path] = "symlink " + e.Target
			default:
				out[e.Path] = "other"
			}
		}
	}
	walk("")
	return out
}

// hostTree describes a host directory tree like viewTree.
func hostTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch m := fi.Mode(); {
		case m.IsDir():
			out[rel] = "dir " + describeMode(m)
		case m.IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file %s %q %d", describeMode(m), b, fi.ModTime().UnixNano())
		case m&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "symlink " + target
		default:
			out[rel] = "other"
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffTrees(t *testing.T, got, want map[string]string) {
	t.Helper()
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		if got[k] != want[k] {
			t.Errorf("%s: got %q, want %q", k, got[k], want[k])
		}
	}
}

// TestCaptureSynthetic captures a hand-made upper dir covering every row of
// the §9.1 table against the base of newTestStack.
func TestCaptureSynthetic(t *testing.T) {
	requireOverlayFormat(t)
	ctx := context.Background()
	s := newTestStack(t)
	base := s.View(mustHead(t, s))
	up := filepath.Join(tempDir(t), "upper")
	mkdir(t, up, 0o755)
	at := func(rel string) string { return filepath.Join(up, filepath.FromSlash(rel)) }

	// Regular files: mode bits beyond 0o777 dropped, mtime kept.
	writeFile(t, at("README.md"), "changed\n", 0o755)
	chmodRaw(t, at("README.md"), 0o7755)
	if err := os.Chtimes(at("README.md"), fixedTime, fixedTime); err != nil {
		t.Fatal(err)
	}
	writeFile(t, at(".wh.foo"), "plain\n", 0o644) // a name, not a marker
	setx(t, at(".wh.foo"), "user.overlay.origin", "")
	// Hardlinks: independent writes.
	writeFile(t, at("h1"), "shared\n", 0o600)
	if err := os.Link(at("h1"), at("h2")); err != nil {
		t.Fatal(err)
	}
	symlink(t, "/etc/passwd", at("link"))
	symlink(t, "dangling/../x", at("link2"))

	// docs: same mode as in base → carrier; both whiteout encodings.
	mkdir(t, at("docs"), 0o755)
	setx(t, at("docs"), "user.overlay.impure", "y")
	setx(t, at("docs"), "user.overlay.origin", "")
	chardev00(t, at("docs/a.md"))
	writeFile(t, at("docs/b.md"), "", 0o644)
	setx(t, at("docs/b.md"), xattrUserWh, "y")
	writeFile(t, at("docs/empty"), "", 0o644)         // empty, no xattr: a write
	writeFile(t, at("docs/not-wh"), "data", 0o644)    // whiteout xattr on a non-empty file: a write
	setx(t, at("docs/not-wh"), xattrUserWh, "y")      //
	chardev00(t, at("docs/"+opaqueMarker))            // in a non-opaque dir: just a delete
	writeFile(t, at("docs/redirected"), "r\n", 0o644) // kernel xattrs are ignored
	setx(t, at("docs/redirected"), "user.overlay.redirect", "/elsewhere")

	// src: mode changed → a real directory change; src/lib opaque in the FUSE
	// encoding (xattr + marker), which is not reported.
	mkdir(t, at("src"), 0o750)
	mkdir(t, at("src/lib"), 0o755)
	setx(t, at("src/lib"), xattrUserOpq, "y")
	chardev00(t, at("src/lib/"+opaqueMarker))
	writeFile(t, at("src/lib/new.go"), "package lib\n", 0o644)
	writeFile(t, at("src/\xff.go"), "x", 0o644)

	// opaque only by xattr (the kernel's encoding), an xattr that is not "y",
	// new directories with sticky / setgid bits.
	mkdir(t, at("kdir"), 0o700)
	setx(t, at("kdir"), xattrUserOpq, "y")
	mkdir(t, at("xdir"), 0o755)
	setx(t, at("xdir"), xattrUserOpq, "x")
	mkdir(t, at("sticky"), 0o755)
	chmodRaw(t, at("sticky"), 0o3775)
	mkdir(t, at("sg"), 0o755)
	chmodRaw(t, at("sg"), 0o2755)

	// Drops.
	if err := mkfifo(at("fifo")); err != nil {
		t.Fatal(err)
	}
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(sock, &unix.SockaddrUnix{Name: at("sock")}); err != nil {
		t.Fatal(err)
	}
	unix.Close(sock)
	writeFile(t, at("bad\xfe/inner.txt"), "never seen", 0o644) // not descended
	chardev00(t, at("bad\xfe/gone"))
	writeFile(t, at("\xff.txt"), "x", 0o644)

	cs, err := Capture(ctx, up, base)
	if err != nil {
		t.Fatalf("Capture: %v", err)
	}
	checkLines(t, "changes", fmtChanges(cs.Changes), []string{
		"write .wh.foo -rw-r--r--",
		"write README.md -rwxr-xr-x",
		"delete docs/.wh..wh..opq",
		"delete docs/a.md",
		"delete docs/b.md",
		"write docs/empty -rw-r--r--",
		"write docs/not-wh -rw-r--r--",
		"write docs/redirected -rw-r--r--",
		"write h1 -rw-------",
		"write h2 -rw-------",
		"opaque_dir kdir -rwx------",
		"symlink link -> /etc/passwd",
		"symlink link2 -> dangling/../x",
		"directory sg -rwxr-xr-x",
		"directory src -rwxr-x---",
		"opaque_dir src/lib -rwxr-xr-x",
		"write src/lib/new.go -rw-r--r--",
		"directory sticky trwxrwxr-x",
		"directory xdir -rwxr-xr-x",
	})
	checkLines(t, "carriers", fmtChanges(cs.Carriers), []string{"directory docs -rwxr-xr-x"})
	checkLines(t, "drops", fmtDrops(cs.Drops), []string{
		"invalid_layer_path .invalid-layer-path/" + hex.EncodeToString([]byte("bad\xfe")),     // 626164fe
		"invalid_layer_path .invalid-layer-path/" + hex.EncodeToString([]byte("src/\xff.go")), // 7372632fff2e676f
		"invalid_layer_path .invalid-layer-path/" + hex.EncodeToString([]byte("\xff.txt")),    // ff2e747874
		"unsupported_special_file fifo",
		"unsupported_special_file sock",
	})
	checkWriteSources(t, up, cs)
	for _, c := range cs.Changes {
		if c.Path == "README.md" && !c.MTime.Equal(fixedTime) {
			t.Errorf("README.md MTime = %v, want %v", c.MTime, fixedTime)
		}
	}
	all := fmtChanges(cs.All())
	if !slices.IsSortedFunc(cs.All(), func(a, b Change) int { return strings.Compare(a.Path, b.Path) }) ||
		len(all) != len(cs.Changes)+len(cs.Carriers) || !slices.Contains(all, "directory docs -rwxr-xr-x") {
		t.Errorf("All() = %q", all)
	}

	// Without a base nothing is a carrier.
	nb, err := Capture(ctx, up, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(nb.Carriers) != 0 || !slices.Contains(fmtChanges(nb.Changes), "directory docs -rwxr-xr-x") {
		t.Errorf("nil base: carriers %q", fmtChanges(nb.Carriers))
	}

	// Publish everything but the reserved names (rejected by routing, §9.2).
	var publishable []Change
	for _, c := range cs.All() {
		if !strings.Contains("/"+c.Path, "/"+whPrefix) {
			publishable = append(publishable, c)
		}
	}
	publish(t, s, publishable...)
	rmt := func(rel string) int64 {
		fi, err := os.Lstat(at(rel))
		if err != nil {
			t.Fatal(err)
		}
		return fi.ModTime().UnixNano()
	}
	diffTrees(t, viewTree(t, s.View(mustHead(t, s))), map[string]string{
		"README.md":       fmt.Sprintf("file -rwxr-xr-x %q %d", "changed\n", fixedTime.UnixNano()),
		"docs":            "dir -rwxr-xr-x",
		"docs/empty":      fmt.Sprintf("file -rw-r--r-- %q %d", "", rmt("docs/empty")),
		"docs/not-wh":     fmt.Sprintf("file -rw-r--r-- %q %d", "data", rmt("docs/not-wh")),
		"docs/redirected": fmt.Sprintf("file -rw-r--r-- %q %d", "r\n", rmt("docs/redirected")),
		"h1":              fmt.Sprintf("file -rw------- %q %d", "shared\n", rmt("h1")),
		"h2":              fmt.Sprintf("file -rw------- %q %d", "shared\n", rmt("h2")),
		"kdir":            "dir -rwx------",
		"link":            "symlink /etc/passwd",
		"link2":           "symlink dangling/../x",
		"sg":              "dir -rwxr-xr-x",
		"src":             "dir -rwxr-x---",
		"src/lib":         "dir -rwxr-xr-x",
		"src/lib/new.go":  fmt.Sprintf("file -rw-r--r-- %q %d", "package lib\n", rmt("src/lib/new.go")),
		"src/main.go":     viewTree(t, base)["src/main.go"],
		"sticky":          "dir trwxrwxr-x",
		"xdir":            "dir -rwxr-xr-x",
	})
	// The published hardlinks are independent files.
	v := s.View(mustHead(t, s))
	e1, _ := v.Lstat("h1")
	e2, _ := v.Lstat("h2")
	if os.SameFile(lstatOrNil(e1.HostPath), lstatOrNil(e2.HostPath)) {
		t.Error("h1 and h2 share an inode in the layer")
	}
}

func lstatOrNil(p string) fs.FileInfo {
	fi, _ := os.Lstat(p)
	return fi
}

func TestCaptureErrors(t *testing.T) {
	requireOverlayFormat(t)
	ctx := context.Background()
	dir := tempDir(t)
	f := filepath.Join(dir, "file")
	writeFile(t, f, "x", 0o644)
	if _, err := Capture(ctx, f, nil); err == nil {
		t.Error("Capture of a regular file succeeded")
	}
	if _, err := Capture(ctx, filepath.Join(dir, "missing"), nil); !isNotExist(err) {
		t.Errorf("missing upper: %v", err)
	}
	// A symlinked upper root is not followed.
	real := filepath.Join(dir, "real")
	writeFile(t, filepath.Join(real, "a"), "a", 0o644)
	symlink(t, real, filepath.Join(dir, "ln"))
	if _, err := Capture(ctx, filepath.Join(dir, "ln"), nil); err == nil {
		t.Error("Capture through a symlinked upper succeeded")
	}
	// Nothing below a symlinked directory is captured.
	up := filepath.Join(dir, "up")
	mkdir(t, up, 0o755)
	symlink(t, real, filepath.Join(up, "d"))
	cs, err := Capture(ctx, up, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkLines(t, "symlinked dir", fmtChanges(cs.Changes), []string{"symlink d -> " + real})

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Capture(cctx, up, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	mc := filepath.Join(dir, "mc")
	writeFile(t, filepath.Join(mc, "f"), "", 0o644)
	setx(t, filepath.Join(mc, "f"), xattrUserMetacopy, "")
	if _, err := Capture(ctx, mc, nil); err == nil || !strings.Contains(err.Error(), "metacopy") {
		t.Errorf("metacopy upper: %v", err)
	}
	empty := filepath.Join(dir, "empty")
	mkdir(t, empty, 0o755)
	cs, err = Capture(ctx, empty, nil)
	if err != nil || len(cs.Changes)+len(cs.Carriers)+len(cs.Drops) != 0 || len(cs.All()) != 0 {
		t.Errorf("empty upper: %+v, %v", cs, err)
	}
}

// TestCaptureKernelOverlay drives a real kernel overlay (userxattr, inside
// unshare -Urm) whose lower dir is the base layer, captures its upper dir,
// publishes the result and compares the merged view with what the overlay
// mount showed.
func TestCaptureKernelOverlay(t *testing.T) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		skipOrFail(t, "unshare not installed: %v", err)
	}
	ctx := context.Background()
	root := tempDir(t)
	ws := filepath.Join(root, "ws")
	writeFile(t, filepath.Join(ws, "src", "main.go"), "package main\n", 0o644)
	writeFile(t, filepath.Join(ws, "src", "lib", "util.go"), "package lib\n", 0o644)
	writeFile(t, filepath.Join(ws, "src", "lib", "deep", "d.go"), "package deep\n", 0o644)
	writeFile(t, filepath.Join(ws, "docs", "a.md"), "a\n", 0o644)
	writeFile(t, filepath.Join(ws, "docs", "b.md"), "b\n", 0o644)
	writeFile(t, filepath.Join(ws, "run.sh"), "echo hi\n", 0o644)
	writeFile(t, filepath.Join(ws, "keep.txt"), "untouched\n", 0o644)
	s, _, err := Create(ctx, filepath.Join(root, "sbx", "layerstack"), ws, SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	head := mustHead(t, s)
	base := s.View(head)
	lower := s.LayerDir(head.Layers[0])
	upper, work, merged, seen := filepath.Join(root, "upper"), filepath.Join(root, "work"),
		filepath.Join(root, "merged"), filepath.Join(root, "seen")
	for _, d := range []string{upper, work, merged, seen} {
		mkdir(t, d, 0o755)
	}
	script := `set -e
umask 022
mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3,userxattr" "$4"
cd "$4"
printf 'edited\n' >> src/main.go
rm docs/a.md
rm -rf src/lib
mkdir src/lib
printf 'fresh\n' > src/lib/fresh.go
mkdir newdir
ln -s src/main.go link
chmod +x run.sh
mkfifo fifo
cp -a . "$5"/
`
	cmd := exec.CommandContext(ctx, unshare, "-Urm", "sh", "-c", script, "sh", lower, upper, work, merged, seen)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kernel overlay in unshare -Urm: %v\n%s", err, out)
	}

	cs, err := Capture(ctx, upper, base)
	if err != nil {
		t.Fatalf("Capture: %v", err)
	}
	checkLines(t, "changes", fmtChanges(cs.Changes), []string{
		"delete docs/a.md",
		"symlink link -> src/main.go",
		"directory newdir -rwxr-xr-x",
		"write run.sh -rwxr-xr-x",
		"opaque_dir src/lib -rwxr-xr-x",
		"write src/lib/fresh.go -rw-r--r--",
		"write src/main.go -rw-r--r--",
	})
	checkLines(t, "carriers", fmtChanges(cs.Carriers), []string{
		"directory docs -rwxr-xr-x",
		"directory src -rwxr-xr-x",
	})
	checkLines(t, "drops", fmtDrops(cs.Drops), []string{"unsupported_special_file fifo"})
	checkWriteSources(t, upper, cs)

	res, err := s.Update(ctx, func(*View) ([]Change, error) { return cs.All(), nil })
	if err != nil || res.NoOp {
		t.Fatalf("Update: %+v, %v", res, err)
	}
	if want := LayerDigest(cs.All()); res.Digest != want {
		t.Errorf("digest %s, want %s", res.Digest, want)
	}
	want := hostTree(t, seen)
	if want["fifo"] != "other" {
		t.Fatalf("the overlay did not show the fifo: %q", want["fifo"])
	}
	delete(want, "fifo") // dropped, never published
	if want["src/main.go"] != fmt.Sprintf("file -rw-r--r-- %q %d", "package main\nedited\n", mtimeOf(t, filepath.Join(upper, "src/main.go"))) {
		t.Errorf("overlay showed src/main.go as %q", want["src/main.go"])
	}
	diffTrees(t, viewTree(t, s.View(mustHead(t, s))), want)
}

func mtimeOf(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.ModTime().UnixNano()
}
