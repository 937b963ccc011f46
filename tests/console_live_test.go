package tests

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestConsoleLiveSessions drives the session page's Sync and Fork and the
// review page's "Publish and keep working" in a real Chromium against a
// real supervisor (issue 19 item 6): a sync brings another agent's
// published work into a session and keeps the session's own edit, and
// the page shows the new base and the refreshed tree and blame; a
// conflicting sync lists every path and changes nothing, then goes
// through with the strategies picked per path; publishing twice in one
// session credits both commits to it in head's blame; a fork opens with
// its source's tree and diverges from it.
func TestConsoleLiveSessions(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start("--http", "tcp://127.0.0.1:0")
		w := e.web()
		b := newBrowser(t)
		b.run("login", chromedp.Navigate(w.url("/auth?token="+w.token)), chromedp.WaitVisible(chromedp.CSS(`#fleet`)))

		root := e.project(map[string]string{
			"a.txt": "a1\na2\na3\n",
			"c.txt": "c base\n",
			"d.txt": "d base\n",
			"k.txt": "k1\nk2\nk3\n",
		})
		id := e.createSandbox(root)
		session := func(agent string) string {
			return e.rt(id, "create_workspace_session", "--agent", agent)["workspace_session_id"].(string)
		}
		exec := func(ws, cmd string) {
			t.Helper()
			if r := e.rt(id, "exec_command", "--workspace-session-id", ws, cmd); r["status"] != "ok" || num(t, r["exit_code"]) != 0 {
				t.Fatalf("%s in %s: %v", cmd, ws, r)
			}
		}
		read := func(ws, path string) string {
			t.Helper()
			return fmt.Sprint(e.rt(id, "file_read", "--workspace-session-id", ws, "--path", path)["content"])
		}
		headVersion := func() string {
			t.Helper()
			return fmt.Sprint(e.ok("sandbox-observability-cli", "layerstack", "--sandbox-id", id)["manifest_version"])
		}
		sessionPage := func(ws string) {
			t.Helper()
			b.run("open "+ws, chromedp.Navigate(w.url("/#/session/"+id+"/"+ws)), chromedp.WaitVisible(chromedp.CSS(`#base-revision`)))
		}
		outcomes := func(scope string) string {
			t.Helper()
			return eval[string](b, fmt.Sprintf(`JSON.stringify(Object.fromEntries([...document.querySelectorAll(%q)].map((s) => [s.dataset.path, s.dataset.outcome])))`, scope+" section.path"))
		}

		// Sync: alice publishes while bob works; bob's Sync plan merges
		// a.txt (each changed another line), then Sync brings alice's
		// file in and keeps bob's edit.
		alice, bob := session("alice"), session("bob")
		exec(bob, "sed -i s/a1/a1-bob/ a.txt; echo bob > bob.txt")
		exec(alice, "sed -i s/a3/a3-alice/ a.txt; echo alice > alice.txt")
		e.rt(id, "publish_workspace_session", "--workspace-session-id", alice)
		sessionPage(bob)
		before := eval[string](b, `document.querySelector('#base-revision').dataset.manifestVersion`)
		b.run("open a.txt", chromedp.Click(chromedp.CSS(`#tree a[data-path="a.txt"]`)), chromedp.WaitVisible(chromedp.CSS(`#file-view td.gutter`)))
		if eval[bool](b, `!!document.querySelector('#tree a[data-path="alice.txt"]')`) {
			t.Fatal("alice.txt is in bob's tree before the sync")
		}
		b.run("open the sync plan", chromedp.Click(chromedp.CSS(`#sync`)), chromedp.WaitVisible(chromedp.CSS(`#sync-paths section.path`)))
		b.waitJS("a.txt planned as merged", `document.querySelector('#sync-paths section.path[data-path="a.txt"]')?.dataset.outcome === 'merged'`)
		b.shot("sync-plan")
		if s := read(bob, "a.txt"); s != "a1-bob\na2\na3" {
			t.Fatalf("the dry-run plan changed bob's a.txt: %q", s)
		}
		b.run("sync", chromedp.Click(chromedp.CSS(`#sync-apply`)), chromedp.WaitVisible(chromedp.CSS(`#synced`)))
		head := headVersion()
		b.waitJS("the new base is shown", fmt.Sprintf(`document.querySelector('#base-revision')?.dataset.manifestVersion === %q`, head))
		if before == head {
			t.Fatalf("base revision %s before the sync is already head's", before)
		}
		b.waitJS("alice's file in the tree", `!!document.querySelector('#tree a[data-path="alice.txt"]')`)
		b.waitJS("a.txt shows both edits", `document.querySelector('#file-view table.blame')?.innerText.includes('a3-alice')`)
		b.shot("synced")
		if c := read(bob, "alice.txt"); c != "alice" {
			t.Fatalf("bob's alice.txt after the sync: %q", c)
		}
		if c := read(bob, "a.txt"); c != "a1-bob\na2\na3-alice" {
			t.Fatalf("bob's a.txt after the sync: %q", c)
		}
		g := b.gutter("#file-view")
		if len(g) != 3 || g[0][0] != "workspace_session:"+bob || g[2][0] != "workspace_session:"+alice {
			t.Fatalf("bob's a.txt blame after the sync: %v", g)
		}

		// A conflicting sync: carol and head both changed c.txt and d.txt.
		// Sync is rejected with both paths and nothing changes; then
		// "theirs" for c.txt and "ours" for d.txt, and it goes through.
		carol := session("carol")
		exec(carol, "echo c carol > c.txt; echo d carol > d.txt")
		e.rt(id, "file_write", "--path", "c.txt", "--content", "c head\n")
		e.rt(id, "file_write", "--path", "d.txt", "--content", "d head\n")
		sessionPage(carol)
		b.run("carol's sync plan", chromedp.Click(chromedp.CSS(`#sync`)), chromedp.WaitVisible(chromedp.CSS(`#sync-paths section.path`)))
		b.waitJS("two conflicts planned", `document.querySelectorAll('#sync-paths section.path[data-outcome="conflict"]').length === 2`)
		b.run("sync carol", chromedp.Click(chromedp.CSS(`#sync-apply`)), chromedp.WaitVisible(chromedp.CSS(`#sync-rejected-paths`)))
		b.shot("sync-rejected")
		if got := eval[[]string](b, `[...document.querySelectorAll('#sync-rejected-paths li')].map((li) => li.dataset.path)`); fmt.Sprint(got) != "[c.txt d.txt]" {
			t.Fatalf("rejected sync lists %v", got)
		}
		if c, d := read(carol, "c.txt"), read(carol, "d.txt"); c != "c carol" || d != "d carol" {
			t.Fatalf("a rejected sync changed carol's files: %q %q", c, d)
		}
		if v := eval[string](b, `document.querySelector('#base-revision').dataset.manifestVersion`); v == headVersion() {
			t.Fatalf("a rejected sync moved carol's base to head (%s)", v)
		}
		b.choose(`#sync-paths select.strategy[data-path="c.txt"]`, "theirs")
		b.choose(`#sync-paths select.strategy[data-path="d.txt"]`, "ours")
		b.waitJS("strategies planned", `document.querySelector('#sync-paths section.path[data-path="c.txt"]')?.dataset.outcome === 'theirs' && document.querySelector('#sync-paths section.path[data-path="d.txt"]')?.dataset.outcome === 'ours'`)
		if got := outcomes("#sync-paths"); got != `{"c.txt":"theirs","d.txt":"ours"}` {
			t.Fatalf("carol's planned outcomes: %s", got)
		}
		b.run("sync carol with strategies", chromedp.Click(chromedp.CSS(`#sync-apply`)), chromedp.WaitVisible(chromedp.CSS(`#synced`)))
		b.waitJS("carol's new base", fmt.Sprintf(`document.querySelector('#base-revision')?.dataset.manifestVersion === %q`, headVersion()))
		if c, d := read(carol, "c.txt"), read(carol, "d.txt"); c != "c head" || d != "d carol" {
			t.Fatalf("carol after syncing theirs/ours: c.txt %q d.txt %q", c, d)
		}

		// Publish and keep working, twice in one session: the review page
		// stays on dave's session over the new head with nothing changed,
		// and head's blame of k.txt credits both of dave's commits.
		dave := session("dave")
		exec(dave, "sed -i s/k1/k1-dave/ k.txt")
		b.run("review dave", chromedp.Navigate(w.url("/#/review/"+id+"/"+dave)), chromedp.WaitVisible(chromedp.CSS(`#review-paths section.path[data-path="k.txt"]`)))
		b.run("publish and keep working", chromedp.Click(chromedp.CSS(`#publish-keep`)), chromedp.WaitVisible(chromedp.CSS(`#published[data-count="1"]`)))
		first := eval[string](b, `document.querySelector('#layer-id').textContent`)
		b.waitJS("no changes left", `document.querySelector('#review-base .changed-count')?.dataset.count === '0'`)
		b.waitJS("the new base is shown", fmt.Sprintf(`document.querySelector('#review-base [data-manifest-version]')?.dataset.manifestVersion === %q`, headVersion()))
		b.shot("kept")
		if loc := eval[string](b, `location.hash`); loc != "#/review/"+id+"/"+dave {
			t.Fatalf("after Publish and keep working the page is %q", loc)
		}
		exec(dave, "sed -i s/k3/k3-dave/ k.txt")
		b.waitJS("the next change is planned", `!!document.querySelector('#review-paths section.path[data-path="k.txt"]') && document.querySelector('#review-base .changed-count')?.dataset.count === '1'`)
		b.run("publish and keep working again", chromedp.Click(chromedp.CSS(`#publish-keep`)), chromedp.WaitVisible(chromedp.CSS(`#published[data-count="2"]`)))
		b.waitJS("head blame shown", `!!document.querySelector('.head-file[data-path="k.txt"] td.gutter')`)
		second := eval[string](b, `document.querySelector('#layer-id').textContent`)
		if first == second || first == "" || strings.HasPrefix(first, "(") {
			t.Fatalf("the two publishes showed layers %q and %q", first, second)
		}
		if c := e.rt(id, "file_read", "--path", "k.txt")["content"]; c != "k1-dave\nk2\nk3-dave" {
			t.Fatalf("head k.txt after two publishes: %q", c)
		}
		layers := eval[[]string](b, `[...document.querySelectorAll('.head-file[data-path="k.txt"] td.gutter')].map((td) => td.dataset.owner + ' ' + td.dataset.layer)`)
		if len(layers) != 3 || layers[0] != "workspace_session:"+dave+" "+first || layers[2] != "workspace_session:"+dave+" "+second {
			t.Fatalf("head blame of k.txt: %q, want lines 1 and 3 credited to %s in layers %s and %s", layers, dave, first, second)
		}
		alive := false
		for _, s := range e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any) {
			alive = alive || s.(map[string]any)["workspace_session_id"] == dave
		}
		if !alive {
			t.Fatal("dave's session ended after Publish and keep working")
		}

		// Fork bob (synced, with edits of his own): the fork's page opens
		// with the same tree and files; an edit made in the fork's terminal
		// does not reach bob.
		sessionPage(bob)
		b.waitJS("bob's tree", `!!document.querySelector('#tree a[data-path="alice.txt"]')`)
		tree := eval[[]string](b, `[...document.querySelectorAll('#tree a')].map((a) => a.textContent).sort()`)
		b.run("open the fork dialog", chromedp.Click(chromedp.CSS(`#fork`)), chromedp.WaitVisible(chromedp.CSS(`#fork-agent`)))
		b.eval0(`document.querySelector('#fork-agent').value = ''`)
		b.run("fork", chromedp.SendKeys(chromedp.CSS(`#fork-agent`), "erin"))
		b.choose(`#fork-network`, "offline")
		b.run("fork", chromedp.Click(chromedp.CSS(`#fork-ok`)))
		b.waitJS("the fork's page opens", fmt.Sprintf(`location.hash.startsWith('#/session/%s/') && !location.hash.endsWith(%q) && !!document.querySelector('#base-revision')`, id, bob))
		fork := strings.TrimPrefix(eval[string](b, `location.hash`), "#/session/"+id+"/")
		b.waitJS("the fork's tree", fmt.Sprintf(`document.querySelectorAll('#tree a').length === %d`, len(tree)))
		b.shot("fork")
		if got := eval[[]string](b, `[...document.querySelectorAll('#tree a')].map((a) => a.textContent).sort()`); fmt.Sprint(got) != fmt.Sprint(tree) {
			t.Fatalf("fork's tree %v, bob's %v", got, tree)
		}
		var rec map[string]any
		for _, s := range e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any) {
			if s.(map[string]any)["workspace_session_id"] == fork {
				rec = s.(map[string]any)
			}
		}
		if rec == nil || rec["agent"] != "erin" || rec["network_profile"] != "offline" {
			t.Fatalf("the fork's record: %v", rec)
		}
		for _, p := range []string{"a.txt", "bob.txt", "alice.txt"} {
			if f, s := read(fork, p), read(bob, p); f != s {
				t.Fatalf("fork's %s %q, bob's %q", p, f, s)
			}
		}
		b.run("edit in the fork", chromedp.SendKeys(chromedp.CSS(`#cmd`), `echo fork-only > fork.txt; sed -i s/a2/a2-erin/ a.txt`), chromedp.Click(chromedp.CSS(`#run`)))
		b.waitJS("the fork's command ends", `document.querySelector('#cmd-status').dataset.state === 'ok'`)
		if c := read(fork, "a.txt"); c != "a1-bob\na2-erin\na3-alice" {
			t.Fatalf("fork's a.txt after its edit: %q", c)
		}
		if c := read(bob, "a.txt"); c != "a1-bob\na2\na3-alice" {
			t.Fatalf("the fork's edit reached bob: %q", c)
		}
		e.rtFail(id, 1, "not_found", "file_read", "--workspace-session-id", bob, "--path", "fork.txt")
	})
}
