package main

// Part 4: publication. A publish through the socket against the alternatives
// a user would pick for the same changed files (`git add -A && git commit`,
// `cp -a`), parallel publishes of disjoint changes against sequential ones,
// and a publish that must 3-way merge a large file against one that need not
// and against `git merge-file` of the same three versions.

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// publishParams are the sizes of part 4 (smaller under -quick).
type publishParams struct {
	changed      []int // changed files per publish
	parallel     int   // sessions publishing at once
	parallelEach int   // files each of them changes
	mergeLines   int   // lines of the file that is 3-way merged
}

func (b *bench) publishParams() publishParams {
	if b.cfg.quick {
		return publishParams{changed: []int{1, 100, 1000}, parallel: 3, parallelEach: 100, mergeLines: 1000}
	}
	return publishParams{changed: []int{1, 100, 1000, 10000}, parallel: 6, parallelEach: 100, mergeLines: 10000}
}

func (b *bench) publication() {
	p := b.publishParams()
	treeFiles := b.cfg.sizes[1]
	tree := filepath.Join(b.root, "pubtree")
	check(generateTree(tree, treeFiles))
	b.printf("project: generated %s files; publish = publish_workspace_session through the socket (Go client),\n", count(treeFiles))
	b.println("which captures the upper dir, resolves it against the head, commits one layer and closes the session")
	b.publishLatency(tree, p)
	b.publishParallel(tree, p)
	b.publishMerge(p)
}

// publish runs publish_workspace_session and returns its publish object and latency.
func (b *bench) publish(sbx, ws string) (map[string]any, time.Duration, error) {
	res, d, err := b.timedCall("publish_workspace_session", sbx, map[string]any{"workspace_session_id": ws})
	if err != nil {
		return nil, d, err
	}
	pub, _ := res["publish"].(map[string]any)
	if pub == nil || res["destroyed"] != true {
		return nil, d, fmt.Errorf("publish_workspace_session: unexpected result %v", res)
	}
	if pub["no_op"] == true {
		return nil, d, fmt.Errorf("publish_workspace_session %s: no-op publish (nothing captured)", ws)
	}
	return pub, d, nil
}

// outcome returns one count of a publish object's outcome_summary.
func outcome(pub map[string]any, key string) int {
	sum, _ := pub["outcome_summary"].(map[string]any)
	n, err := strconv.Atoi(fmt.Sprint(sum[key]))
	if err != nil {
		fail("publish: outcome_summary.%s missing in %v", key, pub)
	}
	return n
}

// execIn runs cmd in an explicit session and waits for it to complete with exit 0.
func (b *bench) execIn(sbx, ws, cmd string) string {
	res, _, err := b.timedCall("exec_command", sbx, map[string]any{"cmd": cmd, "workspace_session_id": ws, "yield_time_ms": 300000})
	check(err)
	if res["status"] != "ok" || fmt.Sprint(res["exit_code"]) != "0" {
		fail("exec_command %q: status %v exit_code %v output %v", cmd, res["status"], res["exit_code"], res["output"])
	}
	return fmt.Sprint(res["output"])
}

// writeCmd writes files dir/f1.txt … dir/fN.txt holding 1 … N.
func writeCmd(dir string, n int) string {
	return fmt.Sprintf("mkdir -p %s && for i in $(seq %d); do echo $i > %s/f$i.txt; done", dir, n, dir)
}

// writeHost writes the same files as writeCmd below root.
func writeHost(root, dir string, n int) error {
	d := filepath.Join(root, dir)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	for i := 1; i <= n; i++ {
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d.txt", i)), []byte(fmt.Sprintf("%d\n", i)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ---------------------------------------------------------------- 4a

func (b *bench) publishLatency(tree string, p publishParams) {
	repo := filepath.Join(b.root, "git-pubtree")
	check(gitRepo(tree, repo))
	cpDst := filepath.Join(b.root, "cp-pubtree")
	check(runCmd("", "cp", "-a", tree, cpDst))
	stage := filepath.Join(b.root, "stage")
	check(os.MkdirAll(stage, 0o755))

	type row struct {
		n                          int
		publish, git, gitFsync, cp time.Duration
		outcome                    string
	}
	var rows []row
	for _, n := range p.changed {
		sbx, _ := b.createSandbox(tree)
		var pubs, gits, gitFsyncs, cps []time.Duration
		var oc string
		for i := 0; i <= b.cfg.reps; i++ { // i == 0 is the warm-up
			dir := fmt.Sprintf("n%d-r%d", n, i) // a fresh directory per rep: always n new files
			ws, _, _ := b.createSession(sbx)
			b.execIn(sbx, ws, writeCmd(dir, n))
			pub, d, err := b.publish(sbx, ws)
			check(err)
			if c := outcome(pub, "conflict"); c != 0 {
				fail("publish of %d files: %d conflicts", n, c)
			}
			if got := outcome(pub, "unchanged_head"); got < n {
				fail("publish of %d files: unchanged_head %d in %v", n, got, pub["outcome_summary"])
			}
			oc = fmt.Sprint(pub["outcome_summary"])

			check(writeHost(repo, dir, n))
			dg, err := timed(func() error {
				if err := runGit(repo, "add", "-A"); err != nil {
					return err
				}
				return runGit(repo, "commit", "-q", "--no-gpg-sign", "-m", "x")
			})
			check(err)
			// The same with git made as durable as a publish (the layer is
			// synced before the manifest commits): by default git flushes
			// neither loose objects nor refs nor the index; batch mode is its
			// cheapest durable setting.
			check(writeHost(repo, dir+"-fsync", n))
			durable := []string{"-c", "core.fsync=all", "-c", "core.fsyncMethod=batch"}
			df, err := timed(func() error {
				if err := runGit(repo, append(durable, "add", "-A")...); err != nil {
					return err
				}
				return runGit(repo, append(durable, "commit", "-q", "--no-gpg-sign", "-m", "x")...)
			})
			check(err)

			check(writeHost(stage, dir, n))
			dc, err := timed(func() error { return runCmd("", "cp", "-a", filepath.Join(stage, dir), cpDst+"/") })
			check(err)
			check(removeAll(filepath.Join(stage, dir)))
			check(removeAll(filepath.Join(cpDst, dir)))
			if i > 0 {
				pubs, gits, gitFsyncs, cps = append(pubs, d), append(gits, dg), append(gitFsyncs, df), append(cps, dc)
			}
		}
		b.destroySandbox(sbx)
		rows = append(rows, row{n: n, publish: median(pubs), git: median(gits), gitFsync: median(gitFsyncs), cp: median(cps), outcome: oc})
	}
	check(removeAll(repo))
	check(removeAll(cpDst))

	b.printf("\n4a. publish latency vs changed files (new files in a fresh directory, written by one untimed exec_command)\n")
	tw := b.table(tabwriter.AlignRight)
	fmt.Fprintln(tw, "changed files\tpublish\tper file\tgit add -A && commit\tper file\tgit, core.fsync=all (batch)\tcp -a\tgit/publish\tdurable git/publish\tcp/publish\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", count(r.n), ms(r.publish), us(r.publish/time.Duration(r.n)),
			ms(r.git), us(r.git/time.Duration(r.n)), ms(r.gitFsync), ms(r.cp), ratio(r.git, r.publish), ratio(r.gitFsync, r.publish), ratio(r.cp, r.publish))
	}
	tw.Flush()
	b.println("a publish is durable when it answers (the layer is synced, then the manifest commits); plain git flushes nothing")
	last := rows[len(rows)-1]
	b.printf("outcome_summary at %s files: %s\n", count(last.n), last.outcome)
	b.printf("git repo and cp target hold the same %s-file tree; each rep commits/copies into a new directory\n", count(b.cfg.sizes[1]))
	for _, r := range rows {
		if r.n == 1000 {
			b.target("publish / git add -A && commit, 1k new files", ratio(r.publish, r.git), ratioValue(r.publish, r.git), "≤", 1, "×", "")
		}
	}
	var small *row
	for i := range rows {
		if rows[i].n == 100 {
			small = &rows[i]
		}
	}
	if small != nil && last.n > small.n {
		perSmall, perLast := small.publish/time.Duration(small.n), last.publish/time.Duration(last.n)
		b.target(fmt.Sprintf("publish per file, %s files / 100 files (flat)", count(last.n)), ratio(perLast, perSmall), ratioValue(perLast, perSmall), "≤", 1.5, "×", "")
	}
}

// ---------------------------------------------------------------- 4b

func (b *bench) publishParallel(tree string, p publishParams) {
	sbx, _ := b.createSandbox(tree)
	k, each := p.parallel, p.parallelEach
	// prepare creates k sessions, each with `each` new files in its own directory.
	prepare := func(tag string) []string {
		ids := make([]string, k)
		for j := range ids {
			ws, _, _ := b.createSession(sbx)
			b.execIn(sbx, ws, writeCmd(fmt.Sprintf("%s-s%d", tag, j), each))
			ids[j] = ws
		}
		return ids
	}
	var par, seq, parEach, seqEach []time.Duration
	for i := 0; i <= b.cfg.reps; i++ { // interleaved; i == 0 is the warm-up
		ids := prepare(fmt.Sprintf("par-r%d", i))
		lat := make([]time.Duration, k)
		errs := make([]error, k)
		var wg sync.WaitGroup
		t0 := time.Now()
		for j, ws := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, lat[j], errs[j] = b.publish(sbx, ws)
			}()
		}
		wg.Wait()
		dp := time.Since(t0)
		for _, err := range errs {
			check(err)
		}

		ids = prepare(fmt.Sprintf("seq-r%d", i))
		slat := make([]time.Duration, k)
		t0 = time.Now()
		for j, ws := range ids {
			_, d, err := b.publish(sbx, ws)
			check(err)
			slat[j] = d
		}
		ds := time.Since(t0)
		if i > 0 {
			par, seq = append(par, dp), append(seq, ds)
			parEach, seqEach = append(parEach, lat...), append(seqEach, slat...)
		}
	}
	b.destroySandbox(sbx)

	b.printf("\n4b. %d sessions publishing disjoint changes (%d new files each, own directory), all created before the first publish\n", k, each)
	tw := b.table(tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\twall time, all publishes\tmedian single publish\tsequential/this\t")
	fmt.Fprintf(tw, "%d sequential\t%s\t%s\t%s\t\n", k, ms(median(seq)), ms(median(seqEach)), ratio(median(seq), median(seq)))
	fmt.Fprintf(tw, "%d in parallel\t%s\t%s\t%s\t\n", k, ms(median(par)), ms(median(parEach)), ratio(median(seq), median(par)))
	tw.Flush()
	b.printf("parallel speedup: %s on %d CPUs (the commit step holds the exclusive writer lock, so < %d× is expected)\n",
		ratio(median(seq), median(par)), runtime.NumCPU(), k)
}

// ---------------------------------------------------------------- 4c

func (b *bench) publishMerge(p publishParams) {
	L := p.mergeLines
	proj := filepath.Join(b.root, "mergetree")
	check(os.MkdirAll(proj, 0o755))
	var sb strings.Builder
	for i := 1; i <= L; i++ {
		fmt.Fprintf(&sb, "line %06d of the base file, long enough to look like code\n", i)
	}
	check(os.WriteFile(filepath.Join(proj, "big.txt"), []byte(sb.String()), 0o644))
	sbx, _ := b.createSandbox(proj)

	// The host keeps the head's content; every version is produced by the
	// same sed command on both sides, so git merge-file sees the same bytes.
	host := filepath.Join(b.root, "merge-host")
	check(os.MkdirAll(host, 0o755))
	headF := filepath.Join(host, "head.txt")
	check(os.WriteFile(headF, []byte(sb.String()), 0o644))
	sed := func(who string, from, rep int) string {
		return fmt.Sprintf("sed -i '%d,%ds/.*/edited by %s in rep %d/' big.txt", from, from+2, who, rep)
	}
	sedHost := func(cmd, file string) {
		check(runCmd(host, "bash", "-c", strings.Replace(cmd, "big.txt", file, 1)))
	}
	top, bottom := 5, L-7

	var merged, plain, gitm []time.Duration
	for i := 0; i <= b.cfg.reps; i++ { // i == 0 is the warm-up
		wsA, _, _ := b.createSession(sbx)
		wsB, _, _ := b.createSession(sbx)
		cmdA, cmdB, cmdC := sed("A", top, i), sed("B", bottom, i), sed("C", bottom, i)
		b.execIn(sbx, wsA, cmdA)
		b.execIn(sbx, wsB, cmdB)
		pub, _, err := b.publish(sbx, wsA)
		check(err)
		if outcome(pub, "unchanged_head") != 1 {
			fail("publish A: outcome_summary %v", pub["outcome_summary"])
		}
		pub, dm, err := b.publish(sbx, wsB) // head moved since B was created: 3-way merge
		check(err)
		if outcome(pub, "merged") != 1 {
			fail("publish B: expected one merged path, outcome_summary %v", pub["outcome_summary"])
		}

		wsC, _, _ := b.createSession(sbx) // same edit, head unchanged since C was created
		b.execIn(sbx, wsC, cmdC)
		pub, dp, err := b.publish(sbx, wsC)
		check(err)
		if outcome(pub, "unchanged_head") != 1 || outcome(pub, "merged") != 0 {
			fail("publish C: outcome_summary %v", pub["outcome_summary"])
		}

		// git merge-file current(=head after A) base other(=B's version), in place.
		for _, f := range []string{"base.txt", "ours.txt", "theirs.txt"} {
			check(runCmd("", "cp", headF, filepath.Join(host, f)))
		}
		sedHost(cmdA, "ours.txt")
		sedHost(cmdB, "theirs.txt")
		dg, err := timed(func() error {
			return runCmd(host, "git", "merge-file", "ours.txt", "base.txt", "theirs.txt")
		})
		check(err)
		check(os.Rename(filepath.Join(host, "ours.txt"), headF))
		sedHost(cmdC, "head.txt")
		if i > 0 {
			merged, plain, gitm = append(merged, dm), append(plain, dp), append(gitm, dg)
		}
	}
	// The sandbox head and the host's replay must agree byte for byte.
	ws, _, _ := b.createSession(sbx)
	out := b.execIn(sbx, ws, "sha256sum big.txt")
	b.destroySession(sbx, ws)
	sum, err := runOut("sha256sum", headF)
	check(err)
	if h := strings.Fields(string(sum))[0]; !strings.Contains(out, h) {
		fail("head big.txt differs from the git merge-file replay: sandbox %s, host %s", out, h)
	}
	b.destroySandbox(sbx)

	b.printf("\n4c. publish of an edit near the bottom of a %s-line file (%d lines edited near the top and published meanwhile)\n", count(L), 3)
	tw := b.table(tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tmedian\tmin\tmax\tthis/merging publish\t")
	for _, r := range []struct {
		name string
		ds   []time.Duration
	}{
		{"publish, head moved: 3-way merge", merged},
		{"publish, same edit, head unchanged: no merge", plain},
		{"git merge-file of the same three versions", gitm},
	} {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", r.name, ms(median(r.ds)), ms(slices.Min(r.ds)), ms(slices.Max(r.ds)), ratio(median(r.ds), median(merged)))
	}
	tw.Flush()
	b.printf("merge overhead of a publish (merging − non-merging median): %s; merged head verified against the git merge-file replay\n",
		ms(median(merged)-median(plain)))
}

func us(d time.Duration) string {
	v := float64(d) / float64(time.Microsecond)
	if v >= 100 {
		return fmt.Sprintf("%.0f µs", v)
	}
	return fmt.Sprintf("%.1f µs", v)
}
