package main

// Part 9: the browser console with a fleet: 20 sandboxes and 100 live
// sessions (quick: 5 and 20). How long the fleet page takes to render every
// sandbox and session in headless Chromium, how long a session created
// through the socket takes to appear on it (live, through the event
// stream), and how far behind the event stream is under a burst of
// operations. Without Chromium the browser figures are skipped with the
// reason; the event stream is still measured.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

func (b *bench) console() {
	nSbx, perSbx := 20, 5
	if b.cfg.quick {
		nSbx, perSbx = 5, 4
	}
	addrB, err := os.ReadFile(filepath.Join(b.home, "run", "http.addr"))
	check(err)
	tokB, err := os.ReadFile(filepath.Join(b.home, "config", "ui.token"))
	check(err)
	base := "http://" + strings.TrimPrefix(strings.TrimSpace(string(addrB)), "tcp://")
	token := strings.TrimSpace(string(tokB))

	proj := filepath.Join(b.root, "fleet")
	check(generateTree(proj, 100))
	t0 := time.Now()
	var sbxs []string
	defer func() {
		for _, id := range sbxs {
			// Best effort: a failed section must still leave no sandbox.
			_, _, _ = b.timedCall("destroy_sandbox", "", map[string]any{"sandbox_id": id})
		}
	}()
	for range nSbx {
		id, _ := b.createSandbox(proj)
		sbxs = append(sbxs, id)
		for range perSbx {
			b.createSession(id)
		}
	}
	b.printf("fleet: %d sandboxes, %d live sessions, set up in %s\n", nSbx, nSbx*perSbx, ms(time.Since(t0)))

	// The event stream: a burst of sessionless writes from 8 clients; lag
	// is the time from a record's timestamp (its span's end) to its
	// arrival at an SSE client. Clocks are the same machine's.
	lags, got, sent := b.streamLag(base, token, sbxs)
	tw := b.table(tabwriter.AlignRight)
	fmt.Fprintln(tw, "event stream under a burst\toperations\trecords seen\tlag median\tp95\tmax\t")
	fmt.Fprintf(tw, "%d clients × file_write\t%d\t%d\t%s\t%s\t%s\t\n", 8, sent, got, ms(median(lags)), ms(percentile(lags, 0.95)), ms(slices.Max(lags)))
	tw.Flush()

	path := chromium()
	if path == "" {
		b.println("chromium not found (Debian package chromium): the fleet page render and live-update figures are skipped")
		return
	}
	profile := filepath.Join(b.root, "chromium-profile")
	actx, cancelA := chromedp.NewExecAllocator(ctx, chromedp.ExecPath(path), chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(profile), chromedp.WindowSize(1280, 800))
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	run := func(a chromedp.Action[chromedp.Void]) {
		c, cancel := context.WithTimeout(bctx, 2*time.Minute)
		defer cancel()
		check(chromedp.Do(c, a))
	}
	// The first Run starts the browser: no timeout on it.
	check(chromedp.Do(bctx, chromedp.Navigate(base+"/auth?token="+token)))
	all := fmt.Sprintf(`document.querySelectorAll('tr.sandbox').length >= %d && document.querySelectorAll('tr.session').length >= %d`, nSbx, nSbx*perSbx)
	var renders, walls []time.Duration
	for i := 0; i <= b.cfg.reps; i++ { // i == 0 warms up
		t := time.Now()
		run(chromedp.Navigate(base + "/#/fleet"))
		c, cancel := context.WithTimeout(bctx, 2*time.Minute)
		v, err := chromedp.Run(c, chromedp.Poll[float64](all+` && performance.now()`, chromedp.WithPollingTimeout(90*time.Second)))
		cancel()
		check(err)
		if i > 0 {
			renders = append(renders, time.Duration(v*float64(time.Millisecond)))
			walls = append(walls, time.Since(t))
		}
		run(chromedp.Navigate("about:blank"))
	}
	// Live: a session created through the socket appears on the open page.
	run(chromedp.Navigate(base + "/#/fleet"))
	run(chromedp.Poll[chromedp.Void](all, chromedp.WithPollingTimeout(90*time.Second)))
	var live []time.Duration
	for i := range b.cfg.reps {
		sbx := sbxs[i%len(sbxs)]
		t := time.Now()
		ws, _, _ := b.createSession(sbx)
		run(chromedp.Poll[chromedp.Void](fmt.Sprintf(`!!document.querySelector('tr.session[data-session-id=%q]')`, ws), chromedp.WithPollingTimeout(60*time.Second)))
		live = append(live, time.Since(t))
	}
	tw = b.table(tabwriter.AlignRight)
	fmt.Fprintf(tw, "fleet page (%d sandboxes, %d sessions)\tmedian\tmin\tmax\t\n", nSbx, nSbx*perSbx+b.cfg.reps)
	fmt.Fprintf(tw, "render (navigation start → every row, performance.now)\t%s\t%s\t%s\t\n", ms(median(renders)), ms(slices.Min(renders)), ms(slices.Max(renders)))
	fmt.Fprintf(tw, "render, wall time seen by the driver\t%s\t%s\t%s\t\n", ms(median(walls)), ms(slices.Min(walls)), ms(slices.Max(walls)))
	fmt.Fprintf(tw, "session created on the socket → row on the page\t%s\t%s\t%s\t\n", ms(median(live)), ms(slices.Min(live)), ms(slices.Max(live)))
	tw.Flush()
	m := median(renders)
	b.target("fleet page render with the fleet", ms(m), float64(m)/float64(time.Millisecond), "<", 1000, " ms", "")
}

// streamLag opens /api/events, fires 8 concurrent clients × n sessionless
// file_write operations across the sandboxes, and measures, for each
// record of those requests, arrival time − record time.
func (b *bench) streamLag(base, token string, sbxs []string) (lags []time.Duration, got, sent int) {
	perClient := 10 * b.cfg.reps
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(sctx, "GET", base+"/api/events", nil)
	check(err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	check(err)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		fail("/api/events: HTTP %d", resp.StatusCode)
	}
	type arrival struct {
		at    time.Time
		ts    int64
		trace string
	}
	arrivals := make(chan arrival, 100000)
	ready := make(chan struct{})
	go func() {
		defer close(arrivals)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			line := sc.Text()
			if line == "event: ready" {
				close(ready)
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			var m struct {
				Record struct {
					TS    int64  `json:"ts"`
					Trace string `json:"trace"`
				} `json:"record"`
			}
			if json.Unmarshal([]byte(data), &m) == nil && m.Record.TS > 0 {
				arrivals <- arrival{time.Now(), m.Record.TS, m.Record.Trace}
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		fail("/api/events sent no ready event")
	}
	mine := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perClient {
				sbx := sbxs[(c*perClient+i)%len(sbxs)]
				id := fmt.Sprintf("bench-lag-%d-%d", c, i)
				if err := b.callWithID(id, "file_write", sbx, map[string]any{"path": fmt.Sprintf("lag/%d.txt", c), "content": id}); err != nil {
					errs[c] = err
					return
				}
				mu.Lock()
				mine[id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		check(err)
	}
	sent = len(mine)
	// Collect until every request's records have arrived or 10 s pass.
	seen := map[string]bool{}
	deadline := time.After(10 * time.Second)
	for len(seen) < sent {
		select {
		case a, ok := <-arrivals:
			if !ok {
				fail("/api/events ended early")
			}
			if mine[a.trace] {
				got++
				seen[a.trace] = true
				lags = append(lags, max(0, a.at.Sub(time.UnixMilli(a.ts))))
			}
		case <-deadline:
			b.printf("only %d of %d requests' records arrived within 10 s of the last response\n", len(seen), sent)
			if len(lags) == 0 {
				fail("no record of the burst arrived on /api/events")
			}
			slices.Sort(lags)
			return lags, got, sent
		}
	}
	slices.Sort(lags)
	return lags, got, sent
}

// callWithID is call with a chosen request_id (the trace id of its records).
func (b *bench) callWithID(id, op, sandboxID string, args map[string]any) error {
	c, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	req := &catalog.Request{Op: op, RequestID: id, Scope: catalog.RequestScope{Kind: "sandbox", SandboxID: sandboxID}, Args: args}
	res, cerr := b.client.Call(c, req)
	if cerr != nil {
		return fmt.Errorf("%s: %v", op, cerr)
	}
	if e := catalog.ErrorFromResponse(res); e != nil {
		return fmt.Errorf("%s: %s: %s", op, e.Kind, e.Message)
	}
	return nil
}

func chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}
