package layers

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestCreateSnapshot(t *testing.T) {
	root := tempDir(t)
	ws := filepath.Join(root, "ws")
	mkdir(t, ws, 0o750)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "hello\n", 0o640)
	if err := os.Chtimes(filepath.Join(ws, "src", "a.txt"), fixedTime, fixedTime); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(ws, "run.sh"), "#!/bin/sh\n", 0o755)
	if err := os.Link(filepath.Join(ws, "src", "a.txt"), filepath.Join(ws, "hardlink")); err != nil {
		t.Fatal(err)
	}
	symlink(t, "src/a.txt", filepath.Join(ws, "link"))
	symlink(t, "/nonexistent/absolute", filepath.Join(ws, "broken"))
	mkdir(t, filepath.Join(ws, "empty"), 0o700)
	mkdir(t, filepath.Join(ws, "sticky"), fs.ModeSticky|0o777)
	writeFile(t, filepath.Join(ws, "ro", "f"), "ro\n", 0o444)
	mkdir(t, filepath.Join(ws, "ro"), 0o555)
	writeFile(t, filepath.Join(ws, "setuid"), "x", 0o4755)

	progress := 0
	dir := filepath.Join(root, "data", "sandboxes", "sbx-1", "layerstack")
	s, stats, err := Create(context.Background(), dir, ws, SnapshotOptions{Progress: func(files, dirs int) { progress++ }})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if progress == 0 {
		t.Error("Progress never called")
	}
	want := SnapshotStats{Files: 5, Dirs: 4, Symlinks: 2, Bytes: 6 + 10 + 6 + 3 + 1}
	stats.BaseRootHash, want.BaseRootHash = "", ""
	if stats != want {
		t.Errorf("stats %+v, want %+v", stats, want)
	}
	base := filepath.Join(dir, "layers", BaseLayerID)
	checks := []struct {
		rel    string
		mode   fs.FileMode
		target string
	}{
		{"", fs.ModeDir | 0o750, ""},
		{"src", fs.ModeDir | 0o755, ""},
		{"src/a.txt", 0o640, ""},
		{"hardlink", 0o640, ""},
		{"run.sh", 0o755, ""},
		{"link", fs.ModeSymlink | 0o777, "src/a.txt"},
		{"broken", fs.ModeSymlink | 0o777, "/nonexistent/absolute"},
		{"empty", fs.ModeDir | 0o700, ""},
		{"sticky", fs.ModeDir | fs.ModeSticky | 0o777, ""},
		{"ro", fs.ModeDir | 0o555, ""},
		{"ro/f", 0o444, ""},
		{"setuid", 0o755, ""},
	}
	for _, c := range checks {
		fi, err := os.Lstat(filepath.Join(base, c.rel))
		if err != nil {
			t.Errorf("%s: %v", c.rel, err)
			continue
		}
		if fi.Mode() != c.mode {
			t.Errorf("%s: mode %v, want %v", c.rel, fi.Mode(), c.mode)
		}
		if c.target != "" {
			if got, _ := os.Readlink(filepath.Join(base, c.rel)); got != c.target {
				t.Errorf("%s: target %q, want %q", c.rel, got, c.target)
			}
		}
	}
	for _, rel := range []string{"src/a.txt", "hardlink"} {
		fi, _ := os.Lstat(filepath.Join(base, rel))
		if !fi.ModTime().Equal(fixedTime) {
			t.Errorf("%s: mtime %v, want %v", rel, fi.ModTime(), fixedTime)
		}
		if n := fi.Sys().(*syscall.Stat_t).Nlink; n != 1 {
			t.Errorf("%s: nlink %d, want an independent file", rel, n)
		}
	}
	wsHash, err := BaseRootHash(ws)
	if err != nil {
		t.Fatal(err)
	}
	layerHash, err := BaseRootHash(base)
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := s.StoredDigest(BaseLayerID)
	if wsHash != layerHash || stored != wsHash {
		t.Errorf("hashes: workspace %s layer %s stored %s", wsHash, layerHash, stored)
	}
	m := mustHead(t, s)
	if m.Version != 1 || len(m.Layers) != 1 || m.Layers[0] != (LayerRef{BaseLayerID, "layers/" + BaseLayerID}) {
		t.Errorf("manifest %+v", m)
	}
	var w map[string]string
	raw, _ := os.ReadFile(filepath.Join(dir, "workspace.json"))
	if err := json.Unmarshal(raw, &w); err != nil {
		t.Fatal(err)
	}
	if w["workspace_root"] != ws || w["layer_stack_root"] != dir || w["base_root_hash"] != wsHash {
		t.Errorf("workspace.json %s", raw)
	}
	if got := names(t, filepath.Join(dir, "staging")); len(got) != 0 {
		t.Errorf("staging not empty: %v", got)
	}
	// The view of the base shows the workspace.
	v := s.View(m)
	if got := readString(t, v, "src/a.txt"); got != "hello\n" {
		t.Errorf("view content %q", got)
	}

	// A sibling shares the base through hardlinks.
	sib, err := CreateSibling(context.Background(), filepath.Join(root, "data", "sandboxes", "sbx-2", "layerstack"), s)
	if err != nil {
		t.Fatalf("CreateSibling: %v", err)
	}
	sibBase := filepath.Join(sib.Dir(), "layers", BaseLayerID)
	a, _ := os.Lstat(filepath.Join(base, "src/a.txt"))
	b, _ := os.Lstat(filepath.Join(sibBase, "src/a.txt"))
	if !os.SameFile(a, b) {
		t.Error("sibling file is not a hardlink of the finished base")
	}
	if h, err := BaseRootHash(sibBase); err != nil || h != wsHash {
		t.Errorf("sibling hash %s, %v", h, err)
	}
	if fi, _ := os.Lstat(filepath.Join(sibBase, "ro")); fi.Mode() != fs.ModeDir|0o555 {
		t.Errorf("sibling ro mode %v", fi.Mode())
	}
	if fi, _ := os.Lstat(sibBase); fi.Mode() != fs.ModeDir|0o750 {
		t.Errorf("sibling root mode %v", fi.Mode())
	}
	sw, err := sib.Workspace()
	if err != nil || sw.WorkspaceRoot != ws || sw.LayerStackRoot != sib.Dir() || sw.BaseRootHash != wsHash {
		t.Errorf("sibling workspace %+v %v", sw, err)
	}
	if sm := mustHead(t, sib); sm.Version != 1 || sm.RootHash() != m.RootHash() {
		t.Errorf("sibling manifest %+v", sm)
	}
	// Remove copes with read-only directories.
	if err := sib.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sib.Dir()); !isNotExist(err) {
		t.Errorf("sibling dir still there: %v", err)
	}
}

func TestCreateRefuses(t *testing.T) {
	tests := []struct {
		name    string
		build   func(t *testing.T, ws string)
		opt     SnapshotOptions
		reason  string
		relPath string
	}{
		{"fifo", func(t *testing.T, ws string) {
			writeFile(t, filepath.Join(ws, "sub", "ok.txt"), "x", 0o644)
			if err := mkfifo(filepath.Join(ws, "sub", "fifo")); err != nil {
				t.Skip(err)
			}
		}, SnapshotOptions{}, ReasonSpecialFile, "sub/fifo"},
		{"socket", func(t *testing.T, ws string) {
			l, err := net.Listen("unix", filepath.Join(ws, "s.sock"))
			if err != nil {
				t.Skip(err)
			}
			t.Cleanup(func() { l.Close() })
		}, SnapshotOptions{}, ReasonSpecialFile, "s.sock"},
		{"non_utf8_name", func(t *testing.T, ws string) {
			writeFile(t, filepath.Join(ws, "d", "bad\xff.txt"), "x", 0o644)
		}, SnapshotOptions{}, ReasonInvalidName, "d/bad\xff.txt"},
		{"too_many_entries", func(t *testing.T, ws string) {
			writeFile(t, filepath.Join(ws, "a"), "x", 0o644)
			writeFile(t, filepath.Join(ws, "b"), "x", 0o644)
			writeFile(t, filepath.Join(ws, "c"), "x", 0o644)
		}, SnapshotOptions{MaxEntries: 2}, ReasonTooManyEntries, "c"},
		{"changed_during_copy", func(t *testing.T, ws string) {
			writeFile(t, filepath.Join(ws, "busy.log"), "x", 0o644)
		}, SnapshotOptions{afterCopy: func(rel string, attempt int) {
			f, _ := os.OpenFile(rel, os.O_APPEND|os.O_WRONLY, 0)
			if f != nil {
				f.WriteString("more")
				f.Close()
			}
		}}, ReasonChanged, "busy.log"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := tempDir(t)
			ws := filepath.Join(root, "ws")
			mkdir(t, ws, 0o755)
			tc.build(t, ws)
			attempts := 0
			if hook := tc.opt.afterCopy; hook != nil {
				tc.opt.afterCopy = func(rel string, attempt int) {
					attempts++
					hook(filepath.Join(ws, rel), attempt)
				}
			}
			dir := filepath.Join(root, "ls")
			_, _, err := Create(context.Background(), dir, ws, tc.opt)
			var se *SnapshotError
			if !errors.As(err, &se) {
				t.Fatalf("error %v, want *SnapshotError", err)
			}
			if se.Reason != tc.reason || se.Path != tc.relPath {
				t.Errorf("got %+v, want reason %s path %q", se, tc.reason, tc.relPath)
			}
			if _, err := os.Lstat(dir); !isNotExist(err) {
				t.Errorf("stack dir left behind: %v", err)
			}
			if tc.reason == ReasonChanged && attempts != 1+maxCopyRetries {
				t.Errorf("copy attempts %d, want %d", attempts, 1+maxCopyRetries)
			}
		})
	}
}

func TestCreateRecopiesAChangedFile(t *testing.T) {
	root := tempDir(t)
	ws := filepath.Join(root, "ws")
	writeFile(t, filepath.Join(ws, "f"), "old", 0o644)
	opt := SnapshotOptions{afterCopy: func(rel string, attempt int) {
		if attempt == 0 {
			time.Sleep(10 * time.Millisecond)
			os.WriteFile(filepath.Join(ws, rel), []byte("newer"), 0o644)
		}
	}}
	s, stats, err := Create(context.Background(), filepath.Join(root, "ls"), ws, opt)
	if err != nil {
		t.Fatal(err)
	}
	if got := readString(t, s.View(mustHead(t, s)), "f"); got != "newer" || stats.Bytes != 5 {
		t.Errorf("content %q bytes %d", got, stats.Bytes)
	}
}

func TestCreateMisc(t *testing.T) {
	t.Run("existing_nonempty_dir_kept", func(t *testing.T) {
		root := tempDir(t)
		ws := filepath.Join(root, "ws")
		writeFile(t, filepath.Join(ws, "f"), "x", 0o644)
		dir := filepath.Join(root, "ls")
		writeFile(t, filepath.Join(dir, "precious"), "x", 0o644)
		if _, _, err := Create(context.Background(), dir, ws, SnapshotOptions{}); err == nil {
			t.Fatal("Create into a non-empty directory succeeded")
		}
		if _, err := os.Stat(filepath.Join(dir, "precious")); err != nil {
			t.Errorf("existing content removed: %v", err)
		}
	})
	t.Run("stack_inside_workspace", func(t *testing.T) {
		ws := tempDir(t)
		writeFile(t, filepath.Join(ws, "f"), "x", 0o644)
		dir := filepath.Join(ws, "zz", "ls")
		if _, _, err := Create(context.Background(), dir, ws, SnapshotOptions{}); err == nil {
			t.Fatal("Create with the stack inside the workspace succeeded")
		}
		if _, err := os.Lstat(dir); !isNotExist(err) {
			t.Errorf("stack dir left behind: %v", err)
		}
	})
	t.Run("missing_workspace", func(t *testing.T) {
		root := tempDir(t)
		dir := filepath.Join(root, "ls")
		if _, _, err := Create(context.Background(), dir, filepath.Join(root, "nope"), SnapshotOptions{}); err == nil {
			t.Fatal("Create of a missing workspace succeeded")
		}
		if _, err := os.Lstat(dir); !isNotExist(err) {
			t.Errorf("stack dir left behind: %v", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		root := tempDir(t)
		ws := filepath.Join(root, "ws")
		writeFile(t, filepath.Join(ws, "f"), "x", 0o644)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		dir := filepath.Join(root, "ls")
		if _, _, err := Create(ctx, dir, ws, SnapshotOptions{}); !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want context.Canceled", err)
		}
		if _, err := os.Lstat(dir); !isNotExist(err) {
			t.Errorf("stack dir left behind: %v", err)
		}
	})
}
