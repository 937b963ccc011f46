package fuseoverlay

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func (f *fixture) flushRecords() []Record {
	f.srv.Flush()
	f.mu.Lock()
	defer f.mu.Unlock()
	out := append([]Record(nil), f.records...)
	f.records = nil
	return out
}

func fmtRecords(rs []Record) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "  %s %s %s->%s off=%d len=%d\n", r.Command, r.Op, r.Path, r.NewPath, r.Offset, r.Length)
	}
	return b.String()
}

func hasRecord(rs []Record, cmd, op, path string) bool {
	for _, r := range rs {
		if r.Command == cmd && r.Op == op && r.Path == path {
			return true
		}
	}
	return false
}

// sh runs a shell command line in the mount and returns its owner name.
func (f *fixture) sh(script string) string {
	f.t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = f.mnt
	out, err := cmd.CombinedOutput()
	if err != nil {
		f.t.Fatalf("sh %q: %v %s", script, err, out)
	}
	return fmt.Sprintf("pid%d", cmd.Process.Pid)
}

func TestProvenanceOwners(t *testing.T) {
	f := mountLayers(t, []tree{{"lower.txt": "0123456789"}}, nil, withSink())
	a := f.sh("echo one > new.txt")
	b := f.sh("echo two >> new.txt")
	c := f.sh("echo x >> lower.txt")
	d := f.sh("mkdir dd && ln -s x dd/s && chmod 600 new.txt && mv new.txt dd/n && rm lower.txt && rmdir dd/../dd 2>/dev/null; true")
	rs := f.flushRecords()
	want := []struct{ cmd, op, path string }{
		{a, "create", "new.txt"},
		{a, "write", "new.txt"},
		{b, "write", "new.txt"},
		{c, "write", "lower.txt"},
		{d, "mkdir", "dd"},
		{d, "symlink", "dd/s"},
		{d, "chmod", "new.txt"},
		{d, "rename", "new.txt"},
		{d, "unlink", "lower.txt"},
	}
	_ = d
	for _, w := range want {
		if w.op == "mkdir" || w.op == "symlink" || w.op == "chmod" || w.op == "rename" || w.op == "unlink" {
			// These run in children of the shell (mkdir, ln, ...): any
			// owner, but the operation must be there.
			found := false
			for _, r := range rs {
				if r.Op == w.op && r.Path == w.path {
					found = true
				}
			}
			if !found {
				t.Errorf("no %s %s record in\n%s", w.op, w.path, fmtRecords(rs))
			}
			continue
		}
		if !hasRecord(rs, w.cmd, w.op, w.path) {
			t.Errorf("no %s %s by %s in\n%s", w.op, w.path, w.cmd, fmtRecords(rs))
		}
	}
	for _, r := range rs {
		if r.Op == "write" && r.Path == "lower.txt" && (r.Offset != 10 || r.Length != 2) {
			t.Errorf("append range: %+v", r)
		}
	}
	f.mu.Lock()
	rels := strings.Join(f.rels, " ")
	f.mu.Unlock()
	if !strings.Contains(rels, "new.txt@"+a) || !strings.Contains(rels, "new.txt@"+b) {
		t.Errorf("Released calls: %s", rels)
	}
}

// TestProvenanceMmap: a shared-mmap write reaches the server with pid 0;
// it must be attributed to the handle's opener.
func TestProvenanceMmap(t *testing.T) {
	var calls []string
	f := mountLayers(t, []tree{{"m.bin": strings.Repeat("a", 8192)}}, nil, withSink(), func(o *Options, f *fixture) {
		o.Owner = func(pid uint32) string {
			c := fmt.Sprintf("opener-%d", pid)
			f.mu.Lock()
			calls = append(calls, c)
			f.mu.Unlock()
			return c
		}
	})
	fh, err := os.OpenFile(f.p("m.bin"), os.O_RDWR, 0)
	must(t, err)
	f.mu.Lock()
	if len(calls) != 1 {
		t.Fatalf("Owner calls at open: %v", calls)
	}
	opener := calls[0]
	f.mu.Unlock()
	m, err := unix.Mmap(int(fh.Fd()), 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	must(t, err)
	copy(m[4096:], "mmap-write")
	must(t, unix.Msync(m, unix.MS_SYNC))
	must(t, unix.Munmap(m))
	must(t, fh.Close())
	if got := f.read("m.bin")[4096:4106]; got != "mmap-write" {
		t.Errorf("content after mmap write: %q", got)
	}
	rs := f.flushRecords()
	var writes []Record
	for _, r := range rs {
		if r.Op == "write" && r.Path == "m.bin" {
			writes = append(writes, r)
		}
	}
	if len(writes) == 0 {
		t.Fatalf("no write record:\n%s", fmtRecords(rs))
	}
	for _, w := range writes {
		if w.Command != opener {
			t.Errorf("mmap write attributed to %q, want the opener %q", w.Command, opener)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(calls) != 1 {
		t.Errorf("Owner was called per write: %v", calls)
	}
}

// TestProvenanceRenameOver: an editor-style save (write temp, rename over).
func TestProvenanceRenameOver(t *testing.T) {
	f := mountLayers(t, []tree{{"doc.txt": "old\n"}}, nil, withSink())
	s := f.sh("printf 'new\\n' > .doc.tmp && mv -f .doc.tmp doc.txt")
	if got := f.read("doc.txt"); got != "new\n" {
		t.Errorf("content %q", got)
	}
	rs := f.flushRecords()
	if !hasRecord(rs, s, "create", ".doc.tmp") || !hasRecord(rs, s, "write", ".doc.tmp") {
		t.Errorf("temp file records missing:\n%s", fmtRecords(rs))
	}
	found := false
	for _, r := range rs {
		if r.Op == "rename" && r.Path == ".doc.tmp" && r.NewPath == "doc.txt" {
			found = true
		}
	}
	if !found {
		t.Errorf("no rename record:\n%s", fmtRecords(rs))
	}
}

// TestNoSink: without a sink nothing is recorded and Flush is harmless.
func TestNoSink(t *testing.T) {
	f := mountLayers(t, nil, nil)
	f.write("x", "y")
	f.srv.Flush()
}

// TestProvenanceFlushPoints: records reach the sink at fsync and on the
// coalescing timer, without Flush; contiguous writes through one handle
// coalesce into one range.
func TestProvenanceFlushPoints(t *testing.T) {
	f := mountLayers(t, nil, nil, withSink(), func(o *Options, _ *fixture) { o.CoalesceInterval = 20 * time.Millisecond })
	fh, err := os.Create(f.p("x"))
	must(t, err)
	defer fh.Close()
	for i := 0; i < 4; i++ {
		_, err := fh.Write([]byte("0123456789"))
		must(t, err)
	}
	must(t, fh.Sync())
	f.mu.Lock()
	got := append([]Record(nil), f.records...)
	f.mu.Unlock()
	var writes []Record
	for _, r := range got {
		if r.Op == "write" {
			writes = append(writes, r)
		}
	}
	if len(writes) != 1 || writes[0].Offset != 0 || writes[0].Length != 40 {
		t.Errorf("after fsync, want one write 0+40:\n%s", fmtRecords(got))
	}
	// The timer: a write without fsync arrives on its own.
	_, err = fh.WriteAt([]byte("abc"), 100)
	must(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		n := len(f.records)
		f.mu.Unlock()
		if n > len(got) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("timer flush never came")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
