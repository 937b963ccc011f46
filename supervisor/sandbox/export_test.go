package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// TestCheckExportDest (#27 item 2): the positive destination rule.
func TestCheckExportDest(t *testing.T) {
	base := t.TempDir()
	ws, allowed, outside := filepath.Join(base, "ws"), filepath.Join(base, "allowed"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(ws, "sub"), filepath.Join(ws, ".git", "hooks"), allowed, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(ws, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ws, filepath.Join(base, "wslink")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	roots := []string{filepath.Join(base, "wslink"), allowed}
	for _, tc := range []struct {
		dest, format string
		root, rel    string // "" root: refused
		msg          string
	}{
		{filepath.Join(base, "wslink"), "dir", ws, "", ""},
		{filepath.Join(ws, "sub", "new", "deeper"), "dir", ws, "sub/new/deeper", ""},
		{filepath.Join(base, "wslink", "sub"), "dir", ws, "sub", ""},
		{filepath.Join(allowed, "x"), "dir", allowed, "x", ""},
		{filepath.Join(allowed, "x.tar"), "tar", allowed, "x.tar", ""},
		{filepath.Join(outside, "x"), "dir", "", "", "below the sandbox's workspace root"},
		{base, "dir", "", "", "below the sandbox's workspace root"},
		{"/home", "dir", "", "", "below the sandbox's workspace root"},
		{filepath.Join(ws, "escape"), "dir", "", "", "symlink"},
		{filepath.Join(ws, "escape", "x"), "dir", "", "", "symlink"},
		{filepath.Join(ws, "escape", "x.tar"), "tar", "", "", "symlink"},
		{filepath.Join(ws, ".git", "hooks"), "dir", "", "", "git directory"},
		{filepath.Join(ws, ".GIT"), "dir", "", "", "git directory"},
		{filepath.Join(ws, "file"), "dir", "", "", "not a directory"},
		{filepath.Join(ws, "file", "x"), "dir", "", "", "not a directory"},
		{filepath.Join(ws, "sub"), "tar", "", "", "is a directory"},
		{filepath.Join(ws, "missing", "x.tar"), "tar", "", "", "parent directory of dest does not exist"},
		{"relative", "dir", "", "", "absolute"},
	} {
		got, err := CheckExportDest(tc.dest, tc.format, nil, roots)
		if tc.root == "" {
			var ce *catalog.Error
			if !errors.As(err, &ce) || ce.Kind != catalog.InvalidRequest || !strings.Contains(ce.Message, tc.msg) {
				t.Errorf("%s (%s): %v, want invalid_request saying %q", tc.dest, tc.format, err, tc.msg)
			}
			continue
		}
		if err != nil || got.Root != ws && got.Root != allowed || got.Root != tc.root || got.Rel != tc.rel {
			t.Errorf("%s (%s) = %+v, %v; want root %s rel %q", tc.dest, tc.format, got, err, tc.root, tc.rel)
		}
	}
}
