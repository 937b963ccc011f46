package layers

import "testing"

func TestClassifyGit(t *testing.T) {
	const obj = "0123456789abcdef0123456789abcdef01234567"
	cases := []struct {
		path  string
		isDir bool
		want  GitKind
		dir   string
	}{
		{"src/a.go", false, GitNone, ""},
		{".gitignore", false, GitNone, ""},
		{".git", true, GitDirItself, ".git"},
		{".git", false, GitProtected, ""},
		{"sub/.git", false, GitProtected, "sub"},
		{".git/config", false, GitProtected, ".git"},
		{".git/config.worktree", false, GitProtected, ".git"},
		{".git/hooks", true, GitProtected, ".git"},
		{".git/hooks/pre-commit", false, GitProtected, ".git"},
		{".git/info/exclude", false, GitProtected, ".git"},
		{".git/info/attributes", false, GitProtected, ".git"},
		{".git/commondir", false, GitProtected, ".git"},
		{".git/objects/info/alternates", false, GitProtected, ".git"},
		{".git/worktrees/w/gitdir", false, GitProtected, ".git"},
		{".git/index", false, GitPrivate, ".git"},
		{".git/index.lock", false, GitPrivate, ".git"},
		{".git/COMMIT_EDITMSG", false, GitPrivate, ".git"},
		{".git/logs/HEAD", false, GitPrivate, ".git"},
		{".git/logs/refs/heads/main", false, GitPrivate, ".git"},
		{".git/ORIG_HEAD", false, GitPrivate, ".git"},
		{".git/rebase-merge/done", false, GitPrivate, ".git"},
		{".git/refs/heads/main.lock", false, GitPrivate, ".git"},
		{".git/objects/info/commit-graph", false, GitPrivate, ".git"},
		{".git/objects/pack/pack-" + obj + ".bitmap", false, GitPrivate, ".git"},
		{".git/objects/ab/tmp_obj_x", false, GitPrivate, ".git"},
		{".git/something-new", false, GitPrivate, ".git"},
		{".git/HEAD", false, GitRef, ".git"},
		{".git/packed-refs", false, GitRef, ".git"},
		{".git/refs/heads/main", false, GitRef, ".git"},
		{".git/refs/tags/v1", false, GitRef, ".git"},
		{".git/refs/heads", true, GitDirItself, ".git"},
		{".git/objects", true, GitDirItself, ".git"},
		{".git/objects/01", true, GitDirItself, ".git"},
		{".git/objects/01/" + obj[2:], false, GitObject, ".git"},
		{".git/objects/pack/pack-" + obj + ".pack", false, GitObject, ".git"},
		{".git/objects/pack/pack-" + obj + ".idx", false, GitObject, ".git"},
		{".git/modules/m", true, GitDirItself, ".git/modules/m"},
		{".git/modules/m/config", false, GitProtected, ".git/modules/m"},
		{".git/modules/m/hooks/post-checkout", false, GitProtected, ".git/modules/m"},
		{".git/modules/m/refs/heads/main", false, GitRef, ".git/modules/m"},
		{".git/modules/m/index", false, GitPrivate, ".git/modules/m"},
		{"vendor/x/.git/config", false, GitProtected, "vendor/x/.git"},
		{"vendor/x/.git/HEAD", false, GitRef, "vendor/x/.git"},
	}
	for _, c := range cases {
		got := ClassifyGit(c.path, c.isDir)
		if got.Kind != c.want || (c.want != GitNone && got.Dir != c.dir) {
			t.Errorf("ClassifyGit(%q, %v) = %v in %q, want %v in %q", c.path, c.isDir, got.Kind, got.Dir, c.want, c.dir)
		}
	}
}
