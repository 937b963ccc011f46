package sandbox

// Git plumbing (contract §0 A5, issue #20): where a workspace came from in
// git (ProbeGit), create_sandbox git_ref (GitRefSnapshot), and the
// repository handle the git export builds trees and commits with. The
// choices are written down with the export (supervisor/git.go): git is
// driven through its CLI's plumbing, every index written is a temporary one
// below the supervisor's data directory, and probing never takes optional
// locks.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// gitEnv is the environment of every git command: the supervisor's without
// GIT_* variables (they would redirect the repository or the index), plus
// extra.
func gitEnv(extra []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GIT_") {
			continue
		}
		out = append(out, kv)
	}
	return append(append(out, "LC_ALL=C", "GIT_TERMINAL_PROMPT=0"), extra...)
}

// gitSafety are the configuration overrides of every git the supervisor
// runs (issue #27 item 3). A repository's own configuration is input the
// supervisor does not trust to run programs in its name: a session may have
// planted it (before publication protected it), a user's hooks expect a
// user's commands, not the supervisor's plumbing.
//
//   - core.hooksPath=/dev/null: no hook runs (reference-transaction for
//     update-ref, post-index-change for a temporary index, post-checkout…).
//     /dev/null is not a directory, so git finds no hook below it, and
//     nobody can create an entry there — a fresh empty directory could be
//     filled by any process of the user between its creation and its use.
//   - core.fsmonitor=false: status and index refreshes run no monitor
//     command (the key is also a command line in older gits).
//   - protocol.allow=never: no transport at all, so a partial clone's lazy
//     fetch cannot start ssh or a remote helper from the repository's
//     configuration; the supervisor's git never talks to a remote.
//   - core.splitIndex, core.untrackedCache, gc.auto: no side files and no
//     background gc in the user's repository.
//
// The system and global configuration files are still read: command-line
// -c values override every level, and the global file carries the user's
// identity (user.name, user.email) that the git export's commits use.
var gitSafety = []string{
	"-c", "core.hooksPath=/dev/null",
	"-c", "core.fsmonitor=false",
	"-c", "protocol.allow=never",
	"-c", "core.splitIndex=false",
	"-c", "core.untrackedCache=false",
	"-c", "gc.auto=0",
}

// GitCommand is the one constructor of a git process of the supervisor:
// every git it runs goes through it (and so through gitSafety and gitEnv).
func GitCommand(ctx context.Context, dir string, env []string, args ...string) *exec.Cmd {
	full := append(append([]string{}, gitSafety...), args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Dir, cmd.Env = dir, gitEnv(env)
	return cmd
}

// RunGit runs git in dir and returns its stdout; the error carries stderr.
func RunGit(ctx context.Context, dir string, env []string, stdin io.Reader, args ...string) (string, error) {
	cmd := GitCommand(ctx, dir, env, args...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// probeGit returns the git origin of a workspace directory, or nil when it
// is not inside a git work tree (or git is missing).
func ProbeGit(ctx context.Context, root string) *GitOrigin {
	out, err := RunGit(ctx, root, nil, nil, "--no-optional-locks", "rev-parse", "--is-inside-work-tree", "--absolute-git-dir", "--show-prefix")
	if err != nil {
		return nil
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) < 2 || lines[0] != "true" {
		return nil
	}
	g := &GitOrigin{GitDir: lines[1]}
	if len(lines) > 2 {
		g.Prefix = lines[2]
	}
	if h, err := RunGit(ctx, root, nil, nil, "rev-parse", "-q", "--verify", "HEAD^{commit}"); err == nil {
		h = strings.TrimSpace(h)
		g.Head = &h
	}
	if b, err := RunGit(ctx, root, nil, nil, "symbolic-ref", "-q", "--short", "HEAD"); err == nil {
		b = strings.TrimSpace(b)
		g.Branch = &b
	}
	st, err := RunGit(ctx, root, nil, nil, "--no-optional-locks", "status", "--porcelain", "-z", "--untracked-files=normal", "--", ".")
	g.Dirty = err != nil || st != ""
	return g
}

// CheckGitLayout refuses a workspace whose own git directory lies outside
// it (issue #28 item 4): a linked worktree (`git worktree add`), or any
// ".git" file at the root whose "gitdir:" leaves the workspace. A session
// sees only the workspace, at /workspace, so git there would find no
// repository. Submodules made by `git submodule add` keep their git
// directories in .git/modules behind relative gitdir lines and work; a
// nested repository (a ".git" directory) is ordinary content.
func CheckGitLayout(root string) error {
	p := filepath.Join(root, ".git")
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil
	}
	dir, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir: ")
	if !ok {
		return nil
	}
	abs := dir
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(root, abs)
	}
	if rel, err := filepath.Rel(root, filepath.Clean(abs)); err == nil && !filepath.IsAbs(dir) && rel != ".." && !strings.HasPrefix(rel, "../") {
		return nil
	}
	return catalog.Errorf(catalog.InvalidRequest,
		"workspace_root %s is a linked git worktree or a repository whose git directory is elsewhere (.git is a file pointing to %s): "+
			"sessions see only the workspace, so git would find no repository there. Not supported: linked worktrees (git worktree add) and "+
			"git directories outside the workspace. Supported: a main working tree or a clone, with submodules whose git directories are "+
			"inside it (.git/modules, as git submodule add makes them), and nested repositories. Use a clone (git clone --shared %s) or git_ref",
		root, dir, root).With("workspace_root", root).With("gitdir", dir)
}

// gitRefSnapshot resolves ref in the repository of root and checks its tree
// (below root's prefix) out into a new directory under tmpParent, through a
// temporary index. The caller removes dir.
func GitRefSnapshot(ctx context.Context, root, ref, tmpParent string) (dir string, origin *GitOrigin, err error) {
	bad := func(format string, a ...any) error {
		return catalog.Errorf(catalog.InvalidRequest, format, a...).With("git_ref", ref)
	}
	if strings.HasPrefix(ref, "-") {
		return "", nil, bad("git_ref must not start with -")
	}
	g := ProbeGit(ctx, root)
	if g == nil {
		return "", nil, bad("git_ref needs a workspace_root inside a git work tree: %s", root)
	}
	commit, err := RunGit(ctx, root, nil, nil, "rev-parse", "-q", "--verify", "--end-of-options", ref+"^{commit}")
	if err != nil {
		return "", nil, bad("git_ref %q does not name a commit of %s", ref, g.GitDir)
	}
	commit = strings.TrimSpace(commit)
	tmp, err := os.MkdirTemp(tmpParent, ".git-ref-")
	if err != nil {
		return "", nil, fmt.Errorf("git_ref %s: %w", ref, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	tree := filepath.Join(tmp, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return "", nil, fmt.Errorf("git_ref %s: %w", ref, err)
	}
	env := []string{"GIT_DIR=" + g.GitDir, "GIT_INDEX_FILE=" + filepath.Join(tmp, "index"), "GIT_WORK_TREE=" + tree}
	treeish := commit
	if g.Prefix != "" {
		treeish = commit + ":" + strings.TrimSuffix(g.Prefix, "/")
	}
	if _, err := RunGit(ctx, tree, env, nil, "read-tree", treeish); err != nil {
		return "", nil, bad("git_ref %q has no %s: %v", ref, g.Prefix, err)
	}
	if _, err := RunGit(ctx, tree, env, nil, "checkout-index", "-a", "-f"); err != nil {
		return "", nil, fmt.Errorf("git_ref %s: check out: %w", ref, err)
	}
	origin = &GitOrigin{Head: &commit, Ref: &ref, GitDir: g.GitDir, Prefix: g.Prefix}
	if full, err := RunGit(ctx, root, nil, nil, "rev-parse", "--symbolic-full-name", ref); err == nil {
		if b, ok := strings.CutPrefix(strings.TrimSpace(full), "refs/heads/"); ok {
			origin.Branch = &b
		}
	}
	return tmp, origin, nil
}

// ---------------------------------------------------------------------------
// Trees in memory

type GitEntry struct{ Mode, OID string }

// gitTree is a flat tree: repository path → entry (blobs, symlinks, gitlinks).
type GitTree map[string]GitEntry

func (t GitTree) RemoveUnder(p string) {
	pre := p + "/"
	for k := range t {
		if strings.HasPrefix(k, pre) {
			delete(t, k)
		}
	}
}

func (t GitTree) Clone() GitTree {
	out := make(GitTree, len(t))
	for k, v := range t {
		out[k] = v
	}
	return out
}

func (t GitTree) Equal(u GitTree) bool {
	if len(t) != len(u) {
		return false
	}
	for k, v := range t {
		if u[k] != v {
			return false
		}
	}
	return true
}

// parseLsTree reads `ls-tree -r -z` or `ls-files -s -z` output.
func ParseLsTree(out string, stage bool) GitTree {
	t := GitTree{}
	for _, rec := range strings.Split(out, "\x00") {
		meta, path, ok := strings.Cut(rec, "\t")
		if !ok {
			continue
		}
		f := strings.Fields(meta)
		if stage && len(f) == 3 {
			t[path] = GitEntry{f[0], f[1]}
		} else if !stage && len(f) == 3 {
			t[path] = GitEntry{f[0], f[2]}
		}
	}
	return t
}

// gitPathSkipped reports whether a path must never enter a tree: a ".git"
// component anywhere (git itself refuses those).
func GitPathSkipped(p string) bool {
	for _, c := range strings.Split(p, "/") {
		if strings.EqualFold(c, ".git") {
			return true
		}
	}
	return false
}

// gitRepo is one export's handle on a repository.
type GitRepo struct {
	Ctx    context.Context
	GitDir string
	Tmp    string // private scratch directory (temporary indexes)
}

func (r *GitRepo) Run(env []string, stdin io.Reader, args ...string) (string, error) {
	return RunGit(r.Ctx, r.Tmp, append([]string{"GIT_DIR=" + r.GitDir}, env...), stdin, args...)
}

func (r *GitRepo) TreeOf(rev string) (GitTree, error) {
	if rev == "" {
		return GitTree{}, nil
	}
	out, err := r.Run(nil, nil, "ls-tree", "-r", "-z", "--full-tree", rev)
	if err != nil {
		return nil, err
	}
	return ParseLsTree(out, false), nil
}

// writeTree writes t as a tree object through a temporary index.
func (r *GitRepo) WriteTree(t GitTree) (string, error) {
	idx := []string{"GIT_INDEX_FILE=" + filepath.Join(r.Tmp, "index")}
	if _, err := r.Run(idx, nil, "read-tree", "--empty"); err != nil {
		return "", err
	}
	var b bytes.Buffer
	for p, e := range t {
		fmt.Fprintf(&b, "%s %s\t%s\x00", e.Mode, e.OID, p)
	}
	if _, err := r.Run(idx, &b, "update-index", "-z", "--index-info"); err != nil {
		return "", err
	}
	out, err := r.Run(idx, nil, "write-tree")
	return strings.TrimSpace(out), err
}

// hashFiles writes the files at host paths as blobs, unfiltered.
func (r *GitRepo) HashFiles(paths []string) ([]string, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	var batch []string
	for _, p := range paths {
		if strings.ContainsAny(p, "\n\r") {
			return r.hashEach(paths)
		}
		batch = append(batch, p)
	}
	out, err := r.Run(nil, strings.NewReader(strings.Join(batch, "\n")+"\n"), "hash-object", "-w", "--no-filters", "--stdin-paths")
	if err != nil {
		return nil, err
	}
	oids := strings.Fields(out)
	if len(oids) != len(paths) {
		return nil, fmt.Errorf("git hash-object: %d ids for %d files", len(oids), len(paths))
	}
	return oids, nil
}

func (r *GitRepo) hashEach(paths []string) ([]string, error) {
	out := make([]string, len(paths))
	for i, p := range paths {
		o, err := r.Run(nil, nil, "hash-object", "-w", "--no-filters", "--", p)
		if err != nil {
			return nil, err
		}
		out[i] = strings.TrimSpace(o)
	}
	return out, nil
}

func (r *GitRepo) HashBytes(b []byte) (string, error) {
	out, err := r.Run(nil, bytes.NewReader(b), "hash-object", "-w", "--no-filters", "--stdin")
	return strings.TrimSpace(out), err
}

// commitOf parses a commit's trailers (the last paragraph's "Key: value" lines).
func (r *GitRepo) Trailers(commit string) (map[string]string, error) {
	out, err := r.Run(nil, nil, "log", "-1", "--format=%(trailers:only,unfold)", commit)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m, nil
}

func (r *GitRepo) IsAncestor(a, b string) bool {
	_, err := r.Run(nil, nil, "merge-base", "--is-ancestor", a, b)
	return err == nil
}

// ident is a git identity with its date.
type Ident struct{ Name, Email, Date string }

func (r *GitRepo) Committer() Ident {
	get := func(k string) string {
		out, err := r.Run(nil, nil, "config", "--get", k)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(out)
	}
	id := Ident{Name: get("user.name"), Email: get("user.email")}
	login := "sandbox"
	if u, err := user.Current(); err == nil && u.Username != "" {
		login = u.Username
	}
	if id.Name == "" {
		id.Name = login
	}
	if id.Email == "" {
		id.Email = login + "@localhost"
	}
	return id
}

func (r *GitRepo) CommitTree(tree, parent, msg string, author, committer Ident) (string, error) {
	args := []string{"commit-tree", "--no-gpg-sign", tree}
	if parent != "" {
		args = append(args, "-p", parent)
	}
	env := []string{"GIT_AUTHOR_NAME=" + author.Name, "GIT_AUTHOR_EMAIL=" + author.Email, "GIT_AUTHOR_DATE=" + author.Date,
		"GIT_COMMITTER_NAME=" + committer.Name, "GIT_COMMITTER_EMAIL=" + committer.Email}
	out, err := r.Run(env, strings.NewReader(msg), args...)
	return strings.TrimSpace(out), err
}

// ---------------------------------------------------------------------------

// CheckBranchName applies git's rules for a branch name (what `git
// check-ref-format --branch` accepts, reimplemented so the reason can be
// said) and the supervisor's own refusals: "HEAD" (refs/heads/HEAD makes
// every later "HEAD" ambiguous), names starting with "refs/" (the branch is
// always created under refs/heads/, so such a name would make
// refs/heads/refs/…), names starting with "-" (an option to git), and
// "@{-N}" shorthands (they name a branch by history, not a new one). The
// error says why; the caller maps it to invalid_request.
func CheckBranchName(b string) error {
	switch {
	case b == "":
		return fmt.Errorf("is empty")
	case b == "HEAD":
		return fmt.Errorf("HEAD is not a branch name")
	case strings.HasPrefix(b, "refs/"):
		return fmt.Errorf("must not start with refs/ (it is created as refs/heads/<branch>)")
	case strings.HasPrefix(b, "-"):
		return fmt.Errorf("must not start with -")
	case b == "@":
		return fmt.Errorf("must not be @")
	case strings.HasPrefix(b, "/") || strings.HasSuffix(b, "/"):
		return fmt.Errorf("must not start or end with /")
	case strings.Contains(b, "//"):
		return fmt.Errorf(`must not contain ".."`)
	case strings.Contains(b, ".."):
		return fmt.Errorf(`must not contain ".."`)
	case strings.Contains(b, "@{"):
		return fmt.Errorf(`must not contain ".."`)
	case strings.HasSuffix(b, "."):
		return fmt.Errorf(`must not end with "."`)
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("must not contain control characters")
		}
		if strings.IndexByte(" ~^:?*[\\", c) >= 0 {
			return fmt.Errorf("must not contain %q", string(c))
		}
	}
	for _, comp := range strings.Split(b, "/") {
		if strings.HasPrefix(comp, ".") {
			return fmt.Errorf("no component may start with . (%q)", comp)
		}
		if strings.HasSuffix(comp, ".lock") {
			return fmt.Errorf("no component may end with .lock (%q)", comp)
		}
	}
	return nil
}
