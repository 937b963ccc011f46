package sandbox

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// CheckWorkspaceRoot applies create_sandbox's workspace_root rules and
// returns the path with symlinks resolved. own are the supervisor's
// directories (data, config, runtime), which a workspace may neither be
// inside of nor contain; roots, when not nil, are the configured workspace
// roots it must be under.
func CheckWorkspaceRoot(p string, own, roots []string) (string, error) {
	bad := func(format string, a ...any) error {
		return catalog.Errorf(catalog.InvalidRequest, format, a...).With("workspace_root", p)
	}
	if !filepath.IsAbs(p) {
		return "", bad("workspace_root must be an absolute path: %s", p)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", bad("workspace_root does not exist: %s", p)
	}
	st, err := os.Stat(real)
	if err != nil || !st.IsDir() {
		return "", bad("workspace_root is not a directory: %s", p)
	}
	if real == "/" {
		return "", bad("workspace_root must not be /")
	}
	for _, d := range own {
		rd, err := filepath.EvalSymlinks(d)
		if err != nil {
			rd = d
		}
		if Within(real, rd) || Within(rd, real) {
			return "", bad("workspace_root must not be inside, equal to or contain the supervisor's directory %s", d)
		}
	}
	if roots != nil && !UnderAny(real, roots) {
		return "", bad("workspace_root is not under a configured workspace root")
	}
	return real, nil
}

// Within reports whether p is dir or below it.
func Within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// UnderAny reports whether p is within one of roots (symlinks of the roots
// resolved).
func UnderAny(p string, roots []string) bool {
	for _, r := range roots {
		rr, err := filepath.EvalSymlinks(r)
		if err != nil {
			rr = filepath.Clean(r)
		}
		if Within(p, rr) {
			return true
		}
	}
	return false
}

// IsRoot reports whether p is one of roots itself.
func IsRoot(p string, roots []string) bool {
	for _, r := range roots {
		if filepath.Clean(r) == p {
			return true
		}
	}
	return false
}
