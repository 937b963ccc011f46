package layers

// The git route of publication (contract A8, design rule 10): how the
// objects and refs of a git directory inside the workspace are published.
// The decisions are written in doc.go ("Git directories").

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ephemeral-ai-lab/sandbox/layers/gitindex"
	"golang.org/x/sys/unix"
)

// GitRefMode says how a session's branch is published when the head's tip
// moved since the session's base (git.publish_refs).
type GitRefMode string

// The ref modes.
const (
	GitRefsMerge  GitRefMode = "merge"  // a merge commit (parents: head tip, session tip)
	GitRefsRebase GitRefMode = "rebase" // the session's commits replayed onto the head tip
	GitRefsBranch GitRefMode = "branch" // only refs/heads/sandbox/<agent>-<session>
)

// Valid reports whether m is a ref mode ("" is not).
func (m GitRefMode) Valid() bool {
	return m == GitRefsMerge || m == GitRefsRebase || m == GitRefsBranch
}

// GitIdent is a git identity.
type GitIdent struct{ Name, Email string }

// GitOptions configures the git route of a publish or a sync.
type GitOptions struct {
	RefMode   GitRefMode // "" means merge
	Agent     string     // the session's agent: author of merge commits, part of sandbox branch names
	Session   string     // the session's ID
	Committer GitIdent   // the user (committer of every commit the route writes)
}

// Outcomes and rejection reasons of the git route.
const (
	// OutcomeGitObject: a loose object or pack the head lacked, verified by
	// its name and published (objects are a union, never a conflict).
	OutcomeGitObject = "git_object"
	// OutcomeGitRef: a ref file (HEAD, packed-refs, refs/**) the session
	// changed; refs are published by value (Plan.GitRefs), never as text.
	OutcomeGitRef = "git_ref"
	// RejectGitObjectInvalid: an object whose content does not hash to its
	// name (or a pack whose checksums do not match): never published.
	RejectGitObjectInvalid = "git_object_invalid"
	// RejectGitRefInvalid: a ref the session would publish names an object
	// that neither the session nor the head has (or the session's branch
	// is not a commit).
	RejectGitRefInvalid = "git_ref_invalid"
)

// Ref actions of GitRefUpdate.
const (
	RefFastForward = "fast_forward"
	RefMerge       = "merge"
	RefRebase      = "rebase"
	RefBranch      = "branch"
	RefCreate      = "create"
	RefUpdate      = "update"
	RefDelete      = "delete"
	RefOurs        = "ours"
	RefTheirs      = "theirs"
	RefConflict    = "conflict"
)

// GitRefUpdate is one ref decision of a plan (plan.git_refs).
type GitRefUpdate struct {
	GitDir  string `json:"git_dir"`
	Ref     string `json:"ref"`
	Action  string `json:"action"`
	Base    string `json:"base,omitempty"`
	Head    string `json:"head,omitempty"`
	Session string `json:"session,omitempty"`
	// New is the head's value after the publish (empty: deleted, or left
	// as head had it).
	New string `json:"new,omitempty"`
	// Commits counts the session's commits a rebase replayed.
	Commits int `json:"commits,omitempty"`
	// Note explains a fallback (a rebase that conflicted became a merge).
	Note string `json:"note,omitempty"`
	// SessionCommits: the session's own commits on its branch since its
	// base (newest first, at most 100), for review.
	SessionCommits []GitCommit `json:"session_commits,omitempty"`
}

// GitCommit is one commit shown for review.
type GitCommit struct {
	Commit  string `json:"commit"`
	Author  string `json:"author"`
	Subject string `json:"subject"`
}

// gitRoute is the planner's git state.
type gitRoute struct {
	dirs    map[string]*gitDirState
	objects map[string]objDecision // object path → decision
	refs    map[string]*refDecision
	scratch string // below staging/, removed at the end of the plan
	sfs     sessionFS
	nextID  int
}

type objDecision struct {
	outcome string // unchanged_head, git_object, git_private; "" + reject
	message string // for a rejection
}

type gitDirState struct {
	dir        string
	skip       bool // the session removed or replaced the git directory
	refChanged bool
	objects    []Change // verified objects the head lacks
	base, head gitRefs
	sess       gitRefs
	headHEAD   string
	branch     string // the session's branch ("HEAD" when base HEAD is detached)
	decisions  []*refDecision
	g          *gitExec
	hashLen    int
}

type refDecision struct {
	upd    GitRefUpdate
	path   string
	reject string // RejectSourceConflict or RejectGitRefInvalid
	msg    string
}

func (d *refDecision) outcome() string {
	switch {
	case d.reject != "":
		return OutcomeConflict
	case d.upd.Action == RefOurs:
		return OutcomeOurs
	case d.upd.Action == RefTheirs:
		return OutcomeTheirs
	}
	return OutcomeGitRef
}

// listed: a decision shown as a plan path of its own.
func (d *refDecision) listed() bool {
	return d.reject != "" || d.upd.Action == RefOurs || d.upd.Action == RefTheirs
}

// refFingerprint shows a ref value as the content of its loose file.
func refFingerprint(v string) *Fingerprint {
	if v == "" {
		return &Fingerprint{Kind: "absent"}
	}
	sum := sha256.Sum256([]byte(v + "\n"))
	return &Fingerprint{Kind: "file", Digest: hex.EncodeToString(sum[:])}
}

// gitPrepare groups the changes inside git directories, verifies the
// objects the session adds and decides every ref the session changed.
func (p *planner) gitPrepare(s *Stack, base, head Manifest, changes []Change) error {
	r := &gitRoute{dirs: map[string]*gitDirState{}, objects: map[string]objDecision{}, refs: map[string]*refDecision{}}
	p.git = r
	ch := make(map[string]*Change, len(changes))
	skipped := map[string]bool{}
	for i := range changes {
		c := &changes[i]
		ch[c.Path] = c
		if path.Base(c.Path) == ".git" && c.Kind != ChangeDirectory {
			skipped[c.Path] = true
		}
	}
	for i := range changes {
		c := &changes[i]
		g := ClassifyGit(c.Path, c.Kind == ChangeDirectory || c.Kind == ChangeOpaqueDir)
		if g.Kind != GitObject && g.Kind != GitRef && (!p.opt.keepGit || g.Kind == GitNone || g.Dir == "") {
			// A sync also looks at git directories where the session
			// changed only private state (its index follows HEAD).
			continue
		}
		st := r.dirs[g.Dir]
		if st == nil {
			st = &gitDirState{dir: g.Dir, skip: skipped[g.Dir]}
			for a := g.Dir; a != ""; a = parentOf(a) {
				if c, ok := ch[a]; ok && c.Kind != ChangeDirectory {
					st.skip = true
				}
			}
			r.dirs[g.Dir] = st
		}
		if g.Kind == GitRef {
			st.refChanged = true
		}
	}
	if len(r.dirs) == 0 {
		return nil
	}
	sfs := sessionFS{base: viewFS{p.bv}, ch: ch}
	r.sfs = sfs
	for _, dir := range sortedKeys(r.dirs) {
		st := r.dirs[dir]
		if st.skip {
			continue
		}
		for i := range changes {
			c := changes[i]
			if g := ClassifyGit(c.Path, false); g.Kind != GitObject || g.Dir != dir {
				continue
			}
			if p.opt.keepGit {
				// A sync keeps the session's objects as they are; git
				// reads them to join the branches.
				if c.Kind == ChangeWrite {
					st.objects = append(st.objects, c)
				}
				continue
			}
			d, err := p.objectDecision(c, sfs)
			if err != nil {
				return err
			}
			r.objects[c.Path] = d
			if d.outcome == OutcomeGitObject {
				st.objects = append(st.objects, c)
			}
		}
		if !st.refChanged || p.opt.keepGit {
			continue // a sync decides refs in gitSyncFinish
		}
		if err := p.decideRefs(s, base, head, st, sfs); err != nil {
			return err
		}
	}
	return nil
}

// objectDecision routes one change of an object path.
func (p *planner) objectDecision(c Change, sfs sessionFS) (objDecision, error) {
	if c.Kind != ChangeWrite {
		// A deletion by gc or repack (or anything else there) stays the
		// session's own business: objects are a union.
		return objDecision{outcome: OutcomeGitPrivate}, nil
	}
	h, err := p.stat(p.hv, c.Path, false)
	if err != nil {
		return objDecision{}, err
	}
	if h.exists && h.kind() == KindFile {
		return objDecision{outcome: OutcomeUnchangedHead}, nil
	}
	if err := verifyObjectChange(c, sfs); err != nil {
		if errors.Is(err, errBadObject) {
			return objDecision{message: fmt.Sprintf("%s: %v", c.Path, err)}, nil
		}
		return objDecision{}, fmt.Errorf("publish %s: %w", c.Path, err)
	}
	return objDecision{outcome: OutcomeGitObject}, nil
}

// verifyObjectChange checks a loose object or a pack file by its name.
func verifyObjectChange(c Change, sfs sessionFS) error {
	name := path.Base(c.Path)
	switch {
	case len(path.Base(path.Dir(c.Path))) == 2 && path.Base(path.Dir(path.Dir(c.Path))) == "objects":
		data, err := changeContent(c)
		if err != nil {
			return err
		}
		return verifyLooseObject(path.Base(path.Dir(c.Path))+name, data)
	case strings.HasSuffix(name, ".pack"):
		id := strings.TrimSuffix(strings.TrimPrefix(name, "pack-"), ".pack")
		if c.Source == "" {
			return verifyPackPair(id, strings.NewReader(string(c.Data)), int64(len(c.Data)), nil)
		}
		f, fi, err := c.OpenSource()
		if err != nil {
			return err
		}
		defer f.Close()
		return verifyPackPair(id, f, fi.Size(), nil)
	case strings.HasSuffix(name, ".idx"):
		id := strings.TrimSuffix(strings.TrimPrefix(name, "pack-"), ".idx")
		data, err := changeContent(c)
		if err != nil {
			return err
		}
		return verifyPackPair(id, nil, 0, data)
	}
	return nil // .keep, .promisor: markers without content to check
}

// decideRefs compares the refs of base, head and session by value.
func (p *planner) decideRefs(s *Stack, base, head Manifest, st *gitDirState, sfs sessionFS) error {
	var err error
	if st.base, err = readGitRefs(viewFS{p.bv}, st.dir); err != nil {
		return err
	}
	if st.head, err = readGitRefs(viewFS{p.hv}, st.dir); err != nil {
		return err
	}
	if st.sess, err = readGitRefs(sfs, st.dir); err != nil {
		return err
	}
	baseHEAD, err := readGitHEAD(viewFS{p.bv}, st.dir)
	if err != nil {
		return err
	}
	if st.headHEAD, err = readGitHEAD(viewFS{p.hv}, st.dir); err != nil {
		return err
	}
	st.branch = strings.TrimPrefix(baseHEAD, "ref: ")
	if isObjectID(baseHEAD) {
		// A detached HEAD in the base: HEAD itself is the session's branch.
		st.branch = "HEAD"
		sh, err := readGitHEAD(sfs, st.dir)
		if err != nil {
			return err
		}
		st.base["HEAD"], st.sess["HEAD"] = baseHEAD, sh
		if isObjectID(st.headHEAD) {
			st.head["HEAD"] = st.headHEAD
		}
	}
	names := map[string]bool{}
	for _, m := range []gitRefs{st.base, st.head, st.sess} {
		for n := range m {
			names[n] = true
		}
	}
	mode := p.opt.Git.RefMode
	if mode == "" {
		mode = GitRefsMerge
	}
	var check []string // values to be published, which must be objects
	for _, name := range sortedKeys(names) {
		b, h, sv := st.base[name], st.head[name], st.sess[name]
		if sv == b || privateRef(name) {
			continue
		}
		d := &refDecision{upd: GitRefUpdate{GitDir: st.dir, Ref: name, Base: b, Head: h, Session: sv}, path: st.dir + "/" + name}
		switch {
		case name == st.branch && isObjectID(sv) && h == b:
			d.upd.Action, d.upd.New = RefFastForward, sv
		case name == st.branch && isObjectID(sv) && h == "":
			d.upd.Action, d.upd.New = RefCreate, sv
		case h == sv:
			continue // both sides agree
		case name == st.branch && isObjectID(sv) && isObjectID(h) && mode == GitRefsBranch:
			d.upd.Action = RefBranch
			d.upd.Ref, d.path = sandboxBranch(p.opt.Git), st.dir+"/"+sandboxBranch(p.opt.Git)
			d.upd.Head, d.upd.New = st.head[d.upd.Ref], sv
		case name == st.branch && isObjectID(sv) && isObjectID(h):
			d.upd.Action = string(mode) // computed by gitFinish
		case h == b:
			d.upd.New = sv
			switch {
			case sv == "":
				d.upd.Action = RefDelete
			case b == "":
				d.upd.Action = RefCreate
			default:
				d.upd.Action = RefUpdate
			}
		default:
			switch p.strategy(d.path) {
			case StrategyOurs:
				d.upd.Action, d.upd.New = RefOurs, sv
			case StrategyTheirs:
				d.upd.Action, d.upd.New = RefTheirs, h
			default:
				d.upd.Action, d.reject = RefConflict, RejectSourceConflict
			}
		}
		if d.upd.Session != "" && !strings.HasPrefix(d.upd.Session, "ref: ") && d.reject == "" && d.upd.Action != RefTheirs {
			if !isObjectID(d.upd.Session) {
				d.reject, d.msg = RejectGitRefInvalid, fmt.Sprintf("ref %s has no object id: %q", name, d.upd.Session)
			} else {
				check = append(check, d.upd.Session)
			}
		}
		st.decisions = append(st.decisions, d)
		p.git.refs[d.path] = d
	}
	if len(check) == 0 {
		return nil
	}
	g, err := p.gitScratch(s, base, head, st)
	if err != nil {
		return err
	}
	for _, d := range st.decisions {
		if (d.upd.Ref == st.branch || d.upd.Action == RefBranch) && isObjectID(d.upd.Base) {
			check = append(check, d.upd.Base)
		}
	}
	types, err := g.objectTypes(p.ctx, check)
	if err != nil {
		return err
	}
	for _, d := range st.decisions {
		t, ok := types[d.upd.Session]
		if !ok || d.reject != "" {
			continue
		}
		if d.upd.Ref == st.branch || d.upd.Action == RefBranch {
			if t == "commit" && (d.upd.Base == "" || types[d.upd.Base] != "missing") {
				d.upd.SessionCommits = sessionCommits(p.ctx, g, d.upd.Base, d.upd.Session)
			}
		}
		switch {
		case t == "missing":
			d.reject, d.msg = RejectGitRefInvalid, fmt.Sprintf("ref %s names %s, an object neither the session nor the head has", d.upd.Ref, d.upd.Session)
		case (d.upd.Ref == st.branch || d.upd.Action == RefBranch) && t != "commit":
			d.reject, d.msg = RejectGitRefInvalid, fmt.Sprintf("branch %s names a %s, not a commit", d.upd.Ref, t)
		}
	}
	return nil
}

// sandboxBranch is refs/heads/sandbox/<agent>-<session>, made ref-safe.
func sandboxBranch(o GitOptions) string {
	return "refs/heads/sandbox/" + refSafe(o.Agent, "agent") + "-" + refSafe(o.Session, "session")
}

// refSafe keeps [A-Za-z0-9_-] and makes everything else '-'.
func refSafe(s, def string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 128 && (r == '-' || r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')) {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	if b.Len() == 0 {
		return def
	}
	return b.String()
}

// gitEntry routes a plan entry inside a git directory the route handles;
// false leaves the entry to the ordinary route.
func (p *planner) gitEntry(e *planEntry, c Change, isDir bool) bool {
	if p.git == nil {
		return false
	}
	g := ClassifyGit(c.Path, isDir)
	st := p.git.dirs[g.Dir]
	if st == nil || c.Path == g.Dir {
		return false
	}
	switch g.Kind {
	case GitObject, GitRef:
	case GitDirItself:
		if !st.skip {
			return false
		}
	default:
		return false
	}
	e.pp.Route = RouteGit
	if st.skip {
		// The session removed or replaced the whole repository: nothing
		// of it is published (the head keeps its own).
		e.pp.Outcome = OutcomeGitPrivate
		if p.opt.keepGit {
			e.writes = []Change{c}
		}
		return true
	}
	if g.Kind == GitObject {
		if p.opt.keepGit {
			e.pp.Outcome, e.writes = OutcomeGitObject, []Change{c}
			return true
		}
		d := p.git.objects[c.Path]
		switch d.outcome {
		case "":
			e.pp.Outcome, e.reject, e.bucket, e.message = OutcomeConflict, RejectGitObjectInvalid, bucketProtected, d.message
		case OutcomeGitObject:
			e.pp.Outcome, e.writes = OutcomeGitObject, []Change{c}
		default:
			e.pp.Outcome = d.outcome
		}
		return true
	}
	if d := p.git.refs[c.Path]; d != nil && d.listed() {
		p.fillRefEntry(e, d)
		return true
	}
	e.pp.Outcome = OutcomeGitRef
	if p.opt.keepGit {
		e.writes = []Change{c}
	}
	return true
}

// fillRefEntry lists a ref decision like a path.
func (p *planner) fillRefEntry(e *planEntry, d *refDecision) {
	e.pp.Route, e.pp.Outcome = RouteGit, d.outcome()
	e.pp.Base, e.pp.Head, e.pp.Session = refFingerprint(d.upd.Base), refFingerprint(d.upd.Head), refFingerprint(d.upd.Session)
	if d.reject != "" {
		e.reject, e.bucket, e.message = d.reject, bucketSource, d.msg
		if d.reject == RejectSourceConflict {
			e.pp.ConflictReason = ConflictReasonChangedOnBothSides
		} else {
			e.bucket = bucketProtected
		}
	}
}

// refEntries are plan entries for listed ref decisions at paths the
// session did not change as files (a ref only in packed-refs).
func (p *planner) refEntries() []*planEntry {
	if p.git == nil {
		return nil
	}
	var out []*planEntry
	for _, path := range sortedKeys(p.git.refs) {
		d := p.git.refs[path]
		if !d.listed() || p.changed[path] {
			continue
		}
		e := &planEntry{synthetic: true, change: Change{Kind: ChangeWrite, Path: path}}
		e.pp = PlanPath{Path: path, Change: ChangeWrite, Strategy: p.strategy(path)}
		p.fillRefEntry(e, d)
		out = append(out, e)
	}
	return out
}

// gitScratch makes the scratch git directory of st: its own objects
// directory (the session's verified objects copied in, new objects written
// there) with every base and head layer's objects as alternates.
func (p *planner) gitScratch(s *Stack, base, head Manifest, st *gitDirState) (*gitExec, error) {
	if st.g != nil {
		return st.g, nil
	}
	r := p.git
	if r.scratch == "" {
		if err := os.MkdirAll(filepath.Join(s.dir, stagingDirName), 0o755); err != nil {
			return nil, err
		}
		d, err := os.MkdirTemp(filepath.Join(s.dir, stagingDirName), "git-")
		if err != nil {
			return nil, fmt.Errorf("git scratch: %w", err)
		}
		r.scratch = d
	}
	r.nextID++
	dir := filepath.Join(r.scratch, fmt.Sprint(r.nextID))
	g := &gitExec{gitDir: dir, objects: filepath.Join(dir, "objects"), hooks: "/dev/null"}
	seen := map[string]bool{}
	for _, m := range []Manifest{head, base} {
		for _, l := range m.Layers {
			od := filepath.Join(s.LayerDir(l), filepath.FromSlash(st.dir), "objects")
			if fi, err := os.Lstat(od); err == nil && fi.IsDir() && !seen[od] {
				seen[od] = true
				g.alts = append(g.alts, od)
			}
		}
	}
	st.hashLen = 40
	for _, v := range st.base {
		if isObjectID(v) {
			st.hashLen = len(v)
			break
		}
	}
	args := []string{"init", "--bare", "--template=", "-q"}
	if st.hashLen == 64 {
		args = append(args, "--object-format=sha256")
	}
	// init with the plain environment (no GIT_DIR yet: git init <dir>).
	ig := &gitExec{gitDir: r.scratch, hooks: "/dev/null"}
	if _, err := ig.run(p.ctx, nil, nil, append(args, dir)...); err != nil {
		return nil, err
	}
	for _, c := range st.objects {
		rel := strings.TrimPrefix(c.Path, st.dir+"/objects/")
		dst := filepath.Join(g.objects, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, err
		}
		if err := copyChangeTo(c, dst); err != nil {
			return nil, fmt.Errorf("git scratch: %s: %w", c.Path, err)
		}
	}
	st.g = g
	return g, nil
}

// copyChangeTo writes a write's content to a new host file.
func copyChangeTo(c Change, dst string) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	if c.Source == "" && !c.loaded {
		_, err = out.Write(c.Data)
	} else if c.loaded {
		_, err = out.Write(c.content)
	} else {
		var f *os.File
		if f, _, err = c.OpenSource(); err == nil {
			_, err = f.WriteTo(out)
			f.Close()
		}
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// objectTypes returns each id's type, or "missing".
func (g *gitExec) objectTypes(ctx context.Context, ids []string) (map[string]string, error) {
	out, err := g.run(ctx, nil, []byte(strings.Join(ids, "\n")+"\n"), "cat-file", "--batch-check=%(objectname) %(objecttype)")
	if err != nil {
		return nil, err
	}
	res := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 {
			res[f[0]] = f[1]
		}
	}
	for _, id := range ids {
		if _, ok := res[id]; !ok {
			res[id] = "missing"
		}
	}
	return res, nil
}

// gitFinish writes what the ref decisions need into the layer: the new
// ref values (merge commits and replays computed here), packed-refs
// without deleted refs, the head's new index when its HEAD commit moves,
// and every object the route created. published reads the layer's result
// at a workspace path (for paths a merge of commits leaves in conflict).
func (p *planner) gitFinish(s *Stack, base, head Manifest, published func(string) (mode string, data []byte, ok bool, err error)) ([]Change, error) {
	if p.git == nil {
		return nil, nil
	}
	if p.opt.keepGit {
		return p.gitSyncFinish(s, base, head, published)
	}
	var out []Change
	for _, dir := range sortedKeys(p.git.dirs) {
		st := p.git.dirs[dir]
		if st.skip || len(st.decisions) == 0 {
			continue
		}
		set := map[string]string{} // ref → new value ("" delete)
		for _, d := range st.decisions {
			switch d.upd.Action {
			case RefTheirs, RefConflict:
				continue
			case RefMerge, RefRebase:
				g, err := p.gitScratch(s, base, head, st)
				if err != nil {
					return nil, err
				}
				if err := p.joinBranch(g, st, d, published); err != nil {
					return nil, err
				}
			}
			set[d.upd.Ref] = d.upd.New
		}
		if len(set) == 0 {
			continue
		}
		dropPacked := map[string]bool{}
		for _, name := range sortedKeys(set) {
			v := set[name]
			rp := st.dir + "/" + name
			if v != "" {
				out = append(out, Change{Kind: ChangeWrite, Path: rp, Data: []byte(v + "\n"), Mode: 0o644})
				continue
			}
			if h, err := p.stat(p.hv, rp, false); err != nil {
				return nil, err
			} else if h.exists {
				out = append(out, Change{Kind: ChangeDelete, Path: rp})
			}
			dropPacked[name] = true
		}
		if len(dropPacked) > 0 {
			data, ok, err := viewFS{p.hv}.read(st.dir + "/packed-refs")
			if err != nil {
				return nil, err
			}
			if ok {
				if nd, changed := packedRefsWithout(data, dropPacked); changed {
					out = append(out, Change{Kind: ChangeWrite, Path: st.dir + "/packed-refs", Data: nd, Mode: 0o644})
				}
			}
		}
		// The head's HEAD commit: when it moves, the head's index follows.
		target := strings.TrimPrefix(st.headHEAD, "ref: ")
		if isObjectID(st.headHEAD) {
			target = "HEAD"
		}
		if tip, ok := set[target]; ok && isObjectID(tip) && hasWorkTree(st.dir) {
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

// indexFor is the new index of st's git directory when its HEAD commit
// moves to tip (a publish's head index, a sync's session index): tip's tree,
// with the stat data a session sees for every file the head view already
// holds as it is (restatHeadIndex).
func (p *planner) indexFor(s *Stack, base, head Manifest, st *gitDirState, tip string) (Change, error) {
	g, err := p.gitScratch(s, base, head, st)
	if err != nil {
		return Change{}, err
	}
	idx, err := headIndex(p.ctx, g, tip)
	if err != nil {
		return Change{}, err
	}
	return Change{Kind: ChangeWrite, Path: st.dir + "/index", Data: p.restatHeadIndex(st.dir, idx), Mode: 0o644}, nil
}

// hasWorkTree: a git directory named .git has its work tree beside it.
func hasWorkTree(dir string) bool { return path.Base(dir) == ".git" }

// workTreePrefix is the workspace path of dir's work tree ("" for the root).
func workTreePrefix(dir string) string {
	if p := parentOf(dir); p != "" {
		return p + "/"
	}
	return ""
}

// headIndex builds the index of commit tip's tree in a temporary index
// file. Its cached stat data are zero; restatHeadIndex fills those it can.
func headIndex(ctx context.Context, g *gitExec, tip string) ([]byte, error) {
	idx := filepath.Join(g.gitDir, "head-index")
	_ = os.Remove(idx)
	ig := *g
	ig.index = idx
	if _, err := ig.run(ctx, nil, nil, "read-tree", tip+"^{tree}"); err != nil {
		return nil, err
	}
	return os.ReadFile(idx)
}

// restatHeadIndex gives the head's new index (idx, written by read-tree
// with zero stat data) the cached stat data a session will see, for every
// entry whose file this publication leaves as the head has it: the path
// shows the same layer file after the commit, so when the head's current
// index records that very file (same object id, and stat data equal to the
// file's: RestatGitIndexInView wrote them) its stat data are copied without
// reading it. Other entries are hashed, and those the publication changes
// (their file is in the new layer, not yet on disk) stay zero, so a
// session's first git status re-reads just those. Best effort: on any
// error the zero-stat index is kept, which git handles by re-reading.
func (p *planner) restatHeadIndex(dir string, idx []byte) []byte {
	old := map[string]gitindex.Entry{}
	if data, ok, err := (viewFS{p.hv}).read(dir + "/index"); err == nil && ok {
		if x, err := gitindex.Parse(data); err == nil {
			for _, e := range x.Entries {
				if e.Regular() {
					old[e.Path] = e
				}
			}
		}
	}
	workTree := parentOf(dir)
	lookup := func(rel string) (string, bool) {
		e, err := p.hv.Lstat(joinRel(workTree, rel))
		if err != nil || (e.Kind != KindFile && e.Kind != KindSymlink) {
			return "", false
		}
		return e.HostPath, true
	}
	known := func(e *gitindex.Entry, st *unix.Stat_t) bool {
		o, ok := old[e.Path]
		return ok && bytes.Equal(o.OID, e.OID) && SameStat(o.Stat, st)
	}
	out, _, err := RestatGitIndex(p.ctx, idx, RestatOptions{Lookup: lookup, Known: known})
	if err != nil {
		return idx
	}
	return out
}

// newScratchObjects are the loose objects the route wrote into st's
// scratch objects directory (the session's copied objects excluded).
func newScratchObjects(st *gitDirState) ([]Change, error) {
	copied := map[string]bool{}
	for _, c := range st.objects {
		copied[strings.TrimPrefix(c.Path, st.dir+"/objects/")] = true
	}
	var out []Change
	err := filepath.WalkDir(st.g.objects, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(st.g.objects, p)
		rel = filepath.ToSlash(rel)
		if copied[rel] || ClassifyGit(".git/objects/"+rel, false).Kind != GitObject {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out = append(out, Change{Kind: ChangeWrite, Path: st.dir + "/objects/" + rel, Data: data, Mode: 0o444})
		return nil
	})
	slices.SortFunc(out, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	return out, err
}

// removeScratch removes the route's scratch directory.
func (r *gitRoute) removeScratch() {
	if r != nil && r.scratch != "" {
		_ = forceRemoveAll(r.scratch)
		r.scratch = ""
	}
}

// updates lists every ref decision (nil without any).
func (r *gitRoute) updates() []GitRefUpdate {
	if r == nil {
		return nil
	}
	var out []GitRefUpdate
	for _, dir := range sortedKeys(r.dirs) {
		for _, d := range r.dirs[dir].decisions {
			out = append(out, d.upd)
		}
	}
	return out
}

// publishedIn reads the result of a publication at a workspace path: the
// layer's change there, else the head's entry.
func publishedIn(hv *View, layer []Change) publishedFunc {
	byPath := make(map[string]*Change, len(layer))
	for i := range layer {
		byPath[layer[i].Path] = &layer[i]
	}
	return func(p string) (string, []byte, bool, error) {
		if c, ok := byPath[p]; ok {
			switch c.Kind {
			case ChangeWrite:
				data, err := changeContent(*c)
				mode := "100644"
				if c.Mode&0o111 != 0 {
					mode = "100755"
				}
				return mode, data, err == nil, err
			case ChangeSymlink:
				return "120000", []byte(c.Target), true, nil
			}
			return "", nil, false, nil
		}
		e, err := hv.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) {
			return "", nil, false, nil
		}
		if err != nil {
			return "", nil, false, err
		}
		switch e.Kind {
		case KindSymlink:
			return "120000", []byte(e.Target), true, nil
		case KindFile:
			data, err := readHostFile(e.HostPath)
			mode := "100644"
			if e.Mode&0o111 != 0 {
				mode = "100755"
			}
			return mode, data, err == nil, err
		}
		return "", nil, false, nil
	}
}

// GitHeadCommit is the commit the HEAD of the git directory dir (".git")
// names in view v: "" without a repository or a commit there.
func GitHeadCommit(v *View, dir string) (string, error) {
	h, err := readGitHEAD(viewFS{v}, dir)
	if err != nil || h == "" {
		return "", err
	}
	if isObjectID(h) {
		return h, nil
	}
	refs, err := readGitRefs(viewFS{v}, dir)
	if err != nil {
		return "", err
	}
	if c := refs[strings.TrimPrefix(h, "ref: ")]; isObjectID(c) {
		return c, nil
	}
	return "", nil
}

// GitObjectDirs are the objects directories of git directory dir in each
// layer of m (newest first): together, the objects of m's repository, for
// GIT_ALTERNATE_OBJECT_DIRECTORIES or objects/info/alternates.
func (s *Stack) GitObjectDirs(m Manifest, dir string) []string {
	var out []string
	for _, l := range m.Layers {
		od := filepath.Join(s.LayerDir(l), filepath.FromSlash(dir), "objects")
		if fi, err := os.Lstat(od); err == nil && fi.IsDir() {
			out = append(out, od)
		}
	}
	return out
}

// sessionCommits lists base..tip (newest first, at most 100); nil when git
// cannot tell.
func sessionCommits(ctx context.Context, g *gitExec, base, tip string) []GitCommit {
	args := []string{"log", "-n", "100", "--format=%H%x00%an <%ae>%x00%s", tip}
	if base != "" {
		args = append(args, "^"+base)
	}
	out, err := g.run(ctx, nil, nil, args...)
	if err != nil {
		return nil
	}
	var cs []GitCommit
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.SplitN(line, "\x00", 3)
		if len(f) == 3 {
			cs = append(cs, GitCommit{Commit: f[0], Author: f[1], Subject: f[2]})
		}
	}
	return cs
}
