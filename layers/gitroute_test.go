package layers

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/layers/gitindex"
	"golang.org/x/sys/unix"
)

// ---- real git repositories as a session sees them ----

func runGitT(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(gitBaseEnv(), "GIT_AUTHOR_NAME=tester", "GIT_AUTHOR_EMAIL=t@example.com",
		"GIT_COMMITTER_NAME=tester", "GIT_COMMITTER_EMAIL=t@example.com", "GIT_OPTIONAL_LOCKS=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("git %v in %s: %v: %s", args, dir, err, errb.String())
	}
	return out.String()
}

// gitRepoStack: a workspace repository with src/f1.txt, src/f2.txt,
// src/f3.txt committed on main.
func gitRepoStack(t *testing.T) *Stack {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	return pubStack(t, func(ws string) {
		runGitT(t, ws, "init", "-q", "-b", "main")
		for _, f := range []string{"f1", "f2", "f3"} {
			writeFile(t, filepath.Join(ws, "src", f+".txt"), f+" line 1\n"+f+" line 2\n", 0o644)
		}
		runGitT(t, ws, "add", "-A")
		runGitT(t, ws, "commit", "-q", "-m", "initial")
	})
}

// materialize copies a view into a new host directory.
func materialize(t *testing.T, v *View) string {
	t.Helper()
	dst := tempDir(t)
	var rec func(rel string)
	rec = func(rel string) {
		es, err := v.ReadDir(rel)
		if err != nil {
			t.Fatalf("ReadDir(%q): %v", rel, err)
		}
		for _, e := range es {
			p := filepath.Join(dst, filepath.FromSlash(e.Path))
			switch e.Kind {
			case KindDir:
				mkdir(t, p, e.Mode.Perm()|0o700)
				rec(e.Path)
			case KindFile:
				data, err := os.ReadFile(e.HostPath)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, data, e.Mode.Perm()|0o600); err != nil {
					t.Fatal(err)
				}
			case KindSymlink:
				symlink(t, e.Target, p)
			}
		}
	}
	rec("")
	return dst
}

// sessionOf is a session's work: a copy of base's view the test changes.
type sessionOf struct {
	s    *Stack
	base Manifest
	dir  string
	// opaque: directories the session removed and made again (an opaque
	// directory in its upper, as the overlay makes it).
	opaque []string
}

func (ss *sessionOf) underOpaque(rel string) bool {
	for _, o := range ss.opaque {
		if rel == o || isBelow(rel, o) {
			return true
		}
	}
	return false
}

func newSession(t *testing.T, s *Stack) *sessionOf {
	base := mustHead(t, s)
	return &sessionOf{s: s, base: base, dir: materialize(t, s.View(base))}
}

func (ss *sessionOf) git(t *testing.T, args ...string) string { return runGitT(t, ss.dir, args...) }

func (ss *sessionOf) appendFile(t *testing.T, rel, line string) {
	f, err := os.OpenFile(filepath.Join(ss.dir, rel), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(line)
	f.Close()
}

// changeset captures the session's work as an upper dir over its base.
func (ss *sessionOf) changeset(t *testing.T) *Changeset {
	t.Helper()
	cs, _ := ss.upper(t)
	return cs
}

// upper builds the session's upper dir and captures it.
func (ss *sessionOf) upper(t *testing.T) (*Changeset, string) {
	t.Helper()
	upper := filepath.Join(tempDir(t), "upper")
	mkdir(t, upper, 0o755)
	bv := ss.s.View(ss.base)
	// Everything new or different in the work dir.
	err := filepath.WalkDir(ss.dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(ss.dir, p)
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		e, berr := bv.Lstat(rel)
		dst := filepath.Join(upper, filepath.FromSlash(rel))
		switch {
		case fi.IsDir():
			if ss.underOpaque(rel) {
				if err := os.MkdirAll(dst, fi.Mode().Perm()); err != nil {
					return err
				}
				if rel == ss.opaque[0] || contains(ss.opaque, rel) {
					return MakeOpaque(dst)
				}
				return nil
			}
			if berr != nil || e.Kind != KindDir {
				return os.MkdirAll(dst, fi.Mode().Perm())
			}
			return nil
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			if berr == nil && e.Kind == KindSymlink && e.Target == target {
				return nil
			}
			os.MkdirAll(filepath.Dir(dst), 0o755)
			return os.Symlink(target, dst)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if berr == nil && e.Kind == KindFile && e.Mode.Perm() == fi.Mode().Perm() && !ss.underOpaque(rel) {
			if old, _ := os.ReadFile(e.HostPath); bytes.Equal(old, data) {
				return nil
			}
		}
		os.MkdirAll(filepath.Dir(dst), 0o755)
		return os.WriteFile(dst, data, fi.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
	// Whiteouts for what the work dir lost.
	var rec func(rel string)
	rec = func(rel string) {
		es, err := bv.ReadDir(rel)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if ss.underOpaque(e.Path) {
				continue
			}
			if _, err := os.Lstat(filepath.Join(ss.dir, filepath.FromSlash(e.Path))); errors.Is(err, fs.ErrNotExist) {
				dir := filepath.Join(upper, filepath.FromSlash(parentOf(e.Path)))
				os.MkdirAll(dir, 0o755)
				if err := MakeWhiteout(dir, filepath.Base(e.Path)); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if e.Kind == KindDir {
				rec(e.Path)
			}
		}
	}
	rec("")
	cs, err := Capture(context.Background(), upper, bv)
	if err != nil {
		t.Fatalf("Capture: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, upper
}

func (ss *sessionOf) publish(t *testing.T, opt PublishOptions) (*Plan, error) {
	t.Helper()
	plan, _, err := ss.s.PublishChangeset(context.Background(), ss.base, ss.changeset(t), opt)
	return plan, err
}

// headRepo checks the head's repository: fsck clean, work tree, index and
// HEAD agreeing (git status empty unless wantStatus), and returns its dir.
func headRepo(t *testing.T, s *Stack, wantStatus string) string {
	t.Helper()
	dir := materialize(t, s.View(mustHead(t, s)))
	runGitT(t, dir, "fsck", "--full", "--strict", "--no-dangling")
	if st := runGitT(t, dir, "status", "--porcelain"); st != wantStatus {
		t.Errorf("head git status %q, want %q", st, wantStatus)
	}
	return dir
}

func gitLog(t *testing.T, dir string, args ...string) string {
	return runGitT(t, dir, append([]string{"log", "--format=%s|%an|%P"}, args...)...)
}

func refUpdate(plan *Plan, ref string) *GitRefUpdate {
	for i := range plan.GitRefs {
		if plan.GitRefs[i].Ref == ref {
			return &plan.GitRefs[i]
		}
	}
	return nil
}

// Two sessions commit disjoint edits and both publish: the first fast-
// forwards, the second is joined per the ref mode (issue 28 item 1).
func TestPublishGitCommits(t *testing.T) {
	cases := []struct {
		mode     GitRefMode
		action   string
		subjects []string // git log --first-parent subjects of main, newest first
		parents  int      // parents of main's tip
	}{
		{GitRefsMerge, RefMerge, []string{"Merge sandbox session sB (bob) into main", "A edits f1", "initial"}, 2},
		{GitRefsRebase, RefRebase, []string{"B edits f2", "A edits f1", "initial"}, 1},
		// branch: A fast-forwards; B's commits only reach its own branch.
		{GitRefsBranch, RefBranch, []string{"A edits f1", "initial"}, 1},
	}
	for _, c := range cases {
		t.Run(string(c.mode), func(t *testing.T) {
			s := gitRepoStack(t)
			a, b := newSession(t, s), newSession(t, s)
			a.appendFile(t, "src/f1.txt", "A was here\n")
			a.git(t, "commit", "-q", "-am", "A edits f1")
			b.appendFile(t, "src/f2.txt", "B was here\n")
			b.git(t, "commit", "-q", "-am", "B edits f2")
			// B also leaves an uncommitted edit: published, shown by status.
			b.appendFile(t, "src/f3.txt", "uncommitted\n")

			opt := PublishOptions{Git: GitOptions{RefMode: c.mode, Agent: "alice", Session: "sA", Committer: GitIdent{"User", "u@example.com"}}}
			plan, err := a.publish(t, opt)
			if err != nil {
				t.Fatalf("A: %v", err)
			}
			if u := refUpdate(plan, "refs/heads/main"); u == nil || u.Action != RefFastForward {
				t.Errorf("A's main: %+v", u)
			}
			for _, pp := range plan.all {
				if pp.Outcome == OutcomeConflict {
					t.Errorf("A conflict at %s", pp.Path)
				}
			}
			headRepo(t, s, "")

			opt.Git.Agent, opt.Git.Session = "bob", "sB"
			plan, err = b.publish(t, opt)
			if err != nil {
				t.Fatalf("B: %v", err)
			}
			ref := "refs/heads/main"
			if c.mode == GitRefsBranch {
				ref = "refs/heads/sandbox/bob-sB"
			}
			if u := refUpdate(plan, ref); u == nil || u.Action != c.action {
				t.Errorf("B's %s: %+v (all %+v)", ref, u, plan.GitRefs)
			} else if len(u.SessionCommits) != 1 || u.SessionCommits[0].Subject != "B edits f2" || u.SessionCommits[0].Author != "tester <t@example.com>" {
				t.Errorf("B's commits for review: %+v", u.SessionCommits)
			}
			status := " M src/f3.txt\n"
			if c.mode == GitRefsBranch {
				status = " M src/f2.txt\n M src/f3.txt\n"
			}
			dir := headRepo(t, s, status)
			var subjects []string
			for _, l := range strings.Split(strings.TrimSpace(gitLog(t, dir, "--first-parent")), "\n") {
				subjects = append(subjects, strings.SplitN(l, "|", 2)[0])
			}
			if strings.Join(subjects, ";") != strings.Join(c.subjects, ";") {
				t.Errorf("main: %q, want %q", subjects, c.subjects)
			}
			tip := strings.Fields(strings.Split(gitLog(t, dir, "-1"), "|")[2])
			if len(tip) != c.parents {
				t.Errorf("tip parents %v, want %d", tip, c.parents)
			}
			all := gitLog(t, dir, "--all")
			for _, m := range []string{"A edits f1", "B edits f2"} {
				if !strings.Contains(all, m) {
					t.Errorf("history lacks %q:\n%s", m, all)
				}
			}
			if c.mode == GitRefsMerge && !strings.Contains(gitLog(t, dir, "-1"), "|bob|") {
				t.Errorf("merge author: %s", gitLog(t, dir, "-1"))
			}
			if c.mode == GitRefsRebase && !strings.Contains(gitLog(t, dir, "-1"), "B edits f2|tester|") {
				t.Errorf("replayed commit keeps its author: %s", gitLog(t, dir, "-1"))
			}
			if c.mode == GitRefsBranch {
				if got := runGitT(t, dir, "log", "--format=%s", "-1", "sandbox/bob-sB"); got != "B edits f2\n" {
					t.Errorf("sandbox branch tip %q", got)
				}
			}
			data, _ := os.ReadFile(filepath.Join(dir, "src", "f2.txt"))
			if !strings.Contains(string(data), "B was here") {
				t.Errorf("f2: %q", data)
			}
		})
	}
}

// The same line edited by both: the file conflicts, never a .git path.
func TestPublishGitSameLineConflict(t *testing.T) {
	s := gitRepoStack(t)
	a, b := newSession(t, s), newSession(t, s)
	os.WriteFile(filepath.Join(a.dir, "src/f1.txt"), []byte("f1 line 1 by A\nf1 line 2\n"), 0o644)
	a.git(t, "commit", "-q", "-am", "A")
	os.WriteFile(filepath.Join(b.dir, "src/f1.txt"), []byte("f1 line 1 by B\nf1 line 2\n"), 0o644)
	b.git(t, "commit", "-q", "-am", "B")
	if _, err := a.publish(t, PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	plan, err := b.publish(t, PublishOptions{})
	var rej *Rejection
	if !errors.As(err, &rej) {
		t.Fatalf("want a rejection, got %v", err)
	}
	var paths []string
	for _, c := range rej.Conflicts {
		paths = append(paths, c.Path)
	}
	if strings.Join(paths, ",") != "src/f1.txt" {
		t.Errorf("conflicts %v, want src/f1.txt only", paths)
	}
	_ = plan
	headRepo(t, s, "")
	// theirs on the file: B's commit is merged, the merge keeps A's line.
	if _, err := b.publish(t, PublishOptions{Resolutions: map[string]Strategy{"src/f1.txt": StrategyTheirs}}); err != nil {
		t.Fatalf("theirs: %v", err)
	}
	dir := headRepo(t, s, "")
	if data, _ := os.ReadFile(filepath.Join(dir, "src/f1.txt")); string(data) != "f1 line 1 by A\nf1 line 2\n" {
		t.Errorf("f1 %q", data)
	}
}

// gc, stash, a branch, a tag, config and a hook: published without a
// conflict, the config and hook stay in the session.
func TestPublishGitHousekeeping(t *testing.T) {
	s := gitRepoStack(t)
	a, b := newSession(t, s), newSession(t, s)
	a.appendFile(t, "src/f1.txt", "A\n")
	a.git(t, "commit", "-q", "-am", "A edits f1")
	if _, err := a.publish(t, PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	b.appendFile(t, "src/f2.txt", "B\n")
	b.git(t, "commit", "-q", "-am", "B edits f2")
	b.appendFile(t, "src/f3.txt", "stashed\n")
	b.git(t, "stash", "-q")
	b.git(t, "branch", "feature")
	b.git(t, "tag", "v1")
	b.git(t, "gc", "-q")
	b.git(t, "config", "core.fsmonitor", "touch /tmp/pwned")
	writeFile(t, filepath.Join(b.dir, ".git/hooks/post-checkout"), "#!/bin/sh\ntouch /tmp/pwned\n", 0o755)
	plan, err := b.publish(t, PublishOptions{})
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	for _, pp := range plan.all {
		if pp.Outcome == OutcomeConflict {
			t.Errorf("conflict at %s", pp.Path)
		}
	}
	dir := headRepo(t, s, "")
	if cfg, _ := os.ReadFile(filepath.Join(dir, ".git/config")); strings.Contains(string(cfg), "pwned") {
		t.Errorf("config published: %s", cfg)
	}
	if _, err := os.Stat(filepath.Join(dir, ".git/hooks/post-checkout")); err == nil {
		t.Error("hook published")
	}
	for _, r := range []string{"feature", "v1"} {
		runGitT(t, dir, "rev-parse", "--verify", r)
	}
	if out := runGitT(t, dir, "stash", "list"); out != "" {
		t.Errorf("stash published: %q", out)
	}
}

// Refs both sides moved differently conflict like a path; ours and theirs
// pick a side.
func TestPublishGitRefConflict(t *testing.T) {
	for _, st := range []Strategy{StrategyMerge, StrategyOurs, StrategyTheirs} {
		t.Run(string(st), func(t *testing.T) {
			s := gitRepoStack(t)
			a, b := newSession(t, s), newSession(t, s)
			a.git(t, "commit", "-q", "--allow-empty", "-m", "A")
			a.git(t, "tag", "v1")
			a.git(t, "reset", "-q", "--hard", "HEAD~1")
			b.git(t, "commit", "-q", "--allow-empty", "-m", "B")
			b.git(t, "tag", "v1")
			b.git(t, "reset", "-q", "--hard", "HEAD~1")
			if _, err := a.publish(t, PublishOptions{}); err != nil {
				t.Fatal(err)
			}
			plan, err := b.publish(t, PublishOptions{Resolutions: map[string]Strategy{".git/refs/tags/v1": st}})
			dir := headRepo(t, s, "")
			got := strings.TrimSpace(runGitT(t, dir, "log", "-1", "--format=%s", "v1"))
			switch st {
			case StrategyMerge:
				var rej *Rejection
				if !errors.As(err, &rej) || len(rej.Conflicts) != 1 || rej.Conflicts[0].Path != ".git/refs/tags/v1" ||
					rej.Conflicts[0].ConflictReason != ConflictReasonChangedOnBothSides {
					t.Fatalf("want one ref conflict, got %v %+v", err, rej)
				}
				if got != "A" {
					t.Errorf("v1 is %s", got)
				}
			case StrategyOurs, StrategyTheirs:
				if err != nil {
					t.Fatal(err)
				}
				want := map[Strategy]string{StrategyOurs: "B", StrategyTheirs: "A"}[st]
				if got != want {
					t.Errorf("v1 is %s, want %s", got, want)
				}
				wantOutcome(t, plan, ".git/refs/tags/v1", string(st), "")
			}
		})
	}
}

// Bad input: a corrupt object, a ref to a missing object, a deleted .git.
func TestPublishGitBadInput(t *testing.T) {
	cases := []struct {
		name   string
		do     func(t *testing.T, ss *sessionOf)
		reject string
		path   string
	}{
		{"corrupt loose object", func(t *testing.T, ss *sessionOf) {
			ss.appendFile(t, "src/f1.txt", "x\n")
			ss.git(t, "commit", "-q", "-am", "x")
			id := strings.TrimSpace(ss.git(t, "rev-parse", "HEAD"))
			p := filepath.Join(ss.dir, ".git/objects", id[:2], id[2:])
			os.Chmod(p, 0o644)
			os.WriteFile(p, []byte("garbage"), 0o444)
		}, RejectGitObjectInvalid, ""},
		{"ref to a missing object", func(t *testing.T, ss *sessionOf) {
			writeFile(t, filepath.Join(ss.dir, ".git/refs/heads/ghost"), strings.Repeat("ab", 20)+"\n", 0o644)
		}, RejectGitRefInvalid, ".git/refs/heads/ghost"},
		{"deleted .git", func(t *testing.T, ss *sessionOf) {
			os.RemoveAll(filepath.Join(ss.dir, ".git"))
			ss.appendFile(t, "src/f1.txt", "x\n")
		}, "", ""},
		{"a new repository in place of .git", func(t *testing.T, ss *sessionOf) {
			os.RemoveAll(filepath.Join(ss.dir, ".git"))
			ss.opaque = []string{".git"}
			ss.git(t, "init", "-q", "-b", "main")
			ss.git(t, "add", "-A")
			ss.git(t, "commit", "-q", "-m", "other history")
		}, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := gitRepoStack(t)
			ss := newSession(t, s)
			c.do(t, ss)
			_, err := ss.publish(t, PublishOptions{})
			var rej *Rejection
			switch {
			case c.reject == "" && err != nil:
				t.Fatalf("publish: %v", err)
			case c.reject != "" && (!errors.As(err, &rej) || rej.Reason != c.reject):
				t.Fatalf("want rejection %s, got %v", c.reject, err)
			case c.reject != "" && c.path != "" && rej.Path != c.path:
				t.Errorf("rejected path %s, want %s", rej.Path, c.path)
			}
			status := ""
			if c.name == "deleted .git" {
				status = " M src/f1.txt\n"
			}
			dir := headRepo(t, s, status)
			if got := gitLog(t, dir); !strings.HasPrefix(got, "initial|") {
				t.Errorf("head history changed: %s", got)
			}
		})
	}
}

// A sync brings the head's commits into the session's branch: a fast-
// forward without commits of its own, else a merge or a replay; the
// session's git status stays right (issue 28 item 2).
func TestSyncGitCommits(t *testing.T) {
	cases := []struct {
		name    string
		mode    GitRefMode
		commit  bool
		action  string
		subject string // the session's HEAD after the sync
	}{
		{"fast-forward", GitRefsMerge, false, RefFastForward, "A edits f1"},
		{"merge", GitRefsMerge, true, RefMerge, "Merge the sandbox head's main into session sB"},
		{"rebase", GitRefsRebase, true, RefRebase, "B edits f2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := gitRepoStack(t)
			a, b := newSession(t, s), newSession(t, s)
			a.appendFile(t, "src/f1.txt", "A\n")
			a.git(t, "commit", "-q", "-am", "A edits f1")
			if _, err := a.publish(t, PublishOptions{}); err != nil {
				t.Fatal(err)
			}
			b.appendFile(t, "src/f2.txt", "B\n")
			if c.commit {
				b.git(t, "commit", "-q", "-am", "B edits f2")
			}
			b.git(t, "status") // the session's index is in its upper
			_, upper := b.upper(t)
			target := mustHead(t, s)
			plan, _, err := s.SyncUpper(context.Background(), SyncOptions{Base: b.base, Target: target, Upper: upper,
				Git: GitOptions{RefMode: c.mode, Agent: "bob", Session: "sB"}})
			if err != nil {
				t.Fatalf("sync: %v", err)
			}
			if err := CompleteSync(upper); err != nil {
				t.Fatal(err)
			}
			if u := refUpdate(plan, "refs/heads/main"); u == nil || u.Action != c.action {
				t.Errorf("main: %+v", plan.GitRefs)
			}
			// The synced session's view, published as is, is what the
			// session sees.
			cs, err := Capture(context.Background(), upper, s.View(target))
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			if _, _, err := s.PublishChangeset(context.Background(), target, cs, PublishOptions{}); err != nil {
				t.Fatal(err)
			}
			status := " M src/f2.txt\n"
			if c.commit {
				status = ""
			}
			dir := headRepo(t, s, status)
			if got := strings.TrimSpace(runGitT(t, dir, "log", "-1", "--format=%s")); got != c.subject {
				t.Errorf("session HEAD %q, want %q", got, c.subject)
			}
			if all := gitLog(t, dir); !strings.Contains(all, "A edits f1") {
				t.Errorf("session log lacks A's commit:\n%s", all)
			}
		})
	}
}

// A publish that moves the head's HEAD writes a head index whose entries
// for the files it leaves alone carry the stat data a session sees (the
// layer file's inode, mtime and size), so a fresh session's git status
// stats them; the file it changed is left for git to re-read.
func TestPublishGitHeadIndexStat(t *testing.T) {
	s := gitRepoStack(t)
	a := newSession(t, s)
	a.appendFile(t, "src/f1.txt", "A was here\n")
	a.git(t, "commit", "-q", "-am", "A edits f1")
	if _, err := a.publish(t, PublishOptions{Git: GitOptions{Agent: "alice", Session: "sA", Committer: GitIdent{"User", "u@example.com"}}}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	v := s.View(mustHead(t, s))
	data, err := v.ReadFile(".git/index")
	if err != nil {
		t.Fatal(err)
	}
	x, err := gitindex.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, e := range x.Entries {
		ve, err := v.Lstat(e.Path)
		if err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(ve.HostPath, &st); err != nil {
			t.Fatal(err)
		}
		switch e.Path {
		case "src/f2.txt", "src/f3.txt":
			seen++
			if e.Stat.Ino != uint32(st.Ino) || e.Stat.Size != uint32(st.Size) || e.Stat.MtimeSec != uint32(st.Mtim.Sec) {
				t.Errorf("%s: index stat %+v, want the layer file's (ino %d size %d)", e.Path, e.Stat, st.Ino, st.Size)
			}
		case "src/f1.txt":
			seen++
			if e.Stat.Ino != 0 {
				t.Errorf("%s: changed by the publish, stat %+v, want zero", e.Path, e.Stat)
			}
		}
	}
	if seen != 3 {
		t.Fatalf("index entries: %+v", x.Entries)
	}
}
