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
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	sbx "github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"
)

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
// (statedb.KindLayerOrigin), else the first line the layer's audit records give it.
type layerOrigin struct {
	owner lineOwner
	ts    string
}

// layerOriginRecord is the persisted statedb.KindLayerOrigin record.
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
	if err := s.store.Put(ctx, statedb.KindLayerOrigin, sb.Rec.ID+"/"+res.LayerID, sb.Rec.ID, rec); err != nil {
		s.log.Warn("layer origin not recorded", "sandbox", sb.Rec.ID, "layer_id", res.LayerID, "err", err)
	}
}

func (s *Supervisor) layerOrigin(ctx context.Context, sandboxID, layerID string) (layerOrigin, error) {
	var found *layerOrigin
	err := s.store.List(ctx, statedb.KindLayerOrigin, sandboxID, func(b []byte) error {
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
	recs, err := s.store.attr().LayerAudit(ctx, sandboxID, layerID)
	if err != nil {
		return layerOrigin{}, err
	}
	for _, rec := range recs {
		for _, o := range rec.LineOwners() {
			if o.HasMeta() && o.LayerID == layerID {
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
	if err := sbx.CheckBranchName(branch); err != nil {
		return nil, gitBad("invalid branch name %q: %v", branch, err).With("argument", "branch").With("branch", branch)
	}
	sb, done, e := s.readStack(id)
	if e != nil {
		return nil, e
	}
	defer done()
	sb.Mu.Lock()
	origin, live, wsRoot := sb.Rec.Git, append([]string{}, sb.Rec.LiveWorkspaceSessions...), sb.Rec.WorkspaceRoot
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
		out, err := sbx.RunGit(ctx, "/", nil, nil, "-C", gd, "rev-parse", "--absolute-git-dir")
		if err != nil {
			return nil, gitBad("git_dir is not a git repository: %s", gd).With("git_dir", gd)
		}
		gitDir = strings.TrimSpace(out)
		// The destination rule of the file formats (#27 item 2): the
		// workspace's own repository, or one below the workspace root or
		// a directory of manager.export.allowed_roots.
		resolved := func(p string) string {
			if r, err := filepath.EvalSymlinks(p); err == nil {
				return r
			}
			return filepath.Clean(p)
		}
		own := origin != nil && resolved(origin.GitDir) == resolved(gitDir)
		if !own && !sbx.UnderAny(resolved(gitDir), append([]string{wsRoot}, s.cfg.Manager.Export.AllowedRoots...)) {
			return nil, gitBad("git_dir must be the workspace's repository or below the sandbox's workspace root or a directory of manager.export.allowed_roots: %s", gd).
				With("git_dir", gd)
		}
	case origin == nil:
		return nil, gitBad("the workspace of sandbox %s was not a git work tree; give git_dir", id).With("sandbox_id", id)
	default:
		gitDir = origin.GitDir
	}
	// git's own judgement too, in case its rules grew beyond CheckBranchName's.
	if _, err := sbx.RunGit(ctx, "/", nil, nil, "check-ref-format", "refs/heads/"+branch); err != nil {
		return nil, gitBad("invalid branch name %q: git check-ref-format refuses refs/heads/%s", branch, branch).With("branch", branch)
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
	r := &sbx.GitRepo{Ctx: ctx, GitDir: gitDir, Tmp: tmp}
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

	// The sandbox's own commits (contract A8, issue 28 item 5): when the
	// head's repository moved past the recorded HEAD through commits the
	// sessions made and published, a first export reuses them (messages,
	// authors) and adds one commit for what the head holds beyond them.
	var sessionTip string
	if prefix == "" && head != "" && parent == head && applied < 0 && !dirtyIn && since < 0 {
		if t, err := layers.GitHeadCommit(sb.Stack.View(m), ".git"); err == nil && t != "" && t != head {
			if err := fetchSandboxCommits(r, sb.Stack.GitObjectDirs(m, ".git"), t, tmp); err != nil {
				s.log.Warn("git export: the sandbox's commits are not reused", "sandbox", id, "err", err)
			} else if r.IsAncestor(head, t) {
				sessionTip = t
			}
		}
	}

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
	step := func(i int, tree sbx.GitTree) (next sbx.GitTree, written []string, fold *layers.Fold, lm layers.Manifest, err error) {
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
	if sessionTip != "" {
		commits, last, err := s.reuseSandboxCommits(r, sb, id, chain, step, tree, head, sessionTip, committer)
		if err != nil {
			return nil, sbx.ExportError(err)
		}
		res.Commits = append(res.Commits, commits...)
		for _, l := range chain {
			res.LayersExported = append(res.LayersExported, l.LayerID)
		}
		parent, start = last, len(chain)
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
	if len(res.Commits) == 0 || parent == oldTip {
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
func (s *Supervisor) checkedOut(r *sbx.GitRepo) []string {
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
func (s *Supervisor) baseGitTree(r *sbx.GitRepo, baseDir, head, prefix string, headTree sbx.GitTree) (sbx.GitTree, error) {
	env := []string{"GIT_INDEX_FILE=" + filepath.Join(r.Tmp, "base-index"), "GIT_WORK_TREE=" + baseDir}
	sub := sbx.GitTree{}
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
	if _, err := sbx.RunGit(r.Ctx, baseDir, append([]string{"GIT_DIR=" + r.GitDir}, env...), nil, "read-tree", "--empty"); err != nil {
		return nil, err
	}
	if _, err := sbx.RunGit(r.Ctx, baseDir, append([]string{"GIT_DIR=" + r.GitDir}, env...), &b, "update-index", "-z", "--index-info"); err != nil {
		return nil, err
	}
	if _, err := sbx.RunGit(r.Ctx, baseDir, append([]string{"GIT_DIR=" + r.GitDir}, env...), nil, "add", "-A", "--", "."); err != nil {
		return nil, err
	}
	out, err := sbx.RunGit(r.Ctx, baseDir, append([]string{"GIT_DIR=" + r.GitDir}, env...), nil, "ls-files", "-s", "-z")
	if err != nil {
		return nil, err
	}
	got := sbx.ParseLsTree(out, true)
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
func (s *Supervisor) applyLayer(r *sbx.GitRepo, v *layers.View, fold *layers.Fold, parent sbx.GitTree, prefix string) (sbx.GitTree, []string, error) {
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
		if sbx.GitPathSkipped(p) || underLink(p) {
			continue
		}
		delete(t, full(p))
		drop(p)
	}
	for _, p := range fold.OpaqueClears {
		if !sbx.GitPathSkipped(p) && !underLink(p) {
			drop(p)
		}
	}
	for _, d := range fold.Dirs {
		if !sbx.GitPathSkipped(d.Path) && !underLink(d.Path) {
			delete(t, full(d.Path)) // a directory replaces a file
		}
	}
	ig := layers.NewIgnorer(v)
	keep := func(p string) bool {
		if sbx.GitPathSkipped(p) || underLink(p) {
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
		t[full(p)] = sbx.GitEntry{Mode: modes[i], OID: oids[i]}
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
		t[full(l.Path)] = sbx.GitEntry{Mode: "120000", OID: oid}
	}
	return t, paths, nil
}

// changedFiles lists the workspace paths of blobs that differ between two
// trees (present in next), below prefix.
func changedFiles(prev, next sbx.GitTree, prefix string) []string {
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
func authorOf(o lineOwner) (sbx.Ident, string) {
	kind, oid, _ := strings.Cut(o.Owner, ":")
	switch kind {
	case "workspace_session":
		name := oid
		if o.Agent != "" {
			name = o.Agent + " (" + oid + ")"
		}
		return sbx.Ident{Name: name, Email: oid + "@sandbox.invalid"}, oid
	case "operation":
		return sbx.Ident{Name: "operation " + oid, Email: "operation@sandbox.invalid"}, ""
	}
	return sbx.Ident{Name: o.Owner, Email: "sandbox@sandbox.invalid"}, ""
}

// layerMessage summarises a layer: the owner, the session's commands since
// its previous layer, the paths, and the trailers.
func (s *Supervisor) layerMessage(ctx context.Context, sb *sandbox, layerID string, lo layerOrigin, sessID, since string, fold *layers.Fold) string {
	var cmds []commandRecord
	if sessID != "" {
		_ = s.store.List(ctx, statedb.KindCommand, sb.Rec.ID, func(b []byte) error {
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

// fetchSandboxCommits copies into r's repository every object reachable from
// tip in the sandbox's repository (objDirs: its objects directories, one
// per layer), through a scratch repository below tmp whose alternates they
// are. No ref of r changes and no hook runs.
func fetchSandboxCommits(r *sbx.GitRepo, objDirs []string, tip, tmp string) error {
	src := filepath.Join(tmp, "sandbox.git")
	if _, err := sbx.RunGit(r.Ctx, tmp, nil, nil, "init", "--bare", "--template=", "-q", src); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, "objects", "info", "alternates"), []byte(strings.Join(objDirs, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	if _, err := sbx.RunGit(r.Ctx, tmp, []string{"GIT_DIR=" + src}, nil, "update-ref", "refs/heads/export", tip); err != nil {
		return err
	}
	// The scratch repository is a local path: the file transport is the one
	// this fetch needs (every other stays off: protocol.allow=never).
	_, err := r.Run(nil, nil, "-c", "core.hooksPath=/dev/null", "-c", "protocol.file.allow=always", "fetch", "-q", "--no-tags", "--no-write-fetch-head", src, "refs/heads/export")
	return err
}

// reuseSandboxCommits lists the sandbox's own commits from head to tip and
// adds, on top of tip, one commit of what the sandbox's head holds beyond
// them (uncommitted changes, ignored-file rules as for layers), unless
// there is nothing. tree is the recorded HEAD's tree with the layers before
// chain's first applied.
func (s *Supervisor) reuseSandboxCommits(r *sbx.GitRepo, sb *sandbox, id string, chain []layers.LayerRef,
	step func(int, sbx.GitTree) (sbx.GitTree, []string, *layers.Fold, layers.Manifest, error),
	tree sbx.GitTree, head, tip string, committer sbx.Ident) ([]gitCommitResult, string, error) {
	var out []gitCommitResult
	list, err := r.Run(nil, nil, "log", "--reverse", "--format=%H%x00%an <%ae>", head+".."+tip)
	if err != nil {
		return nil, "", err
	}
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		if c, au, ok := strings.Cut(line, "\x00"); ok {
			out = append(out, gitCommitResult{Commit: c, Author: au})
		}
	}
	for i := range chain {
		next, _, _, _, err := step(i, tree)
		if err != nil {
			return nil, "", err
		}
		tree = next
	}
	tipTree, err := r.TreeOf(tip)
	if err != nil {
		return nil, "", err
	}
	if tree.Equal(tipTree) || len(chain) == 0 {
		return out, tip, nil
	}
	oid, err := r.WriteTree(tree)
	if err != nil {
		return nil, "", err
	}
	last := chain[len(chain)-1].LayerID
	msg := fmt.Sprintf("Uncommitted changes of sandbox %s\n\nWhat the sandbox's head holds beyond its sessions' commits.\n\nSandbox-Id: %s\nLayer: %s\n", id, id, last)
	au := committer
	au.Date = nowRFC3339()
	c, err := r.CommitTree(oid, tip, msg, au, committer)
	if err != nil {
		return nil, "", err
	}
	return append(out, gitCommitResult{Commit: c, LayerID: last, Author: au.Name + " <" + au.Email + ">"}), c, nil
}
