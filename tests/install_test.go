package tests

import (
	"debug/elf"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGoBuildIsAProduct is what `go install …/cmd/...` gives (issue 31):
// `go build ./cmd/...` of a git checkout, with nothing else (no C exec shim
// next to the supervisor, no -ldflags), reports a real version in every
// binary and runs commands in a sandbox made from a Docker image, through
// the Go exec shim started by the host's dynamic loader (the supervisor is
// built with cgo, as go install does wherever a C compiler is installed).
func TestGoBuildIsAProduct(t *testing.T) {
	requireDocker(t)
	src := t.TempDir()
	copySource(t, "..", src)
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = src
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	git("add", "-A")
	git("commit", "-q", "-m", "checkout")
	rev := git("rev-parse", "HEAD")

	bins := t.TempDir()
	_ = os.Chmod(bins, 0o755)
	build := exec.Command("go", "build", "-o", bins+"/", "./cmd/...")
	build.Dir = src
	// CI's GOFLAGS=-buildvcs=false would leave nothing to report: this is
	// the build a user's go install or go build makes.
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=true", "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/...: %v\n%s", err, out)
	}
	ents, err := os.ReadDir(bins)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if got := strings.Join(names, " "); got != "sandbox-manager-cli sandbox-mcp sandbox-observability-cli sandbox-runtime-cli sandbox-supervisor" {
		t.Fatalf("go build ./cmd/... made %s", got)
	}
	if f, err := elf.Open(filepath.Join(bins, "sandbox-supervisor")); err != nil {
		t.Fatal(err)
	} else {
		dynamic := false
		for _, p := range f.Progs {
			dynamic = dynamic || p.Type == elf.PT_INTERP
		}
		f.Close()
		if !dynamic {
			t.Fatal("the supervisor built with CGO_ENABLED=1 is static: the loader path is not tested")
		}
	}

	for _, argv := range [][]string{
		{"sandbox-supervisor", "version"}, {"sandbox-mcp", "--version"}, {"sandbox-manager-cli", "--version"},
		{"sandbox-runtime-cli", "--version"}, {"sandbox-observability-cli", "--version"},
	} {
		out, err := exec.Command(filepath.Join(bins, argv[0]), argv[1:]...).Output()
		v := strings.TrimSpace(string(out))
		if err != nil || v == "dev" || !strings.Contains(v, rev[:12]) {
			t.Errorf("%v: %q (%v), want a version naming revision %s", argv, v, err, rev[:12])
		}
	}

	e := newEnv(t)
	e.bins = bins
	e.start()
	root := e.project(map[string]string{"README.md": "project\n"})
	sb := e.ok("sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", root, "--image", busyboxImage)
	id := sb["id"].(string)
	out := e.shell(id, `esbx-image-only && cat /workspace/README.md && grep CapEff /proc/self/status && echo made > /workspace/made.txt`)
	for _, want := range []string{"only in the image: from-image", "project", "CapEff:\t00000000880024ff"} {
		if !strings.Contains(out, want) {
			t.Errorf("image command output lacks %q:\n%s", want, out)
		}
	}
	// The binary's and the loader's descriptors are closed before the
	// command runs.
	fds := e.shell(id, `ls -l /proc/self/fd/`)
	for _, leak := range []string{"ld-linux", "libc", "sandbox-supervisor"} {
		if strings.Contains(fds, leak) {
			t.Errorf("a command inherits a descriptor of %s:\n%s", leak, fds)
		}
	}
}

// copySource copies the module's files (no .git, no build output) to dst.
func copySource(t *testing.T, from, dst string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if d.IsDir() && (rel == ".git" || rel == "bin" || rel == "dist" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type().IsRegular():
			if rel == ".git" {
				return nil // a worktree's .git file
			}
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			info, err := in.Stat()
			if err != nil {
				return err
			}
			o, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
			if err != nil {
				return err
			}
			if _, err := io.Copy(o, in); err != nil {
				o.Close()
				return err
			}
			return o.Close()
		}
		return nil // symlinks and others: none in the module
	})
	if err != nil {
		t.Fatalf("copy source: %v", err)
	}
}
