package layers

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestQuoteDiffPath (#27 item 5): diff header names are quoted as git
// quotes them (core.quotePath=true, its default); where git is installed,
// its own diff of the same file names is the reference.
func TestQuoteDiffPath(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"a/plain.txt", "a/plain.txt"},
		{"a/with space", "a/with space"},
		{"a/nl\n+++ b/<img src=x onerror=alert(1)>\n@@ -0,0 +1 @@\n+<img>", `"a/nl\n+++ b/<img src=x onerror=alert(1)>\n@@ -0,0 +1 @@\n+<img>"`},
		{"a/q\"uote", `"a/q\"uote"`},
		{"a/back\\slash", `"a/back\\slash"`},
		{"a/tab\there", `"a/tab\there"`},
		{"a/cr\rbell\a", `"a/cr\rbell\a"`},
		{"a/esc\x1b[31m", `"a/esc\033[31m"`},
		{"a/del\x7f", `"a/del\177"`},
		{"a/ünï", `"a/\303\274n\303\257"`},
	} {
		if got := QuoteDiffPath(tc.name); got != tc.want {
			t.Errorf("QuoteDiffPath(%q) = %s, want %s", tc.name, got, tc.want)
		}
	}
	if _, err := exec.LookPath("git"); err != nil {
		return
	}
	dir := t.TempDir()
	names := []string{"nl\n+++ bx", "q\"uote", "back\\slash", "tab\there", "esc\x1b[31m", "del\x7f", "ünï", "plain"}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		cmd := exec.Command("git", "-c", "core.quotePath=true", "diff", "--no-index", "--no-color", "--", "/dev/null", n)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
		out, _ := cmd.Output()
		var plus string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "+++ ") {
				// git ends a name holding a space with a tab (GNU diff's
				// cue that no timestamp follows); our headers carry no
				// timestamps, so none is written.
				plus = strings.TrimSuffix(strings.TrimPrefix(l, "+++ "), "\t")
				break
			}
		}
		if want := QuoteDiffPath("b/" + n); plus != want {
			t.Errorf("git writes +++ %s for %q, QuoteDiffPath %s", plus, n, want)
		}
	}
}
