package layers

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var layerIDRe = regexp.MustCompile(`^L(\d{6,})-[0-9a-f]{8}$`)

func write(p, content string, mode fs.FileMode) Change {
	return Change{Kind: ChangeWrite, Path: p, Data: []byte(content), Mode: mode}
}

func publish(t *testing.T, s *Stack, changes ...Change) PublishResult {
	t.Helper()
	res, err := s.Publish(context.Background(), changes)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	return res
}

func TestUpdateThreeWrites(t *testing.T) {
	s := newTestStack(t)
	for i := 1; i <= 3; i++ {
		ch := write("src/main.go", fmt.Sprintf("package main // v%d\n", i), 0o644)
		res := publish(t, s, ch)
		m := mustHead(t, s)
		if res.NoOp || m.Version != 1+i || len(m.Layers) != 1+i || m.Layers[0].LayerID != res.LayerID {
			t.Fatalf("publish %d: res %+v head %+v", i, res, m)
		}
		sub := layerIDRe.FindStringSubmatch(res.LayerID)
		if sub == nil || sub[1] != fmt.Sprintf("%06d", 1+i) || m.Layers[0].Path != "layers/"+res.LayerID {
			t.Errorf("layer id %q / path %q", res.LayerID, m.Layers[0].Path)
		}
		if res.Revision != m.Revision() {
			t.Errorf("revision %+v, head %+v", res.Revision, m.Revision())
		}
		if d, err := s.StoredDigest(res.LayerID); err != nil || d != LayerDigest([]Change{ch}) || d != res.Digest {
			t.Errorf("stored digest %q %v", d, err)
		}
		if n, err := s.StoredBytes(res.LayerID); err != nil || n != int64(len(ch.Data)) || res.Bytes != n {
			t.Errorf("stored bytes %d %v", n, err)
		}
	}
	m := mustHead(t, s)
	if m.Layers[len(m.Layers)-1].LayerID != BaseLayerID {
		t.Errorf("base not last: %+v", m.Layers)
	}
	v := s.View(m)
	if got := readString(t, v, "src/main.go"); got != "package main // v3\n" {
		t.Errorf("head content %q", got)
	}
	if got := readString(t, v, "src/lib/util.go"); got != "package lib\n" {
		t.Errorf("lower content %q", got)
	}
	if e, _ := v.Lstat("src"); e.Mode != 0o755 {
		t.Errorf("carrier dir mode %v", e.Mode)
	}
	if got := names(t, filepath.Join(s.Dir(), "staging")); len(got) != 0 {
		t.Errorf("staging leftovers %v", got)
	}
}

func TestUpdateNoOp(t *testing.T) {
	tests := []struct {
		name     string
		first    []Change
		second   []Change
		wantNoOp bool
	}{
		{"identical_rewrite", []Change{write("a.txt", "x", 0o644)}, []Change{write("a.txt", "x", 0o644)}, true},
		{"identical_in_new_dirs", []Change{write("n/m/f", "x", 0o644)}, []Change{write("n/m/f", "x", 0o644)}, true},
		{"identical_mixed", []Change{write("a", "1", 0o600), {Kind: ChangeDelete, Path: "docs/a.md"}, {Kind: ChangeSymlink, Path: "l", Target: "a"}, {Kind: ChangeDirectory, Path: "d", Mode: 0o750}},
			[]Change{{Kind: ChangeDirectory, Path: "d", Mode: 0o750}, {Kind: ChangeSymlink, Path: "l", Target: "a"}, {Kind: ChangeDelete, Path: "docs/a.md"}, write("a", "1", 0o600)}, true},
		{"mode_only_file", []Change{write("a.txt", "x", 0o644)}, []Change{write("a.txt", "x", 0o755)}, false},
		{"mode_only_dir", []Change{{Kind: ChangeDirectory, Path: "d", Mode: 0o755}}, []Change{{Kind: ChangeDirectory, Path: "d", Mode: 0o700}}, false},
		{"content_change", []Change{write("a.txt", "x", 0o644)}, []Change{write("a.txt", "y", 0o644)}, false},
		{"empty", []Change{write("a.txt", "x", 0o644)}, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStack(t)
			publish(t, s, tc.first...)
			before := mustHead(t, s)
			res := publish(t, s, tc.second...)
			after := mustHead(t, s)
			if res.NoOp != tc.wantNoOp {
				t.Fatalf("NoOp = %v, want %v", res.NoOp, tc.wantNoOp)
			}
			if tc.wantNoOp {
				if after.Version != before.Version || res.Revision != before.Revision() || res.LayerID != "" {
					t.Errorf("no-op changed head: %+v -> %+v (%+v)", before, after, res)
				}
			} else if after.Version != before.Version+1 {
				t.Errorf("version %d -> %d", before.Version, after.Version)
			}
			if got := names(t, filepath.Join(s.Dir(), "staging")); len(got) != 0 {
				t.Errorf("staging leftovers %v", got)
			}
		})
	}
}

func TestUpdateLayerContent(t *testing.T) {
	s := newTestStack(t)
	src := filepath.Join(tempDir(t), "upper-file")
	writeFile(t, src, "from source", 0o600)
	res := publish(t, s,
		Change{Kind: ChangeWrite, Path: "new/deep/file.txt", Source: src, Mode: 0o750, MTime: fixedTime},
		Change{Kind: ChangeDelete, Path: "docs/a.md"},
		Change{Kind: ChangeOpaqueDir, Path: "src/lib", Mode: 0o700},
		write("src/lib/fresh.go", "fresh", 0o644),
		Change{Kind: ChangeSymlink, Path: "link", Target: "/abs/target", MTime: fixedTime},
		Change{Kind: ChangeDirectory, Path: "emptydir", Mode: fs.ModeSticky | 0o777},
		write("README.md", "ignored: replaced by the next change", 0o644),
		Change{Kind: ChangeDelete, Path: "README.md"},
	)
	v := s.View(mustHead(t, s))
	if got := readString(t, v, "new/deep/file.txt"); got != "from source" {
		t.Errorf("source write %q", got)
	}
	e, _ := v.Lstat("new/deep/file.txt")
	if e.Mode != 0o750 || !e.ModTime.Equal(fixedTime) || e.LayerID != res.LayerID {
		t.Errorf("entry %+v", e)
	}
	for _, d := range []string{"new", "new/deep"} {
		if e, err := v.Lstat(d); err != nil || e.Kind != KindDir || e.Mode != 0o755 {
			t.Errorf("implicit parent %s: %+v %v", d, e, err)
		}
	}
	for _, gone := range []string{"docs/a.md", "src/lib/util.go", "README.md"} {
		if _, err := v.Lstat(gone); !isNotExist(err) {
			t.Errorf("%s still visible: %v", gone, err)
		}
	}
	if es, _ := v.ReadDir("src/lib"); !equalStrings(entryNames(es), []string{"fresh.go"}) {
		t.Errorf("opaque dir listing %v", entryNames(es))
	}
	if e, _ := v.Lstat("src/lib"); e.Mode != 0o700 {
		t.Errorf("opaque dir mode %v", e.Mode)
	}
	if es, _ := v.ReadDir("docs"); !equalStrings(entryNames(es), []string{"b.md"}) {
		t.Errorf("docs listing %v", entryNames(es))
	}
	if e, _ := v.Lstat("link"); e.Kind != KindSymlink || e.Target != "/abs/target" {
		t.Errorf("symlink %+v", e)
	}
	if e, _ := v.Lstat("emptydir"); e.Mode != fs.ModeSticky|0o777 {
		t.Errorf("sticky dir mode %v", e.Mode)
	}
	layer := filepath.Join(s.Dir(), "layers", res.LayerID)
	// One encoding: the xattr where user xattrs work, else the OCI marker.
	_, markerErr := os.Lstat(filepath.Join(layer, "src", "lib", opaqueMarker))
	v2, ok := getxattr(filepath.Join(layer, "src", "lib"), xattrUserOpq)
	if canUserXattr(tempDir(t)) {
		if !ok || v2 != "y" || markerErr == nil {
			t.Errorf("opaque xattr %q %v, marker present: %v", v2, ok, markerErr == nil)
		}
	} else if markerErr != nil {
		t.Errorf("opaque marker missing in the layer: %v", markerErr)
	}
	want := LayerDigest([]Change{
		{Kind: ChangeWrite, Path: "new/deep/file.txt", Data: []byte("from source")},
		{Kind: ChangeDelete, Path: "docs/a.md"},
		{Kind: ChangeOpaqueDir, Path: "src/lib"},
		write("src/lib/fresh.go", "fresh", 0o644),
		{Kind: ChangeSymlink, Path: "link", Target: "/abs/target"},
		{Kind: ChangeDirectory, Path: "emptydir"},
		{Kind: ChangeDelete, Path: "README.md"},
	})
	if res.Digest != want {
		t.Errorf("digest %s, want %s", res.Digest, want)
	}
	if res.Bytes != int64(len("from source")+len("fresh")) {
		t.Errorf("bytes %d", res.Bytes)
	}
	// The lower layers are untouched.
	old := s.View(Manifest{SchemaVersion: 1, Version: 1, Layers: mustHead(t, s).Layers[1:]})
	if got := readString(t, old, "README.md"); got != "hello\n" {
		t.Errorf("base changed: %q", got)
	}
}

func TestUpdateRejects(t *testing.T) {
	fnErr := errors.New("resolution rejected")
	tests := []struct {
		name    string
		fn      func(v *View) ([]Change, error)
		wantErr string
	}{
		{"fn_error", func(*View) ([]Change, error) { return nil, fnErr }, "resolution rejected"},
		{"reserved_name", func(*View) ([]Change, error) { return []Change{write("a/.wh.b", "x", 0o644)}, nil }, "reserved"},
		{"dotdot", func(*View) ([]Change, error) { return []Change{write("../x", "x", 0o644)}, nil }, "invalid change path"},
		{"absolute", func(*View) ([]Change, error) { return []Change{write("/x", "x", 0o644)}, nil }, "invalid change path"},
		{"empty_path", func(*View) ([]Change, error) { return []Change{write("", "x", 0o644)}, nil }, "invalid change path"},
		{"unknown_kind", func(*View) ([]Change, error) { return []Change{{Kind: "rename", Path: "x"}}, nil }, "unknown kind"},
		{"empty_target", func(*View) ([]Change, error) { return []Change{{Kind: ChangeSymlink, Path: "x"}}, nil }, "symlink target"},
		{"file_under_file", func(*View) ([]Change, error) {
			return []Change{write("a", "x", 0o644), write("a/b", "y", 0o644)}, nil
		}, "conflicting changes"},
		{"file_under_delete", func(*View) ([]Change, error) {
			return []Change{{Kind: ChangeDelete, Path: "src"}, write("src/x", "y", 0o644)}, nil
		}, "conflicting changes"},
		{"missing_source", func(*View) ([]Change, error) {
			return []Change{{Kind: ChangeWrite, Path: "x", Source: "/nonexistent/source"}}, nil
		}, "source"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStack(t)
			before := mustHead(t, s)
			_, err := s.Update(context.Background(), tc.fn)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if tc.name == "fn_error" && !errors.Is(err, fnErr) {
				t.Errorf("fn error not returned as is: %v", err)
			}
			assertUnchanged(t, s, before)
		})
	}
}

// assertUnchanged checks head is before and nothing but its layers exists.
func assertUnchanged(t *testing.T, s *Stack, before Manifest) {
	t.Helper()
	after := mustHead(t, s)
	if after.Version != before.Version || after.RootHash() != before.RootHash() {
		t.Errorf("head changed: %+v -> %+v", before, after)
	}
	if got := names(t, filepath.Join(s.Dir(), "staging")); len(got) != 0 {
		t.Errorf("staging leftovers %v", got)
	}
	if got, want := names(t, filepath.Join(s.Dir(), "layers")), sortedIDs(before); !equalStrings(got, want) {
		t.Errorf("layers/ = %v, want %v", got, want)
	}
	for _, n := range names(t, filepath.Join(s.Dir(), metaDirName)) {
		id := strings.TrimSuffix(strings.TrimSuffix(n, digestSuffix), bytesSuffix)
		if !contains(before.LayerIDs(), id) {
			t.Errorf("leftover sidecar %s", n)
		}
	}
}

func sortedIDs(m Manifest) []string {
	ids := m.LayerIDs()
	slicesSort(ids)
	return ids
}

func TestUpdateConcurrent(t *testing.T) {
	s := newTestStack(t)
	other, err := Open(s.Dir()) // a second handle: serializes through the flock only
	if err != nil {
		t.Fatal(err)
	}
	publish(t, s, write("counter", "0", 0o644))
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := s
			if i%2 == 1 {
				st = other
			}
			_, err := st.Update(context.Background(), func(v *View) ([]Change, error) {
				b, err := v.ReadFile("counter")
				if err != nil {
					return nil, err
				}
				c, err := strconv.Atoi(string(b))
				if err != nil {
					return nil, err
				}
				time.Sleep(time.Millisecond) // widen the race window
				return []Change{write("counter", strconv.Itoa(c+1), 0o644), write(fmt.Sprintf("w/%02d", i), "x", 0o644)}, nil
			})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	m := mustHead(t, s)
	if m.Version != 2+n || len(m.Layers) != 2+n {
		t.Fatalf("head version %d with %d layers, want %d", m.Version, len(m.Layers), 2+n)
	}
	v := s.View(m)
	if got := readString(t, v, "counter"); got != strconv.Itoa(n) {
		t.Errorf("counter = %s, want %d (lost update)", got, n)
	}
	if es, _ := v.ReadDir("w"); len(es) != n {
		t.Errorf("w/ has %d files", len(es))
	}
	for i, l := range m.Layers[:n] {
		sub := layerIDRe.FindStringSubmatch(l.LayerID)
		if sub == nil {
			t.Fatalf("layer id %s", l.LayerID)
		}
		if v, _ := strconv.Atoi(sub[1]); v != m.Version-i {
			t.Errorf("layer %d is %s, want version %d", i, l.LayerID, m.Version-i)
		}
	}
}

func TestUpdateLockHonoursContext(t *testing.T) {
	s := newTestStack(t)
	inside := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := s.Update(context.Background(), func(*View) ([]Change, error) {
			close(inside)
			<-release
			return nil, nil
		})
		done <- err
	}()
	<-inside
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.Publish(ctx, []Change{write("x", "x", 0o644)}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v, want deadline exceeded", err)
	}
	// Another handle waits on the flock itself.
	other, _ := Open(s.Dir())
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := other.Publish(ctx2, []Change{write("x", "x", 0o644)}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("flock wait: error %v, want deadline exceeded", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	publish(t, other, write("x", "x", 0o644))
}

func TestUpdateDetectsForeignManifestChange(t *testing.T) {
	s := newTestStack(t)
	before := mustHead(t, s)
	s.hook = func(p publishStep) hookAction {
		if p == stepAfterDigest {
			m := mustHead(t, s)
			m.Version++
			if err := writeManifest(s.dir, m, nil); err != nil {
				t.Error(err)
			}
		}
		return hookContinue
	}
	_, err := s.Publish(context.Background(), []Change{write("x", "x", 0o644)})
	if err == nil || !strings.Contains(err.Error(), "active manifest changed: expected version 1, found version 2") {
		t.Fatalf("error %v", err)
	}
	s.hook = nil
	before.Version = 2
	assertUnchanged(t, s, before)
}

func TestFailNextPublishFailpoint(t *testing.T) {
	s := newTestStack(t)
	marker := filepath.Join(s.Dir(), metaDirName, FailNextPublishMarker)
	writeFile(t, marker, "", 0o644)

	// Without the env var the marker is ignored.
	t.Setenv(FailpointEnv, "")
	publish(t, s, write("a", "1", 0o644))
	if _, err := os.Stat(marker); err != nil {
		t.Fatal("marker consumed without the env var")
	}

	t.Setenv(FailpointEnv, "1")
	before := mustHead(t, s)
	if _, err := s.Publish(context.Background(), []Change{write("a", "2", 0o644)}); err == nil || !strings.Contains(err.Error(), FailNextPublishMarker) {
		t.Fatalf("error %v, want the failpoint", err)
	}
	if _, err := os.Stat(marker); !isNotExist(err) {
		t.Error("marker not removed")
	}
	assertUnchanged(t, s, before)
	if res := publish(t, s, write("a", "2", 0o644)); res.NoOp {
		t.Error("publish after the failpoint was a no-op")
	}
}
