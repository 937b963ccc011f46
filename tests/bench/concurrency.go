package main

// Part 8: concurrency. k sessions of one sandbox issue no-op commands at
// once (throughput and latency percentiles), and 4 KiB file_read/file_write
// latencies in a session through the socket and through the CLI.

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

func (b *bench) concurrency() {
	const k = 8
	per := b.cfg.reps * 4
	proj := filepath.Join(b.root, "conc")
	check(generateTree(proj, 100))
	sbx, _ := b.createSandbox(proj)
	ids := make([]string, k)
	for i := range ids {
		ids[i], _, _ = b.createSession(sbx)
		b.execIn(sbx, ids[i], "true") // warm-up
	}
	lat := make([][]time.Duration, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, ws := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				res, d, err := b.timedCall("exec_command", sbx, map[string]any{"cmd": "true", "workspace_session_id": ws})
				if err == nil {
					err = execOK(res)
				}
				if err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], d)
			}
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	for _, err := range errs {
		check(err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	ops := float64(len(all)) / wall.Seconds()

	// 4 KiB file operations in one session, socket and CLI interleaved.
	ws := ids[0]
	content := strings.Repeat("0123456789abcde\n", 256) // 4 KiB
	rt := filepath.Join(b.cfg.bin, "sandbox-runtime-cli")
	type method struct {
		name string
		run  func() (time.Duration, error)
		ds   []time.Duration
	}
	cliJSON := func(args ...string) error {
		out, err := runOut(rt, append([]string{"--sandbox-id", sbx}, args...)...)
		if err != nil {
			return err
		}
		var res map[string]any
		if err := json.Unmarshal(out, &res); err != nil {
			return fmt.Errorf("sandbox-runtime-cli output %q: %v", out, err)
		}
		return nil
	}
	methods := []*method{
		{name: "file_write 4 KiB, socket", run: func() (time.Duration, error) {
			_, d, err := b.timedCall("file_write", sbx, map[string]any{"workspace_session_id": ws, "path": "f4k.txt", "content": content})
			return d, err
		}},
		{name: "file_read 4 KiB, socket", run: func() (time.Duration, error) {
			_, d, err := b.timedCall("file_read", sbx, map[string]any{"workspace_session_id": ws, "path": "f4k.txt"})
			return d, err
		}},
		{name: "file_write 4 KiB, sandbox-runtime-cli", run: func() (time.Duration, error) {
			return timed(func() error {
				return cliJSON("file_write", "--workspace-session-id", ws, "--path", "f4k.txt", "--content", content)
			})
		}},
		{name: "file_read 4 KiB, sandbox-runtime-cli", run: func() (time.Duration, error) {
			return timed(func() error { return cliJSON("file_read", "--workspace-session-id", ws, "--path", "f4k.txt") })
		}},
	}
	for i := 0; i <= per; i++ { // i == 0 is the warm-up
		for _, m := range methods {
			d, err := m.run()
			check(err)
			if i > 0 {
				m.ds = append(m.ds, d)
			}
		}
	}
	for _, ws := range ids {
		b.destroySession(sbx, ws)
	}
	b.destroySandbox(sbx)

	tw := b.table(tabwriter.AlignRight)
	fmt.Fprintln(tw, "sessions\tcommands\twall time\tthroughput (ops/s)\tmedian\tp95\tmax\t")
	fmt.Fprintf(tw, "%d\t%d\t%s\t%.1f\t%s\t%s\t%s\t\n", k, len(all), ms(wall), ops, ms(all[len(all)/2]), ms(percentile(all, 0.95)), ms(all[len(all)-1]))
	tw.Flush()
	b.printf("%d sessions each run %d no-op exec_command (true) through the socket at once; the reference reports 31.9 ops/s at concurrency 5\n", k, per)
	tw = b.table(0)
	fmt.Fprintf(tw, "4 KiB file operation (median of %d)\tmedian\tmin\tmax\t\n", per)
	for _, m := range methods {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", m.name, ms(median(m.ds)), ms(slices.Min(m.ds)), ms(slices.Max(m.ds)))
	}
	tw.Flush()
	b.println("the reference reports 12.1 ms for a 4 KiB file_read and 19.0 ms for a file_write")
	// #18 target 4 asks for these figures; the reference implementation's
	// are the bar they are held to.
	b.target(fmt.Sprintf("%d sessions at once: no-op exec_command throughput (reference 31.9 ops/s at 5)", k),
		fmt.Sprintf("%.1f ops/s", ops), ops, "≥", 31.9, " ops/s", "")
	b.target(fmt.Sprintf("%d sessions at once: no-op exec_command p95", k), ms(percentile(all, 0.95)),
		float64(percentile(all, 0.95))/1e6, "<", math.Round(1000/31.9*float64(k)), " ms", "the latency the reference's throughput implies at this concurrency")
	refs := map[string]float64{"file_write 4 KiB, socket": 19.0, "file_read 4 KiB, socket": 12.1,
		"file_write 4 KiB, sandbox-runtime-cli": 19.0, "file_read 4 KiB, sandbox-runtime-cli": 12.1}
	for _, m := range methods {
		d := median(m.ds)
		b.target(m.name+" (reference)", ms(d), float64(d)/1e6, "<", refs[m.name], " ms", "")
	}
}

// percentile of sorted ds (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
