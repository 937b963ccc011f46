package main

// Part 11: fork_workspace_session of a session with 1,000 changed files, on
// both overlay drivers, next to a new session on the same sandbox and to
// `cp -a` of the source's upper dir (what copying the changes by hand
// would cost; the fork also leases the chain, copies attribution and starts
// a holder).

import (
	"fmt"
	"path/filepath"
	"text/tabwriter"
	"time"
)

const forkChanged = 1000

func (b *bench) fork() {
	tree := filepath.Join(b.root, "forktree")
	files := max(b.cfg.sizes[0], forkChanged)
	check(generateTree(tree, files))
	type row struct {
		driver, na          string
		fork, create, cpDir time.Duration
	}
	var rows []*row
	for _, driver := range []string{"kernel", "fuse"} {
		r := &row{driver: driver}
		rows = append(rows, r)
		res, _, err := b.timedCall("create_sandbox", "", map[string]any{"workspace_root": tree, "overlay": driver})
		if err != nil {
			r.na = "unavailable: " + oneLine(err.Error())
			continue
		}
		sbx, _ := res["id"].(string)
		src, _, _ := b.createSession(sbx)
		// Half the changes edit project files, half are new files.
		b.execIn(sbx, src, writeCmd("new", forkChanged/2)+fmt.Sprintf(" && for f in $(find d0* -name '*.txt' | sort | head -n %d); do echo changed >> $f; done", forkChanged/2))
		upper := filepath.Join(b.home, "data", "sandboxes", sbx, "sessions", src, "upper")
		var forks, creates, cps []time.Duration
		for i := 0; i <= b.cfg.reps; i++ { // i == 0 is the warm-up
			res, df, err := b.timedCall("fork_workspace_session", sbx, map[string]any{"workspace_session_id": src})
			check(err)
			fws, _ := res["workspace_session_id"].(string)
			if i == 0 {
				// The fork must really hold the changes.
				if got := b.execIn(sbx, fws, "cat new/f7.txt; find new -type f | wc -l"); got != fmt.Sprintf("7\n%d", forkChanged/2) {
					fail("fork of a %s session sees %q", driver, got)
				}
			}
			b.destroySession(sbx, fws)
			ws, _, dc := b.createSession(sbx)
			b.destroySession(sbx, ws)
			dst := filepath.Join(b.root, "cp-upper")
			dp, err := timed(func() error { return runCmd("", "cp", "-a", upper, dst) })
			check(err)
			check(removeAll(dst))
			if i > 0 {
				forks, creates, cps = append(forks, df), append(creates, dc), append(cps, dp)
			}
		}
		b.destroySandbox(sbx)
		r.fork, r.create, r.cpDir = median(forks), median(creates), median(cps)
	}
	tw := b.table(tabwriter.AlignRight)
	fmt.Fprintln(tw, "driver\tchanged files\tfork\tnew session\tcp -a upper\tnew session/fork\tcp -a/fork\t")
	for _, r := range rows {
		if r.na != "" {
			fmt.Fprintf(tw, "%s\t%d\t%s\t\t\t\t\t\n", r.driver, forkChanged, r.na)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.driver, forkChanged, ms(r.fork), ms(r.create), ms(r.cpDir),
			ratio(r.create, r.fork), ratio(r.cpDir, r.fork))
	}
	tw.Flush()
	b.printf("project: generated %s files; fork and new session measured through the socket (Go client); a fork leases the source's chain,\n", count(files))
	b.println("copies its upper dir (reflink or copy_file_range) and attribution, and starts its own holder; cp -a copies the upper dir only")
}
