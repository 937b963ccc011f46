package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Part 7 builds a real Go module inside a session, once per overlay driver
// (kernel, fuse), with GOCACHE cleared before every build. GOCACHE lives in
// the workspace, so the build's reads (sources, the toolchain's standard
// library) and its cache writes both go through the session's overlay; the
// standard library comes from the host root and is the same for both.
// The time is measured inside the session (date before and after), so the
// command round trip is not part of it.

const gobuildScript = `export GOCACHE=/workspace/.gocache GOPATH=/tmp/gopath GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0
rm -rf "$GOCACHE" /tmp/benchbin
s=$(date +%s%N)
go build -o /tmp/benchbin/ ./... || exit 1
e=$(date +%s%N)
/tmp/benchbin/benchmod >/dev/null || exit 1
echo "elapsed_ns=$((e-s))"`

func (b *bench) goBuild() {
	mod := filepath.Join(b.root, "gomod")
	check(genModule(mod, 6, 8))
	reps := min(b.cfg.reps, 3)
	type row struct {
		driver, na string
		ds         []time.Duration
	}
	var rows []*row
	for _, driver := range []string{"kernel", "fuse"} {
		r := &row{driver: driver}
		rows = append(rows, r)
		res, _, err := b.timedCall("create_sandbox", "", map[string]any{"workspace_root": mod, "overlay": driver})
		if err != nil {
			r.na = "unavailable: " + oneLine(err.Error())
			continue
		}
		sbx, _ := res["id"].(string)
		for i := 0; i <= reps; i++ { // i == 0 is the warm-up (host page cache, holder)
			ws, drv, _ := b.createSession(sbx)
			if drv != driver {
				fail("session overlay_driver %q, want %q", drv, driver)
			}
			out := b.call("exec_command", sbx, map[string]any{"cmd": gobuildScript, "workspace_session_id": ws, "yield_time_ms": 300000})
			if err := execOK(out); err != nil {
				fail("go build in a %s session: %v", driver, err)
			}
			text, _ := out["output"].(string)
			_, v, ok := strings.Cut(text, "elapsed_ns=")
			ns, perr := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if !ok || perr != nil {
				fail("go build in a %s session: no elapsed time in %q", driver, oneLine(text))
			}
			b.destroySession(sbx, ws)
			if i > 0 {
				r.ds = append(r.ds, time.Duration(ns))
			}
		}
		b.destroySandbox(sbx)
	}
	tw := b.table(tabwriter.AlignRight)
	fmt.Fprintf(tw, "driver\tgo build ./... (GOCACHE cleared, median of %d)\t\n", reps)
	for _, r := range rows {
		if r.na != "" {
			fmt.Fprintf(tw, "%s\tn/a\t\n", r.driver)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t\n", r.driver, ms(median(r.ds)))
	}
	tw.Flush()
	for _, r := range rows {
		if r.na != "" {
			b.printf("%s: %s\n", r.driver, r.na)
		}
	}
	if rows[0].na == "" && rows[1].na == "" {
		f, k := median(rows[1].ds), median(rows[0].ds)
		b.target("go build, fuse / kernel", ratio(f, k), ratioValue(f, k), "≤", 1.3, "×", "")
	} else {
		b.target("go build, fuse / kernel", "n/a", math.NaN(), "≤", 1.3, "×", "not measured")
	}
}

// genModule writes a module with pkgs packages of files files each, and a
// main package that uses them all (plus fmt, sort, strings, encoding/json).
func genModule(dir string, pkgs, files int) error {
	write := func(p, s string) error {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, []byte(s), 0o644)
	}
	if err := write(filepath.Join(dir, "go.mod"), "module benchmod\n\ngo 1.22\n"); err != nil {
		return err
	}
	var imports, calls strings.Builder
	for p := 0; p < pkgs; p++ {
		name := fmt.Sprintf("pkg%d", p)
		fmt.Fprintf(&imports, "\t\"benchmod/%s\"\n", name)
		fmt.Fprintf(&calls, "\ttotal += %s.Sum0(items)\n", name)
		for f := 0; f < files; f++ {
			var src strings.Builder
			fmt.Fprintf(&src, "package %s\n\nimport (\n\t\"sort\"\n\t\"strings\"\n)\n\n", name)
			fmt.Fprintf(&src, "// Item%d is a record.\ntype Item%d struct {\n\tName string\n\tTags []string\n\tN int\n}\n\n", f, f)
			fmt.Fprintf(&src, "// Sum%d sorts and joins names and sums their lengths.\nfunc Sum%d(names []string) int {\n", f, f)
			src.WriteString("\ts := append([]string(nil), names...)\n\tsort.Strings(s)\n\tt := 0\n\tfor _, n := range s {\n\t\tt += len(strings.ToUpper(n))\n\t}\n\treturn t\n}\n")
			if err := write(filepath.Join(dir, name, fmt.Sprintf("f%d.go", f)), src.String()); err != nil {
				return err
			}
		}
	}
	main := "package main\n\nimport (\n\t\"encoding/json\"\n\t\"fmt\"\n\t\"os\"\n\n" + imports.String() + ")\n\nfunc main() {\n\titems := []string{\"b\", \"a\", \"c\"}\n\ttotal := 0\n" +
		calls.String() + "\tjson.NewEncoder(os.Stdout).Encode(map[string]int{\"total\": total})\n\tfmt.Println(total)\n}\n"
	return write(filepath.Join(dir, "cmd", "benchmod", "main.go"), main)
}
