package tests

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

type diffFileT struct {
	Path          string             `json:"path"`
	Status        string             `json:"status"`
	Kind          string             `json:"kind"`
	Route         string             `json:"route"`
	Binary        bool               `json:"binary"`
	Mode          map[string]*string `json:"mode"`
	Diff          *string            `json:"diff"`
	DiffTruncated bool               `json:"diff_truncated"`
}

type diffResultT struct {
	WorkspaceSessionID string          `json:"workspace_session_id"`
	Against            string          `json:"against"`
	BaseRevision       json.RawMessage `json:"base_revision"`
	HeadRevision       json.RawMessage `json:"head_revision"`
	Files              []diffFileT     `json:"files"`
	HeadChangedPaths   []string        `json:"head_changed_paths"`
	Truncated          bool            `json:"truncated"`
}

func (e *env) diff(id, ws string, args ...string) diffResultT {
	e.t.Helper()
	m := e.rt(id, append([]string{"diff_workspace_session", "--workspace-session-id", ws}, args...)...)
	b, err := json.Marshal(m)
	if err != nil {
		e.t.Fatal(err)
	}
	var r diffResultT
	if err := json.Unmarshal(b, &r); err != nil {
		e.t.Fatalf("diff result %s: %v", b, err)
	}
	if r.Files == nil || r.HeadChangedPaths == nil {
		e.t.Fatalf("files and head_changed_paths must be arrays: %s", b)
	}
	return r
}

func sp(s string) *string { return &s }

func modes(old, new *string) map[string]*string { return map[string]*string{"old": old, "new": new} }

func (r diffResultT) byPath() map[string]diffFileT {
	out := map[string]diffFileT{}
	for _, f := range r.Files {
		out[f.Path] = f
	}
	return out
}

func (r diffResultT) paths() []string {
	out := []string{}
	for _, f := range r.Files {
		out = append(out, f.Path)
	}
	return out
}

func showFile(f diffFileT) string {
	b, _ := json.Marshal(f)
	return string(b)
}

var diffProject = map[string]string{
	"edit.txt":         "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n",
	"del.txt":          "gone\n",
	"run.sh":           "#!/bin/sh\necho run\n",
	".gitignore":       "*.log\nbuild/\n",
	"olddir/a.txt":     "a\n",
	"olddir/sub/b.txt": "b\n",
	"keep.txt":         "keep\n",
}

const diffSessionScript = "umask 022 && sed -i 's/^5$/FIVE/' edit.txt && rm del.txt && mkdir -p new/deep && echo x > new/deep/f.txt && " +
	"ln -s edit.txt link && chmod +x run.sh && printf 'a\\000b' > bin.dat && echo l > x.log && mkdir build && echo o > build/out && " +
	"rm -rf olddir && echo done"

func diffSandbox(t *testing.T) (*env, string, string) {
	t.Helper()
	e := newEnv(t)
	e.start()
	id := e.createSandbox(e.project(diffProject))
	ws := e.session(id)
	if out := e.exec(id, "--workspace-session-id", ws, diffSessionScript); out["status"] != "ok" || out["output"] != "done" {
		t.Fatalf("session script: %v", out)
	}
	return e, id, ws
}

func wantDiffFiles() []diffFileT {
	m644, m755 := sp("0644"), sp("0755")
	return []diffFileT{
		{Path: "bin.dat", Status: "added", Kind: "file", Route: "source", Binary: true, Mode: modes(nil, m644)},
		{Path: "build", Status: "dir", Kind: "directory", Route: "ignored", Mode: modes(nil, m755)},
		{Path: "build/out", Status: "added", Kind: "file", Route: "ignored", Mode: modes(nil, m644),
			Diff: sp("--- a/build/out\n+++ b/build/out\n@@ -0,0 +1 @@\n+o\n")},
		{Path: "del.txt", Status: "deleted", Kind: "absent", Route: "source", Mode: modes(m644, nil),
			Diff: sp("--- a/del.txt\n+++ b/del.txt\n@@ -1 +0,0 @@\n-gone\n")},
		{Path: "edit.txt", Status: "modified", Kind: "file", Route: "source", Mode: modes(m644, m644),
			Diff: sp("--- a/edit.txt\n+++ b/edit.txt\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+FIVE\n 6\n 7\n 8\n")},
		{Path: "link", Status: "symlink", Kind: "symlink", Route: "source"},
		{Path: "new", Status: "dir", Kind: "directory", Route: "source", Mode: modes(nil, m755)},
		{Path: "new/deep", Status: "dir", Kind: "directory", Route: "source", Mode: modes(nil, m755)},
		{Path: "new/deep/f.txt", Status: "added", Kind: "file", Route: "source", Mode: modes(nil, m644),
			Diff: sp("--- a/new/deep/f.txt\n+++ b/new/deep/f.txt\n@@ -0,0 +1 @@\n+x\n")},
		{Path: "olddir", Status: "deleted", Kind: "absent", Route: "source", Mode: modes(m755, nil)},
		{Path: "olddir/a.txt", Status: "deleted", Kind: "absent", Route: "source", Mode: modes(m644, nil),
			Diff: sp("--- a/olddir/a.txt\n+++ b/olddir/a.txt\n@@ -1 +0,0 @@\n-a\n")},
		{Path: "olddir/sub", Status: "deleted", Kind: "absent", Route: "source", Mode: modes(m755, nil)},
		{Path: "olddir/sub/b.txt", Status: "deleted", Kind: "absent", Route: "source", Mode: modes(m644, nil),
			Diff: sp("--- a/olddir/sub/b.txt\n+++ b/olddir/sub/b.txt\n@@ -1 +0,0 @@\n-b\n")},
		{Path: "run.sh", Status: "modified", Kind: "file", Route: "source", Mode: modes(m644, m755), Diff: sp("")},
		{Path: "x.log", Status: "added", Kind: "file", Route: "ignored", Mode: modes(nil, m644),
			Diff: sp("--- a/x.log\n+++ b/x.log\n@@ -0,0 +1 @@\n+l\n")},
	}
}

func checkDiffFiles(t *testing.T, got []diffFileT, want []diffFileT) {
	t.Helper()
	var gp, wp []string
	for _, f := range got {
		gp = append(gp, f.Path)
	}
	for _, f := range want {
		wp = append(wp, f.Path)
	}
	if !reflect.DeepEqual(gp, wp) {
		t.Fatalf("paths:\n got %v\nwant %v", gp, wp)
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("file %s:\n got %s\nwant %s", want[i].Path, showFile(got[i]), showFile(want[i]))
		}
	}
}

func TestDiffAgainstBase(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id, ws := diffSandbox(t)
		r := e.diff(id, ws)
		if r.WorkspaceSessionID != ws || r.Against != "base" || r.Truncated || len(r.HeadChangedPaths) != 0 {
			t.Fatalf("result: %+v", r)
		}
		if string(r.BaseRevision) != string(r.HeadRevision) || !strings.Contains(string(r.BaseRevision), `"manifest_version"`) {
			t.Fatalf("revisions: %s / %s", r.BaseRevision, r.HeadRevision)
		}
		checkDiffFiles(t, r.Files, wantDiffFiles())

		// paths filter: each entry matches itself and everything below it.
		f := e.diff(id, ws, "--paths", `["new","/workspace/edit.txt","olddir/sub","ne","./x.log"]`)
		if got := strings.Join(f.paths(), ","); got != "edit.txt,new,new/deep,new/deep/f.txt,olddir/sub,olddir/sub/b.txt,x.log" {
			t.Fatalf("filtered: %s", got)
		}
		if got := e.diff(id, ws, "--paths", `["nothing/here"]`); len(got.Files) != 0 || got.Truncated {
			t.Fatalf("filter matching nothing: %+v", got)
		}

		// max_bytes: the budget is spent in path order; once a diff does not fit,
		// every later diff is null and truncated.
		all := r.byPath()
		budget := len(*all["build/out"].Diff) + len(*all["del.txt"].Diff)
		m := e.diff(id, ws, "--max-bytes", fmt.Sprint(budget))
		if !m.Truncated {
			t.Fatalf("max_bytes %d: not truncated", budget)
		}
		mb := m.byPath()
		for _, p := range []string{"build/out", "del.txt"} {
			if mb[p].Diff == nil || mb[p].DiffTruncated {
				t.Errorf("%s within budget: %s", p, showFile(mb[p]))
			}
		}
		for _, p := range []string{"edit.txt", "new/deep/f.txt", "olddir/a.txt", "run.sh", "x.log"} {
			if mb[p].Diff != nil || !mb[p].DiffTruncated || mb[p].Binary {
				t.Errorf("%s past budget: %s", p, showFile(mb[p]))
			}
		}
		for _, p := range []string{"bin.dat", "link", "new", "olddir"} {
			if mb[p].Diff != nil || mb[p].DiffTruncated {
				t.Errorf("%s has no diff to truncate: %s", p, showFile(mb[p]))
			}
		}
		if one := e.diff(id, ws, "--max-bytes", "1"); !one.Truncated || one.byPath()["build/out"].Diff != nil || !one.byPath()["build/out"].DiffTruncated {
			t.Fatalf("max_bytes 1: %+v", one)
		}

		// Errors.
		e.rtFail(id, 1, "not_found", "diff_workspace_session", "--workspace-session-id", "ws-nope")
		for _, tc := range []struct {
			code int // 2: refused by the CLI's own argument check, 1: by the supervisor
			args []string
		}{
			{2, []string{"--against", "sideways"}},
			{2, []string{"--max-bytes", "0"}},
			{2, []string{"--max-bytes", "8388609"}},
			{2, []string{"--paths", `{"a":1}`}},
			{1, []string{"--paths", `["../x"]`}},
			{1, []string{"--paths", `["/etc/passwd"]`}},
			{2, []string{"--paths", `[1]`}}, // items are declared strings: the CLI checks them
		} {
			e.rtFail(id, tc.code, "invalid_request", append([]string{"diff_workspace_session", "--workspace-session-id", ws}, tc.args...)...)
		}
		// The supervisor checks the same arguments itself.
		for _, args := range []map[string]any{
			{"workspace_session_id": ws, "against": "sideways"},
			{"workspace_session_id": ws, "max_bytes": 0},
			{"workspace_session_id": ws, "paths": []any{"a", nil}},
			{"workspace_session_id": ws, "paths": []any{1}},
			{"against": "base"},
		} {
			if m := e.rawObj(map[string]any{"op": "diff_workspace_session", "scope": map[string]any{"kind": "sandbox", "sandbox_id": id}, "args": args}); errKind(m) != "invalid_request" {
				t.Errorf("%v: %v", args, m)
			}
		}
	})
}

func TestDiffAgainstHead(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id, ws := diffSandbox(t)
		e.rt(id, "file_write", "--path", "edit.txt", "--content", "1\n2\n3\n4\n5\n6\n7\n8\n9\nTEN\n")
		e.rt(id, "file_write", "--path", "unrelated.txt", "--content", "u\n")
		base := e.diff(id, ws)
		if strings.Join(base.HeadChangedPaths, ",") != "edit.txt" || string(base.BaseRevision) == string(base.HeadRevision) {
			t.Fatalf("against base after a head write: %+v", base)
		}
		checkDiffFiles(t, base.Files, wantDiffFiles()) // the left side is still the base

		head := e.diff(id, ws, "--against", "head")
		if head.Against != "head" || strings.Join(head.HeadChangedPaths, ",") != "edit.txt" || string(head.HeadRevision) != string(base.HeadRevision) {
			t.Fatalf("against head: %+v", head)
		}
		if strings.Join(head.paths(), ",") != strings.Join(base.paths(), ",") {
			t.Fatalf("against head lists other paths: %v", head.paths())
		}
		ed := head.byPath()["edit.txt"]
		want := "--- a/edit.txt\n+++ b/edit.txt\n@@ -2,9 +2,9 @@\n 2\n 3\n 4\n-5\n+FIVE\n 6\n 7\n 8\n 9\n-TEN\n+10\n"
		if ed.Status != "modified" || ed.Diff == nil || *ed.Diff != want {
			t.Fatalf("edit.txt against head: %s", showFile(ed))
		}
		// Paths head did not touch diff as against base.
		wb := base.byPath()
		for _, p := range []string{"del.txt", "olddir/a.txt", "run.sh", "bin.dat"} {
			if !reflect.DeepEqual(head.byPath()[p], wb[p]) {
				t.Errorf("%s: against head %s, against base %s", p, showFile(head.byPath()[p]), showFile(wb[p]))
			}
		}
		// head deletes a path the session also changed.
		e.exec(id, "rm keep.txt && echo ok")
		e.exec(id, "--workspace-session-id", ws, "echo kept >> keep.txt")
		h2 := e.diff(id, ws, "--against", "head", "--paths", `["keep.txt"]`)
		if strings.Join(h2.HeadChangedPaths, ",") != "keep.txt" || len(h2.Files) != 1 {
			t.Fatalf("keep.txt against head: %+v", h2)
		}
		if k := h2.Files[0]; k.Status != "added" || k.Mode["old"] != nil || k.Diff == nil || *k.Diff != "--- a/keep.txt\n+++ b/keep.txt\n@@ -0,0 +1,2 @@\n+keep\n+kept\n" {
			t.Fatalf("keep.txt against head: %s", showFile(k))
		}
	})
}

func TestDiffWithoutHolder(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id, ws := diffSandbox(t)
		before := e.diff(id, ws)
		// A restart restores the session from its upper dir.
		e.kill9()
		e.start()
		checkDiffFiles(t, e.diff(id, ws).Files, before.Files)
		// The holder dies: the session is re-created once with a new holder
		// (§5.6) and the diff is the same (it reads the upper dir, not the holder).
		holder := func() (int64, string) {
			for _, s := range e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any) {
				if s := s.(map[string]any); s["workspace_session_id"] == ws {
					st, _ := s["state"].(string)
					if s["holder_pid"] == nil {
						return 0, st
					}
					return num(t, s["holder_pid"]), st
				}
			}
			return 0, ""
		}
		pid, _ := holder()
		if pid <= 0 {
			t.Fatalf("no holder pid")
		}
		if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			p, state := holder()
			if p > 0 && p != pid && state == "active" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("session not re-created after the holder died: state %q pid %d", state, p)
			}
			time.Sleep(50 * time.Millisecond)
		}
		checkDiffFiles(t, e.diff(id, ws).Files, before.Files)
		e.rt(id, "destroy_workspace_session", "--workspace-session-id", ws)
		e.rtFail(id, 1, "not_found", "diff_workspace_session", "--workspace-session-id", ws)
	})
}

func TestDiffOpaqueDirectoryAndSpecialFiles(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		id := e.createSandbox(e.project(diffProject))
		ws := e.session(id)
		script := "umask 022 && rm -rf olddir && mkdir olddir && echo n > olddir/new.txt && mkfifo pipe && rm keep.txt && mkdir keep.txt && echo done"
		if out := e.exec(id, "--workspace-session-id", ws, script); out["status"] != "ok" || out["output"] != "done" {
			t.Fatalf("session script: %v", out)
		}
		m644, m755 := sp("0644"), sp("0755")
		checkDiffFiles(t, e.diff(id, ws).Files, []diffFileT{
			// A file replaced by a directory: the old content is shown removed.
			{Path: "keep.txt", Status: "dir", Kind: "directory", Route: "source", Mode: modes(m644, m755),
				Diff: sp("--- a/keep.txt\n+++ b/keep.txt\n@@ -1 +0,0 @@\n-keep\n")},
			{Path: "olddir", Status: "dir", Kind: "directory", Route: "source", Mode: modes(m755, m755)},
			{Path: "olddir/a.txt", Status: "deleted", Kind: "absent", Route: "source", Mode: modes(m644, nil),
				Diff: sp("--- a/olddir/a.txt\n+++ b/olddir/a.txt\n@@ -1 +0,0 @@\n-a\n")},
			{Path: "olddir/new.txt", Status: "added", Kind: "file", Route: "source", Mode: modes(nil, m644),
				Diff: sp("--- a/olddir/new.txt\n+++ b/olddir/new.txt\n@@ -0,0 +1 @@\n+n\n")},
			{Path: "olddir/sub", Status: "deleted", Kind: "absent", Route: "source", Mode: modes(m755, nil)},
			{Path: "olddir/sub/b.txt", Status: "deleted", Kind: "absent", Route: "source", Mode: modes(m644, nil),
				Diff: sp("--- a/olddir/sub/b.txt\n+++ b/olddir/sub/b.txt\n@@ -1 +0,0 @@\n-b\n")},
			// A FIFO is a protected drop: listed with kind other.
			{Path: "pipe", Status: "added", Kind: "other", Route: "source"},
		})
	})
}

func TestDiffListsAtMost10000Files(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
		ws := e.session(id)
		if out := e.exec(id, "--workspace-session-id", ws, "--yield-time-ms", "60000", "mkdir m && cd m && seq -w 1 10001 | xargs touch && echo done"); out["output"] != "done" {
			t.Fatalf("create files: %v", out)
		}
		r := e.diff(id, ws)
		if len(r.Files) != 10000 || !r.Truncated || r.Files[0].Path != "m" || r.Files[9999].Path != "m/09999" {
			t.Fatalf("cap: %d files, truncated %v, first %s, last %s", len(r.Files), r.Truncated, r.Files[0].Path, r.Files[len(r.Files)-1].Path)
		}
		if f := r.Files[1]; f.Status != "added" || f.Diff == nil || *f.Diff != "" || f.DiffTruncated {
			t.Fatalf("empty file: %s", showFile(f))
		}
	})
}
