package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Git at the host's speed (issue #28 item 3): the head's index carries the
// stat data a session sees, so git in a fresh session stats files instead
// of hashing them. Behaviour, not timing: git's cached stat data for every
// tracked file equal the session's lstat in every field git compares, and
// `git status` (optional locks allowed) finds nothing to refresh, so it
// leaves the entries of the session's index as they were, and reports what
// the host reports.

// gitSpeedRepo makes a committed repository with files in directories, an
// executable, a symlink, a file modified after the commit and an untracked
// file.
func (e *env) gitSpeedRepo() string {
	e.t.Helper()
	files := map[string]string{".gitignore": "*.log\n", "run.sh": "#!/bin/sh\necho hi\n"}
	for d := 0; d < 5; d++ {
		for f := 0; f < 20; f++ {
			files[fmt.Sprintf("src/d%d/f%02d.txt", d, f)] = fmt.Sprintf("dir %d file %d\n", d, f)
		}
	}
	root := e.project(files)
	if err := os.Chmod(filepath.Join(root, "run.sh"), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Symlink("src/d0/f00.txt", filepath.Join(root, "link")); err != nil {
		e.t.Fatal(err)
	}
	gitIn(e.t, root, "init", "-q", "-b", "main")
	gitIn(e.t, root, "add", "-A")
	gitIn(e.t, root, "commit", "-q", "-m", "init")
	for p, c := range map[string]string{"src/d1/f03.txt": "changed on the host\n", "new.txt": "untracked\n", "x.log": "ignored\n"} {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
	return root
}

// indexStat is what `git ls-files --debug` shows of one entry, and the
// same fields of the session's lstat.
type indexStat struct{ ctime, mtime, ino, uid, gid, size string }

func parseLsFilesDebug(t *testing.T, out string) map[string]indexStat {
	t.Helper()
	res := map[string]indexStat{}
	var cur string
	var st indexStat
	flush := func() {
		if cur != "" {
			res[cur] = st
		}
	}
	for _, l := range strings.Split(strings.ReplaceAll(out, "\r", ""), "\n") {
		f := strings.Fields(l)
		switch {
		case l == "":
		case !strings.HasPrefix(l, " "):
			flush()
			cur, st = l, indexStat{}
		case f[0] == "ctime:":
			st.ctime = strings.Replace(f[1], ":", ".", 1)
		case f[0] == "mtime:":
			st.mtime = strings.Replace(f[1], ":", ".", 1)
		case f[0] == "dev:" && len(f) == 4:
			st.ino = f[3]
		case f[0] == "uid:" && len(f) == 4:
			st.uid, st.gid = f[1], f[3]
		case f[0] == "size:":
			st.size = f[1]
		}
	}
	flush()
	return res
}

// normNsec writes S.N with N as 9 digits (ls-files --debug prints N bare).
func normNsec(s string) string {
	sec, ns, ok := strings.Cut(s, ".")
	if !ok {
		return s
	}
	return sec + "." + fmt.Sprintf("%09s", ns)
}

// sessionGitState runs, in a session, git status between two digests of
// the index, then lists the index's stat data and the files' lstat.
func (e *env) sessionGitState(id, ws, dir string) (status string, indexChanged bool, cached, seen map[string]indexStat) {
	e.t.Helper()
	// Content-wise: git may write the same entries again (it does when an
	// entry is racily clean, as files written in the second the snapshot
	// ran are), which changes nothing git reads.
	script := `cd ` + dir + ` && git ls-files --debug -s >/tmp/a && git status --porcelain >/tmp/st 2>&1; git ls-files --debug -s >/tmp/b
echo "INDEX $(cmp -s /tmp/a /tmp/b && echo same || echo changed)"; sed 's/^/STATUS /' /tmp/st; diff /tmp/a /tmp/b | head -20 | sed 's/^/DIFF /' 
echo DEBUG; git ls-files --debug; echo STAT
git ls-files -z | xargs -0 stat -c '%n|%.9Z|%.9Y|%i|%u|%g|%s'`
	out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "60000", script)
	if out["status"] != "ok" || num(e.t, out["exit_code"]) != 0 {
		e.t.Fatalf("git in the session: %v", out)
	}
	text := strings.ReplaceAll(out["output"].(string), "\r", "")
	before, rest, ok := strings.Cut(text, "DEBUG\n")
	debug, stat, ok2 := strings.Cut(rest, "STAT\n")
	if !ok || !ok2 {
		e.t.Fatalf("session output: %s", text)
	}
	var st []string
	for _, l := range strings.Split(before, "\n") {
		if s, ok := strings.CutPrefix(l, "STATUS "); ok {
			st = append(st, s)
		}
		if s, ok := strings.CutPrefix(l, "INDEX "); ok {
			indexChanged = s != "same"
		}
		if s, ok := strings.CutPrefix(l, "DIFF "); ok {
			e.t.Logf("index entries after git status: %s", s)
		}
	}
	cached = parseLsFilesDebug(e.t, debug)
	seen = map[string]indexStat{}
	for _, l := range strings.Split(stat, "\n") {
		f := strings.Split(l, "|")
		if len(f) == 7 {
			seen[f[0]] = indexStat{ctime: f[1], mtime: f[2], ino: f[3], uid: f[4], gid: f[5], size: f[6]}
		}
	}
	return strings.Join(st, "\n"), indexChanged, cached, seen
}

func TestGitStatusStatsOnly(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		root := e.gitSpeedRepo()
		hostStatus := strings.TrimRight(gitIn(t, root, "status", "--porcelain"), "\n")
		if !strings.Contains(hostStatus, " M src/d1/f03.txt") || !strings.Contains(hostStatus, "?? new.txt") {
			t.Fatalf("host status: %q", hostStatus)
		}
		before := gitDirState(t, root)
		// count 2: the second stack hard-links the base, which moves every
		// base file's ctime after the first stack's index was written.
		rec := e.mgr("create_sandbox", "--workspace-bind-root", root, "--count", "2", "--overlay", e.overlay)
		sbs := objs(rec["sandboxes"])
		if len(sbs) != 2 {
			t.Fatalf("create_sandbox --count 2: %v", rec)
		}
		for _, sb := range sbs {
			id := sb["id"].(string)
			ws := e.session(id)
			status, changed, cached, seen := e.sessionGitState(id, ws, "/workspace")
			if status != hostStatus {
				t.Errorf("%s: session status %q, host %q", id, status, hostStatus)
			}
			if changed {
				t.Errorf("%s: git status in a fresh session rewrote its index (it had to refresh stat data)", id)
			}
			if len(cached) != 103 || len(seen) != 103 {
				t.Fatalf("%s: %d index entries, %d stats", id, len(cached), len(seen))
			}
			for p, c := range cached {
				s := seen[p]
				c.ctime, c.mtime = normNsec(c.ctime), normNsec(c.mtime)
				if p == "src/d1/f03.txt" {
					// Changed on the host: its stat data stay the host's,
					// so git compares its content.
					if c.ino == s.ino {
						t.Errorf("%s: a changed file got the session's stat data: %+v", id, c)
					}
					continue
				}
				// ctime is not compared in sessions (core.trustCtime=false):
				// the second stack's hard links moved it.
				c.ctime, s.ctime = "", ""
				if c != s {
					t.Errorf("%s: %s: index %+v, session lstat %+v", id, p, c, s)
				}
			}
		}
		if after := gitDirState(t, root); after != before {
			t.Errorf("create_sandbox changed the user's repository")
		}
		// Edits are seen, through the refreshed stat data.
		id := sbs[0]["id"].(string)
		ws := e.session(id)
		out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "60000",
			`for i in 0 1 2; do echo edit >> src/d2/f0$i.txt; done; git status --porcelain; git diff --stat | tail -1`)
		got := strings.ReplaceAll(out["output"].(string), "\r", "")
		for _, want := range []string{" M src/d2/f00.txt", " M src/d2/f02.txt", " M src/d1/f03.txt", "4 files changed"} {
			if !strings.Contains(got, want) {
				t.Errorf("after edits: %q lacks %q", got, want)
			}
		}
	})
}

// gitDirState is what the supervisor must never change in the user's
// repository: the index and HEAD, byte for byte, and the index's mtime.
func gitDirState(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	for _, p := range []string{".git/index", ".git/HEAD"} {
		c, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(filepath.Join(root, p))
		fmt.Fprintf(&b, "%s=%q %v\n", p, c, fi.ModTime().UnixNano())
	}
	return b.String()
}

// Item 4 of issue #28: a linked worktree (its .git a file pointing outside
// the workspace) is refused at create_sandbox with a message saying what is
// supported; a repository with a submodule works in sessions, and the
// submodule's own index gets the session's stat data too.
func TestGitWorktreeAndSubmodules(t *testing.T) {
	t.Run("linked-worktree", func(t *testing.T) {
		e := newEnv(t)
		e.start()
		root := e.gitRepo()
		wt := filepath.Join(e.root, "linked")
		gitIn(t, root, "worktree", "add", "-q", "-b", "side", wt)
		body := e.fail(1, "invalid_request", "sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", wt)
		msg, _ := body["message"].(string)
		for _, want := range []string{"linked git worktree", "Not supported", "Supported", "submodules"} {
			if !strings.Contains(msg, want) {
				t.Errorf("message lacks %q: %s", want, msg)
			}
		}
		// The main working tree is fine, and so is a git_ref snapshot of
		// the worktree (it has no .git).
		e.createSandbox(root)
		e.createSandbox(wt, "--git-ref", "side")
	})
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		sub := filepath.Join(e.root, "subrepo")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		for p, c := range map[string]string{"lib.txt": "library\n", "inc/h.txt": "header\n"} {
			os.MkdirAll(filepath.Join(sub, filepath.Dir(p)), 0o755)
			if err := os.WriteFile(filepath.Join(sub, p), []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		gitIn(t, sub, "init", "-q", "-b", "main")
		gitIn(t, sub, "add", "-A")
		gitIn(t, sub, "commit", "-q", "-m", "sub init")
		root := e.gitSpeedRepo()
		gitIn(t, root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", "file://"+sub, "mod")
		gitIn(t, root, "commit", "-q", "-m", "add submodule")
		hostStatus := strings.TrimRight(gitIn(t, root, "status", "--porcelain"), "\n")
		id := e.createSandbox(root)
		ws := e.session(id)
		status, changed, _, _ := e.sessionGitState(id, ws, "/workspace")
		if status != hostStatus || changed {
			t.Errorf("super repository: status %q (host %q), index rewritten: %v", status, hostStatus, changed)
		}
		status, changed, cached, seen := e.sessionGitState(id, ws, "/workspace/mod")
		if status != "" || changed || len(cached) != 2 {
			t.Errorf("submodule: status %q, index rewritten: %v, entries %v", status, changed, cached)
		}
		for p, c := range cached {
			c.ctime, c.mtime = normNsec(c.ctime), normNsec(c.mtime)
			if s := seen[p]; c != s {
				t.Errorf("submodule %s: index %+v, session lstat %+v", p, c, s)
			}
		}
		out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "60000",
			`git submodule status | cut -c2-; git -C mod log --oneline | wc -l; echo more >> mod/lib.txt; git status --porcelain; git -C mod status --porcelain`)
		got := strings.ReplaceAll(out["output"].(string), "\r", "")
		subHead := strings.TrimSpace(gitIn(t, sub, "rev-parse", "HEAD"))
		for _, want := range []string{subHead + " mod", "\n1\n", " M mod", " M lib.txt"} {
			if !strings.Contains(got, want) {
				t.Errorf("submodule in a session: %q lacks %q", got, want)
			}
		}
	})
}
