package layers

// Joining a session's branch with a head's branch that moved: a merge
// commit or a replay of the session's commits, computed with git plumbing
// on the scratch git directory and the package's own 3-way merge
// (merge3.go), the same one the planner merges the work tree's files with.

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// treeEntry is one path of a tree (mode "" = absent).
type treeEntry struct{ mode, id string }

func (e treeEntry) regular() bool { return e.mode == "100644" || e.mode == "100755" }

// publishedFunc reads the publication's result at a workspace path: git
// mode (100644, 100755, 120000) and content; ok false when absent.
type publishedFunc func(path string) (mode string, data []byte, ok bool, err error)

// joinBranch computes d's new value for the session's branch: a replay
// (rebase mode; a replay that does not apply cleanly becomes a merge, said
// in d's note) or a merge commit of the head's tip and the session's tip.
func (p *planner) joinBranch(g *gitExec, st *gitDirState, d *refDecision, published publishedFunc) error {
	h, sv := d.upd.Head, d.upd.Session
	if done, err := p.replayOrMerge(g, d); done || err != nil {
		return err
	}
	tree, err := p.applyDelta(g, h, p.mergeBase(g, h, sv), sv, p.resolver(g, st, published))
	if err != nil {
		return err
	}
	if tree == "" {
		return fmt.Errorf("merge of %s into %s: conflicting paths with no work tree to resolve them", sv, h)
	}
	branch := strings.TrimPrefix(d.upd.Ref, "refs/heads/")
	msg := fmt.Sprintf("Merge sandbox session %s into %s\n", orDefault(p.opt.Git.Session, "session"), branch)
	if p.opt.Git.Agent != "" {
		msg = fmt.Sprintf("Merge sandbox session %s (%s) into %s\n", orDefault(p.opt.Git.Session, "session"), p.opt.Git.Agent, branch)
	}
	agent := orDefault(p.opt.Git.Agent, "sandbox agent")
	author := GitIdent{Name: agent, Email: refSafe(p.opt.Git.Agent, "agent") + "@sandbox.invalid"}
	c, err := p.commitTree(g, tree, []string{h, sv}, msg, author, "")
	if err != nil {
		return err
	}
	d.upd.New = c
	return nil
}

// resolver resolves a path both commits changed from the publication's
// (or sync's) result in the work tree, which the planner already resolved
// with the same strategies.
func (p *planner) resolver(g *gitExec, st *gitDirState, published publishedFunc) func(string) (treeEntry, error) {
	return func(path string) (treeEntry, error) {
		if !hasWorkTree(st.dir) || published == nil {
			return treeEntry{}, fmt.Errorf("no work tree to resolve %s from", path)
		}
		mode, data, ok, err := published(workTreePrefix(st.dir) + path)
		if err != nil || !ok {
			return treeEntry{}, err
		}
		id, err := g.run1(p.ctx, nil, data, "hash-object", "-w", "--no-filters", "--stdin")
		return treeEntry{mode: mode, id: id}, err
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// commitTree writes a commit; date "" is now.
func (p *planner) commitTree(g *gitExec, tree string, parents []string, msg string, author GitIdent, date string) (string, error) {
	com := p.opt.Git.Committer
	if com.Name == "" {
		com.Name = "sandbox"
	}
	if com.Email == "" {
		com.Email = "sandbox@localhost"
	}
	env := []string{"GIT_AUTHOR_NAME=" + author.Name, "GIT_AUTHOR_EMAIL=" + author.Email,
		"GIT_COMMITTER_NAME=" + com.Name, "GIT_COMMITTER_EMAIL=" + com.Email}
	if date != "" {
		env = append(env, "GIT_AUTHOR_DATE="+date)
	}
	args := []string{"commit-tree", "--no-gpg-sign", tree}
	for _, par := range parents {
		args = append(args, "-p", par)
	}
	return g.run1(p.ctx, env, []byte(msg), args...)
}

// replay applies the session's commits (not reachable from onto, merges
// left out, oldest first) onto onto with their messages and authors; ok is
// false when one of them does not apply cleanly.
func (p *planner) replay(g *gitExec, onto, tip string) (string, int, bool, error) {
	out, err := g.run1(p.ctx, nil, nil, "rev-list", "--reverse", "--topo-order", "--no-merges", "--parents", tip, "^"+onto)
	if err != nil {
		return "", 0, false, err
	}
	cur, n := onto, 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		c, parent := f[0], ""
		if len(f) > 1 {
			parent = f[1]
		}
		tree, err := p.applyDelta(g, cur, parent, c, nil)
		if err != nil {
			return "", 0, false, err
		}
		if tree == "" {
			return "", 0, false, nil
		}
		raw, err := g.run(p.ctx, nil, nil, "cat-file", "commit", c)
		if err != nil {
			return "", 0, false, err
		}
		author, date, msg := parseCommitAuthor(raw)
		if cur, err = p.commitTree(g, tree, []string{cur}, msg, author, date); err != nil {
			return "", 0, false, err
		}
		n++
	}
	return cur, n, true, nil
}

// parseCommitAuthor returns a raw commit's author, author date (git's
// internal format) and message.
func parseCommitAuthor(raw string) (GitIdent, string, string) {
	hdr, msg, _ := strings.Cut(raw, "\n\n")
	var id GitIdent
	var date string
	for _, line := range strings.Split(hdr, "\n") {
		rest, ok := strings.CutPrefix(line, "author ")
		if !ok {
			continue
		}
		lt, gt := strings.IndexByte(rest, '<'), strings.LastIndexByte(rest, '>')
		if lt < 0 || gt < lt {
			continue
		}
		id = GitIdent{Name: strings.TrimSpace(rest[:lt]), Email: rest[lt+1 : gt]}
		date = "@" + strings.TrimSpace(rest[gt+1:])
	}
	return id, date, msg
}

// applyDelta applies the change from → to (commits; from "" is the empty
// tree) to cur's tree and writes the result: a path cur left as from has
// takes to's entry, a path both changed is merged 3-way when all sides are
// regular files, and anything else is resolved by resolve (nil: the delta
// does not apply, tree "").
func (p *planner) applyDelta(g *gitExec, cur, from, to string, resolve func(string) (treeEntry, error)) (string, error) {
	ctx := p.ctx
	fromTree := from
	if from == "" {
		empty, err := g.run1(ctx, nil, []byte{}, "hash-object", "-t", "tree", "--stdin")
		if err != nil {
			return "", err
		}
		fromTree = empty
	}
	diff, err := g.run(ctx, nil, nil, "diff-tree", "-r", "-z", "--no-renames", "--no-commit-id", fromTree, to)
	if err != nil {
		return "", err
	}
	curTree, err := lsTree(ctx, g, cur)
	if err != nil {
		return "", err
	}
	var info strings.Builder
	zero := strings.Repeat("0", len(to))
	setEntry := func(path string, e treeEntry) {
		if e.mode == "" {
			fmt.Fprintf(&info, "0 %s\t%s\x00", zero, path)
			return
		}
		fmt.Fprintf(&info, "%s %s\t%s\x00", e.mode, e.id, path)
	}
	fields := strings.Split(diff, "\x00")
	for i := 0; i+1 < len(fields); i += 2 {
		meta, path := strings.Fields(strings.TrimPrefix(fields[i], ":")), fields[i+1]
		if len(meta) < 5 {
			continue
		}
		pe, ce := treeEntry{mode: meta[0], id: meta[2]}, treeEntry{mode: meta[1], id: meta[3]}
		if pe.mode == "000000" {
			pe = treeEntry{}
		}
		if ce.mode == "000000" {
			ce = treeEntry{}
		}
		ue := curTree[path]
		switch {
		case ue == pe:
			setEntry(path, ce)
			continue
		case ue == ce:
			continue
		}
		if ue.regular() && ce.regular() && (pe.mode == "" || pe.regular()) {
			if e, ok, err := p.mergeBlobs(g, pe, ue, ce); err != nil {
				return "", err
			} else if ok {
				setEntry(path, e)
				continue
			}
		}
		if resolve == nil {
			return "", nil
		}
		e, err := resolve(path)
		if err != nil {
			return "", err
		}
		setEntry(path, e)
	}
	if info.Len() == 0 {
		return g.run1(ctx, nil, nil, "rev-parse", cur+"^{tree}")
	}
	idx := filepath.Join(g.gitDir, "delta-index")
	_ = os.Remove(idx)
	ig := *g
	ig.index = idx
	if _, err := ig.run(ctx, nil, nil, "read-tree", cur+"^{tree}"); err != nil {
		return "", err
	}
	if _, err := ig.run(ctx, nil, []byte(info.String()), "update-index", "-z", "--index-info"); err != nil {
		return "", err
	}
	return ig.run1(ctx, nil, nil, "write-tree")
}

// mergeBlobs merges three regular-file entries with Merge3 and the mode
// rule of §9.5.
func (p *planner) mergeBlobs(g *gitExec, base, head, sess treeEntry) (treeEntry, bool, error) {
	read := func(e treeEntry) ([]byte, error) {
		if e.mode == "" {
			return nil, nil
		}
		out, err := g.run(p.ctx, nil, nil, "cat-file", "blob", e.id)
		return []byte(out), err
	}
	bb, err := read(base)
	if err != nil {
		return treeEntry{}, false, err
	}
	hb, err := read(head)
	if err != nil {
		return treeEntry{}, false, err
	}
	sb, err := read(sess)
	if err != nil {
		return treeEntry{}, false, err
	}
	perm := func(m string) fs.FileMode {
		if m == "100755" {
			return 0o755
		}
		return 0o644
	}
	var bm *fs.FileMode
	if base.mode != "" {
		m := perm(base.mode)
		bm = &m
	}
	mode, ok := mergeMode(bm, perm(head.mode), perm(sess.mode))
	if !ok {
		return treeEntry{}, false, nil
	}
	res := Merge3(bb, hb, sb, p.opt.Merge)
	if !res.Clean {
		return treeEntry{}, false, nil
	}
	id, err := g.run1(p.ctx, nil, res.Merged, "hash-object", "-w", "--no-filters", "--stdin")
	if err != nil {
		return treeEntry{}, false, err
	}
	gm := "100644"
	if mode&0o111 != 0 {
		gm = "100755"
	}
	return treeEntry{mode: gm, id: id}, true, nil
}

// lsTree lists a commit's tree recursively.
func lsTree(ctx context.Context, g *gitExec, commit string) (map[string]treeEntry, error) {
	out, err := g.run(ctx, nil, nil, "ls-tree", "-r", "-z", "--full-tree", commit)
	if err != nil {
		return nil, err
	}
	m := map[string]treeEntry{}
	for _, rec := range strings.Split(out, "\x00") {
		meta, path, ok := strings.Cut(rec, "\t")
		f := strings.Fields(meta)
		if !ok || len(f) != 3 {
			continue
		}
		m[path] = treeEntry{mode: f[0], id: f[2]}
	}
	return m, nil
}

// replayOrMerge tries the rebase mode's replay of the session's commits onto
// the head's tip: done when d holds the replayed tip. A replay that does not
// apply cleanly turns d into a merge (said in its note), as does any other
// mode; the caller then writes the merge commit.
func (p *planner) replayOrMerge(g *gitExec, d *refDecision) (done bool, err error) {
	if d.upd.Action != RefRebase {
		return false, nil
	}
	tip, n, ok, err := p.replay(g, d.upd.Head, d.upd.Session)
	if err != nil || ok {
		if ok {
			d.upd.New, d.upd.Commits = tip, n
		}
		return ok, err
	}
	d.upd.Action, d.upd.Note = RefMerge, "the session's commits do not replay cleanly onto the head's tip: merged instead"
	return false, nil
}

// mergeBase is the first merge base of a and b, "" for unrelated histories
// (the empty tree is then the base).
func (p *planner) mergeBase(g *gitExec, a, b string) string {
	mb, err := g.run1(p.ctx, nil, nil, "merge-base", a, b)
	if err != nil {
		return ""
	}
	if i := strings.IndexByte(mb, '\n'); i >= 0 {
		mb = mb[:i]
	}
	return mb
}
