package tests

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// plantedGit is what a hostile agent writes into the workspace's git
// directory: a configuration whose fsmonitor is one of its own scripts, and
// hooks for what a user runs next (status, commit, checkout). Each script
// appends its name to "<work tree>.marks/<name>", so the same files run in
// another clone mark that clone's directory.
func plantedGit() map[string]string {
	hook := func(name string) string {
		return "#!/bin/sh\necho " + name + " >> \"$PWD.marks/" + name + "\"\nexit 0\n"
	}
	files := map[string]string{
		".git/config": "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n" +
			"\tfsmonitor = .git/hooks/query-watchman\n[user]\n\tname = Repo Owner\n\temail = owner@example.com\n",
		".git/hooks/query-watchman": "#!/bin/sh\necho fsmonitor >> \"$PWD.marks/fsmonitor\"\nexit 1\n",
	}
	for _, h := range []string{"pre-commit", "post-commit", "post-checkout", "reference-transaction", "post-index-change"} {
		files[".git/hooks/"+h] = hook(h)
	}
	return files
}

// hostGitSession is what a user does in their repository after an export:
// status, commit, checkout. It returns the marker files written.
func hostGitSession(t *testing.T, root string) []string {
	t.Helper()
	marks := root + ".marks"
	if err := os.MkdirAll(marks, 0o755); err != nil {
		t.Fatal(err)
	}
	gitIn(t, root, "status", "--porcelain")
	gitIn(t, root, "add", "-A")
	gitIn(t, root, "commit", "-q", "-m", "after the export")
	gitIn(t, root, "checkout", "-q", "-b", "after-export")
	gitIn(t, root, "checkout", "-q", "main")
	ents, err := os.ReadDir(marks)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// TestMCPAgentCannotPlantGitHooks (#27 item 1): an agent with nothing but
// the default sandbox-mcp tools plants a git configuration (core.fsmonitor)
// and hooks in a session, publishes, and exports into the workspace root, a
// real git work tree (the README's own example). The user's next git
// status, commit and checkout there run none of the agent's programs; the
// publish says the git paths stayed in the session; the agent's ordinary
// file is exported. The control runs the same files in a clone to show
// they would fire.
func TestMCPAgentCannotPlantGitHooks(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.gitRepo()
	configBefore, err := os.ReadFile(filepath.Join(root, ".git", "config"))
	if err != nil {
		t.Fatal(err)
	}

	c := e.mcpIn("", bin("sandbox-mcp")) // the default set
	c.initialize()
	isErr, sbx := c.call("create_sandbox", map[string]any{"workspace_root": root})
	if isErr {
		t.Fatalf("create_sandbox: %v", sbx)
	}
	id := sbx["id"].(string)
	isErr, ws := c.call("create_workspace_session", map[string]any{"sandbox_id": id, "agent": "attacker"})
	if isErr {
		t.Fatalf("session: %v", ws)
	}
	wsID := ws["workspace_session_id"].(string)
	planted := plantedGit()
	planted["agent.txt"] = "ordinary work\n"
	for p, content := range planted {
		if isErr, obj := c.call("file_write", map[string]any{"sandbox_id": id, "workspace_session_id": wsID, "path": p, "content": content}); isErr {
			t.Fatalf("file_write %s: %v", p, obj)
		}
	}
	r := c.send("tools/call", map[string]any{"name": "exec_command", "arguments": map[string]any{"sandbox_id": id,
		"workspace_session_id": wsID, "cmd": "chmod 755 .git/hooks/*", "yield_time_ms": 30000}}, false)
	if meta, out := c.commandText(r); meta["status"] != "ok" {
		t.Fatalf("exec: %v %s", meta, out)
	}
	isErr, pub := c.call("publish_workspace_session", map[string]any{"sandbox_id": id, "workspace_session_id": wsID})
	if isErr {
		t.Fatalf("publish: %v", pub)
	}
	sum, _ := pub["publish"].(map[string]any)["summary"].(map[string]any)
	if sum["result"] != "published" || sum["published_paths"] != float64(1) || sum["git_protected_paths"].(float64) < float64(len(planted)-1) {
		t.Errorf("publish summary does not say the git files stayed in the session: %v", sum)
	}
	isErr, ex := c.call("export_changes", map[string]any{"sandbox_id": id, "dest": root})
	if isErr {
		t.Fatalf("export_changes: %v", ex)
	}

	// The user's repository after the export.
	if b, err := os.ReadFile(filepath.Join(root, "agent.txt")); err != nil || string(b) != "ordinary work\n" {
		t.Errorf("the ordinary file was not exported: %q %v (%v)", b, err, ex)
	}
	if b, _ := os.ReadFile(filepath.Join(root, ".git", "config")); string(b) != string(configBefore) {
		t.Errorf(".git/config changed by the export:\n%s", b)
	}
	hooks, _ := filepath.Glob(filepath.Join(root, ".git", "hooks", "*"))
	for _, h := range hooks {
		if !strings.HasSuffix(h, ".sample") {
			t.Errorf("the export planted %s", h)
		}
	}
	if got := hostGitSession(t, root); len(got) != 0 {
		t.Errorf("the user's git ran the agent's programs: %v", got)
	}

	// Control: the same files in a clone do run.
	scratch := filepath.Join(e.root, "scratch")
	gitIn(t, e.root, "clone", "-q", root, scratch)
	for p, content := range plantedGit() {
		if err := os.WriteFile(filepath.Join(scratch, p), []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(scratch, "x.txt"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(hostGitSession(t, scratch), ",")
	for _, want := range []string{"fsmonitor", "pre-commit", "post-commit", "post-checkout", "reference-transaction"} {
		if !strings.Contains(got, want) {
			t.Errorf("control: the planted %s did not run in a clone (markers %s): the test proves nothing", want, got)
		}
	}
}
