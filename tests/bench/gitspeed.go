package main

// Part 12 times git inside real sessions against git on the host, in the
// same run, over one 20,000-file repository (2,000 with -quick): a fresh
// session's first `git status` (it only stats when the head's index
// carries the stat data a session sees), `git status` warm, and
// `git diff --stat` after editing 10 files. The timings are taken inside
// the session by bash itself ($EPOCHREALTIME around each git run), so the
// exec round trip is not part of them; the host runs the same script.

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// gitSpeedScript prints "FIRST real user sys", reps × "STATUS …", then
// edits 10 files and prints reps × "DIFF …" (bash's own time keyword:
// seconds of wall clock and of git's CPU).
func gitSpeedScript(dir string, files, reps int) string {
	var edits []string
	for i := 0; i < 10; i++ {
		n := i * files / 10
		edits = append(edits, fmt.Sprintf("p%04d/f%d.go", n/10, n))
	}
	return fmt.Sprintf(`cd %s || exit 1
t() { local TIMEFORMAT="$1 %%3R %%3U %%3S"; time "${@:2}" >/dev/null; }
exec 2>&1
t FIRST git status --porcelain
for i in $(seq %d); do t STATUS git status --porcelain; done
for f in %s; do echo '// edited' >> "$f"; done
git diff --stat >/dev/null
for i in $(seq %d); do t DIFF git diff --stat; done
`, dir, reps, strings.Join(edits, " "), reps)
}

// gitTiming is one timed git run.
type gitTiming struct{ wall, cpu time.Duration }

// parseGitSpeed returns the timings per label.
func parseGitSpeed(out string) (map[string][]gitTiming, error) {
	res := map[string][]gitTiming{}
	for _, l := range strings.Split(strings.ReplaceAll(out, "\r", ""), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 {
			continue
		}
		var v [3]float64
		ok := true
		for i := range v {
			x, err := strconv.ParseFloat(f[i+1], 64)
			ok = ok && err == nil
			v[i] = x
		}
		if !ok {
			continue
		}
		sec := func(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
		res[f[0]] = append(res[f[0]], gitTiming{wall: sec(v[0]), cpu: sec(v[1] + v[2])})
	}
	if len(res["FIRST"]) != 1 || len(res["STATUS"]) == 0 || len(res["DIFF"]) == 0 {
		return nil, fmt.Errorf("git timing output: %q", oneLine(out))
	}
	return res, nil
}

func (b *bench) gitSpeed() {
	files := 20000
	if b.cfg.quick {
		files = 2000
	}
	repo := filepath.Join(b.root, "git-speed")
	check(genRepo(repo, files))
	drivers := []string{"kernel", "fuse"}
	type sess struct{ sbx, ws string }
	sessions := map[string]sess{}
	for _, d := range drivers {
		res, _, err := b.timedCall("create_sandbox", "", map[string]any{"workspace_root": repo, "overlay": d})
		check(err)
		sbx, _ := res["id"].(string)
		ws, drv, _ := b.createSession(sbx)
		if drv != d {
			fail("session overlay_driver %q, want %q", drv, d)
		}
		sessions[d] = sess{sbx, ws}
	}
	results := map[string]map[string][]gitTiming{}
	// The host runs the script last edits in its own copy: the sandboxes
	// were snapshotted before.
	hostOut, err := runOut("bash", "-c", gitSpeedScript(repo, files, b.cfg.reps))
	check(err)
	results["host"], err = parseGitSpeed(string(hostOut))
	check(err)
	for _, d := range drivers {
		s := sessions[d]
		out := b.execIn(s.sbx, s.ws, gitSpeedScript("/workspace", files, b.cfg.reps))
		results[d], err = parseGitSpeed(out)
		check(err)
	}
	for _, d := range drivers {
		b.call("destroy_sandbox", "", map[string]any{"sandbox_id": sessions[d].sbx})
	}
	med := func(col, label string) time.Duration {
		var ds []time.Duration
		for _, x := range results[col][label] {
			ds = append(ds, x.wall)
		}
		return median(ds)
	}
	cpu := func(col, label string) time.Duration {
		var ds []time.Duration
		for _, x := range results[col][label] {
			ds = append(ds, x.cpu)
		}
		return median(ds)
	}
	tw := b.table(0)
	fmt.Fprintf(tw, "%s-file repo\thost\tkernel session\tfuse session\tkernel / host\tfuse / host\thost cpu\tkernel cpu\tfuse cpu\t\n", count(files))
	for _, row := range []struct{ name, label string }{
		{"git status, first in a fresh session", "FIRST"},
		{"git status warm", "STATUS"},
		{"git diff --stat, 10 files edited", "DIFF"},
	} {
		h, k, f := med("host", row.label), med("kernel", row.label), med("fuse", row.label)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", row.name, ms(h), ms(k), ms(f), ratio(k, h), ratio(f, h),
			ms(cpu("host", row.label)), ms(cpu("kernel", row.label)), ms(cpu("fuse", row.label)))
	}
	tw.Flush()
	b.println("timed by bash's time keyword around each git run, inside each session and on the host, same script; \"first\" is one run,")
	b.println("the others medians; cpu is git's own user+sys (the FUSE server's work is not in it, the kernel overlay's is)")
	limits := map[string]float64{"kernel": 1.5, "fuse": 3}
	for _, label := range []struct{ name, label string }{{"git status warm", "STATUS"}, {"git diff --stat", "DIFF"}} {
		for _, d := range drivers {
			h, v := med("host", label.label), med(d, label.label)
			if h <= 0 || v <= 0 {
				b.target(d+" / host, "+label.name, "n/a", math.NaN(), "≤", limits[d], "×", "not measured")
				continue
			}
			b.target(d+" / host, "+label.name, ratio(v, h), ratioValue(v, h), "≤", limits[d], "×", "")
		}
	}
	_ = os.RemoveAll(repo)
}
