package main

// Part 10: live sessions (issue #19). The time to bring a session with 10
// changed files up to a head 100 layers newer (sync_workspace_session:
// freeze, capture, plan, new upper, holder swap onto the new chain),
// next to the time of a new session on that head, which is what an agent
// would otherwise do (a fresh session loses its running processes).

import (
	"fmt"
	"text/tabwriter"
	"time"
)

const (
	syncChanged = 10  // files the session changed
	syncNewer   = 100 // layers published meanwhile
)

func (b *bench) liveSync() {
	tree := fmt.Sprintf("%s/synctree", b.root)
	check(generateTree(tree, b.cfg.sizes[0]))
	sbx, _ := b.createSandbox(tree)
	defer b.destroySandbox(sbx)
	var syncs, news []time.Duration
	var driver string
	for i := 0; i <= b.cfg.reps; i++ { // i == 0 is the warm-up
		ws, d, _ := b.createSession(sbx)
		driver = d
		b.execIn(sbx, ws, writeCmd(fmt.Sprintf("sync-r%d", i), syncChanged))
		for j := range syncNewer {
			b.call("file_write", sbx, map[string]any{"path": fmt.Sprintf("head-r%d/h%d.txt", i, j), "content": fmt.Sprintf("%d\n", j)})
		}
		res, ds, err := b.timedCall("sync_workspace_session", sbx, map[string]any{"workspace_session_id": ws})
		check(err)
		s, _ := res["sync"].(map[string]any)
		if s == nil || s["result"] != "synced" {
			fail("sync_workspace_session: unexpected result %v", res)
		}
		if out := b.execIn(sbx, ws, fmt.Sprintf("cat head-r%d/h%d.txt sync-r%d/f%d.txt", i, syncNewer-1, i, syncChanged)); out != fmt.Sprintf("%d\n%d", syncNewer-1, syncChanged) {
			fail("after sync the session sees %q", out)
		}
		fresh, _, dn := b.createSession(sbx)
		b.destroySession(sbx, fresh)
		b.destroySession(sbx, ws)
		if i > 0 {
			syncs, news = append(syncs, ds), append(news, dn)
		}
	}
	sync, fresh := median(syncs), median(news)
	b.printf("session with %d changed files, head %d layers newer (sessionless file_write each), %s-file project, %s driver\n",
		syncChanged, syncNewer, count(b.cfg.sizes[0]), driver)
	tw := b.table(tabwriter.AlignRight)
	fmt.Fprintln(tw, "operation\tmedian\tsync/new session\t")
	fmt.Fprintf(tw, "sync_workspace_session\t%s\t%s\t\n", ms(sync), ratio(sync, fresh))
	fmt.Fprintf(tw, "create_workspace_session\t%s\t\t\n", ms(fresh))
	tw.Flush()
	b.target("sync (10 files, 100 layers newer) / new session", ratio(sync, fresh), ratioValue(sync, fresh), "≤", 3, "×",
		"a new session is the alternative that loses the running processes")
}
