package supervisor

// Git integration (contract §0 A5, issue #20): where a sandbox came from in
// git, create_sandbox git_ref, export_changes format git and Agent Trace
// notes.
//
// Decisions where the contract is silent:
//
//   - Git is driven through the git CLI's plumbing (rev-parse, read-tree,
//     hash-object, update-index, write-tree, commit-tree, update-ref, notes)
//     rather than go-git: the CLI is already a host requirement of CI, it
//     honours everything of the user's repository that go-git only partly
//     knows (worktrees and commondir, alternates, the ignore rules, clean and
//     smudge filters, object formats, split indexes), and it adds no
//     dependency. Every index we write is a temporary one (GIT_INDEX_FILE)
//     below the supervisor's data directory; the user's working tree, index
//     and HEAD are never written.
//   - Probing a work tree (rev-parse, symbolic-ref, status) runs with
//     --no-optional-locks, so even the index's stat cache is left alone.
//   - The export's tree of a layer is the view at that layer: the parent
//     commit's tree with the layer's own delta (its fold alone) applied;
//     paths with a ".git" component never enter a tree, and a new path that
//     the view's .gitignore files ignore is left out unless the parent
//     tracks it. The dirty-snapshot commit is what `git add -A` of the base
//     snapshot onto HEAD's tree gives (all of git's ignore rules and clean
//     filters apply there). Blobs of layers are hashed with --no-filters:
//     they are the sandbox's bytes.
//   - Incremental exports: the branch tip's trailers (Sandbox-Id, Layer)
//     name the last exported layer; the next export starts after it. A tip
//     that is not ours, or ours but naming a layer no longer in head (a
//     squash replaced it), is only moved when it is an ancestor of the new
//     commits, else refused with invalid_request (details.reason
//     "not_ancestor") unless force; force rebuilds from the recorded HEAD.
//   - since LAYER exports only the layers newer than LAYER (and newer than
//     the tip's Layer when continuing our own branch); the skipped layers
//     and the dirty snapshot are not committed on their own but carried by
//     the first commit, so every commit's tree is still the view at its
//     layer.
//   - An export with nothing new creates no commit and leaves the branch
//     as it is (an absent branch stays absent); every commit maps to one
//     layer, even when ignored or .git paths leave its tree unchanged.
//   - Authors: a layer's owner from its audit records (agent label and
//     session, or the operation); a layer without records (deletions only, a
//     squashed layer) is authored by the sandbox. The committer is git's
//     configured user.name/user.email, else the login name at localhost.
//   - Every commit (the dirty-snapshot one included) gets an Agent Trace
//     v0.1 record as a note under refs/notes/agent-trace, written before the
//     branch moves; update-ref compares with the tip read at the start, so
//     a concurrent change of the branch fails the export instead of being
//     overwritten.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	sbx "github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
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

// runGit runs git in dir and returns its stdout; the error carries stderr.
func RunGit(ctx context.Context, dir string, env []string, stdin io.Reader, args ...string) (string, error) {
	full := append([]string{"-c", "core.fsmonitor=false", "-c", "core.splitIndex=false", "-c", "core.untrackedCache=false",
		"-c", "gc.auto=0"}, args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, gitEnv(env), stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// probeGit returns the git origin of a workspace directory, or nil when it
// is not inside a git work tree (or git is missing).
func ProbeGit(ctx context.Context, root string) *gitOrigin {
	out, err := RunGit(ctx, root, nil, nil, "--no-optional-locks", "rev-parse", "--is-inside-work-tree", "--absolute-git-dir", "--show-prefix")
	if err != nil {
		return nil
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) < 2 || lines[0] != "true" {
		return nil
	}
	g := &gitOrigin{GitDir: lines[1]}
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

// gitRefSnapshot resolves ref in the repository of root and checks its tree
// (below root's prefix) out into a new directory under tmpParent, through a
// temporary index. The caller removes dir.
func GitRefSnapshot(ctx context.Context, root, ref, tmpParent string) (dir string, origin *gitOrigin, err error) {
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
	origin = &gitOrigin{Head: &commit, Ref: &ref, GitDir: g.GitDir, Prefix: g.Prefix}
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
// export_changes format git

type gitCommitResult struct {
	Commit             string  `json:"commit"`
	LayerID            string  `json:"layer_id"`
	WorkspaceSessionID *string `json:"workspace_session_id"`
	Author             string  `json:"author"`
	Note               bool    `json:"note"`
}

type exportGitResult struct {
	ManifestVersion       int               `json:"manifest_version"`
	Format                string            `json:"format"`
	Branch                string            `json:"branch"`
	GitDir                string            `json:"git_dir"`
	PreviousTip           *string           `json:"previous_tip"`
	Tip                   *string           `json:"tip"`
	Commits               []gitCommitResult `json:"commits"`
	LayersExported        []string          `json:"layers_exported"`
	LiveWorkspaceSessions []string          `json:"live_workspace_sessions,omitempty"`
}

// layerOrigin is who published a layer: the record publish writes
// (kindLayerOrigin), else the first line the layer's audit records give it.
type layerOrigin struct {
	owner lineOwner
	ts    string
}

// layerOriginRecord is the persisted kindLayerOrigin record.
type layerOriginRecord struct {
	LayerID          string  `json:"layer_id"`
	Owner            string  `json:"owner"`
	Agent            *string `json:"agent"`
	CommandSessionID *string `json:"command_session_id"`
	TS               string  `json:"ts"`
}

// recordLayerOrigin remembers who published a committed layer (the git
// export's author); a failure is logged, never fatal to the publish.
func (s *Supervisor) recordLayerOrigin(ctx context.Context, sb *sandbox, res layers.PublishResult, owner lineOwner) {
	if res.NoOp || res.LayerID == "" {
		return
	}
	rec := layerOriginRecord{LayerID: res.LayerID, Owner: owner.Owner, Agent: nullable(owner.Agent),
		CommandSessionID: nullable(owner.CommandSessionID), TS: nowRFC3339()}
	if err := s.store.put(ctx, kindLayerOrigin, sb.Rec.ID+"/"+res.LayerID, sb.Rec.ID, rec); err != nil {
		s.log.Warn("layer origin not recorded", "sandbox", sb.Rec.ID, "layer_id", res.LayerID, "err", err)
	}
}

func (s *Supervisor) layerOrigin(ctx context.Context, sandboxID, layerID string) (layerOrigin, error) {
	var found *layerOrigin
	err := s.store.list(ctx, kindLayerOrigin, sandboxID, func(b []byte) error {
		var rec layerOriginRecord
		if json.Unmarshal(b, &rec) == nil && rec.LayerID == layerID {
			found = &layerOrigin{owner: lineOwner{Owner: rec.Owner, Agent: deref(rec.Agent), LayerID: layerID}, ts: rec.TS}
		}
		return nil
	})
	if err == nil && found != nil {
		return *found, nil
	}
	// Layers published before origins were recorded: the first line the
	// layer itself wrote.
	if err := s.store.ensureAudit(ctx); err != nil {
		return layerOrigin{}, err
	}
	rows, err := s.store.db.QueryContext(ctx, `SELECT record FROM audit WHERE sandbox_id = ? AND layer_id = ? ORDER BY seq`, sandboxID, layerID)
	if err != nil {
		return layerOrigin{}, err
	}
	defer rows.Close()
	for rows.Next() {
		var text string
		var rec auditRecord
		if rows.Scan(&text) != nil || json.Unmarshal([]byte(text), &rec) != nil {
			continue
		}
		for _, o := range rec.lineOwners() {
			if o.hasMeta() && o.LayerID == layerID {
				o.CommandSessionID = ""
				return layerOrigin{owner: o, ts: rec.TS}, nil
			}
		}
	}
	return layerOrigin{}, fmt.Errorf("no origin of layer %s", layerID)
}

// layerVersion is the manifest version a layer was committed in (L/S IDs).
func layerVersion(id string, fallback int) int {
	if len(id) < 2 {
		return fallback
	}
	v, err := strconv.Atoi(strings.SplitN(id[1:], "-", 2)[0])
	if err != nil {
		return fallback
	}
	return v
}

func gitBad(format string, a ...any) *catalog.Error {
	return catalog.Errorf(catalog.InvalidRequest, format, a...)
}

// exportGit is export_changes with format git.
func (s *Supervisor) exportGit(c *call) (any, error) {
	id := c.args.String("sandbox_id")
	branch := c.args.String("branch")
	if !c.args.Has("branch") || branch == "" {
		return nil, gitBad("format git needs branch").With("argument", "branch")
	}
	if c.args.Has("dest") {
		return nil, gitBad("format git writes to git_dir, not dest").With("argument", "dest")
	}
	sb, done, e := s.readStack(id)
	if e != nil {
		return nil, e
	}
	defer done()
	sb.Mu.Lock()
	origin, live := sb.Rec.Git, append([]string{}, sb.Rec.LiveWorkspaceSessions...)
	sb.Mu.Unlock()
	if len(live) == 0 {
		live = nil
	}
	ctx := c.ctx
	gitDir := ""
	switch {
	case c.args.Has("git_dir"):
		gd := c.args.String("git_dir")
		if !filepath.IsAbs(gd) {
			return nil, gitBad("git_dir must be an absolute path: %s", gd).With("git_dir", gd)
		}
		out, err := RunGit(ctx, "/", nil, nil, "-C", gd, "rev-parse", "--absolute-git-dir")
		if err != nil {
			return nil, gitBad("git_dir is not a git repository: %s", gd).With("git_dir", gd)
		}
		gitDir = strings.TrimSpace(out)
	case origin == nil:
		return nil, gitBad("the workspace of sandbox %s was not a git work tree; give git_dir", id).With("sandbox_id", id)
	default:
		gitDir = origin.GitDir
	}
	if _, err := RunGit(ctx, "/", nil, nil, "check-ref-format", "refs/heads/"+branch); err != nil || strings.HasPrefix(branch, "-") {
		return nil, gitBad("invalid branch name: %q", branch).With("branch", branch)
	}
	ref := "refs/heads/" + branch

	lease, release, err := s.exporter.Lease(sb, id, c.req.RequestID)
	if err != nil {
		return nil, err
	}
	defer release()
	m := lease.Manifest()
	chain := make([]layers.LayerRef, 0, len(m.Layers)) // oldest first, base excluded
	for i := len(m.Layers) - 1; i >= 0; i-- {
		if !strings.HasPrefix(m.Layers[i].LayerID, "B") {
			chain = append(chain, m.Layers[i])
		}
	}
	indexOf := func(layerID string) int {
		for i, l := range chain {
			if l.LayerID == layerID {
				return i
			}
		}
		return -1
	}
	since := -1
	if c.args.Has("since") {
		sl := c.args.String("since")
		if since = indexOf(sl); since < 0 {
			return nil, catalog.Errorf(catalog.NotFound, "layer %s is not a published layer of head", sl).With("since", sl)
		}
	}

	tmp, err := os.MkdirTemp(sb.Dir, ".git-export-")
	if err != nil {
		return nil, sbx.ExportError(err)
	}
	defer os.RemoveAll(tmp)
	r := &GitRepo{Ctx: ctx, GitDir: gitDir, Tmp: tmp}
	for _, wt := range s.checkedOut(r) {
		if wt == ref {
			return nil, gitBad("branch %s is checked out; export to another branch", branch).With("branch", branch)
		}
	}
	var head string
	if origin != nil && origin.Head != nil {
		head = *origin.Head
		if _, err := r.Run(nil, nil, "cat-file", "-e", head+"^{commit}"); err != nil {
			return nil, gitBad("the recorded HEAD %s is not in %s", head, gitDir).With("git_dir", gitDir)
		}
	}
	prefix := ""
	if origin != nil {
		prefix = origin.Prefix
	}
	var oldTip string
	if out, err := r.Run(nil, nil, "rev-parse", "-q", "--verify", ref+"^{commit}"); err == nil {
		oldTip = strings.TrimSpace(out)
	}

	// Where the new commits start: parent's tree already holds the layers
	// up to chain[applied] (and the dirty snapshot when dirtyIn).
	parent, applied, dirtyIn := head, -1, false
	if oldTip != "" && !c.args.Bool("force") {
		tr, err := r.Trailers(oldTip)
		if err != nil {
			return nil, sbx.ExportError(err)
		}
		ours := tr["Sandbox-Id"] == id
		switch {
		case ours && tr["Layer"] == layers.BaseLayerID:
			parent, dirtyIn = oldTip, true
		case ours && indexOf(tr["Layer"]) >= 0:
			parent, applied, dirtyIn = oldTip, indexOf(tr["Layer"]), true
		case oldTip == head, head != "" && r.IsAncestor(oldTip, head):
			// a fast-forward from the recorded HEAD
		default:
			return nil, gitBad("branch %s (%s) is not an ancestor of the commits to export; use force to move it", branch, oldTip).
				With("branch", branch).With("tip", oldTip).With("reason", "not_ancestor")
		}
	}
	start := max(applied, since) + 1

	tree, err := r.TreeOf(parent)
	if err != nil {
		return nil, sbx.ExportError(err)
	}
	committer := r.Committer()
	res := exportGitResult{ManifestVersion: m.Version, Format: "git", Branch: branch, GitDir: gitDir,
		Commits: []gitCommitResult{}, LayersExported: []string{}, LiveWorkspaceSessions: live}
	if oldTip != "" {
		res.PreviousTip = &oldTip
	}
	base := m.Layers[len(m.Layers)-1]
	type pending struct {
		commit string
		note   []byte
	}
	var notes []pending
	ts := nowRFC3339()

	if !dirtyIn {
		bt, err := s.baseGitTree(r, sb.Stack.LayerDir(base), head, prefix, tree)
		if err != nil {
			return nil, sbx.ExportError(err)
		}
		if since >= 0 {
			tree = bt // skipped: the first commit carries it
		} else if !bt.Equal(tree) {
			oid, err := r.WriteTree(bt)
			if err != nil {
				return nil, sbx.ExportError(err)
			}
			msg := fmt.Sprintf("Snapshot of the working tree of %s\n\nThe uncommitted state sandbox %s was created from.\n\nSandbox-Id: %s\nLayer: %s\n",
				sb.Rec.WorkspaceRoot, id, id, layers.BaseLayerID)
			au := committer
			au.Date = sb.Rec.CreatedAt
			commit, err := r.CommitTree(oid, parent, msg, au, committer)
			if err != nil {
				return nil, sbx.ExportError(err)
			}
			note := s.traceRecord(ctx, sb, commit, ts, map[string]any{"sandbox_id": id, "layer_id": layers.BaseLayerID, "snapshot": true},
				changedFiles(tree, bt, prefix), layers.Manifest{SchemaVersion: layers.SchemaVersion, Version: 1, Layers: m.Layers[len(m.Layers)-1:]})
			notes = append(notes, pending{commit, note})
			res.Commits = append(res.Commits, gitCommitResult{Commit: commit, LayerID: layers.BaseLayerID, Author: au.Name + " <" + au.Email + ">", Note: true})
			parent, tree = commit, bt
		}
	}

	// step applies chain[i]'s own delta to tree; lm is head's chain from
	// that layer down to the base.
	step := func(i int, tree GitTree) (next GitTree, written []string, fold *layers.Fold, lm layers.Manifest, err error) {
		l := chain[i]
		lm = layers.Manifest{SchemaVersion: layers.SchemaVersion, Version: layerVersion(l.LayerID, m.Version)}
		for j, hl := range m.Layers {
			if hl.LayerID == l.LayerID {
				lm.Layers = m.Layers[j:]
				break
			}
		}
		fold, err = sb.Stack.FoldContext(ctx, layers.Manifest{SchemaVersion: layers.SchemaVersion, Version: lm.Version, Layers: []layers.LayerRef{l, base}})
		if err != nil {
			return nil, nil, nil, lm, err
		}
		next, written, err = s.applyLayer(r, sb.Stack.View(lm), fold, tree, prefix)
		return next, written, fold, lm, err
	}
	for i := applied + 1; i < start; i++ { // skipped by since: carried by the first commit
		next, _, _, _, err := step(i, tree)
		if err != nil {
			return nil, sbx.ExportError(err)
		}
		tree = next
	}
	prevTS := map[string]string{} // session → ts of its previous exported layer
	for i := start; i < len(chain); i++ {
		l := chain[i]
		next, written, fold, lm, err := step(i, tree)
		if err != nil {
			return nil, sbx.ExportError(err)
		}
		oid, err := r.WriteTree(next)
		if err != nil {
			return nil, sbx.ExportError(err)
		}
		lo, lerr := s.layerOrigin(ctx, id, l.LayerID)
		if lerr != nil {
			lo = layerOrigin{owner: lineOwner{Owner: "sandbox:" + id}}
		}
		if lo.ts == "" {
			if fi, err := os.Stat(sb.Stack.LayerDir(l)); err == nil {
				lo.ts = rfc3339ms(fi.ModTime())
			} else {
				lo.ts = ts
			}
		}
		au, sessID := authorOf(lo.owner)
		au.Date = lo.ts
		msg := s.layerMessage(ctx, sb, l.LayerID, lo, sessID, prevTS[sessID], fold)
		if sessID != "" {
			prevTS[sessID] = lo.ts
		}
		commit, err := r.CommitTree(oid, parent, msg, au, committer)
		if err != nil {
			return nil, sbx.ExportError(err)
		}
		meta := map[string]any{"sandbox_id": id, "layer_id": l.LayerID, "manifest_version": lm.Version, "owner": lo.owner.Owner,
			"workspace_session_id": nullable(sessID), "agent": nullable(lo.owner.Agent)}
		note := s.traceRecord(ctx, sb, commit, ts, meta, written, lm)
		notes = append(notes, pending{commit, note})
		res.Commits = append(res.Commits, gitCommitResult{Commit: commit, LayerID: l.LayerID, WorkspaceSessionID: nullable(sessID),
			Author: au.Name + " <" + au.Email + ">", Note: true})
		res.LayersExported = append(res.LayersExported, l.LayerID)
		parent, tree = commit, next
		c.progress(fmt.Sprintf("export: layer %s → commit %s", l.LayerID, commit))
	}
	if len(res.Commits) == 0 {
		if oldTip != "" {
			res.Tip = &oldTip
		}
		return res, nil
	}
	for _, n := range notes {
		env := []string{"GIT_COMMITTER_NAME=" + committer.Name, "GIT_COMMITTER_EMAIL=" + committer.Email,
			"GIT_AUTHOR_NAME=" + committer.Name, "GIT_AUTHOR_EMAIL=" + committer.Email}
		if _, err := r.Run(env, bytes.NewReader(n.note), "notes", "--ref=agent-trace", "add", "-f", "-F", "-", n.commit); err != nil {
			return nil, sbx.ExportError(err)
		}
	}
	old := oldTip
	if old == "" {
		old = strings.Repeat("0", len(parent))
	}
	if _, err := r.Run(nil, nil, "update-ref", "-m", "export_changes "+id, ref, parent, old); err != nil {
		return nil, catalog.Errorf(catalog.OperationFailed, "branch %s changed during the export: %v", branch, err).With("branch", branch)
	}
	res.Tip = &parent
	return res, nil
}

// checkedOut returns the refs checked out in any work tree of the repository.
func (s *Supervisor) checkedOut(r *GitRepo) []string {
	var out []string
	if h, err := r.Run(nil, nil, "symbolic-ref", "-q", "HEAD"); err == nil {
		out = append(out, strings.TrimSpace(h))
	}
	if wl, err := r.Run(nil, nil, "worktree", "list", "--porcelain"); err == nil {
		for _, l := range strings.Split(wl, "\n") {
			if b, ok := strings.CutPrefix(l, "branch "); ok {
				out = append(out, strings.TrimSpace(b))
			}
		}
	}
	return out
}

// baseGitTree is the tree of the base snapshot: `git add -A` of the base
// layer directory onto HEAD's tree below prefix, in a temporary index.
func (s *Supervisor) baseGitTree(r *GitRepo, baseDir, head, prefix string, headTree GitTree) (GitTree, error) {
	env := []string{"GIT_INDEX_FILE=" + filepath.Join(r.Tmp, "base-index"), "GIT_WORK_TREE=" + baseDir}
	sub := GitTree{}
	if prefix == "" {
		sub = headTree
	} else {
		for p, e := range headTree {
			if rest, ok := strings.CutPrefix(p, prefix); ok {
				sub[rest] = e
			}
		}
	}
	var b bytes.Buffer
	for p, e := range sub {
		fmt.Fprintf(&b, "%s %s\t%s\x00", e.Mode, e.OID, p)
	}
	if _, err := RunGit(r.Ctx, baseDir, append([]string{"GIT_DIR=" + r.GitDir}, env...), nil, "read-tree", "--empty"); err != nil {
		return nil, err
	}
	if _, err := RunGit(r.Ctx, baseDir, append([]string{"GIT_DIR=" + r.GitDir}, env...), &b, "update-index", "-z", "--index-info"); err != nil {
		return nil, err
	}
	if _, err := RunGit(r.Ctx, baseDir, append([]string{"GIT_DIR=" + r.GitDir}, env...), nil, "add", "-A", "--", "."); err != nil {
		return nil, err
	}
	out, err := RunGit(r.Ctx, baseDir, append([]string{"GIT_DIR=" + r.GitDir}, env...), nil, "ls-files", "-s", "-z")
	if err != nil {
		return nil, err
	}
	got := ParseLsTree(out, true)
	if prefix == "" {
		return got, nil
	}
	t := headTree.Clone()
	t.RemoveUnder(strings.TrimSuffix(prefix, "/"))
	for p, e := range got {
		t[prefix+p] = e
	}
	return t, nil
}

// applyLayer applies one layer's own delta to the parent's tree and returns
// the new tree and the workspace paths of the regular files it wrote.
// Submodules (gitlinks) are kept as they are: nothing below one is taken.
func (s *Supervisor) applyLayer(r *GitRepo, v *layers.View, fold *layers.Fold, parent GitTree, prefix string) (GitTree, []string, error) {
	t := parent.Clone()
	full := func(p string) string { return prefix + p }
	// The parent's directories, so a subtree is only scanned for removal
	// where there is one (a layer may touch many paths of a large tree).
	dirs, links := map[string]bool{}, map[string]bool{}
	for p, e := range parent {
		if e.Mode == "160000" {
			links[p] = true
		}
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if dirs[d] {
				break
			}
			dirs[d] = true
		}
	}
	underLink := func(p string) bool {
		for d := full(p); d != "." && d != "/"; d = path.Dir(d) {
			if links[d] {
				return true
			}
		}
		return false
	}
	drop := func(p string) {
		if dirs[full(p)] {
			t.RemoveUnder(full(p))
		}
	}
	for _, p := range fold.Deletions {
		if GitPathSkipped(p) || underLink(p) {
			continue
		}
		delete(t, full(p))
		drop(p)
	}
	for _, p := range fold.OpaqueClears {
		if !GitPathSkipped(p) && !underLink(p) {
			drop(p)
		}
	}
	for _, d := range fold.Dirs {
		if !GitPathSkipped(d.Path) && !underLink(d.Path) {
			delete(t, full(d.Path)) // a directory replaces a file
		}
	}
	ig := layers.NewIgnorer(v)
	keep := func(p string) bool {
		if GitPathSkipped(p) || underLink(p) {
			return false
		}
		if _, tracked := parent[full(p)]; tracked {
			return true
		}
		return !ig.Ignored(p, false)
	}
	var srcs, paths, modes []string
	for _, f := range fold.Files {
		if !keep(f.Path) {
			continue
		}
		srcs, paths = append(srcs, f.Source), append(paths, f.Path)
		mode := "100644"
		if f.Mode&0o100 != 0 {
			mode = "100755"
		}
		modes = append(modes, mode)
	}
	oids, err := r.HashFiles(srcs)
	if err != nil {
		return nil, nil, err
	}
	for i, p := range paths {
		drop(p)
		t[full(p)] = GitEntry{modes[i], oids[i]}
	}
	for _, l := range fold.Symlinks {
		if !keep(l.Path) {
			continue
		}
		oid, err := r.HashBytes([]byte(l.Target))
		if err != nil {
			return nil, nil, err
		}
		drop(l.Path)
		t[full(l.Path)] = GitEntry{"120000", oid}
	}
	return t, paths, nil
}

// changedFiles lists the workspace paths of blobs that differ between two
// trees (present in next), below prefix.
func changedFiles(prev, next GitTree, prefix string) []string {
	var out []string
	for p, e := range next {
		if e.Mode == "120000" || e.Mode == "160000" || prev[p] == e {
			continue
		}
		if rest, ok := strings.CutPrefix(p, prefix); ok {
			out = append(out, rest)
		}
	}
	sort.Strings(out)
	return out
}

// authorOf maps a layer owner to a git author and its session ID.
func authorOf(o lineOwner) (Ident, string) {
	kind, oid, _ := strings.Cut(o.Owner, ":")
	switch kind {
	case "workspace_session":
		name := oid
		if o.Agent != "" {
			name = o.Agent + " (" + oid + ")"
		}
		return Ident{Name: name, Email: oid + "@sandbox.invalid"}, oid
	case "operation":
		return Ident{Name: "operation " + oid, Email: "operation@sandbox.invalid"}, ""
	}
	return Ident{Name: o.Owner, Email: "sandbox@sandbox.invalid"}, ""
}

// layerMessage summarises a layer: the owner, the session's commands since
// its previous layer, the paths, and the trailers.
func (s *Supervisor) layerMessage(ctx context.Context, sb *sandbox, layerID string, lo layerOrigin, sessID, since string, fold *layers.Fold) string {
	var cmds []commandRecord
	if sessID != "" {
		_ = s.store.list(ctx, kindCommand, sb.Rec.ID, func(b []byte) error {
			var rec commandRecord
			if json.Unmarshal(b, &rec) == nil && rec.WorkspaceSessionID == sessID &&
				(lo.ts == "" || rec.StartedAt <= lo.ts) && (since == "" || rec.StartedAt > since) {
				cmds = append(cmds, rec)
			}
			return nil
		})
		sort.Slice(cmds, func(i, j int) bool { return cmds[i].StartedAt < cmds[j].StartedAt })
	}
	var b strings.Builder
	who := lo.owner.Owner
	if lo.owner.Agent != "" {
		who = lo.owner.Agent + " (" + who + ")"
	}
	n := len(fold.Files) + len(fold.Symlinks) + len(fold.Deletions)
	switch len(cmds) {
	case 0:
		fmt.Fprintf(&b, "%s: %d paths changed\n", who, n)
	case 1:
		fmt.Fprintf(&b, "%s: %s\n", who, firstLine(cmds[0].Cmd, 60))
	default:
		fmt.Fprintf(&b, "%s: %d commands, %d paths changed\n", who, len(cmds), n)
	}
	if len(cmds) > 0 {
		b.WriteString("\nCommands:\n")
		for _, c := range cmds {
			exit := "running"
			if c.ExitCode != nil {
				exit = "exit " + strconv.Itoa(*c.ExitCode)
			}
			fmt.Fprintf(&b, "- %s (%s, %s)\n", firstLine(c.Cmd, 200), c.CommandSessionID, exit)
		}
	}
	fmt.Fprintf(&b, "\nSandbox-Id: %s\n", sb.Rec.ID)
	if sessID != "" {
		fmt.Fprintf(&b, "Workspace-Session: %s\n", sessID)
	}
	fmt.Fprintf(&b, "Layer: %s\n", layerID)
	return b.String()
}

func firstLine(s string, n int) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	if r := []rune(l); len(r) > n {
		return string(r[:n]) + "…"
	}
	return l
}

// ---------------------------------------------------------------------------
// Agent Trace v0.1

type atRange struct {
	StartLine   int    `json:"start_line"`
	EndLine     int    `json:"end_line"`
	ContentHash string `json:"content_hash,omitempty"`
}

type atConversation struct {
	Contributor map[string]string `json:"contributor"`
	Ranges      []atRange         `json:"ranges"`
	Metadata    map[string]any    `json:"metadata"`
}

type atFile struct {
	Path          string           `json:"path"`
	Conversations []atConversation `json:"conversations"`
}

type atRecord struct {
	Version   string            `json:"version"`
	ID        string            `json:"id"`
	Timestamp string            `json:"timestamp"`
	VCS       map[string]string `json:"vcs"`
	Tool      map[string]string `json:"tool"`
	Files     []atFile          `json:"files"`
	Metadata  map[string]any    `json:"metadata"`
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// contributorType maps an owner to Agent Trace's contributor types: lines
// of sessions are the agents', original lines the user's.
func contributorType(owner string) string {
	switch {
	case strings.HasPrefix(owner, "workspace_session:"):
		return "ai"
	case owner == ownerOriginal:
		return "human"
	}
	return "unknown"
}

// traceFile groups a file's blame ranges into one conversation per owner
// key (owner, command, agent, layer), in order of first appearance.
func traceFile(p string, owners []lineOwner, lines []string, wholesale bool) atFile {
	f := atFile{Path: p, Conversations: []atConversation{}}
	at := map[blameKey]int{}
	for _, rg := range tileRanges(owners, wholesale) {
		k := rg.key()
		i, ok := at[k]
		if !ok {
			i = len(f.Conversations)
			at[k] = i
			meta := map[string]any{"owner": rg.Owner}
			if rg.hasMeta() {
				meta["workspace_session_id"], meta["command_session_id"], meta["agent"], meta["layer_id"] =
					nullable(strings.TrimPrefix(rg.Owner, "workspace_session:")), nullable(rg.CommandSessionID), nullable(rg.Agent), nullable(rg.LayerID)
				if !strings.HasPrefix(rg.Owner, "workspace_session:") {
					meta["workspace_session_id"] = nil
				}
			}
			f.Conversations = append(f.Conversations, atConversation{Contributor: map[string]string{"type": contributorType(rg.Owner)}, Metadata: meta})
		}
		r := atRange{StartLine: rg.StartLine, EndLine: rg.StartLine + rg.LineCount - 1}
		if lines != nil && r.EndLine <= len(lines) {
			r.ContentHash = contentDigest([]byte(strings.Join(lines[r.StartLine-1:r.EndLine], "\n")))
		}
		f.Conversations[i].Ranges = append(f.Conversations[i].Ranges, r)
	}
	return f
}

func newTraceRecord(revision, ts string, meta map[string]any) atRecord {
	return atRecord{Version: "0.1.0", ID: newUUID(), Timestamp: ts, VCS: map[string]string{"type": "git", "revision": revision},
		Tool: map[string]string{"name": "ephemeral-sandbox"}, Files: []atFile{}, Metadata: meta}
}

// traceRecord builds the Agent Trace note of an exported commit: the line
// owners of each given regular file in the view of m.
func (s *Supervisor) traceRecord(ctx context.Context, sb *sandbox, commit, ts string, meta map[string]any, paths []string, m layers.Manifest) []byte {
	rec := newTraceRecord(commit, ts, meta)
	v := sb.Stack.View(m)
	for _, p := range paths {
		owners, content, text, wholesale, err := s.viewOwners(ctx, sb, v, m.Version, p)
		if err != nil {
			continue // not a regular file at that layer
		}
		var lines []string
		if text {
			lines = textLines(content)
		}
		rec.Files = append(rec.Files, traceFile(p, owners, lines, wholesale))
	}
	b, _ := json.MarshalIndent(rec, "", "  ")
	return append(b, '\n')
}

// gitHeadRevision is the revision file_blame's Agent Trace record names:
// the sandbox's recorded HEAD ("" when none).
func gitHeadRevision(sb *sandbox) string {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	if sb.Rec.Git != nil && sb.Rec.Git.Head != nil {
		return *sb.Rec.Git.Head
	}
	return ""
}
