package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func (e *env) publish(id, ws string, args ...string) map[string]any {
	e.t.Helper()
	return e.rt(id, append([]string{"publish_workspace_session", "--workspace-session-id", ws}, args...)...)
}

func (e *env) publishFail(id, ws string, args ...string) map[string]any {
	e.t.Helper()
	return e.rtFail(id, 1, "operation_failed", append([]string{"publish_workspace_session", "--workspace-session-id", ws}, args...)...)
}

func lines(n int, tag string) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "line %d %s\n", i, tag)
	}
	return b.String()
}

func sandboxWith(t *testing.T, files map[string]string) (*env, string) {
	t.Helper()
	e := newEnv(t)
	e.start()
	return e, e.createSandbox(e.project(files))
}

func TestPublishMergesStaleBaseAndBlameShowsBothOwners(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		root := e.project(map[string]string{"f.txt": lines(10, "base"), "run.sh": "#!/bin/sh\necho a\n\n\necho b\n"})
		if err := os.Chmod(filepath.Join(root, "run.sh"), 0o755); err != nil {
			t.Fatal(err)
		}
		id := e.createSandbox(root)
		a := e.session(id, "--agent", "alice")
		b := e.session(id, "--agent", "bob")
		e.exec(id, "--workspace-session-id", a, "sed -i 's/line 2 base/line 2 alice/' f.txt && sed -i 's/echo a/echo A/' run.sh")
		e.exec(id, "--workspace-session-id", b, "sed -i 's/line 9 base/line 9 bob/' f.txt && sed -i 's/echo b/echo B/' run.sh")
		pa := e.publish(id, a)
		if pa["destroyed"] != true || pa["publish"].(map[string]any)["no_op"] != false {
			t.Fatalf("alice: %v", pa)
		}
		pb := e.publish(id, b)
		sum := pb["publish"].(map[string]any)["outcome_summary"].(map[string]any)
		if num(t, sum["merged"]) != 2 {
			t.Fatalf("bob's stale-base publish did not merge: %v", pb)
		}
		got := e.rt(id, "file_read", "--path", "f.txt")["content"].(string)
		if !strings.Contains(got, "line 2 alice") || !strings.Contains(got, "line 9 bob") {
			t.Fatalf("merged content: %q", got)
		}
		if out := e.exec(id, "test -x run.sh && ./run.sh"); out["output"] != "A\nB" {
			t.Fatalf("executable after merge: %v", out)
		}
		bl := e.rt(id, "file_blame", "--path", "f.txt")
		owners := map[string]int{}
		covered := 0
		for _, r := range bl["ranges"].([]any) {
			m := r.(map[string]any)
			if strings.HasPrefix(m["owner"].(string), "workspace_session:") {
				if cmd, _ := m["command_session_id"].(string); !strings.HasPrefix(cmd, "cmd-") {
					t.Errorf("a merged line lost the command that wrote it: %v", m)
				}
			}
			owners[m["owner"].(string)] += int(num(t, m["line_count"]))
			covered += int(num(t, m["line_count"]))
		}
		if owners["workspace_session:"+a] != 1 || owners["workspace_session:"+b] != 1 || owners["original"] != 8 || covered != 10 {
			t.Fatalf("blame: %v", bl)
		}
		for _, gone := range []string{a, b} {
			e.rtFail(id, 1, "not_found", "exec_command", "--workspace-session-id", gone, "true")
		}
	})
}

func TestPublishRejectsOverlapAndKeepsSession(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"f.txt": lines(5, "base"), "other.txt": "o\n"})
		ws := e.session(id)
		e.exec(id, "--workspace-session-id", ws, "sed -i 's/line 3 base/line 3 session/' f.txt && echo new > unrelated.txt")
		e.rt(id, "file_edit", "--path", "f.txt", "--edits", `[{"old_string":"line 3 base","new_string":"line 3 head"}]`)
		before := manifestLayers(t, e, id)

		dry := e.publish(id, ws, "--dry-run")
		if dry["would_commit"] != false || dry["destroyed"] != false {
			t.Fatalf("dry run: %v", dry)
		}
		body := e.publishFail(id, ws)
		d := body["details"].(map[string]any)
		rej := d["publish_rejection"].(map[string]any)
		if d["session_retained"] != true || rej["reason"] != "source_conflict" || rej["path"] != "f.txt" {
			t.Fatalf("rejection: %v", body)
		}
		sc := rej["source_conflict"].(map[string]any)
		if sc["expected"].(map[string]any)["kind"] != "file" || sc["actual"].(map[string]any)["digest"] == sc["expected"].(map[string]any)["digest"] {
			t.Fatalf("fingerprints: %v", sc)
		}
		conf := rej["conflicts"].([]any)
		if len(conf) != 1 || len(conf[0].(map[string]any)["hunks"].([]any)) != 1 {
			t.Fatalf("conflicts: %v", conf)
		}
		if after := manifestLayers(t, e, id); strings.Join(after, ",") != strings.Join(before, ",") {
			t.Fatal("a rejected publish changed the stack")
		}
		// Retained and usable: fix and retry.
		e.exec(id, "--workspace-session-id", ws, "sed -i 's/line 3 session/line 3 head/' f.txt")
		ok := e.publish(id, ws)
		if ok["destroyed"] != true {
			t.Fatalf("retry: %v", ok)
		}
		if got := e.rt(id, "file_read", "--path", "unrelated.txt")["content"]; got != "new" {
			t.Fatalf("retry content: %v", got)
		}
	})
}

func TestPublishDeleteModifyRejectsEverything(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"f.txt": "one\n"})
		ws := e.session(id)
		e.exec(id, "--workspace-session-id", ws, "rm f.txt && echo fresh > brand-new.txt")
		e.rt(id, "file_write", "--path", "f.txt", "--content", "changed in head\n")
		body := e.publishFail(id, ws)
		rej := body["details"].(map[string]any)["publish_rejection"].(map[string]any)
		c := rej["conflicts"].([]any)[0].(map[string]any)
		if c["path"] != "f.txt" || c["conflict_reason"] != "delete_modify" {
			t.Fatalf("delete vs modify: %v", rej)
		}
		e.rtFail(id, 1, "not_found", "file_read", "--path", "brand-new.txt")
		// theirs on the conflicting path lets the rest land; the head's version stays.
		ok := e.publish(id, ws, "--resolutions", `[{"path":"f.txt","strategy":"theirs"}]`)
		rp := ok["publish"].(map[string]any)["resolved_paths"].([]any)
		if len(rp) != 1 || rp[0].(map[string]any)["outcome"] != "theirs" {
			t.Fatalf("resolved_paths: %v", ok)
		}
		if got := e.rt(id, "file_read", "--path", "f.txt")["content"]; got != "changed in head" {
			t.Fatalf("theirs: %v", got)
		}
		if got := e.rt(id, "file_read", "--path", "brand-new.txt")["content"]; got != "fresh" {
			t.Fatalf("rest: %v", got)
		}
	})
}

func TestPublishOursAndProtected(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"a.txt": "a\n", "b.txt": "b\n"})
		ws := e.session(id)
		e.exec(id, "--workspace-session-id", ws, "echo A-session > a.txt && echo B-session > b.txt")
		e.rt(id, "file_write", "--path", "a.txt", "--content", "A-head\n")
		e.rt(id, "file_write", "--path", "b.txt", "--content", "B-head\n")
		body := e.publishFail(id, ws, "--resolutions", `[{"path":"a.txt","strategy":"ours"}]`)
		conf := body["details"].(map[string]any)["publish_rejection"].(map[string]any)["conflicts"].([]any)
		if len(conf) != 1 || conf[0].(map[string]any)["path"] != "b.txt" {
			t.Fatalf("ours resolves only a.txt: %v", conf)
		}
		e.rtFail(id, 1, "invalid_request", "publish_workspace_session", "--workspace-session-id", ws, "--resolutions", `[{"path":"nope.txt","strategy":"ours"}]`)
		e.publish(id, ws, "--resolutions", `[{"path":"a.txt","strategy":"ours"},{"path":"b.txt","strategy":"theirs"}]`)
		if a, b := e.rt(id, "file_read", "--path", "a.txt")["content"], e.rt(id, "file_read", "--path", "b.txt")["content"]; a != "A-session" || b != "B-head" {
			t.Fatalf("ours/theirs: %v %v", a, b)
		}
		// Protected paths reject the whole publish.
		ws2 := e.session(id)
		out := e.exec(id, "--workspace-session-id", ws2, "mkdir -p x && { echo s > x/.wh.secret || echo refused; } 2>/dev/null; echo fine > fine.txt")
		if out["output"] == "refused" {
			// The FUSE overlay refuses reserved .wh. names when they are
			// created (fuseoverlay's package doc), so none can reach a
			// publish; the kernel overlay stores them as plain files.
			if e.overlay != "fuse" {
				t.Fatalf("%s overlay refused a .wh. name", e.overlay)
			}
			e.publish(id, ws2)
			if got := e.rt(id, "file_read", "--path", "fine.txt")["content"]; got != "fine" {
				t.Fatalf("fine.txt: %v", got)
			}
			return
		}
		before := manifestLayers(t, e, id)
		rej := e.publishFail(id, ws2)["details"].(map[string]any)["publish_rejection"].(map[string]any)
		if rej["reason"] != "protected_path" || rej["path"] != "x/.wh.secret" {
			t.Fatalf("protected: %v", rej)
		}
		if after := manifestLayers(t, e, id); len(after) != len(before) {
			t.Fatal("protected publish committed something")
		}
	})
}

func TestPublishEverythingOnceAndNoOp(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"edit.txt": "old\n", "gone.txt": "bye\n"})
		ws := e.session(id)
		e.exec(id, "--workspace-session-id", ws, "echo new > edit.txt && rm gone.txt && mkdir -p n/e/s && echo t > n/e/s/t.txt && ln -s edit.txt link")
		dry := e.publish(id, ws, "--dry-run")
		plan := dry["plan"].(map[string]any)
		var got []string
		for _, p := range plan["paths"].([]any) {
			m := p.(map[string]any)
			got = append(got, m["path"].(string)+":"+m["change"].(string)+":"+m["outcome"].(string))
		}
		want := "edit.txt:write:unchanged_head,gone.txt:delete:unchanged_head,link:symlink:unchanged_head,n:directory:unchanged_head,n/e:directory:unchanged_head,n/e/s:directory:unchanged_head,n/e/s/t.txt:write:unchanged_head"
		if strings.Join(got, ",") != want || dry["would_commit"] != true {
			t.Fatalf("dry-run plan:\n%s\nwant\n%s\n%v", strings.Join(got, ","), want, dry)
		}
		before := len(manifestLayers(t, e, id))
		pub := e.publish(id, ws)
		if len(manifestLayers(t, e, id)) != before+1 {
			t.Fatal("not exactly one layer")
		}
		if pub["publish"].(map[string]any)["layer_id"] == nil {
			t.Fatalf("publish: %v", pub)
		}
		if out := e.exec(id, "cat edit.txt n/e/s/t.txt; readlink link; test -e gone.txt || echo gone"); out["output"] != "new\nt\nedit.txt\ngone" {
			t.Fatalf("published: %v", out)
		}
		e.rtFail(id, 1, "not_found", "publish_workspace_session", "--workspace-session-id", ws)
		empty := e.session(id)
		np := e.publish(id, empty)
		if np["publish"].(map[string]any)["no_op"] != true || np["destroyed"] != true {
			t.Fatalf("empty publish: %v", np)
		}
	})
}

func TestPublishRacingDestroy(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"a": "a\n"})
		for round := 0; round < 5; round++ {
			ws := e.session(id)
			e.rt(id, "file_write", "--workspace-session-id", ws, "--path", fmt.Sprintf("r%d.txt", round), "--content", "x\n")
			before := len(manifestLayers(t, e, id))
			var wg sync.WaitGroup
			var pub, des result
			wg.Add(2)
			go func() {
				defer wg.Done()
				pub = e.run("sandbox-runtime-cli", "--sandbox-id", id, "publish_workspace_session", "--workspace-session-id", ws)
			}()
			go func() {
				defer wg.Done()
				des = e.run("sandbox-runtime-cli", "--sandbox-id", id, "destroy_workspace_session", "--workspace-session-id", ws)
			}()
			wg.Wait()
			after := len(manifestLayers(t, e, id))
			switch {
			case pub.code == 0 && des.code == 1 && after == before+1:
			case pub.code == 1 && des.code == 0 && after == before:
			default:
				t.Fatalf("round %d: publish %d %s / destroy %d %s, layers %d → %d", round, pub.code, pub.stderr, des.code, des.stderr, before, after)
			}
			if n := len(e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any)); n != 0 {
				t.Fatalf("leaked sessions: %d", n)
			}
			if ents, _ := os.ReadDir(filepath.Join(e.data(), "sandboxes", id, "sessions")); len(ents) != 0 {
				t.Fatalf("leaked session dirs: %d", len(ents))
			}
		}
	})
}

func TestParallelDisjointPublishes(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"a": "a\n"})
		var wss []string
		for i := 0; i < 6; i++ {
			ws := e.session(id, "--agent", fmt.Sprintf("agent-%d", i))
			e.exec(id, "--workspace-session-id", ws, fmt.Sprintf("echo from-%d > own-%d.txt", i, i))
			wss = append(wss, ws)
		}
		before := len(manifestLayers(t, e, id))
		var wg sync.WaitGroup
		for _, ws := range wss {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := e.run("sandbox-runtime-cli", "--sandbox-id", id, "publish_workspace_session", "--workspace-session-id", ws); r.code != 0 {
					t.Errorf("publish %s: %s", ws, r.stderr)
				}
			}()
		}
		wg.Wait()
		if after := len(manifestLayers(t, e, id)); after != before+6 {
			t.Fatalf("6 publishes → %d new layers", after-before)
		}
		for i, ws := range wss {
			bl := e.rt(id, "file_blame", "--path", fmt.Sprintf("own-%d.txt", i))
			r := bl["ranges"].([]any)[0].(map[string]any)
			if r["owner"] != "workspace_session:"+ws || r["agent"] != fmt.Sprintf("agent-%d", i) {
				t.Errorf("owner of own-%d.txt: %v", i, bl)
			}
		}
	})
}

func TestImplicitRejectionKeepsRecoveryArtifact(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e, id := sandboxWith(t, map[string]string{"f.txt": "base\n"})
		out := e.exec(id, "--yield-time-ms", "0", "sleep 0.5; echo session > f.txt; echo other > other.txt")
		e.rt(id, "file_write", "--path", "f.txt", "--content", "head\n")
		done := e.waitDone(id, out["command_session_id"].(string))
		if done["publish_rejected"] != true || done["publish_reject_class"] != "source_conflict" || done["status"] != "ok" {
			t.Fatalf("implicit rejection: %v", done)
		}
		rej := done["publish_rejection"].(map[string]any)
		if rej["path"] != "f.txt" || rej["recovery_artifact"] == nil {
			t.Fatalf("rejection body: %v", rej)
		}
		e.rtFail(id, 1, "not_found", "file_read", "--path", "other.txt") // nothing of it was published
		rec := e.mgr("inspect_sandbox", "--sandbox-id", id)
		arts := rec["recovery_artifacts"].([]any)
		if len(arts) != 1 || arts[0].(map[string]any)["workspace_session_id"] != out["workspace_session_id"] || arts[0].(map[string]any)["reason"] != "source_conflict" {
			t.Fatalf("recovery_artifacts: %v", rec)
		}
		dir := filepath.Join(e.data(), "sandboxes", id, rej["recovery_artifact"].(string))
		if b, err := os.ReadFile(filepath.Join(dir, "upper", "other.txt")); err != nil || string(b) != "other\n" {
			t.Fatalf("the agent's work is not in the artifact: %q %v", b, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "manifest.json")); err != nil {
			t.Fatal(err)
		}
	})
}
