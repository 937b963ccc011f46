package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

func TestObservabilityConfigRanges(t *testing.T) {
	tests := []struct {
		yaml, err string
	}{
		{"observability:\n  resource_stats:\n    max_disk_bytes: 131073\n", "not even"},
		{"observability:\n  resource_stats:\n    max_disk_bytes: 131070\n", "out of range"},
		{"observability:\n  resource_stats:\n    max_disk_bytes: 131072\n    sample_interval_ms: 250\n", ""},
		{"observability:\n  resource_stats:\n    sample_interval_ms: 249\n", "out of range"},
		{"observability:\n  max_disk_bytes: 1000\n", "out of range"},
		{"observability:\n  max_disk_bytes: 1048576\n", ""},
	}
	for _, tc := range tests {
		p := filepath.Join(t.TempDir(), "config.yml")
		if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load(p)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.err)
		}
	}
}

// TestLoadErrors: every refused configuration is a config_error naming the
// file and the key, and its cause stays visible to errors.Is.
func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, yml string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, path, msg string
		cause           error
	}{
		{"a directory", dir, "read config " + dir, syscall.EISDIR},
		{"unknown key", write("unknown.yml", "supervisor:\n  no_such_key: 1\n"), "no_such_key", nil},
		{"out of range", write("range.yml", "manager:\n  max_create_count: 0\n"), "manager.max_create_count: 0 is out of range", nil},
		{"not an enum value", write("enum.yml", "sandbox:\n  default_overlay: zfs\n"), `sandbox.default_overlay: "zfs" is not one of auto, kernel, fuse`, nil},
		{"bad YAML", write("bad.yml", "nonsense: [\n"), "config " + filepath.Join(dir, "bad.yml"), nil},
		{"relative export root", write("export-rel.yml", "manager:\n  export:\n    allowed_roots: [out]\n"), `manager.export.allowed_roots: "out" must be an absolute path other than /`, nil},
		{"export root /", write("export-root.yml", "manager:\n  export:\n    allowed_roots: [/]\n"), `manager.export.allowed_roots: "/" must be an absolute path other than /`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.path)
			if err == nil || c != nil {
				t.Fatalf("Load(%s) = %v, %v; want an error", tc.path, c, err)
			}
			var ce *catalog.Error
			if !errors.As(err, &ce) || ce.Kind != catalog.ConfigError || !strings.Contains(ce.Message, tc.msg) {
				t.Fatalf("error %v (as catalog.Error: %+v), want a config_error containing %q", err, ce, tc.msg)
			}
			if err.Error() != ce.Error() {
				t.Errorf("Error() = %q, want the envelope's %q", err.Error(), ce.Error())
			}
			if tc.cause != nil && !errors.Is(err, tc.cause) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.cause)
			}
		})
	}
}

// TestLoadAbsentAndMerge: an absent file is every default; a file replaces
// only the keys it names (objects merge, scalars and arrays replace).
func TestLoadAbsentAndMerge(t *testing.T) {
	dir := t.TempDir()
	c, err := Load(filepath.Join(dir, "absent.yml"))
	if err != nil || c.Manager.MaxCreateCount != 16 || len(c.Sandbox.HostPaths) == 0 {
		t.Fatalf("absent file: %+v, %v", c, err)
	}
	p := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(p, []byte("manager:\n  max_create_count: 2\nsandbox:\n  host_paths: [/usr]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Manager.MaxCreateCount != 2 || c.Manager.MaxSandboxes != 64 || strings.Join(c.Sandbox.HostPaths, ",") != "/usr" || c.Sandbox.DefaultOverlay != "auto" {
		t.Errorf("merged: max_create_count %d, max_sandboxes %d, host_paths %v, default_overlay %q",
			c.Manager.MaxCreateCount, c.Manager.MaxSandboxes, c.Sandbox.HostPaths, c.Sandbox.DefaultOverlay)
	}
}
