package tests

import (
	"os/exec"
	"strings"
	"testing"
)

// Git inside sessions (issue 28, contract A8): agents commit freely and
// publication merges their commits.

// gitSandbox: a repository with three committed files, as a sandbox.
func gitSandbox(t *testing.T) (*env, string) {
	t.Helper()
	e, id, _ := gitSandboxRoot(t)
	return e, id
}

func gitSandboxRoot(t *testing.T) (*env, string, string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		skipOrFail(t, "git CLI: %v", err)
	}
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"src/f1.txt": "f1 line 1\nf1 line 2\n", "src/f2.txt": "f2 line 1\n", "src/f3.txt": "f3 line 1\n"})
	gitIn(t, root, "init", "-q", "-b", "main")
	gitIn(t, root, "config", "user.name", "Repo Owner")
	gitIn(t, root, "config", "user.email", "owner@example.com")
	gitIn(t, root, "add", "-A")
	gitIn(t, root, "commit", "-q", "-m", "initial")
	return e, e.createSandbox(root), root
}

// sh runs a shell command in a session and returns its output; it must
// succeed.
func (e *env) sh(id, ws, cmd string) string {
	e.t.Helper()
	r := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "60000", cmd)
	if r["status"] == "running" {
		r = e.waitDone(id, r["command_session_id"].(string))
	}
	if r["status"] != "ok" || num(e.t, r["exit_code"]) != 0 {
		e.t.Fatalf("%s: %v", cmd, r)
	}
	out, _ := r["output"].(string)
	return out
}

// headGit checks the head's repository through a fresh session: git fsck
// --full passes and git status shows exactly wantStatus; it returns the
// first-parent subjects of HEAD and every commit subject.
func (e *env) headGit(id, wantStatus string) (firstParent, all []string) {
	e.t.Helper()
	ws := e.session(id, "--agent", "checker")
	defer e.rt(id, "destroy_workspace_session", "--workspace-session-id", ws)
	e.sh(id, ws, "git fsck --full --strict --no-dangling >/dev/null 2>&1 || git fsck --full --strict")
	// Each line bracketed: the command output is trimmed.
	if st := e.sh(id, ws, "git status --porcelain | sed 's/^/[/;s/$/]/'"); st != wantStatus {
		e.t.Errorf("head git status %q, want %q", st, wantStatus)
	}
	firstParent = strings.Split(e.sh(id, ws, "git --no-pager log --first-parent --format=%s | cat"), "\n")
	all = strings.Split(e.sh(id, ws, "git --no-pager log --all --format=%s | cat"), "\n")
	return
}

const gitIdent = "git config user.name Agent && git config user.email agent@example.com"

// Two agents commit disjoint edits and both publish: merge (default) and
// rebase; git status on the head is clean and fsck passes.
func TestGitPublishCommits(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		for _, mode := range []string{"merge", "rebase"} {
			t.Run(mode, func(t *testing.T) {
				e, id := gitSandbox(t)
				a := e.session(id, "--agent", "alice")
				b := e.session(id, "--agent", "bob")
				e.sh(id, a, gitIdent+" && echo 'A was here' >> src/f1.txt && git commit -q -am 'A edits f1'")
				e.sh(id, b, gitIdent+" && echo 'B was here' >> src/f2.txt && git commit -q -am 'B edits f2'")
				pa := e.publish(id, a, "--git-refs", mode)["publish"].(map[string]any)
				if s := pa["summary"].(map[string]any); num(t, s["conflict_paths"]) != 0 {
					t.Fatalf("A: %v", pa)
				}
				pb := e.publish(id, b, "--git-refs", mode)["publish"].(map[string]any)
				refs, _ := pb["git_refs"].([]any)
				if len(refs) != 1 || refs[0].(map[string]any)["action"] != mode {
					t.Errorf("B's git_refs: %v", pb["git_refs"])
				}
				fp, all := e.headGit(id, "")
				want := map[string][]string{
					"merge":  {"Merge sandbox session " + b + " (bob) into main", "A edits f1", "initial"},
					"rebase": {"B edits f2", "A edits f1", "initial"},
				}[mode]
				if strings.Join(fp, ";") != strings.Join(want, ";") {
					t.Errorf("first-parent history %q, want %q", fp, want)
				}
				if j := strings.Join(all, ";"); !strings.Contains(j, "A edits f1") || !strings.Contains(j, "B edits f2") {
					t.Errorf("history %q lacks a commit", all)
				}
			})
		}
	})
}

// The same line edited and committed by both: the conflict is on that file
// only, never on a .git path; and a session's git housekeeping (gc, stash,
// a branch, a tag, its config and a hook) publishes without conflicts and
// without the config or the hook.
func TestGitPublishConflictAndHousekeeping(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := gitSandbox(t)
		a := e.session(id, "--agent", "alice")
		b := e.session(id, "--agent", "bob")
		c := e.session(id, "--agent", "carol")
		e.sh(id, a, gitIdent+" && sed -i 's/f1 line 1/f1 line 1 by A/' src/f1.txt && git commit -q -am A")
		e.sh(id, b, gitIdent+" && sed -i 's/f1 line 1/f1 line 1 by B/' src/f1.txt && git commit -q -am B")
		e.sh(id, c, gitIdent+" && echo C >> src/f3.txt && git commit -q -am 'C edits f3' && echo stashed >> src/f2.txt && git stash -q"+
			" && git branch feature && git tag v1 && git gc -q && git config core.fsmonitor 'touch /tmp/pwned'"+
			" && printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout")
		e.publish(id, a)
		rej := e.publishFail(id, b)
		conf := rej["details"].(map[string]any)["publish_rejection"].(map[string]any)["conflicts"].([]any)
		var paths []string
		for _, x := range conf {
			paths = append(paths, x.(map[string]any)["path"].(string))
		}
		if strings.Join(paths, ",") != "src/f1.txt" {
			t.Errorf("conflicts %v, want src/f1.txt only", paths)
		}
		pc := e.publish(id, c)["publish"].(map[string]any)
		if s := pc["summary"].(map[string]any); num(t, s["conflict_paths"]) != 0 || num(t, s["git_protected_paths"]) == 0 {
			t.Errorf("C's publish: %v", s)
		}
		fp, _ := e.headGit(id, "")
		if len(fp) < 2 || !strings.HasPrefix(fp[0], "Merge sandbox session") {
			t.Errorf("history after C: %q", fp)
		}
		ws := e.session(id)
		if out := e.sh(id, ws, "git config --get core.fsmonitor || echo none; test -e .git/hooks/post-checkout && echo hook || echo nohook;"+
			" git rev-parse -q --verify feature >/dev/null && git rev-parse -q --verify v1 >/dev/null && echo refs; git stash list | wc -l"); out != "none\nnohook\nrefs\n0" {
			t.Errorf("head repository: %q", out)
		}
	})
}

// Bad input: a corrupt object, a ref to a missing object and a deleted
// .git each get a clear rejection or a documented outcome, and the head's
// repository stays valid.
func TestGitPublishBadInput(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := gitSandbox(t)
		bad := e.session(id)
		e.sh(id, bad, gitIdent+" && echo x >> src/f1.txt && git commit -q -am x && o=$(git rev-parse HEAD) &&"+
			" f=.git/objects/$(echo $o | cut -c1-2)/$(echo $o | cut -c3-) && chmod u+w $f && echo garbage > $f")
		r := e.publishFail(id, bad)["details"].(map[string]any)["publish_rejection"].(map[string]any)
		if r["reason"] != "git_object_invalid" || !strings.HasPrefix(r["path"].(string), ".git/objects/") {
			t.Errorf("corrupt object: %v", r)
		}
		ghost := e.session(id)
		e.sh(id, ghost, "echo "+strings.Repeat("ab", 20)+" > .git/refs/heads/ghost")
		r = e.publishFail(id, ghost)["details"].(map[string]any)["publish_rejection"].(map[string]any)
		if r["reason"] != "git_ref_invalid" || r["path"] != ".git/refs/heads/ghost" {
			t.Errorf("ref to a missing object: %v", r)
		}
		gone := e.session(id)
		e.sh(id, gone, "rm -rf .git && echo more >> src/f2.txt")
		pg := e.publish(id, gone)["publish"].(map[string]any)
		if s := pg["summary"].(map[string]any); num(t, s["git_protected_paths"]) != 1 {
			t.Errorf("deleted .git: %v", s)
		}
		fp, _ := e.headGit(id, "[ M src/f2.txt]")
		if strings.Join(fp, ";") != "initial" {
			t.Errorf("head history %q", fp)
		}
	})
}

// A sync brings A's commit into B's git log; B's status stays right and its
// publish then merges (issue 28 item 2).
func TestGitSyncBringsCommits(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := gitSandbox(t)
		a := e.session(id, "--agent", "alice")
		b := e.session(id, "--agent", "bob")
		e.sh(id, a, gitIdent+" && echo 'A was here' >> src/f1.txt && git commit -q -am 'A edits f1'")
		e.sh(id, b, gitIdent+" && echo 'B was here' >> src/f2.txt && git commit -q -am 'B edits f2' && echo wip >> src/f3.txt && git status >/dev/null")
		e.publish(id, a)
		r := e.sync(id, b)
		if s := r["sync"].(map[string]any); s["result"] != "synced" {
			t.Fatalf("sync: %v", r)
		}
		if log := e.sh(id, b, "git --no-pager log --format=%s | cat"); !strings.Contains(log, "A edits f1") || !strings.Contains(log, "B edits f2") {
			t.Errorf("B's log after the sync: %q", log)
		}
		if st := e.sh(id, b, "git status --porcelain | sed 's/^/[/;s/$/]/'"); st != "[ M src/f3.txt]" {
			t.Errorf("B's status after the sync: %q", st)
		}
		e.sh(id, b, "git fsck --full --strict >/dev/null 2>&1")
		e.publish(id, b)
		// B's sync merge has B's commit as its first parent; the head
		// fast-forwards to it.
		fp, all := e.headGit(id, "[ M src/f3.txt]")
		if strings.Join(fp, ";") != "Merge the sandbox head's main into session "+b+";B edits f2;initial" || !strings.Contains(strings.Join(all, ";"), "A edits f1") {
			t.Errorf("head history after B: %q (all %q)", fp, all)
		}
	})
}

// The git export reuses the sessions' commits (messages, authors) and adds
// one commit for what the head holds beyond them (issue 28 item 5).
func TestGitExportReusesSessionCommits(t *testing.T) {
	e, id, root := gitSandboxRoot(t)
	a := e.session(id, "--agent", "alice")
	e.sh(id, a, gitIdent+" && echo 'A was here' >> src/f1.txt && git commit -q -am 'A edits f1' && echo wip >> src/f3.txt")
	e.publish(id, a)
	r := e.mgr("export_changes", "--sandbox-id", id, "--format", "git", "--branch", "agents")
	if n := len(r["commits"].([]any)); n != 2 {
		t.Errorf("commits %v", r["commits"])
	}
	got := gitIn(t, root, "log", "--format=%s|%an", "agents")
	want := "Uncommitted changes of sandbox " + id + "|Repo Owner\nA edits f1|Agent\ninitial|Test Setup\n"
	if got != want {
		t.Errorf("exported history:\n%s\nwant:\n%s", got, want)
	}
	if diff := gitIn(t, root, "diff", "--stat", "agents~1", "agents", "--", "src/f3.txt"); !strings.Contains(diff, "src/f3.txt") {
		t.Errorf("the last commit lacks the uncommitted change: %q", diff)
	}
	gitIn(t, root, "fsck", "--full", "--strict")
}

// publish keep:true with commits: the session continues on the head's merge
// commit (its branch fast-forwards to it), and its next commit publishes
// as a fast-forward.
func TestGitPublishKeep(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := gitSandbox(t)
		a := e.session(id, "--agent", "alice")
		b := e.session(id, "--agent", "bob")
		e.sh(id, a, gitIdent+" && echo A >> src/f1.txt && git commit -q -am 'A edits f1'")
		e.sh(id, b, gitIdent+" && echo B >> src/f2.txt && git commit -q -am 'B edits f2'")
		e.publish(id, a)
		e.publish(id, b, "--keep")
		if got := e.sh(id, b, "git --no-pager log -1 --format=%s | cat; git status --porcelain | wc -l"); got != "Merge sandbox session "+b+" (bob) into main\n0" {
			t.Errorf("B after publish keep: %q", got)
		}
		e.sh(id, b, "echo again > src/f4.txt && git add src/f4.txt && git commit -q -m 'B again'")
		pb := e.publish(id, b)["publish"].(map[string]any)
		refs, _ := pb["git_refs"].([]any)
		if len(refs) != 1 || refs[0].(map[string]any)["action"] != "fast_forward" {
			t.Errorf("B's second publish: %v", pb["git_refs"])
		}
		if fp, _ := e.headGit(id, ""); len(fp) == 0 || fp[0] != "B again" {
			t.Errorf("head history %q", fp)
		}
	})
}
