package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// browser is one headless Chromium on a fresh profile, driven over the
// DevTools protocol. Every exception thrown by a page and every console
// error (CSP violations included) is collected: the console tests fail on
// any of them.
type browser struct {
	t    *testing.T
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

// chromiumFlags work on a machine without internet (see README): no
// background requests, no first-run UI, no sandbox (tests may run in
// containers without user namespaces for Chromium's own sandbox).
func chromiumFlags(profile string) []chromedp.ExecAllocatorOption {
	return []chromedp.ExecAllocatorOption{
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile), chromedp.WindowSize(1280, 800),
	}
}

func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		skipOrFail(t, "no chromium on PATH (Debian package chromium)")
	}
	profile := t.TempDir()
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), append(chromiumFlags(profile), chromedp.ExecPath(path))...)
	ctx, cancelC := chromedp.NewContext(actx)
	b := &browser{t: t, ctx: ctx}
	t.Cleanup(func() {
		cancelC()
		cancelA()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, e := range b.errs {
			t.Errorf("browser: %s", e)
		}
	})
	// The first call starts the browser and must not carry a timeout.
	err := chromedp.Listen(ctx, func(ev any) {
		var msg string
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			msg = "exception: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				msg += " " + ev.ExceptionDetails.Exception.Description
			}
		case *log.EventEntryAdded:
			msg = "log " + string(ev.Entry.Level) + ": " + ev.Entry.Text + " " + ev.Entry.URL
			if ev.Entry.Level != log.EntryLevelError {
				msg = ""
			}
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				msg = "console.error"
				for _, a := range ev.Args {
					msg += " " + string(a.Value) + a.Description
				}
			}
		}
		if msg != "" {
			b.mu.Lock()
			b.errs = append(b.errs, msg)
			b.mu.Unlock()
		}
	})
	if err == nil {
		_, err = chromedp.Call(ctx, log.Enable, cdp.Empty{})
	}
	if err == nil {
		_, err = chromedp.Call(ctx, runtime.Enable, cdp.Empty{})
	}
	if err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return b
}

// run performs actions with a bound; on failure it shows what the page
// showed.
func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.fail(what, err)
	}
}

func (b *browser) fail(what string, err error) {
	b.t.Helper()
	tctx, tcancel := context.WithTimeout(b.ctx, 5*time.Second)
	text, _ := chromedp.Run(tctx, chromedp.Evaluate[string](`document.body.innerText`))
	tcancel()
	b.t.Fatalf("%s: %v\npage:\n%s", what, err, text)
}

// eval runs JS and returns its value.
func eval[T any](b *browser, js string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		b.fail("eval "+js, err)
	}
	return v
}

// waitJS polls until the expression is true.
func (b *browser) waitJS(what, js string) {
	b.t.Helper()
	b.run(what, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(45*time.Second)))
}

// shot saves a screenshot to $ESBX_CONSOLE_SHOTS/<name>.png when that is
// set (for looking at the pages; the tests assert nothing about pixels).
func (b *browser) shot(name string) {
	b.t.Helper()
	dir := os.Getenv("ESBX_CONSOLE_SHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, strings.ReplaceAll(b.t.Name(), "/", "_")+"-"+name+".png"), png, 0o644)
	}
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
	}
}

// typeInTerminal types a line into the terminal. Text arrives as a
// keyboard's text input does (Input.insertText): chromedp's key events
// deliver each printable key twice to xterm.js (a keyDown with text and a
// char event), so they are used for Enter only.
func (b *browser) typeInTerminal(line string) {
	b.t.Helper()
	b.run("type "+line, chromedp.Focus(chromedp.CSS(`#terminal .xterm-helper-textarea`)),
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: line})
			return err
		}), chromedp.KeyEvent("\r"))
}

// eval0 runs JS for its effect.
func (b *browser) eval0(js string) {
	b.t.Helper()
	b.run("eval "+js, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Evaluate[chromedp.Void](js)(ctx, t)
		return err
	}))
}

// choose sets a <select> and fires its change event, as a person picking
// an option does.
func (b *browser) choose(sel, value string) {
	b.t.Helper()
	if !eval[bool](b, fmt.Sprintf(`(() => { const s = document.querySelector(%q); if (!s) return false; s.value = %q; s.dispatchEvent(new Event('change')); return true; })()`, sel, value)) {
		b.t.Fatalf("no %s", sel)
	}
}

// gutter reads the blame gutter of the file view in scope: per line, the
// owner and agent.
func (b *browser) gutter(scope string) [][2]string {
	b.t.Helper()
	return eval[[][2]string](b, fmt.Sprintf(`[...document.querySelectorAll(%q)].map((td) => [td.dataset.owner || '', td.dataset.agent || ''])`, scope+" td.gutter"))
}

// TestConsole drives the console in a real Chromium against a real
// supervisor (issue 15's Done-when): log in through /auth, watch a sandbox
// created by the CLI appear live, run a command in a session's terminal and
// see its output stream in, read a file's blame gutter, review a publish
// with one conflict, pick "ours", publish, see the new layer and head's
// blame; then a second session's publish is rejected with every conflicting
// path listed, and it is discarded.
func TestConsole(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start("--http", "tcp://127.0.0.1:0")
		w := e.web()
		b := newBrowser(t)

		// Login: /auth sets the cookie and redirects to the console; the
		// page cannot read the cookie and the token left the address bar.
		b.run("login", chromedp.Navigate(w.url("/auth?token="+w.token)), chromedp.WaitVisible(chromedp.CSS(`#fleet`)))
		loc := eval[string](b, `location.href`)
		cookies := eval[string](b, `document.cookie`)
		if strings.Contains(loc, w.token) || strings.TrimSuffix(loc, "#/fleet") != w.url("/") {
			t.Fatalf("after login the address is %q", loc)
		}
		if strings.Contains(cookies, "es_ui") {
			t.Fatalf("the page can read the login cookie: %q", cookies)
		}
		b.waitJS("live stream", `document.querySelector('#live').textContent.includes('live')`)

		// A sandbox created by the CLI appears without a reload.
		root := e.project(map[string]string{
			"f.txt":  "one\ntwo\nthree\n",
			"h1.txt": "h1 base\n",
			"h2.txt": "h2 base\n",
		})
		id := e.createSandbox(root)
		b.waitJS("sandbox row appears live", fmt.Sprintf(`!!document.querySelector('tr.sandbox[data-sandbox-id=%q]')`, id))
		alice := e.rt(id, "create_workspace_session", "--agent", "alice")["workspace_session_id"].(string)
		bob := e.rt(id, "create_workspace_session", "--agent", "bob")["workspace_session_id"].(string)
		b.waitJS("sessions appear live", fmt.Sprintf(`!!document.querySelector('tr.session[data-session-id=%q]') && !!document.querySelector('tr.session[data-session-id=%q]')`, alice, bob))
		// An implicit session (a command run without a session) is labelled
		// as one while its command runs.
		imp := e.rt(id, "exec_command", "sleep 5", "--yield-time-ms", "100")["workspace_session_id"].(string)
		b.waitJS("implicit session labelled", fmt.Sprintf(`document.querySelector('tr.session[data-session-id=%q]')?.textContent.includes('implicit')`, imp))

		// The terminal: a command's output streams in, line by line.
		b.run("open the session", chromedp.Click(chromedp.CSS(fmt.Sprintf(`a[href="#/session/%s/%s"]`, id, alice))),
			chromedp.WaitVisible(chromedp.CSS(`#terminal .xterm-rows`)))
		cmd := `for i in 1 2 3; do echo stream-$i; sleep 0.2; done; sed -i s/two/two-alice/ f.txt; echo new > new.txt`
		b.run("run a command", chromedp.SendKeys(chromedp.CSS(`#cmd`), cmd), chromedp.Click(chromedp.CSS(`#run`)))
		b.waitJS("output streams in", `document.querySelector('#terminal .xterm-rows').textContent.includes('stream-3')`)
		b.waitJS("exit status", `document.querySelector('#cmd-status').dataset.state === 'ok'`)
		b.shot("session")
		b.waitJS("history lists it", `[...document.querySelectorAll('#history tr.cmd')].some((tr) => tr.textContent.includes('stream-') && tr.textContent.includes('ok'))`)

		// Typing in the terminal goes to the running command's stdin; ^C
		// cancels a command.
		b.run("run a reader", chromedp.SendKeys(chromedp.CSS(`#cmd`), `read x; echo got-$x`), chromedp.Click(chromedp.CSS(`#run`)))
		b.waitJS("reader running", `document.querySelector('#cmd-status').dataset.state === 'running'`)
		b.typeInTerminal("hello")
		b.waitJS("stdin reached it", `document.querySelector('#terminal .xterm-rows').textContent.includes('got-hello')`)
		b.waitJS("reader done", `document.querySelector('#cmd-status').dataset.state === 'ok'`)
		b.run("run a sleeper", chromedp.SendKeys(chromedp.CSS(`#cmd`), `sleep 600`), chromedp.Click(chromedp.CSS(`#run`)))
		b.waitJS("sleeper running", `document.querySelector('#cmd-status').dataset.state === 'running'`)
		b.run("^C", chromedp.Click(chromedp.CSS(`#ctrl-c`)))
		b.waitJS("cancelled", `document.querySelector('#cmd-status').dataset.state === 'cancelled'`)

		// A command an agent started elsewhere: the history shows it
		// running; attaching streams it and takes the terminal's input.
		agentCmd := e.rt(id, "exec_command", "--workspace-session-id", alice, "--yield-time-ms", "100", "read y; echo agent-$y")
		if agentCmd["status"] != "running" {
			t.Fatalf("agent command: %v", agentCmd)
		}
		attach := fmt.Sprintf(`#history tr.cmd[data-command-id=%q] button.attach`, agentCmd["command_session_id"])
		b.run("attach", chromedp.WaitVisible(chromedp.CSS(attach)), chromedp.Click(chromedp.CSS(attach)))
		b.waitJS("attached", `document.querySelector('#cmd-status').dataset.state === 'running'`)
		b.typeInTerminal("from-the-page")
		b.waitJS("the agent's command read it", `document.querySelector('#terminal .xterm-rows').textContent.includes('agent-from-the-page')`)
		b.waitJS("agent command done", `document.querySelector('#cmd-status').dataset.state === 'ok'`)

		// The blame gutter of the session's view: line 2 is alice's.
		b.run("open f.txt", chromedp.Click(chromedp.CSS(`#tree a[data-path="f.txt"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#file-view td.gutter`)))
		g := b.gutter("#file-view")
		want := [][2]string{{"original", ""}, {"workspace_session:" + alice, "alice"}, {"original", ""}}
		if fmt.Sprint(g) != fmt.Sprint(want) {
			t.Fatalf("session blame gutter: %v, want %v", g, want)
		}

		// The head changes the same line: the review shows one conflict
		// with its hunk; "ours" for it, then Publish.
		e.rt(id, "file_write", "--path", "f.txt", "--content", "one\ntwo-head\nthree\n")
		b.run("open the review", chromedp.Click(chromedp.CSS(`#review`)), chromedp.WaitVisible(chromedp.CSS(`#review-paths section.path`)))
		b.waitJS("one conflict planned", `document.querySelector('section.path[data-path="f.txt"]')?.dataset.outcome === 'conflict'`)
		planned := eval[map[string]string](b, `Object.fromEntries([...document.querySelectorAll('section.path')].map((s) => [s.dataset.path, s.dataset.outcome]))`)
		if fmt.Sprint(planned) != "map[f.txt:conflict new.txt:unchanged_head]" {
			t.Fatalf("planned outcomes: %v", planned)
		}
		hunk := eval[string](b, `document.querySelector('section.path[data-path="f.txt"] tr.hunk')?.innerText || ''`)
		if !strings.Contains(hunk, "two-head") || !strings.Contains(hunk, "two-alice") {
			t.Fatalf("conflict hunk shows %q", hunk)
		}
		b.shot("review")
		b.choose(`select.strategy[data-path="f.txt"]`, "ours")
		b.waitJS("ours planned", `document.querySelector('section.path[data-path="f.txt"]')?.dataset.outcome === 'ours'`)
		b.run("publish", chromedp.Click(chromedp.CSS(`#publish`)))
		b.waitJS("new layer shown", `(document.querySelector('#layer-id')?.textContent || '').length > 0 && !!document.querySelector('#new-layer li')`)
		b.waitJS("head blame shown", `!!document.querySelector('.head-file[data-path="f.txt"] td.gutter')`)
		layer := eval[string](b, `document.querySelector('#layer-id').textContent`)
		resolved := eval[string](b, `document.querySelector('#resolved').innerText`)
		if !strings.Contains(resolved, "f.txt") || !strings.Contains(resolved, "ours") {
			t.Fatalf("resolved paths shown: %q", resolved)
		}
		ls := e.ok("sandbox-observability-cli", "layerstack", "--sandbox-id", id)
		if top := ls["layers"].([]any)[0].(map[string]any)["layer_id"]; top != layer {
			t.Fatalf("page shows layer %q, head's newest is %v", layer, top)
		}
		if c := e.rt(id, "file_read", "--path", "f.txt")["content"]; c != "one\ntwo-alice\nthree" {
			t.Fatalf("head f.txt after publishing ours: %q", c)
		}
		b.shot("published")
		g = b.gutter(`.head-file[data-path="f.txt"]`)
		if len(g) != 3 || g[1] != [2]string{"workspace_session:" + alice, "alice"} || g[0][0] == g[1][0] {
			t.Fatalf("head blame gutter: %v", g)
		}

		// Bob's publish conflicts on two paths: the rejection lists both;
		// then Discard, confirmed, destroys the session.
		e.rt(id, "exec_command", "--workspace-session-id", bob, "echo h1 bob > h1.txt; echo h2 bob > h2.txt")
		e.rt(id, "file_write", "--path", "h1.txt", "--content", "h1 head\n")
		e.rt(id, "file_write", "--path", "h2.txt", "--content", "h2 head\n")
		b.run("fleet", chromedp.Navigate(w.url("/#/fleet")))
		b.waitJS("bob's changed-path count", fmt.Sprintf(`document.querySelector('tr.session[data-session-id=%q] td.changed')?.textContent === '2 changed'`, bob))
		b.run("review bob", chromedp.Navigate(w.url("/#/review/"+id+"/"+bob)), chromedp.WaitVisible(chromedp.CSS(`#review-paths section.path`)))
		b.waitJS("two conflicts planned", `document.querySelectorAll('section.path[data-outcome="conflict"]').length === 2`)
		b.run("publish bob", chromedp.Click(chromedp.CSS(`#publish`)), chromedp.WaitVisible(chromedp.CSS(`#rejected-paths`)))
		b.shot("rejected")
		rejected := eval[[]string](b, `[...document.querySelectorAll('#rejected-paths li')].map((li) => li.dataset.path)`)
		if fmt.Sprint(rejected) != "[h1.txt h2.txt]" {
			t.Fatalf("rejected paths shown: %v", rejected)
		}
		b.run("discard", chromedp.Click(chromedp.CSS(`#discard`)), chromedp.WaitVisible(chromedp.CSS(`#confirm-ok`)),
			chromedp.Click(chromedp.CSS(`#confirm-ok`)), chromedp.WaitVisible(chromedp.CSS(`#fleet`)))
		for _, s := range e.rt(id, "list_workspace_sessions")["workspace_sessions"].([]any) {
			if s.(map[string]any)["workspace_session_id"] == bob {
				t.Fatalf("bob's session survived Discard: %v", s)
			}
		}
		if c := e.rt(id, "file_read", "--path", "h1.txt")["content"]; c != "h1 head" {
			t.Fatalf("discarded work reached head: %q", c)
		}
		b.waitJS("bob's row leaves the fleet", fmt.Sprintf(`!document.querySelector('tr.session[data-session-id=%q]')`, bob))
		b.shot("fleet")

		// Create a sandbox from the page (the workspace picker browses to
		// it) and destroy it after the confirmation.
		proj2 := filepath.Join(e.root, "proj2")
		if err := os.MkdirAll(proj2, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proj2, "a.txt"), []byte("a\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		b.run("open the create form", chromedp.Click(chromedp.CSS(`#new-sandbox`)), chromedp.WaitVisible(chromedp.CSS(`#ws-path`)),
			chromedp.SendKeys(chromedp.CSS(`#ws-path`), e.root), chromedp.Click(chromedp.CSS(`#create-form button[type=button]`)))
		b.waitJS("the picker lists proj2", `[...document.querySelectorAll('ul.dirs a')].some((a) => a.textContent === 'proj2/')`)
		b.eval0(`[...document.querySelectorAll('ul.dirs a')].find((a) => a.textContent === 'proj2/').click()`)
		b.waitJS("the picker chose proj2", fmt.Sprintf(`document.querySelector('#ws-path').value === %q`, proj2))
		if e.overlay != "" {
			b.choose(`#ws-overlay`, e.overlay)
		}
		b.run("create", chromedp.SendKeys(chromedp.CSS(`#ws-name`), "from-the-page"), chromedp.Click(chromedp.CSS(`#create-form button[type=submit]`)))
		b.waitJS("the new sandbox is listed", `[...document.querySelectorAll('tr.sandbox')].some((tr) => tr.textContent.includes('from-the-page'))`)
		id2 := eval[string](b, `[...document.querySelectorAll('tr.sandbox')].find((tr) => tr.textContent.includes('from-the-page')).dataset.sandboxId`)
		if rec := e.mgr("inspect_sandbox", "--sandbox-id", id2); rec["workspace_root"] != proj2 || rec["name"] != "from-the-page" || (e.overlay != "" && rec["overlay_driver"] != e.overlay) {
			t.Fatalf("sandbox created by the page: %v", rec)
		}
		b.run("destroy", chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr.sandbox[data-sandbox-id=%q] button.destroy`, id2))),
			chromedp.WaitVisible(chromedp.CSS(`#confirm-ok`)), chromedp.Click(chromedp.CSS(`#confirm-ok`)))
		b.waitJS("the destroyed sandbox leaves", fmt.Sprintf(`!document.querySelector('tr.sandbox[data-sandbox-id=%q]')`, id2))
		if r := e.run("sandbox-manager-cli", "inspect_sandbox", "--sandbox-id", id2); r.code == 0 && !strings.Contains(r.stdout, `"stopped"`) {
			t.Fatalf("sandbox %s after Destroy: %s", id2, r.stdout)
		}

		// Observability: every tab renders from its operation, and Squash
		// (confirmed) squashes the stack.
		b.run("observability", chromedp.Navigate(w.url("/#/obs/"+id)), chromedp.WaitVisible(chromedp.CSS(`#obs-tabs`)))
		b.waitJS("events listed", `document.querySelectorAll('#event-rows tr').length > 0`)
		b.shot("events")
		for _, tc := range []struct{ tab, ready string }{
			{"trace", `document.querySelectorAll('.waterfall .span-row').length > 0`},
			{"resources", `!!document.querySelector('.charts .chart, .charts p')`},
			{"topology", `document.querySelector('#obs-pane').textContent.length > 0`},
			{"doctor", `!!document.querySelector('#doctor tr[data-check="userns"]') && document.querySelector('#doctor tr[data-check="userns"]').textContent.includes('pass')`},
			{"layers", `document.querySelectorAll('#layers tbody tr').length > 0`},
		} {
			b.run(tc.tab, chromedp.Click(chromedp.CSS(`#tab-`+tc.tab)))
			b.waitJS(tc.tab+" renders", tc.ready)
			b.shot(tc.tab)
		}
		b.run("squash", chromedp.Click(chromedp.CSS(`#squash`)), chromedp.WaitVisible(chromedp.CSS(`#confirm-ok`)), chromedp.Click(chromedp.CSS(`#confirm-ok`)))
		b.waitJS("squash reported", `document.querySelector('#toasts').textContent.includes('squashed')`)
		n := len(e.ok("sandbox-observability-cli", "layerstack", "--sandbox-id", id)["layers"].([]any))
		b.waitJS("the stack after squash", fmt.Sprintf(`document.querySelectorAll('#layers tbody tr').length === %d`, n))
	})
}

// TestConsoleReviewQuotesDiffNames (#27 item 5): a file whose name holds
// newlines, a forged "+++ b/…" header, a hunk header and an added line with
// markup shows in the review as one file under its quoted name (git's
// core.quotePath quoting), with only its real added line, no rename and no
// element or script injected.
func TestConsoleReviewQuotesDiffNames(t *testing.T) {
	e := newEnv(t)
	e.start("--http", "tcp://127.0.0.1:0")
	w := e.web()
	b := newBrowser(t)
	b.run("login", chromedp.Navigate(w.url("/auth?token="+w.token)), chromedp.WaitVisible(chromedp.CSS(`#fleet`)))
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	ws := e.rt(id, "create_workspace_session", "--agent", "mallory")["workspace_session_id"].(string)
	const img1, img2 = "<img src=x onerror=window.__pwned=1>", "<img src=x onerror=window.__pwned=2>"
	name := "nl\n+++ b/" + img1 + "\n@@ -0,0 +1 @@\n+" + img2
	if out := e.exec(id, `mkdir -p "$(printf 'nl\n+++ b')" && printf 'hello\n' > "$(printf 'nl\n+++ b/`+img1+`\n@@ -0,0 +1 @@\n+`+img2+`')"`,
		"--workspace-session-id", ws); out["status"] != "ok" {
		t.Fatalf("exec: %v", out)
	}
	d := e.rt(id, "diff_workspace_session", "--workspace-session-id", ws)
	var diff string
	for _, f := range objs(d["files"]) {
		if f["path"] == name {
			diff, _ = f["diff"].(string)
		}
	}
	if !strings.HasPrefix(diff, "--- \"a/nl\\n+++ b/"+img1+"\\n@@ -0,0 +1 @@\\n+"+img2+"\"\n+++ \"b/nl\\n") {
		t.Errorf("diff_workspace_session headers are not quoted:\n%s", diff)
	}

	b.run("review", chromedp.Navigate(w.url("/#/review/"+id+"/"+ws)), chromedp.WaitVisible(chromedp.CSS(`#review-paths section.path`)))
	b.waitJS("the diff rendered", `document.querySelectorAll('#review-paths .d2h-file-wrapper').length > 0`)
	b.shot("review-quoted-name")
	type view struct {
		Wrappers int      `json:"wrappers"`
		Names    []string `json:"names"`
		Inserted []string `json:"inserted"`
		Imgs     int      `json:"imgs"`
		Pwned    bool     `json:"pwned"`
		Tags     []string `json:"tags"`
	}
	v := eval[view](b, `({
		wrappers: document.querySelectorAll('#review-paths .d2h-file-wrapper').length,
		names: [...document.querySelectorAll('#review-paths .d2h-file-name')].map((e) => e.textContent),
		inserted: [...document.querySelectorAll('#review-paths .d2h-ins .d2h-code-line-ctn')].map((e) => e.textContent),
		imgs: document.querySelectorAll('img').length,
		pwned: window.__pwned !== undefined,
		tags: [...document.querySelectorAll('#review-paths .d2h-tag')].map((e) => e.textContent.trim()),
	})`)
	wantName := `"nl\n+++ b/` + img1 + `\n@@ -0,0 +1 @@\n+` + img2 + `"`
	if v.Wrappers != 1 || len(v.Names) != 1 || v.Names[0] != wantName {
		t.Errorf("the review shows %d files named %q, want one named %q", v.Wrappers, v.Names, wantName)
	}
	if fmt.Sprint(v.Inserted) != "[hello]" {
		t.Errorf("added lines shown: %q, want only the file's one line", v.Inserted)
	}
	for _, tag := range v.Tags {
		if strings.Contains(strings.ToUpper(tag), "RENAME") || strings.Contains(strings.ToUpper(tag), "MOVED") {
			t.Errorf("a rename is shown: %q", v.Tags)
		}
	}
	if v.Imgs != 0 || v.Pwned {
		t.Errorf("the file name injected elements (%d img) or ran script (%v)", v.Imgs, v.Pwned)
	}
}

// TestConsolePages checks what the pages are served with: the console's
// CSP (scripts only from the listener itself), no caching, module scripts
// with a JavaScript type, and nothing without the token.
func TestConsolePages(t *testing.T) {
	e := newEnv(t)
	e.start("--http", "tcp://127.0.0.1:0")
	w := e.web()
	auth := map[string]string{"Authorization": "Bearer " + w.token}
	for _, tc := range []struct{ path, ctype string }{
		{"/", "text/html; charset=utf-8"},
		{"/app/main.js", "text/javascript; charset=utf-8"},
		{"/vendor/xterm-xterm/xterm.mjs", "text/javascript; charset=utf-8"},
		{"/app/style.css", "text/css; charset=utf-8"},
	} {
		resp, body := w.do("GET", tc.path, "", auth)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != tc.ctype || len(body) == 0 {
			t.Errorf("%s: %d %q (%d bytes)", tc.path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self';") || strings.Contains(csp, "unsafe-eval") || !strings.Contains(csp, "default-src 'none'") ||
			strings.Contains(strings.SplitN(strings.SplitN(csp, "script-src", 2)[1], ";", 2)[0], "unsafe-inline") {
			t.Errorf("%s: CSP %q", tc.path, csp)
		}
		if resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s: Cache-Control %q", tc.path, resp.Header.Get("Cache-Control"))
		}
		if resp, _ := w.do("GET", tc.path, "", nil); resp.StatusCode != 401 {
			t.Errorf("%s without the token: %d", tc.path, resp.StatusCode)
		}
	}
	// No inline script in the page: every <script> has a src.
	_, page := w.do("GET", "/", "", auth)
	for _, tag := range strings.Split(string(page), "<script")[1:] {
		if !strings.Contains(strings.SplitN(tag, ">", 2)[0], "src=") {
			t.Errorf("inline <script%s", strings.SplitN(tag, "\n", 2)[0])
		}
	}
	for _, p := range []string{"/app/nope.js", "/vendor/", "/vendor/MANIFEST/x"} {
		if resp, body := w.do("GET", p, "", auth); resp.StatusCode != 404 {
			t.Errorf("%s: %d %s", p, resp.StatusCode, body)
		}
	}
	// The API keeps its stricter policy (no inline style either).
	resp, _ := w.do("POST", "/api/rpc", `{"op":"health","scope":{"kind":"system"}}`, w.bearer())
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "style-src 'self';") || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("/api/rpc: CSP %q Cache-Control %q", csp, resp.Header.Get("Cache-Control"))
	}

	// The Doctor tab's host diagnosis: the checks of `sandbox-supervisor
	// doctor`, each with its fix, behind the token like every page.
	if resp, _ := w.do("GET", "/api/doctor", "", nil); resp.StatusCode != 401 {
		t.Errorf("/api/doctor without the token: %d", resp.StatusCode)
	}
	resp, body := w.do("GET", "/api/doctor", "", auth)
	var report struct {
		OK     bool
		Checks []struct {
			ID, Detail, Fix string
			Required, OK    bool
		}
	}
	if err := json.Unmarshal(body, &report); resp.StatusCode != 200 || err != nil || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("/api/doctor: %d %v %s", resp.StatusCode, err, body)
	}
	seen := map[string]bool{}
	for _, c := range report.Checks {
		seen[c.ID] = c.OK
		if !c.OK && c.Fix == "" {
			t.Errorf("/api/doctor: failed check %s without a fix", c.ID)
		}
	}
	// This host runs the suite: user namespaces and the kernel overlay work.
	if !seen["userns"] || !seen["kernel_overlay"] || len(report.Checks) < 5 {
		t.Errorf("/api/doctor checks: %s", body)
	}
}
