package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestExportKeepsGitProtectedOut (#27 item 1): layers that hold a git
// directory's protected and private files — written before publication
// protected them — are folded without them: a dir export never writes a
// config, a hook, info/, alternates or a gitlink into dest, never deletes
// or empties the destination's own, never replaces an existing object, and
// an archive never carries them either. Fold.KeptOut names them.
func TestExportKeepsGitProtectedOut(t *testing.T) {
	root := tempDir(t)
	ws := filepath.Join(root, "ws")
	obj := ".git/objects/ab/" + strings.Repeat("c", 38)
	writeFile(t, filepath.Join(ws, ".git", "config"), "[core]\n\tbare = false\n", 0o644)
	writeFile(t, filepath.Join(ws, ".git", "HEAD"), "ref: refs/heads/main\n", 0o644)
	writeFile(t, filepath.Join(ws, "a.txt"), "a\n", 0o644)
	s, _, err := Create(context.Background(), filepath.Join(root, "sbx", "layerstack"), ws, SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The older layers, through the storage writer (no publish planner).
	publish(t, s,
		write(".git/config", "[core]\n\tfsmonitor = touch /tmp/pwned\n", 0o644),
		write(".git/hooks/pre-commit", "#!/bin/sh\ntouch /tmp/pwned\n", 0o755),
		write(".git/hooks/post-checkout", "#!/bin/sh\ntouch /tmp/pwned\n", 0o755),
		write(".git/info/exclude", "*\n", 0o644),
		write(".git/objects/info/alternates", "/tmp/evil/objects\n", 0o644),
		write(".git/index", "DIRC", 0o644),
		write(".git/logs/HEAD", "log\n", 0o644),
		write(".git/refs/heads/old", "0123\n", 0o644),
		write(obj, "agent's copy", 0o444),
		write(".GIT/config", "[core]\n\tfsmonitor = touch /tmp/pwned\n", 0o644),
		write("sub/.git", "gitdir: /tmp/evil\n", 0o644),
		write("nested/.git/hooks/post-commit", "#!/bin/sh\ntouch /tmp/pwned\n", 0o755),
		Change{Kind: ChangeSymlink, Path: ".git/objects/pack", Target: "/tmp/evil"},
		write("ok.txt", "ok\n", 0o644),
	)
	publish(t, s,
		Change{Kind: ChangeDelete, Path: ".git/description"},
		Change{Kind: ChangeDelete, Path: ".git/hooks/pre-push"},
		Change{Kind: ChangeOpaqueDir, Path: ".git/refs", Mode: 0o755},
		write(".git/refs/heads/agent", "4567\n", 0o644),
		Change{Kind: ChangeOpaqueDir, Path: "vendor", Mode: 0o755},
		write("vendor/new.txt", "new\n", 0o644),
	)
	f := mustFold(t, s, mustHead(t, s))
	wantOut := []string{".GIT/config", ".git/config", ".git/description", ".git/hooks", ".git/hooks/post-checkout",
		".git/hooks/pre-commit", ".git/hooks/pre-push", ".git/index", ".git/info", ".git/info/exclude", ".git/logs",
		".git/logs/HEAD", ".git/objects/info/alternates", ".git/objects/pack", "nested/.git/hooks", "nested/.git/hooks/post-commit", "sub/.git"}
	if !slices.Equal(f.KeptOut, wantOut) {
		t.Errorf("KeptOut\n%q\nwant\n%q", f.KeptOut, wantOut)
	}

	// The destination: the user's own repository.
	dest := filepath.Join(root, "dest")
	writeFile(t, filepath.Join(dest, ".git", "config"), "user config\n", 0o644)
	writeFile(t, filepath.Join(dest, ".git", "description"), "desc\n", 0o644)
	writeFile(t, filepath.Join(dest, ".git", "hooks", "pre-push"), "#!/bin/sh\n# the user's hook\n", 0o755)
	writeFile(t, filepath.Join(dest, ".git", "index"), "user index", 0o644)
	writeFile(t, filepath.Join(dest, ".git", "refs", "heads", "main"), "89ab\n", 0o644)
	writeFile(t, filepath.Join(dest, obj), "the user's object", 0o444)
	writeFile(t, filepath.Join(dest, "vendor", ".git", "config"), "vendor config\n", 0o644)
	writeFile(t, filepath.Join(dest, "vendor", "old.txt"), "old\n", 0o644)
	if _, err := f.ExportDir(context.Background(), dest, ExportCaps{}, nil); err != nil {
		t.Fatalf("ExportDir: %v", err)
	}
	for p, want := range map[string]string{
		".git/config": "user config\n", ".git/description": "desc\n", ".git/hooks/pre-push": "#!/bin/sh\n# the user's hook\n",
		".git/index": "user index", ".git/refs/heads/main": "89ab\n", ".git/refs/heads/agent": "4567\n",
		obj: "the user's object", "vendor/.git/config": "vendor config\n", "vendor/new.txt": "new\n", "ok.txt": "ok\n",
	} {
		if b, err := os.ReadFile(filepath.Join(dest, p)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", p, b, err, want)
		}
	}
	for _, p := range []string{".git/hooks/pre-commit", ".git/hooks/post-checkout", ".git/info", ".git/objects/info/alternates",
		".git/logs", ".GIT/config", "sub/.git", ".git/refs/heads/old", "nested/.git/hooks", ".git/objects/pack", "vendor/old.txt"} {
		if _, err := os.Lstat(filepath.Join(dest, p)); !isNotExist(err) {
			t.Errorf("%s exists after the export: %v", p, err)
		}
	}

	// An archive carries none of them.
	var buf bytes.Buffer
	if _, err := f.ExportTar(context.Background(), &buf, 0, ExportCaps{}, nil); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n := h.Name
		for _, p := range wantOut {
			if strings.TrimSuffix(n, "/") == p || strings.HasPrefix(n, p+"/") {
				t.Errorf("the archive carries %s", n)
			}
		}
	}
}

// TestExportKeepsExistingDirModes (#27 item 2): a directory that exists in
// dest keeps its mode (0700 stays 0700, a read-only one stays read-only
// although files were written into it); a new one gets the layer's mode.
func TestExportKeepsExistingDirModes(t *testing.T) {
	s := newTestStack(t)
	publish(t, s,
		Change{Kind: ChangeDirectory, Path: "private", Mode: 0o755},
		write("private/x.txt", "x\n", 0o644),
		Change{Kind: ChangeDirectory, Path: "ro", Mode: 0o777},
		write("ro/y.txt", "y\n", 0o644),
		Change{Kind: ChangeDirectory, Path: "fresh", Mode: 0o750},
		write("fresh/z.txt", "z\n", 0o644),
	)
	f := mustFold(t, s, mustHead(t, s))
	dest := tempDir(t)
	mkdir(t, filepath.Join(dest, "private"), 0o700)
	mkdir(t, filepath.Join(dest, "ro"), 0o555)
	if _, err := f.ExportDir(context.Background(), dest, ExportCaps{}, nil); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"private": 0o700, "ro": 0o555, "fresh": 0o750} {
		fi, err := os.Lstat(filepath.Join(dest, p))
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v %v, want %v", p, fi.Mode().Perm(), err, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dest, "ro", "y.txt")); err != nil || string(b) != "y\n" {
		t.Errorf("ro/y.txt: %q %v", b, err)
	}
}
