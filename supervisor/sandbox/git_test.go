package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gitHookNames are hooks that git plumbing and porcelain run on their own.
var gitHookNames = []string{"reference-transaction", "post-index-change", "post-checkout", "post-commit",
	"pre-commit", "pre-auto-gc", "post-rewrite", "pre-push", "post-merge"}

// hostileRepo makes a repository whose hooks (in .git/hooks and in a
// core.hooksPath of its own) and fsmonitor write a marker into marks.
func hostileRepo(t *testing.T) (root, marks string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	dir := t.TempDir()
	root, marks = filepath.Join(dir, "repo"), filepath.Join(dir, "marks")
	for _, d := range []string{root, marks, filepath.Join(dir, "userhooks")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x",
			"GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(root, "a.txt"), []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", "a.txt")
	git("commit", "-q", "-m", "one")
	// Hooks are installed after the setup commit, so no marker comes from
	// the test's own git.
	for label, hd := range map[string]string{"repo-hooks": filepath.Join(root, ".git", "hooks"), "user-hooks": filepath.Join(dir, "userhooks")} {
		for _, h := range gitHookNames {
			script := "#!/bin/sh\necho " + h + " >> " + filepath.Join(marks, label+"-"+h) + "\n"
			if err := os.WriteFile(filepath.Join(hd, h), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	fsmon := filepath.Join(dir, "fsmonitor.sh")
	if err := os.WriteFile(fsmon, []byte("#!/bin/sh\necho fsmonitor >> "+filepath.Join(marks, "fsmonitor")+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	git("config", "core.fsmonitor", fsmon)
	git("config", "core.hooksPath", filepath.Join(dir, "userhooks"))
	if err := os.WriteFile(filepath.Join(root, "dirty.txt"), []byte("d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The test's own git must fire them (the fixture is armed).
	git("status", "--porcelain")
	if n := markers(t, marks); len(n) == 0 {
		t.Fatal("the fixture's fsmonitor did not fire for the test's own git status")
	}
	if err := os.RemoveAll(marks); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(marks, 0o755); err != nil {
		t.Fatal(err)
	}
	return root, marks
}

func markers(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestGitRunsNoRepositoryHooks: every git the supervisor runs (the probe of
// create_sandbox, the git_ref snapshot, the git export's plumbing: blobs,
// trees, commits, update-ref, notes) runs neither the repository's hooks
// (its own .git/hooks or its core.hooksPath) nor its fsmonitor (#27 item 3).
func TestGitRunsNoRepositoryHooks(t *testing.T) {
	root, marks := hostileRepo(t)
	ctx := context.Background()

	g := ProbeGit(ctx, root)
	if g == nil || !g.Dirty || g.Branch == nil || *g.Branch != "main" {
		t.Fatalf("probe: %+v", g)
	}
	dir, _, err := GitRefSnapshot(ctx, root, "main", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "tree", "a.txt")); err != nil || string(b) != "a\n" {
		t.Fatalf("snapshot: %q %v", b, err)
	}

	r := &GitRepo{Ctx: ctx, GitDir: g.GitDir, Tmp: t.TempDir()}
	tree, err := r.TreeOf("main")
	if err != nil {
		t.Fatal(err)
	}
	oid, err := r.HashBytes([]byte("b\n"))
	if err != nil {
		t.Fatal(err)
	}
	tree["b.txt"] = GitEntry{Mode: "100644", OID: oid}
	to, err := r.WriteTree(tree)
	if err != nil {
		t.Fatal(err)
	}
	parent := strings.TrimSpace(must(r.Run(nil, nil, "rev-parse", "main")))
	id := Ident{Name: "a", Email: "a@x", Date: "2026-01-01T00:00:00Z"}
	commit, err := r.CommitTree(to, parent, "two\n", id, id)
	if err != nil {
		t.Fatal(err)
	}
	// The identity is passed as the git export passes it (CI's fresh user
	// has no global git config).
	ident := []string{"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x"}
	if _, err := r.Run(ident, nil, "update-ref", "-m", "test", "refs/heads/agents", commit, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(ident, strings.NewReader("note\n"), "notes", "--ref=agent-trace", "add", "-f", "-F", "-", commit); err != nil {
		t.Fatal(err)
	}
	if got := markers(t, marks); len(got) != 0 {
		t.Fatalf("the supervisor's git ran the repository's programs: %v", got)
	}
}

func must(s string, err error) string {
	if err != nil {
		panic(err)
	}
	return s
}

// TestCheckBranchName: the names export_changes --format git refuses (#27
// item 4), each also refused by `git check-ref-format --branch` unless it
// is one of the supervisor's own refusals.
func TestCheckBranchName(t *testing.T) {
	_, gitErr := exec.LookPath("git")
	for _, tc := range []struct {
		name string
		ok   bool
		ours bool // refused by the supervisor although git accepts it
	}{
		{"agents", true, false},
		{"feature/x-1", true, false},
		{"a.b", true, false},
		{"ünïcode", true, false},
		{"HEAD", false, true},
		{"refs/heads/main", false, true},
		{"refs/notes/agent-trace", false, true},
		{"refs/x", false, true},
		{"-x", false, false},
		{"", false, false},
		{"@", false, true}, // git expands @ to HEAD
		{"a..b", false, false},
		{"x.lock", false, false},
		{"a/x.lock/b", false, false},
		{"a b", false, false},
		{"a~1", false, false},
		{"a^", false, false},
		{"a:b", false, false},
		{"a?", false, false},
		{"a*", false, false},
		{"a[b", false, false},
		{"a\\b", false, false},
		{"a@{1}", false, false},
		{"@{-1}", false, true}, // git expands it to a previous branch
		{".hidden", false, false},
		{"a/.b", false, false},
		{"a/", false, false},
		{"/a", false, false},
		{"a//b", false, false},
		{"a.", false, false},
		{"a\tb", false, false},
		{"a\x7fb", false, false},
	} {
		err := CheckBranchName(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("CheckBranchName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if gitErr != nil || tc.ours || tc.name == "" || strings.HasPrefix(tc.name, "-") {
			continue // git check-ref-format --branch takes "-x" as an option
		}
		gerr := exec.Command("git", "check-ref-format", "--branch", tc.name).Run()
		if (gerr == nil) != tc.ok {
			t.Errorf("git check-ref-format --branch %q: %v, but the table says ok=%v", tc.name, gerr, tc.ok)
		}
	}
}
