package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func manifestLayers(t *testing.T, e *env, id string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.data(), "sandboxes", id, "layerstack", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Version int `json:"version"`
		Layers  []struct {
			LayerID string `json:"layer_id"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range m.Layers {
		ids = append(ids, l.LayerID)
	}
	return ids
}

func TestSessionlessWriteReadEdit(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"src/main.go": "package main\r\n\r\nfunc main() {}\r\n", "tool.sh": "#!/bin/sh\necho hi\n"})
	if err := os.Chmod(filepath.Join(root, "tool.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	id := e.createSandbox(root)

	w := e.rt(id, "file_write", "--path", "notes/todo.txt", "--content", "one\ntwo\nthree\n")
	if w["type"] != "create" || w["path"] != "notes/todo.txt" || num(t, w["bytes_written"]) != 14 {
		t.Fatalf("write: %v", w)
	}
	lid, _ := w["layer_id"].(string)
	if !strings.HasPrefix(lid, "L000002-") || len(lid) != len("L000002-")+8 {
		t.Fatalf("layer_id %v", w["layer_id"])
	}
	rev := w["revision"].(map[string]any)
	if num(t, rev["manifest_version"]) != 2 || num(t, rev["layer_count"]) != 2 || len(rev["root_hash"].(string)) != 64 {
		t.Fatalf("revision %v", rev)
	}

	r := e.rt(id, "file_read", "--path", "/workspace/notes/todo.txt")
	want := map[string]any{"path": "notes/todo.txt", "content": "one\ntwo\nthree", "truncated": false, "next_offset": nil}
	for k, v := range want {
		if r[k] != v {
			t.Errorf("read %s = %#v, want %#v", k, r[k], v)
		}
	}
	for k, v := range map[string]int64{"start_line": 1, "num_lines": 3, "total_lines": 3, "bytes_read": 13, "total_bytes": 14} {
		if num(t, r[k]) != v {
			t.Errorf("read %s = %v, want %d", k, r[k], v)
		}
	}

	win := e.rt(id, "file_read", "--path", "notes/todo.txt", "--offset", "2", "--limit", "1")
	if win["content"] != "two" || num(t, win["next_offset"]) != 3 || win["truncated"] != true || num(t, win["num_lines"]) != 1 {
		t.Fatalf("window: %v", win)
	}
	past := e.rt(id, "file_read", "--path", "notes/todo.txt", "--offset", "9")
	if past["content"] != "" || num(t, past["num_lines"]) != 0 || past["next_offset"] != nil {
		t.Fatalf("past the end: %v", past)
	}

	ed := e.rt(id, "file_edit", "--path", "notes/todo.txt", "--edits", `[{"old_string":"two","new_string":"TWO"},{"old_string":"e\n","new_string":"E\n","replace_all":true}]`)
	if ed["type"] != "edit" || num(t, ed["edits_applied"]) != 2 || num(t, ed["replacements"]) != 3 || num(t, ed["bytes_written"]) != 14 {
		t.Fatalf("edit: %v", ed)
	}
	if !strings.HasPrefix(ed["layer_id"].(string), "L000003-") {
		t.Fatalf("edit layer %v", ed["layer_id"])
	}
	if got := e.rt(id, "file_read", "--path", "notes/todo.txt")["content"]; got != "onE\nTWO\nthreE" {
		t.Fatalf("after edit: %q", got)
	}

	// CRLF file: read normalizes, edit keeps CRLF; executable keeps its mode.
	if got := e.rt(id, "file_read", "--path", "src/main.go")["content"]; got != "package main\n\nfunc main() {}" {
		t.Fatalf("crlf read: %q", got)
	}
	e.rt(id, "file_edit", "--path", "src/main.go", "--edits", `[{"old_string":"func main() {}","new_string":"func main() {\n}"}]`)
	e.rt(id, "file_write", "--path", "tool.sh", "--content", "#!/bin/sh\necho bye\n")
	layers := manifestLayers(t, e, id)
	layerDir := filepath.Join(e.data(), "sandboxes", id, "layerstack", "layers")
	if st, err := os.Stat(filepath.Join(layerDir, layers[0], "tool.sh")); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("tool.sh mode after write: %v %v", st, err)
	}
	prev := filepath.Join(layerDir, layers[1], "src", "main.go")
	if b, err := os.ReadFile(prev); err != nil || string(b) != "package main\r\n\r\nfunc main() {\r\n}\r\n" {
		t.Fatalf("crlf edit result %q %v", b, err)
	}

	lst := e.rt(id, "file_list")
	names := []string{}
	for _, en := range lst["entries"].([]any) {
		m := en.(map[string]any)
		names = append(names, m["name"].(string)+":"+m["kind"].(string))
	}
	if strings.Join(names, ",") != "notes:directory,src:directory,tool.sh:file" || lst["path"] != "" || lst["truncated"] != false {
		t.Fatalf("list: %v", lst)
	}
	if got := e.rt(id, "file_list", "--path", "notes", "--limit", "1")["entries"].([]any)[0].(map[string]any); num(t, got["size"]) != 14 {
		t.Fatalf("list size: %v", got)
	}
	if rec := e.mgr("inspect_sandbox", "--sandbox-id", id); num(t, rec["activity_revision"]) != 4 || num(t, rec["layer_count"]) != 5 {
		t.Fatalf("record after 4 writes: %v", rec)
	}
}

func TestSessionlessLayersAndNoOp(t *testing.T) {
	e := newEnv(t)
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	for i, c := range []string{"1\n", "2\n", "3\n"} {
		got := e.rt(id, "file_write", "--path", "x.txt", "--content", c)
		if i == 0 && got["type"] != "create" || i > 0 && got["type"] != "update" {
			t.Fatalf("write %d type %v", i, got["type"])
		}
	}
	if l := manifestLayers(t, e, id); len(l) != 4 || l[3] != "B000001-base" {
		t.Fatalf("three writes → %v", l)
	}
	same := e.rt(id, "file_write", "--path", "x.txt", "--content", "3\n")
	if same["layer_id"] != nil || same["type"] != "update" || num(t, same["revision"].(map[string]any)["manifest_version"]) != 4 {
		t.Fatalf("identical rewrite: %v", same)
	}
	if l := manifestLayers(t, e, id); len(l) != 4 {
		t.Fatalf("identical rewrite added a layer: %v", l)
	}
}

func TestSessionlessConcurrentWritesOneWinner(t *testing.T) {
	e := newEnv(t)
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	var wg sync.WaitGroup
	contents := map[string]bool{}
	for i := 0; i < 20; i++ {
		c := strings.Repeat(string(rune('a'+i)), 1000) + "\n"
		contents[strings.TrimSuffix(c, "\n")] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.run("sandbox-runtime-cli", "--sandbox-id", id, "file_write", "--path", "same.txt", "--content", c)
			if r.code != 0 {
				t.Errorf("concurrent write: %s", r.stderr)
			}
		}()
	}
	wg.Wait()
	got := e.rt(id, "file_read", "--path", "same.txt")["content"].(string)
	if !contents[got] {
		t.Fatalf("torn result: %q", got[:min(40, len(got))])
	}
	if l := manifestLayers(t, e, id); len(l) != 21 {
		t.Fatalf("20 writes → %d layers", len(l))
	}
}

func TestFileBadInput(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"dir/f.txt": "x\n", "bin.dat": "\xff\xfe\x00", "big.txt": strings.Repeat(strings.Repeat("y", 199)+"\n", 1400)})
	if err := os.Symlink("dir/f.txt", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	id := e.createSandbox(root)
	e.rt(id, "file_write", "--path", "gone.txt", "--content", "soon\n")
	before := manifestLayers(t, e, id)

	type bad struct {
		code     int
		kind     string
		args     []string
		contains string
	}
	cases := []bad{
		{1, "invalid_request", []string{"file_read", "--path", "a/../p"}, "invalid path: a/../p"},
		{1, "invalid_request", []string{"file_read", "--path", "../etc/passwd"}, "invalid path"},
		{1, "invalid_request", []string{"file_read", "--path", "/etc/passwd"}, "invalid path: /etc/passwd"},
		{1, "invalid_request", []string{"file_read", "--path", "/workspace"}, "invalid path"},
		{1, "invalid_request", []string{"file_read", "--path", strings.Repeat("n", 256)}, "invalid path"},
		{1, "invalid_request", []string{"file_read", "--path", "dir"}, "path is not a regular file (Directory)"},
		{1, "invalid_request", []string{"file_read", "--path", "link"}, "path is not a regular file (Symlink)"},
		{1, "invalid_request", []string{"file_read", "--path", "bin.dat"}, "file is not valid UTF-8: bin.dat"},
		{1, "invalid_request", []string{"file_read", "--path", "big.txt"}, "selected read output exceeds the maximum of 262144 bytes"},
		{1, "not_found", []string{"file_read", "--path", "nope.txt"}, "file not found: nope.txt"},
		{1, "invalid_request", []string{"file_read", "--path", "link/f.txt"}, `component "link" is a symlink`},
		{2, "invalid_request", []string{"file_read", "--path", "dir/f.txt", "--limit", "0"}, "limit must be between 1 and 2000"},
		{2, "invalid_request", []string{"file_read", "--path", "dir/f.txt", "--limit", "2001"}, "limit must be between 1 and 2000"},
		{2, "invalid_request", []string{"file_read"}, "path is required for file_read"},
		{2, "invalid_request", []string{"file_read", "--path", "x", "--offset", "-1"}, "offset must be an unsigned integer"},
		{1, "not_found", []string{"file_read", "--path", "dir/f.txt", "--workspace-session-id", "ws-nope"}, "workspace session not found: ws-nope"},
		{1, "invalid_request", []string{"file_write", "--path", "dir", "--content", "x"}, "path is not a regular file (Directory)"},
		{1, "invalid_request", []string{"file_write", "--path", "link", "--content", "x"}, "path is not a regular file (Symlink)"},
		{1, "invalid_request", []string{"file_write", "--path", "link/new.txt", "--content", "x"}, `component "link" is a symlink`},
		{1, "invalid_request", []string{"file_write", "--path", "dir/f.txt/new.txt", "--content", "x"}, "parent component"},
		{1, "invalid_request", []string{"file_write", "--path", "a/../p", "--content", "x"}, "invalid path: a/../p"},
		{1, "operation_failed", []string{"file_write", "--path", "x/.wh.secret", "--content", "x"}, "protected"},
		{1, "operation_failed", []string{"file_write", "--path", ".wh..wh..opq", "--content", "x"}, "protected"},
		{2, "invalid_request", []string{"file_write", "--path", "x"}, "content is required for file_write"},
		{1, "not_found", []string{"file_edit", "--path", "nope.txt", "--edits", `[{"old_string":"a","new_string":"b"}]`}, "file not found: nope.txt"},
		{1, "invalid_request", []string{"file_edit", "--path", "dir/f.txt", "--edits", `[]`}, "at least one edit"},
		{1, "invalid_request", []string{"file_edit", "--path", "dir/f.txt", "--edits", `[{"old_string":"","new_string":"b"}]`}, "old_string must not be empty"},
		{1, "invalid_request", []string{"file_edit", "--path", "dir/f.txt", "--edits", `[{"old_string":"x","new_string":"x"}]`}, "identical"},
		{1, "invalid_request", []string{"file_edit", "--path", "dir/f.txt", "--edits", `[{"old_string":"zzz-not-there","new_string":"b"}]`}, `old_string not found: "zzz-not-there"`},
		{1, "invalid_request", []string{"file_edit", "--path", "big.txt", "--edits", `[{"old_string":"y","new_string":"z"}]`}, "not unique"},
		{1, "invalid_request", []string{"file_edit", "--path", "dir/f.txt", "--edits", `[{"old_string":"x","new_string":"y"},{"old_string":"y","new_string":"x"}]`}, "edit made no changes"},
		{1, "invalid_request", []string{"file_edit", "--path", "bin.dat", "--edits", `[{"old_string":"a","new_string":"b"}]`}, "not valid UTF-8"},
		{1, "invalid_request", []string{"file_edit", "--path", "dir", "--edits", `[{"old_string":"a","new_string":"b"}]`}, "not a regular file"},
		{2, "invalid_request", []string{"file_edit", "--path", "dir/f.txt", "--edits", `[{"old":"a"}]`}, "edits[0] has an unknown field: old"}, // checked against the declared items, locally
		{2, "invalid_request", []string{"file_edit", "--path", "dir/f.txt", "--edits", `{"old_string":"a"}`}, "edits must be an array"},
		{1, "invalid_request", []string{"file_list", "--path", "dir/f.txt"}, "not a directory"},
		{1, "invalid_request", []string{"file_list", "--path", "link"}, "not a directory (Symlink)"},
		{1, "not_found", []string{"file_list", "--path", "nope"}, "not found"},
		{2, "invalid_request", []string{"file_list", "--limit", "0"}, "limit must be between 1 and 2000"},
		{2, "invalid_request", []string{"file_list", "--bogus"}, ""},
	}
	for _, tc := range cases {
		body := e.rtFail(id, tc.code, tc.kind, tc.args...)
		if !strings.Contains(body["message"].(string), tc.contains) {
			t.Errorf("%v: message %q does not contain %q", tc.args, body["message"], tc.contains)
		}
	}
	if after := manifestLayers(t, e, id); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("a refused operation changed the stack: %v → %v", before, after)
	}
	body := e.rtFail(id, 1, "operation_failed", "file_write", "--path", "x/.wh.secret", "--content", "x")
	rej, _ := body["details"].(map[string]any)["publish_rejection"].(map[string]any)
	if rej == nil || rej["reason"] != "protected_path" || rej["path"] != "x/.wh.secret" {
		t.Fatalf("protected rejection details: %v", body)
	}
	// Lookalikes of the reserved prefix are ordinary names.
	for _, p := range []string{".wh", ".whx", "x.wh.y", "wh.foo"} {
		e.rt(id, "file_write", "--path", p, "--content", "ok\n")
	}
}

// TestFileSymlinkParent: a path that leads through a symlink gets one
// answer from every file operation, with and without a session, on both
// overlay drivers: invalid_request naming the symlink component (§7.3:
// symlinks are never followed). A symlink as the last component keeps the
// operation's own "not a regular file / not a directory (Symlink)".
func TestFileSymlinkParent(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		root := e.project(map[string]string{"realdir/inner.txt": "inner\n", "realdir/sub/deep.txt": "deep\n"})
		for link, target := range map[string]string{"linkdir": "realdir", "realdir/lnk": ".", "abslink": "/etc"} {
			if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
				t.Fatal(err)
			}
		}
		id := e.createSandbox(root)
		ws := e.session(id)
		// A symlink the session made itself lives in its upper directory.
		e.exec(id, "--workspace-session-id", ws, "ln -s realdir /workspace/madelink")
		edits := `[{"old_string":"inner","new_string":"changed"}]`
		type tc struct {
			op        []string
			component string // "" → final-component case, want contains
			contains  string
		}
		cases := []tc{
			{[]string{"file_read", "--path", "linkdir/inner.txt"}, "linkdir", ""},
			{[]string{"file_read", "--path", "/workspace/linkdir/sub/deep.txt"}, "linkdir", ""},
			{[]string{"file_read", "--path", "realdir/lnk/inner.txt"}, "realdir/lnk", ""},
			{[]string{"file_read", "--path", "abslink/passwd"}, "abslink", ""},
			{[]string{"file_read", "--path", "linkdir/absent.txt"}, "linkdir", ""},
			{[]string{"file_write", "--path", "linkdir/inner.txt", "--content", "x\n"}, "linkdir", ""},
			{[]string{"file_write", "--path", "linkdir/new.txt", "--content", "x\n"}, "linkdir", ""},
			{[]string{"file_write", "--path", "linkdir/newdir/new.txt", "--content", "x\n"}, "linkdir", ""},
			{[]string{"file_write", "--path", "realdir/lnk/new.txt", "--content", "x\n"}, "realdir/lnk", ""},
			{[]string{"file_edit", "--path", "linkdir/inner.txt", "--edits", edits}, "linkdir", ""},
			{[]string{"file_edit", "--path", "realdir/lnk/inner.txt", "--edits", edits}, "realdir/lnk", ""},
			{[]string{"file_blame", "--path", "linkdir/inner.txt"}, "linkdir", ""},
			{[]string{"file_blame", "--path", "realdir/lnk/sub/deep.txt"}, "realdir/lnk", ""},
			{[]string{"file_list", "--path", "linkdir/sub"}, "linkdir", ""},
			{[]string{"file_list", "--path", "realdir/lnk/sub"}, "realdir/lnk", ""},
			// The last component itself: the contract's kind messages.
			{[]string{"file_read", "--path", "linkdir"}, "", "path is not a regular file (Symlink)"},
			{[]string{"file_write", "--path", "linkdir", "--content", "x"}, "", "path is not a regular file (Symlink)"},
			{[]string{"file_edit", "--path", "linkdir", "--edits", edits}, "", "path is not a regular file (Symlink)"},
			{[]string{"file_blame", "--path", "linkdir"}, "", "path is not a regular file (Symlink)"},
			{[]string{"file_list", "--path", "linkdir"}, "", "path is not a directory (Symlink)"},
		}
		sessionOnly := []tc{
			{[]string{"file_read", "--path", "madelink/inner.txt"}, "madelink", ""},
			{[]string{"file_write", "--path", "madelink/new.txt", "--content", "x\n"}, "madelink", ""},
			{[]string{"file_list", "--path", "madelink/sub"}, "madelink", ""},
		}
		before := manifestLayers(t, e, id)
		for _, view := range []string{"sessionless", "session"} {
			list := cases
			if view == "session" {
				list = append(append([]tc{}, cases...), sessionOnly...)
			}
			for _, c := range list {
				args := c.op
				if view == "session" {
					args = append(append([]string{}, c.op...), "--workspace-session-id", ws)
				}
				r := e.run("sandbox-runtime-cli", append([]string{"--sandbox-id", id}, args...)...)
				if r.code == 0 {
					t.Errorf("%s %v: succeeded: %s", view, c.op, r.stdout)
					continue
				}
				body, _ := r.obj(t)["error"].(map[string]any)
				msg, _ := body["message"].(string)
				details, _ := body["details"].(map[string]any)
				path, _ := catalogPath(c.op)
				want := c.contains
				if c.component != "" {
					want = `path "` + path + `": component "` + c.component + `" is a symlink`
				}
				if body["kind"] != "invalid_request" || msg != want && !(c.component == "" && strings.Contains(msg, want)) {
					t.Errorf("%s %v: got %s %q, want invalid_request %q", view, c.op, body["kind"], msg, want)
					continue
				}
				if c.component != "" && (details["component"] != c.component || details["path"] != path) {
					t.Errorf("%s %v: details %v, want component %q and path %q", view, c.op, details, c.component, path)
				}
			}
		}
		if after := manifestLayers(t, e, id); strings.Join(after, ",") != strings.Join(before, ",") {
			t.Errorf("a refused operation changed the stack: %v → %v", before, after)
		}
		// Refused session writes left nothing behind in the session either.
		got := e.exec(id, "--workspace-session-id", ws, "cat /workspace/realdir/inner.txt; ls -1 /workspace/realdir")
		if out, _ := got["output"].(string); strings.TrimSpace(out) != "inner\ninner.txt\nlnk\nsub" {
			t.Errorf("session view after refused writes: %q", out)
		}
	})
}

// catalogPath is the workspace-relative form of a test case's --path.
func catalogPath(args []string) (string, bool) {
	for i, a := range args {
		if a == "--path" && i+1 < len(args) {
			return strings.TrimPrefix(args[i+1], "/workspace/"), true
		}
	}
	return "", false
}
