package tests

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestSandboxLifecycle(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"src/a.txt": "hello\n", "README.md": "# x\n"})
	if err := os.Symlink("src/a.txt", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "README.md"), 0o755); err != nil {
		t.Fatal(err)
	}

	rec := e.mgr("create_sandbox", "--workspace-bind-root", root, "--name", "first")
	id := rec["id"].(string)
	want := map[string]any{"name": "first", "workspace_root": root, "image": "host", "rootfs": "host", "state": "ready"}
	for k, v := range want {
		if rec[k] != v {
			t.Errorf("record %s = %v, want %v", k, rec[k], v)
		}
	}
	if d := rec["overlay_driver"]; d != "kernel" && d != "fuse" {
		t.Errorf("overlay_driver %v", d)
	}
	if num(t, rec["layer_count"]) != 1 || num(t, rec["activity_revision"]) != 0 {
		t.Errorf("fresh record: %v", rec)
	}
	if !strings.HasSuffix(rec["created_at"].(string), "Z") {
		t.Errorf("created_at %v", rec["created_at"])
	}
	sb := rec["shared_base"].(map[string]any)
	if sb["source"] != root || sb["target"] != "/workspace" || sb["readonly"] != true || len(sb["root_hash"].(string)) != 64 {
		t.Errorf("shared_base %v", sb)
	}
	if rp := rec["resource_profile"].(map[string]any); rp["name"] != "unlimited" || rp["enforced"] != false {
		t.Errorf("resource_profile %v", rp)
	}

	// The base layer is a faithful copy: modes, symlinks.
	base := filepath.Join(e.data(), "sandboxes", id, "layerstack", "layers", "B000001-base")
	if st, err := os.Stat(filepath.Join(base, "README.md")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("base README.md: %v %v", st, err)
	}
	if tgt, err := os.Readlink(filepath.Join(base, "link")); err != nil || tgt != "src/a.txt" {
		t.Errorf("base link: %q %v", tgt, err)
	}

	two := e.mgr("create_sandbox", "--workspace-bind-root", root, "--count", "2")
	list := two["sandboxes"].([]any)
	if len(list) != 2 {
		t.Fatalf("count 2 gave %v", two)
	}

	all := e.mgr("list_sandboxes")["sandboxes"].([]any)
	if len(all) != 3 || all[0].(map[string]any)["id"] != id {
		t.Fatalf("list: %v", all)
	}
	for i := 1; i < len(all); i++ {
		if all[i-1].(map[string]any)["id"].(string) >= all[i].(map[string]any)["id"].(string) {
			t.Fatal("list not sorted by id")
		}
	}
	if got := e.mgr("inspect_sandbox", "--sandbox-id", id); got["id"] != id || got["name"] != "first" {
		t.Fatalf("inspect: %v", got)
	}

	gone := e.mgr("destroy_sandbox", "--sandbox-id", id)
	if gone["state"] != "stopped" || len(gone["live_workspace_sessions"].([]any)) != 0 || gone["id"] != id {
		t.Fatalf("destroy result: %v", gone)
	}
	if _, err := os.Stat(filepath.Join(e.data(), "sandboxes", id)); !os.IsNotExist(err) {
		t.Fatalf("sandbox directory left behind: %v", err)
	}
	body := e.fail(1, "not_found", "sandbox-manager-cli", "inspect_sandbox", "--sandbox-id", id)
	if body["message"] != "sandbox not found: "+id || body["details"].(map[string]any)["sandbox_id"] != id {
		t.Fatalf("not found body: %v", body)
	}
	e.fail(1, "not_found", "sandbox-manager-cli", "destroy_sandbox", "--sandbox-id", id)
	e.rtFail(id, 1, "not_found", "file_list")
	if _, err := os.Stat(filepath.Join(root, "src", "a.txt")); err != nil {
		t.Fatalf("host workspace touched: %v", err)
	}
	if n := len(e.mgr("list_sandboxes")["sandboxes"].([]any)); n != 2 {
		t.Fatalf("after destroy: %d sandboxes", n)
	}
}

func sandboxDirs(t *testing.T, e *env) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.data(), "sandboxes"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, en := range ents {
		out = append(out, en.Name())
	}
	return out
}

func TestCreateRollsBack(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"a.txt": "a\n", "deep/er/b.txt": "b\n"})
	keep := e.createSandbox(root)
	fifo := filepath.Join(root, "deep", "pipe")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, count := range []string{"1", "3"} {
		body := e.fail(1, "invalid_request", "sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", root, "--count", count)
		if !strings.Contains(body["message"].(string), "deep/pipe") {
			t.Errorf("message does not name the FIFO: %v", body)
		}
		if got := e.mgr("list_sandboxes")["sandboxes"].([]any); len(got) != 1 || got[0].(map[string]any)["id"] != keep {
			t.Fatalf("list changed after a failed create: %v", got)
		}
		if dirs := sandboxDirs(t, e); len(dirs) != 1 || dirs[0] != keep {
			t.Fatalf("files left behind: %v", dirs)
		}
	}
	os.Remove(fifo)
	bad := filepath.Join(root, "bad\xffname")
	if err := os.WriteFile(bad, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	e.fail(1, "invalid_request", "sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", root)
	if dirs := sandboxDirs(t, e); len(dirs) != 1 {
		t.Fatalf("files left behind: %v", dirs)
	}
}

func TestCreateBadArguments(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"a": "a"})
	file := filepath.Join(root, "a")
	cases := []struct {
		code int
		kind string
		args []string
	}{
		{2, "invalid_request", []string{"create_sandbox"}},
		{1, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", "relative/dir"}},
		{1, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", "/nonexistent/dir"}},
		{1, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", file}},
		{1, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", "/"}},
		{1, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", e.home}},
		{1, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", e.data()}},
		{1, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", root, "--count", "17"}},
		{2, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", root, "--count", "0"}},
		{2, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", root, "--count", "x"}},
		{2, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", root, "--overlay", "zfs"}},
		{1, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", root, "--image", "Not A Reference!"}},
		{2, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", root, "--name", strings.Repeat("n", 129)}},
		{2, "invalid_request", []string{"create_sandbox", "--workspace-bind-root", root, "--bogus", "1"}},
		{2, "invalid_request", []string{"destroy_sandbox"}},
		{2, "invalid_request", []string{"inspect_sandbox", "--sandbox-id", "bad id!"}},
	}
	for _, tc := range cases {
		e.fail(tc.code, tc.kind, "sandbox-manager-cli", tc.args...)
	}
	if dirs := sandboxDirs(t, e); len(dirs) != 0 {
		t.Fatalf("a refused create left %v", dirs)
	}
	// --workspace-root is the alias of --workspace-bind-root.
	e.mgr("create_sandbox", "--workspace-root", root)
}

func TestListWorkspaceDirectories(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"b/x": "", "a/y": "", "file": ""})
	if err := os.Symlink("a", filepath.Join(root, "link-to-a")); err != nil {
		t.Fatal(err)
	}
	got := e.mgr("list_workspace_directories", "--path", root)
	dirs := got["directories"].([]any)
	if len(dirs) != 2 || dirs[0].(map[string]any)["name"] != "a" || dirs[1].(map[string]any)["path"] != filepath.Join(root, "b") {
		t.Fatalf("directories: %v", got)
	}
	if got["parent"] != filepath.Dir(root) || got["path"] != root || got["truncated"] != false {
		t.Fatalf("listing: %v", got)
	}
	if top := e.mgr("list_workspace_directories"); top["path"] != nil || top["parent"] != nil || len(top["directories"].([]any)) != 1 {
		t.Fatalf("roots: %v", top)
	}
	if slash := e.mgr("list_workspace_directories", "--path", "/"); slash["parent"] != nil {
		t.Fatalf("parent of /: %v", slash)
	}
	e.fail(1, "invalid_request", "sandbox-manager-cli", "list_workspace_directories", "--path", filepath.Join(root, "file"))
	e.fail(1, "invalid_request", "sandbox-manager-cli", "list_workspace_directories", "--path", "relative")
	e.fail(1, "invalid_request", "sandbox-manager-cli", "list_workspace_directories", "--path", "/does/not/exist")
}

func TestRestartKeepsSandboxes(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"a.txt": "one\n"})
	id := e.createSandbox(root, "--name", "keep")
	e.rt(id, "file_write", "--path", "b.txt", "--content", "two\n")
	e.rt(id, "file_write", "--path", "c.txt", "--content", "three\n")
	before := e.mgr("inspect_sandbox", "--sandbox-id", id)
	e.stop()
	if _, err := os.Stat(e.socket()); !os.IsNotExist(err) {
		t.Fatalf("socket left after a clean stop: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.home, "run", "supervisor.pid")); !os.IsNotExist(err) {
		t.Fatalf("pid file left after a clean stop: %v", err)
	}
	e.start()
	after := e.mgr("inspect_sandbox", "--sandbox-id", id)
	for _, k := range []string{"id", "name", "state", "created_at", "layer_count", "activity_revision"} {
		if before[k] != after[k] {
			t.Errorf("%s changed across restart: %v → %v", k, before[k], after[k])
		}
	}
	if num(t, after["layer_count"]) != 3 {
		t.Fatalf("layer_count %v", after["layer_count"])
	}
	if got := e.rt(id, "file_read", "--path", "c.txt"); got["content"] != "three" {
		t.Fatalf("read after restart: %v", got)
	}
	// kill -9 too: the stale socket is replaced and nothing is lost.
	e.kill9()
	e.start()
	if got := e.rt(id, "file_read", "--path", "b.txt"); got["content"] != "two" {
		t.Fatalf("read after kill -9: %v", got)
	}
}
