package fuseoverlay

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPerfReport measures this driver against the kernel overlay on the
// same trees and logs the ratios (no timing assertions). It runs only with
// FUSEOVERLAY_PERF=1: it builds ~27,000 files and takes about a minute.
//
//	FUSEOVERLAY_PERF=1 go test -run PerfReport -v ./fuseoverlay
func TestPerfReport(t *testing.T) {
	if os.Getenv("FUSEOVERLAY_PERF") != "1" {
		t.Skip("set FUSEOVERLAY_PERF=1 to measure")
	}
	requireNS(t)
	base := t.TempDir()
	lower := filepath.Join(base, "lower")
	must(t, os.Mkdir(lower, 0o755))
	content := strings.Repeat("x", 4096)
	for i := 0; i < 2000; i++ {
		p := filepath.Join(lower, "small", fmt.Sprintf("d%02d", i%20), fmt.Sprintf("f%04d", i))
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(content), 0o644))
	}
	for i := 0; i < 20000; i++ {
		p := filepath.Join(lower, "many", fmt.Sprintf("d%03d", i%200), fmt.Sprintf("f%05d", i))
		if i < 200 {
			must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		}
		must(t, os.WriteFile(p, []byte("0123456789"), 0o644))
	}
	repo := filepath.Join(lower, "repo")
	line := strings.Repeat("// some go code line\n", 60)
	for i := 0; i < 5000; i++ {
		p := filepath.Join(repo, fmt.Sprintf("p%03d", i%500), fmt.Sprintf("f%04d.go", i))
		if i < 500 {
			must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		}
		must(t, os.WriteFile(p, []byte(line), 0o644))
	}
	git := func(dir string, args ...string) {
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t", "HOME="+base)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	git(repo, "init", "-q")
	git(repo, "add", "-A")
	git(repo, "commit", "-qm", "x")

	type mountFn func(t *testing.T) (mnt string, done func())
	kernel := func(t *testing.T) (string, func()) {
		d := t.TempDir()
		u, w, m := filepath.Join(d, "u"), filepath.Join(d, "w"), filepath.Join(d, "m")
		for _, x := range []string{u, w, m} {
			must(t, os.Mkdir(x, 0o755))
		}
		if err := unix.Mount("overlay", m, "overlay", 0, "lowerdir="+lower+",upperdir="+u+",workdir="+w+",userxattr"); err != nil {
			t.Skipf("kernel overlay: %v", err)
		}
		return m, func() { unix.Unmount(m, 0) }
	}
	fuseMount := func(sink bool) mountFn {
		return func(t *testing.T) (string, func()) {
			d := t.TempDir()
			u, m := filepath.Join(d, "u"), filepath.Join(d, "m")
			must(t, os.Mkdir(u, 0o755))
			must(t, os.Mkdir(m, 0o755))
			lf, err := os.Open(lower)
			must(t, err)
			uf, err := os.Open(u)
			must(t, err)
			o := Options{Lowers: []*os.File{lf}, Upper: uf}
			var n int
			if sink {
				o.Sink = func(rs []Record) { n += len(rs) }
				o.Owner = func(pid uint32) string { return "cmd" }
			}
			srv, err := Mount(t.Context(), m, o)
			must(t, err)
			return m, func() { srv.Unmount(); lf.Close(); uf.Close() }
		}
	}
	readAll := func(root string) {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			must(t, err)
			if d.Type().IsRegular() {
				_, err := os.ReadFile(p)
				must(t, err)
			}
			return nil
		})
	}
	statAll := func(root string) {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			must(t, err)
			var st unix.Stat_t
			must(t, unix.Lstat(p, &st))
			return nil
		})
	}
	write200 := func(mnt string) {
		f, err := os.Create(filepath.Join(mnt, "big"))
		must(t, err)
		buf := make([]byte, 1<<20)
		for i := 0; i < 200; i++ {
			_, err := f.Write(buf)
			must(t, err)
		}
		must(t, f.Close())
		must(t, os.Remove(filepath.Join(mnt, "big")))
	}
	gitStatus := func(mnt string) {
		cmd := exec.Command("git", "-C", filepath.Join(mnt, "repo"), "status", "--porcelain")
		cmd.Env = append(os.Environ(), "HOME="+base)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git status: %v %s", err, out)
		}
	}
	best := func(reps int, fn func()) time.Duration {
		var b time.Duration
		for i := 0; i < reps; i++ {
			s := time.Now()
			fn()
			if d := time.Since(s); b == 0 || d < b {
				b = d
			}
		}
		return b
	}
	type res struct{ readCold, readWarm, stat, gitWarm, write time.Duration }
	measure := func(name string, mf mountFn) res {
		mnt, done := mf(t)
		defer done()
		var r res
		s := time.Now()
		readAll(filepath.Join(mnt, "small"))
		r.readCold = time.Since(s)
		r.readWarm = best(5, func() { readAll(filepath.Join(mnt, "small")) })
		statAll(filepath.Join(mnt, "many"))
		r.stat = best(3, func() { statAll(filepath.Join(mnt, "many")) })
		gitStatus(mnt)
		r.gitWarm = best(3, func() { gitStatus(mnt) })
		r.write = best(3, func() { write200(mnt) })
		t.Logf("%-12s read2000 first %v warm %v | stat20000 warm %v | git status warm %v | write200MB %v (%.0f MB/s)",
			name, r.readCold, r.readWarm, r.stat, r.gitWarm, r.write, 200/r.write.Seconds())
		return r
	}
	k := measure("kernel", kernel)
	f := measure("fuse", fuseMount(false))
	fs := measure("fuse+sink", fuseMount(true))
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	t.Logf("fuse/kernel: read warm %.2fx, stat warm %.2fx, git status warm %.2fx, write %.2fx",
		ratio(f.readWarm, k.readWarm), ratio(f.stat, k.stat), ratio(f.gitWarm, k.gitWarm), ratio(f.write, k.write))
	t.Logf("recording cost on 200 MB write: %.1f%% (%v without sink, %v with)",
		100*(ratio(fs.write, f.write)-1), f.write, fs.write)
}

// TestWriteRecordingCost writes 200 MB through two mounts of the same
// layers, one recording into a sink and one not, alternating rounds so
// machine noise hits both alike, and logs the median times (no
// assertions). FUSEOVERLAY_PERF=1 enables it.
func TestWriteRecordingCost(t *testing.T) {
	if os.Getenv("FUSEOVERLAY_PERF") != "1" {
		t.Skip("set FUSEOVERLAY_PERF=1 to measure")
	}
	plain := mountLayers(t, []tree{{}}, nil)
	rec := mountLayers(t, []tree{{}}, nil, withSink())
	buf := make([]byte, 1<<20)
	write := func(f *fixture) time.Duration {
		s := time.Now()
		fh, err := os.Create(f.p("big"))
		must(t, err)
		for i := 0; i < 200; i++ {
			_, err := fh.Write(buf)
			must(t, err)
		}
		must(t, fh.Close())
		d := time.Since(s)
		must(t, os.Remove(f.p("big")))
		return d
	}
	var dp, dr []time.Duration
	for i := 0; i < 10; i++ {
		// Alternate which goes first: the first of a pair pays for the
		// writeback of the previous round's pages.
		if i%2 == 0 {
			dp = append(dp, write(plain))
			dr = append(dr, write(rec))
		} else {
			dr = append(dr, write(rec))
			dp = append(dp, write(plain))
		}
	}
	med := func(d []time.Duration) time.Duration {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	mp, mr := med(dp), med(dr)
	recs := rec.flushRecords()
	t.Logf("200 MB write, median of 10: without sink %v (%.0f MB/s), with sink %v (%.0f MB/s): %+.1f%%; %d records for the last round",
		mp, 200/mp.Seconds(), mr, 200/mr.Seconds(), 100*(float64(mr)/float64(mp)-1), len(recs))
}
