package layers

// The git route of a sync (sync_workspace_session, contract A8): the
// head's commits come into the session's branch, its index follows.

import (
	"fmt"
	"strings"
)

// gitSyncFinish decides the session's refs over the target head and
// returns what its new upper must hold beyond its kept changes:
//
//   - the session's branch: when the session has no commits of its own it
//     fast-forwards to the head's tip; when both moved, a merge commit
//     (parents: the session's tip, then the head's) or, in rebase mode, the
//     session's commits replayed onto the head's tip (branch mode merges:
//     the session needs the head's commits either way);
//   - every other ref the session left as its base had it shows the head's
//     value (written as a loose ref, since the session's own packed-refs
//     may hide the head's); a ref the session changed keeps its value;
//   - when the session's HEAD commit moves, its index is rebuilt from the
//     new commit's tree (its staged changes become unstaged ones).
func (p *planner) gitSyncFinish(s *Stack, base, head Manifest, published publishedFunc) ([]Change, error) {
	var out []Change
	for _, dir := range sortedKeys(p.git.dirs) {
		st := p.git.dirs[dir]
		if st.skip {
			continue
		}
		sfs := p.git.sfs
		var err error
		if st.base, err = readGitRefs(viewFS{p.bv}, dir); err != nil {
			return nil, err
		}
		if st.head, err = readGitRefs(viewFS{p.hv}, dir); err != nil {
			return nil, err
		}
		if st.sess, err = readGitRefs(sfs, dir); err != nil {
			return nil, err
		}
		baseHEAD, err := readGitHEAD(viewFS{p.bv}, dir)
		if err != nil {
			return nil, err
		}
		sessHEAD, err := readGitHEAD(sfs, dir)
		if err != nil {
			return nil, err
		}
		st.headHEAD = sessHEAD
		st.branch = strings.TrimPrefix(baseHEAD, "ref: ")
		names := map[string]bool{}
		for _, m := range []gitRefs{st.base, st.head, st.sess} {
			for n := range m {
				names[n] = true
			}
		}
		set := map[string]string{}
		for _, name := range sortedKeys(names) {
			b, h, sv := st.base[name], st.head[name], st.sess[name]
			if privateRef(name) || h == b || sv == h {
				continue // the head did not move it, or both agree
			}
			d := &refDecision{upd: GitRefUpdate{GitDir: dir, Ref: name, Base: b, Head: h, Session: sv}, path: dir + "/" + name}
			switch {
			case sv == b:
				d.upd.Action, d.upd.New = RefFastForward, h
				if name != st.branch {
					d.upd.Action = RefUpdate
					if h == "" {
						d.upd.Action = RefDelete
					}
				}
			case name == st.branch && isObjectID(sv) && isObjectID(h):
				g, err := p.gitScratch(s, base, head, st)
				if err != nil {
					return nil, err
				}
				if _, err := g.run(p.ctx, nil, nil, "merge-base", "--is-ancestor", sv, h); err == nil {
					// The head already has the session's commits (its own
					// publish merged them, publish keep:true).
					d.upd.Action, d.upd.New = RefFastForward, h
					break
				}
				d.upd.Action = RefMerge
				if p.opt.Git.RefMode == GitRefsRebase {
					d.upd.Action = RefRebase
				}
				if err := p.joinSessionBranch(g, st, d, published); err != nil {
					return nil, err
				}
			default:
				continue // the session's own value stays
			}
			st.decisions = append(st.decisions, d)
			set[name] = d.upd.New
		}
		for _, name := range sortedKeys(set) {
			v := set[name]
			if v != "" {
				out = append(out, Change{Kind: ChangeWrite, Path: dir + "/" + name, Data: []byte(v + "\n"), Mode: 0o644})
				continue
			}
			out = append(out, Change{Kind: ChangeDelete, Path: dir + "/" + name})
			if data, ok, err := sfs.read(dir + "/packed-refs"); err == nil && ok {
				if nd, changed := packedRefsWithout(data, map[string]bool{name: true}); changed {
					out = append(out, Change{Kind: ChangeWrite, Path: dir + "/packed-refs", Data: nd, Mode: 0o644})
				}
			}
		}
		target := strings.TrimPrefix(sessHEAD, "ref: ")
		if tip, ok := set[target]; ok && isObjectID(tip) && hasWorkTree(dir) {
			c, err := p.indexFor(s, base, head, st, tip)
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		}
		if st.g != nil {
			objs, err := newScratchObjects(st)
			if err != nil {
				return nil, err
			}
			out = append(out, objs...)
		}
	}
	return out, nil
}

// joinSessionBranch brings the head's tip into the session's branch: the
// session's commits replayed onto it (rebase) or a merge commit whose first
// parent is the session's tip.
func (p *planner) joinSessionBranch(g *gitExec, st *gitDirState, d *refDecision, published publishedFunc) error {
	h, sv := d.upd.Head, d.upd.Session
	if done, err := p.replayOrMerge(g, d); done || err != nil {
		return err
	}
	tree, err := p.applyDelta(g, sv, p.mergeBase(g, sv, h), h, p.resolver(g, st, published))
	if err != nil {
		return err
	}
	if tree == "" {
		return fmt.Errorf("sync merge of %s into %s: conflicting paths with no work tree to resolve them", h, sv)
	}
	branch := strings.TrimPrefix(d.upd.Ref, "refs/heads/")
	msg := fmt.Sprintf("Merge the sandbox head's %s into session %s\n", branch, orDefault(p.opt.Git.Session, "session"))
	author := GitIdent{Name: orDefault(p.opt.Git.Agent, "sandbox agent"), Email: refSafe(p.opt.Git.Agent, "agent") + "@sandbox.invalid"}
	c, err := p.commitTree(g, tree, []string{sv, h}, msg, author, "")
	if err != nil {
		return err
	}
	d.upd.New = c
	return nil
}
