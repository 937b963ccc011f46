package catalog

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckPrivateDir covers what one user can arrange alone; a directory
// of another owner is tests/TestRuntimeDirSquatting's (a real second user).
func TestCheckPrivateDir(t *testing.T) {
	root := t.TempDir()
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(root, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	private := mk("private", 0o700)
	loose := mk("loose", 0o755)
	groupX := mk("group-x", 0o710)
	link := filepath.Join(root, "link")
	if err := os.Symlink(private, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir  string
		want string // "" = accepted; else a part of the config_error message
	}{
		{private, ""},
		{loose, "has mode 0755; it must be 0700 (fix: chmod 0700 " + loose + ")"},
		{groupX, "has mode 0710"},
		{link, "is a symlink"},
		{file, "is not a directory"},
	} {
		err := CheckPrivateDir("socket directory", tc.dir)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.dir, err)
			}
			continue
		}
		var ce *Error
		if !errors.As(err, &ce) || ce.Kind != ConfigError || !strings.Contains(ce.Message, tc.want) || !strings.Contains(ce.Message, tc.dir) {
			t.Errorf("%s: got %v, want a config_error with %q", tc.dir, err, tc.want)
			continue
		}
		if ce.Details["path"] != tc.dir || ce.Details["owner_uid"] != os.Geteuid() {
			t.Errorf("%s: details %v", tc.dir, ce.Details)
		}
	}
	if err := CheckPrivateDir("socket directory", filepath.Join(root, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing directory: %v", err)
	}
}

func TestStartReason(t *testing.T) {
	const earlier = `{"error":{"kind":"config_error","message":"an earlier start's reason","details":{}}}` + "\n"
	for _, tc := range []struct {
		name, written, want string
	}{
		{"envelope", "time=x level=INFO msg=probes\n" + `{"error":{"kind":"config_error","message":"another supervisor holds /d/supervisor.lock","details":{}}}` + "\n",
			"another supervisor holds /d/supervisor.lock"},
		{"error log line", "time=x level=INFO msg=a\ntime=x level=ERROR msg=\"supervisor failed\" err=boom\ntime=x level=INFO msg=b\n",
			`time=x level=ERROR msg="supervisor failed" err=boom`},
		{"panic", "panic: runtime error: index out of range\n\ngoroutine 1 [running]:\nmain.main()\n",
			"panic: runtime error: index out of range"},
		{"anything else", "time=x level=INFO msg=a\nkilled\n\n", "killed"},
		{"nothing written", "", ""},
	} {
		f, err := os.CreateTemp(t.TempDir(), "log")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(earlier); err != nil {
			t.Fatal(err)
		}
		from := int64(len(earlier))
		if _, err := f.WriteString(tc.written); err != nil {
			t.Fatal(err)
		}
		if got := startReason(f, from); got != tc.want {
			t.Errorf("%s: reason %q, want %q", tc.name, got, tc.want)
		}
		f.Close()
	}
}
