package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// git runs the real git CLI in dir with a fixed identity for the test's own
// commits; the supervisor's commits take the repository's user.name.
func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := gitTry(dir, args...)
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return out
}

func gitTry(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=Test Setup", "GIT_AUTHOR_EMAIL=setup@example.com",
		"GIT_COMMITTER_NAME=Test Setup", "GIT_COMMITTER_EMAIL=setup@example.com", "GIT_CONFIG_NOSYSTEM=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

// gitRepo makes a repository on branch main with one commit and a dirty
// working tree: a modified tracked file, an untracked file, an ignored one.
func (e *env) gitRepo() string {
	e.t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		skipOrFail(e.t, "git CLI: %v", err)
	}
	root := e.project(map[string]string{"a.txt": "one\ntwo\nthree\n", "b.txt": "bee\n", ".gitignore": "*.log\n", "sub/s.txt": "sub\n"})
	gitIn(e.t, root, "init", "-q", "-b", "main")
	gitIn(e.t, root, "config", "user.name", "Repo Owner")
	gitIn(e.t, root, "config", "user.email", "owner@example.com")
	gitIn(e.t, root, "add", "-A")
	gitIn(e.t, root, "commit", "-q", "-m", "init")
	for p, c := range map[string]string{"a.txt": "one\ntwo\nthree\nfour\n", "u.txt": "untracked\n", "x.log": "ignored\n"} {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
	return root
}

// repoState is what an export must never change: the working tree's files,
// the index and HEAD, byte for byte, and the checked-out branch.
func repoState(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	for _, p := range []string{"a.txt", "b.txt", "u.txt", "x.log", "sub/s.txt", ".git/index", ".git/HEAD"} {
		c, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s=%q\n", p, c)
	}
	b.WriteString(gitIn(t, root, "symbolic-ref", "HEAD"))
	b.WriteString(gitIn(t, root, "rev-parse", "refs/heads/main"))
	return b.String()
}

// blameLines flattens file_blame ranges to "start-end owner cmd".
func blameLines(t *testing.T, b map[string]any) []string {
	var out []string
	for _, r := range objs(b["ranges"]) {
		s := num(t, r["start_line"])
		out = append(out, fmt.Sprintf("%d-%d %v %v", s, s+num(t, r["line_count"])-1, r["owner"], r["command_session_id"]))
	}
	return out
}

// traceLines flattens an Agent Trace record's ranges of path the same way
// (owner and command from the conversation's metadata), in line order.
func traceLines(t *testing.T, rec map[string]any, path string) []string {
	t.Helper()
	if rec["version"] != "0.1.0" || rec["id"] == "" || rec["timestamp"] == "" {
		t.Fatalf("not an Agent Trace record: %v", rec)
	}
	if vcs, _ := rec["vcs"].(map[string]any); vcs == nil || vcs["type"] != "git" {
		t.Fatalf("vcs: %v", rec["vcs"])
	}
	type line struct {
		start int64
		s     string
	}
	var ls []line
	found := false
	for _, f := range objs(rec["files"]) {
		if f["path"] != path {
			continue
		}
		found = true
		for _, c := range objs(f["conversations"]) {
			ct, _ := c["contributor"].(map[string]any)
			if ct == nil || ct["type"] == "" {
				t.Fatalf("conversation without contributor type: %v", c)
			}
			meta, _ := c["metadata"].(map[string]any)
			for _, r := range objs(c["ranges"]) {
				s := num(t, r["start_line"])
				ls = append(ls, line{s, fmt.Sprintf("%d-%d %v %v", s, num(t, r["end_line"]), meta["owner"], meta["command_session_id"])})
			}
		}
	}
	if !found {
		t.Fatalf("no file %s in record %v", path, rec)
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i].start < ls[j].start })
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.s
	}
	return out
}

// headTreeNoGit is headTree without the snapshot's .git directory.
func (e *env) headTreeNoGit(id, dir string, out map[string]string) {
	e.t.Helper()
	args := []string{"file_list"}
	if dir != "" {
		args = append(args, "--path", dir)
	}
	for _, m := range objs(e.rt(id, args...)["entries"]) {
		p := m["name"].(string)
		if dir != "" {
			p = dir + "/" + p
		}
		switch {
		case p == ".git":
		case m["kind"] == "directory":
			out[p] = "dir"
			e.headTreeNoGit(id, p, out)
		case m["kind"] == "file":
			out[p] = "file " + e.rt(id, "file_read", "--path", p)["content"].(string)
		default:
			out[p] = m["kind"].(string)
		}
	}
}

func decodeJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	return m
}

func gitLines(s string) []string {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestGitExport(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		root := e.gitRepo()
		headSHA := strings.TrimSpace(gitIn(t, root, "rev-parse", "HEAD"))
		id := e.createSandbox(root)

		g, _ := e.mgr("inspect_sandbox", "--sandbox-id", id)["git"].(map[string]any)
		if g == nil || g["head"] != headSHA || g["branch"] != "main" || g["dirty"] != true {
			t.Fatalf("inspect_sandbox git = %v, want head %s branch main dirty", g, headSHA)
		}

		// Two agents publish in turn.
		ws1 := e.rt(id, "create_workspace_session", "--agent", "alice")["workspace_session_id"].(string)
		c1 := e.exec(id, "--workspace-session-id", ws1, "printf 'alice\\n' >> a.txt; echo new > c.txt; echo built > build.log")
		if c1["status"] != "ok" {
			t.Fatalf("exec: %v", c1)
		}
		l1 := e.rt(id, "publish_workspace_session", "--workspace-session-id", ws1)["publish"].(map[string]any)["layer_id"].(string)
		ws2 := e.rt(id, "create_workspace_session", "--agent", "bob")["workspace_session_id"].(string)
		if c := e.exec(id, "--workspace-session-id", ws2, "sed -i s/bee/BEE/ b.txt && rm u.txt && echo hook > .git/hooks/post-commit"); c["status"] != "ok" {
			t.Fatalf("exec: %v", c)
		}
		l2 := e.rt(id, "publish_workspace_session", "--workspace-session-id", ws2)["publish"].(map[string]any)["layer_id"].(string)

		before := repoState(t, root)
		r := e.mgr("export_changes", "--sandbox-id", id, "--format", "git", "--branch", "agents")
		if after := repoState(t, root); after != before {
			t.Fatalf("export changed the working tree, index or HEAD:\nbefore %s\nafter %s", before, after)
		}
		commits := objs(r["commits"])
		if len(commits) != 3 || r["branch"] != "agents" || r["previous_tip"] != nil {
			t.Fatalf("export result: %v", r)
		}
		tip := strings.TrimSpace(gitIn(t, root, "rev-parse", "agents"))
		if r["tip"] != tip || commits[2]["commit"] != tip {
			t.Fatalf("tip %s, result %v", tip, r)
		}

		// The history: snapshot, alice, bob, on main's HEAD.
		log := gitLines(gitIn(t, root, "log", "--reverse", "--format=%an|%ae|%cn|%(trailers:key=Layer,valueonly,separator=)|%(trailers:key=Workspace-Session,valueonly,separator=)|%(trailers:key=Sandbox-Id,valueonly,separator=)", "main..agents"))
		want := []string{
			"Repo Owner|owner@example.com|Repo Owner|B000001-base||" + id,
			"alice (" + ws1 + ")|" + ws1 + "@sandbox.invalid|Repo Owner|" + l1 + "|" + ws1 + "|" + id,
			"bob (" + ws2 + ")|" + ws2 + "@sandbox.invalid|Repo Owner|" + l2 + "|" + ws2 + "|" + id,
		}
		if !slices.Equal(log, want) {
			t.Fatalf("git log:\n got %q\nwant %q", log, want)
		}
		if p := strings.TrimSpace(gitIn(t, root, "rev-parse", "agents~3")); p != headSHA {
			t.Fatalf("agents~3 = %s, want HEAD %s", p, headSHA)
		}
		msg := gitIn(t, root, "log", "-1", "--format=%B", commits[1]["commit"].(string))
		if !strings.Contains(msg, "printf 'alice\\n' >> a.txt; echo new > c.txt; echo built > build.log") || !strings.Contains(msg, c1["command_session_id"].(string)) {
			t.Errorf("alice's message does not list her command:\n%s", msg)
		}
		stats := map[string]string{}
		for i, c := range commits {
			stats[fmt.Sprint(i)] = strings.Join(gitLines(gitIn(t, root, "show", "--format=", "--name-status", c["commit"].(string))), ",")
		}
		if stats["0"] != "M\ta.txt,A\tu.txt" || stats["1"] != "M\ta.txt,A\tc.txt" || stats["2"] != "M\tb.txt,D\tu.txt" {
			t.Errorf("git show --name-status per commit: %v", stats)
		}
		if st := gitIn(t, root, "show", "--stat", "--format=", commits[1]["commit"].(string)); !strings.Contains(st, "2 files changed, 2 insertions(+)") {
			t.Errorf("git show --stat of alice's commit:\n%s", st)
		}

		// git diff main agents is the sandbox's change: agents' tree is head's.
		if d := strings.Join(gitLines(gitIn(t, root, "diff", "--name-status", "main", "agents")), ","); d != "M\ta.txt,M\tb.txt,A\tc.txt" {
			t.Errorf("git diff main agents: %s", d)
		}
		head := map[string]string{}
		e.headTreeNoGit(id, "", head)
		tree := map[string]string{}
		for _, p := range gitLines(gitIn(t, root, "ls-tree", "-r", "--name-only", "agents")) {
			tree[p] = "file " + strings.TrimSuffix(gitIn(t, root, "show", "agents:"+p), "\n")
		}
		for p, v := range head {
			if v == "dir" || p == "x.log" || p == "build.log" {
				continue
			}
			if tree[p] != v {
				t.Errorf("%s: agents has %q, the sandbox %q", p, tree[p], v)
			}
			delete(tree, p)
		}
		if len(tree) != 0 {
			t.Errorf("agents has paths the sandbox lacks: %v", tree)
		}

		// Attribution notes: Agent Trace records whose ranges are file_blame's.
		aliceNote := decodeJSON(t, gitIn(t, root, "notes", "--ref", "agent-trace", "show", commits[1]["commit"].(string)))
		if aliceNote["vcs"].(map[string]any)["revision"] != commits[1]["commit"] {
			t.Errorf("note revision: %v", aliceNote["vcs"])
		}
		for _, tc := range []struct{ path, commit string }{{"a.txt", commits[1]["commit"].(string)}, {"b.txt", tip}, {"c.txt", commits[1]["commit"].(string)}} {
			note := decodeJSON(t, gitIn(t, root, "notes", "--ref", "agent-trace", "show", tc.commit))
			blame := blameLines(t, e.rt(id, "file_blame", "--path", tc.path))
			if got := traceLines(t, note, tc.path); !slices.Equal(got, blame) {
				t.Errorf("%s: note ranges %v, file_blame %v", tc.path, got, blame)
			}
			if got := traceLines(t, e.rt(id, "file_blame", "--path", tc.path, "--format", "agent-trace"), tc.path); !slices.Equal(got, blame) {
				t.Errorf("%s: file_blame agent-trace %v, ranges %v", tc.path, got, blame)
			}
		}
		if a := traceLines(t, aliceNote, "a.txt"); len(a) != 2 || !strings.Contains(a[1], "workspace_session:"+ws1+" "+c1["command_session_id"].(string)) {
			t.Errorf("a.txt: alice's line is not hers: %v", a)
		}

		// A repeated export adds nothing; after one more publish exactly one commit.
		if r := e.mgr("export_changes", "--sandbox-id", id, "--format", "git", "--branch", "agents"); len(objs(r["commits"])) != 0 || r["tip"] != tip {
			t.Fatalf("repeated export: %v", r)
		}
		// A layer that only deletes has no line records; its author is still
		// the session that published it.
		ws3 := e.rt(id, "create_workspace_session", "--agent", "carol")["workspace_session_id"].(string)
		if c := e.exec(id, "--workspace-session-id", ws3, "rm sub/s.txt"); c["status"] != "ok" {
			t.Fatalf("exec: %v", c)
		}
		l3 := e.rt(id, "publish_workspace_session", "--workspace-session-id", ws3)["publish"].(map[string]any)["layer_id"].(string)
		r = e.mgr("export_changes", "--sandbox-id", id, "--format", "git", "--branch", "agents")
		if c := objs(r["commits"]); len(c) != 1 || c[0]["layer_id"] != l3 || r["previous_tip"] != tip {
			t.Fatalf("second export: %v", r)
		}
		if au := strings.TrimSpace(gitIn(t, root, "log", "-1", "--format=%an|%(trailers:key=Workspace-Session,valueonly,separator=)", "agents")); au != "carol ("+ws3+")|"+ws3 {
			t.Errorf("deleting layer's author: %s", au)
		}
		if st := gitIn(t, root, "show", "--format=", "--name-status", "agents"); strings.TrimSpace(st) != "D\tsub/s.txt" {
			t.Errorf("deleting layer's commit: %q", st)
		}
		if n := strings.TrimSpace(gitIn(t, root, "rev-list", "--count", "main..agents")); n != "4" {
			t.Fatalf("main..agents has %s commits, want 4", n)
		}
		if p := strings.TrimSpace(gitIn(t, root, "rev-parse", "agents^")); p != tip {
			t.Fatalf("the new commit's parent is %s, want the old tip %s", p, tip)
		}
		if after := repoState(t, root); after != before {
			t.Fatalf("second export changed the working tree, index or HEAD")
		}

		// A branch that is not an ancestor is refused, and moved with force.
		diverged := strings.TrimSpace(gitIn(t, root, "commit-tree", "-p", headSHA, "-m", "elsewhere", headSHA+"^{tree}"))
		gitIn(t, root, "update-ref", "refs/heads/other", diverged)
		body := e.fail(1, "invalid_request", "sandbox-manager-cli", "export_changes", "--sandbox-id", id, "--format", "git", "--branch", "other")
		if d := body["details"].(map[string]any); d["reason"] != "not_ancestor" {
			t.Errorf("refusal details: %v", body)
		}
		if got := strings.TrimSpace(gitIn(t, root, "rev-parse", "other")); got != diverged {
			t.Fatalf("refused export moved other to %s", got)
		}
		r = e.mgr("export_changes", "--sandbox-id", id, "--format", "git", "--branch", "other", "--force")
		if len(objs(r["commits"])) != 4 || r["previous_tip"] != diverged {
			t.Fatalf("forced export: %v", r)
		}
		if _, err := gitTry(root, "merge-base", "--is-ancestor", headSHA, "other"); err != nil {
			t.Errorf("forced branch does not descend from HEAD")
		}
		if d := gitIn(t, root, "diff", "agents", "other"); d != "" {
			t.Errorf("forced rebuild differs from agents:\n%s", d)
		}
	})
}

func TestGitExportBadInput(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.gitRepo()
	id := e.createSandbox(root)
	e.rt(id, "file_write", "--path", "n.txt", "--content", "n\n")
	notRepo := filepath.Join(e.root, "plain")
	if err := os.MkdirAll(notRepo, 0o755); err != nil {
		t.Fatal(err)
	}
	otherRepo := filepath.Join(e.root, "other-repo")
	gitIn(t, e.root, "init", "-q", otherRepo)
	refs := gitIn(t, root, "for-each-ref")
	before := repoState(t, root)
	for _, tc := range []struct {
		name, kind, msg string
		args            []string
	}{
		{"no branch", "invalid_request", "needs branch", nil},
		{"bad branch name", "invalid_request", "invalid branch name", []string{"--branch", "a..b"}},
		// #27 item 4: names git itself refuses as a branch, or that would
		// make refs/heads/HEAD or refs/heads/refs/….
		{"branch HEAD", "invalid_request", "invalid branch name", []string{"--branch", "HEAD"}},
		{"branch refs/heads/main", "invalid_request", "must not start with refs/", []string{"--branch", "refs/heads/main"}},
		{"branch refs/notes/agent-trace", "invalid_request", "must not start with refs/", []string{"--branch", "refs/notes/agent-trace"}},
		{"branch x.lock", "invalid_request", "invalid branch name", []string{"--branch", "x.lock"}},
		{"branch -x", "invalid_request", "invalid branch name", []string{"--branch=-x"}},
		{"branch @", "invalid_request", "invalid branch name", []string{"--branch", "@"}},
		{"checked-out branch", "invalid_request", "checked out", []string{"--branch", "main"}},
		{"git_dir not a repo", "invalid_request", "not a git repository", []string{"--branch", "agents", "--git-dir", notRepo}},
		{"git_dir outside the allowed roots", "invalid_request", "must be the workspace's repository", []string{"--branch", "agents", "--git-dir", otherRepo}},
		{"unknown since layer", "not_found", "not a published layer", []string{"--branch", "agents", "--since", "L000099-deadbeef"}},
		{"dest with git", "invalid_request", "not dest", []string{"--branch", "agents", "--dest", filepath.Join(e.root, "out")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"export_changes", "--sandbox-id", id, "--format", "git"}, tc.args...)
			body := e.fail(1, tc.kind, "sandbox-manager-cli", args...)
			if m, _ := body["message"].(string); !strings.Contains(m, tc.msg) {
				t.Errorf("message %q does not say %q", m, tc.msg)
			}
		})
	}
	if got := gitIn(t, root, "for-each-ref"); got != refs {
		t.Errorf("refs changed:\n%s\nwant\n%s", got, refs)
	}
	if _, err := gitTry(root, "notes", "--ref", "agent-trace", "list"); err == nil {
		if out, _ := gitTry(root, "notes", "--ref", "agent-trace", "list"); strings.TrimSpace(out) != "" {
			t.Errorf("refused exports wrote notes: %s", out)
		}
	}
	if after := repoState(t, root); after != before {
		t.Errorf("refused exports changed the repository")
	}
	if _, err := os.Stat(filepath.Join(e.root, "out")); err == nil {
		t.Errorf("a refused export wrote dest")
	}
	// A sandbox of a plain directory has no git origin: git_dir is needed.
	plainID := e.createSandbox(notRepo)
	if g, ok := e.mgr("inspect_sandbox", "--sandbox-id", plainID)["git"]; ok {
		t.Errorf("a plain directory has git %v", g)
	}
	e.fail(1, "invalid_request", "sandbox-manager-cli", "export_changes", "--sandbox-id", plainID, "--format", "git", "--branch", "x")
	e.fail(1, "invalid_request", "sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", notRepo, "--git-ref", "main")
	e.fail(1, "invalid_request", "sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", root, "--git-ref", "no-such-ref")
}

func TestGitRefSnapshot(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.gitRepo()
	gitIn(t, root, "checkout", "-q", "-b", "feature")
	gitIn(t, root, "add", "-A")
	gitIn(t, root, "commit", "-q", "-m", "feature work")
	if err := os.WriteFile(filepath.Join(root, "a.txt"), []byte("dirty again\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mainSHA := strings.TrimSpace(gitIn(t, root, "rev-parse", "main"))
	before := repoState(t, root)
	id := e.createSandbox(root, "--git-ref", "main")
	rec := e.mgr("inspect_sandbox", "--sandbox-id", id)
	g, _ := rec["git"].(map[string]any)
	if g == nil || g["head"] != mainSHA || g["branch"] != "main" || g["dirty"] != false || g["ref"] != "main" {
		t.Fatalf("git origin of --git-ref main: %v", g)
	}
	head := map[string]string{}
	e.headTree(id, "", head)
	want := map[string]string{}
	for _, p := range gitLines(gitIn(t, root, "ls-tree", "-r", "--name-only", "main")) {
		want[p] = "file " + strings.TrimSuffix(gitIn(t, root, "show", "main:"+p), "\n")
		for d := filepath.Dir(p); d != "."; d = filepath.Dir(d) {
			want[d] = "dir"
		}
	}
	sameTree(t, "--git-ref main", head, want)
	if after := repoState(t, root); after != before {
		t.Errorf("create_sandbox --git-ref changed the repository")
	}
	// Exporting it adds no snapshot commit: the base is main's tree.
	e.rt(id, "file_write", "--path", "b.txt", "--content", "from main\n")
	r := e.mgr("export_changes", "--sandbox-id", id, "--format", "git", "--branch", "from-main")
	if c := objs(r["commits"]); len(c) != 1 || strings.TrimSpace(gitIn(t, root, "rev-parse", "from-main^")) != mainSHA {
		t.Fatalf("export of a --git-ref sandbox: %v", r)
	}
	// The record survives a restart.
	e.stop()
	e.start()
	if g2, _ := e.mgr("inspect_sandbox", "--sandbox-id", id)["git"].(map[string]any); g2 == nil || g2["head"] != mainSHA || g2["ref"] != "main" {
		t.Errorf("git origin after restart: %v", g2)
	}
}

// A workspace below the top level exports into its own directory of the
// tree; since skips layers (the first commit then carries them).
func TestGitExportSubdirectory(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.gitRepo()
	if err := os.Remove(filepath.Join(root, "u.txt")); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(root, "sub")
	id := e.createSandbox(sub)
	g, _ := e.mgr("inspect_sandbox", "--sandbox-id", id)["git"].(map[string]any)
	if g == nil || g["prefix"] != "sub/" || g["dirty"] != false {
		t.Fatalf("git origin of a subdirectory: %v", g)
	}
	l1 := e.rt(id, "file_write", "--path", "one.txt", "--content", "1\n")["layer_id"].(string)
	e.rt(id, "file_write", "--path", "s.txt", "--content", "sub changed\n")
	r := e.mgr("export_changes", "--sandbox-id", id, "--format", "git", "--branch", "sub-agents")
	if len(objs(r["commits"])) != 2 {
		t.Fatalf("export: %v", r)
	}
	if d := strings.Join(gitLines(gitIn(t, root, "diff", "--name-status", "main", "sub-agents")), ","); d != "A\tsub/one.txt,M\tsub/s.txt" {
		t.Errorf("git diff main sub-agents: %s", d)
	}
	r = e.mgr("export_changes", "--sandbox-id", id, "--format", "git", "--branch", "since", "--since", l1)
	if c := objs(r["commits"]); len(c) != 1 || c[0]["layer_id"] == l1 {
		t.Fatalf("export --since: %v", r)
	}
	if d := gitIn(t, root, "diff", "sub-agents", "since"); d != "" {
		t.Errorf("--since tree differs from the full export:\n%s", d)
	}
}
