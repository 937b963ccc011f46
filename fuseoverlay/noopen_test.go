package fuseoverlay

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOpenFileOutlivesItsName: files are opened without OPEN, so the
// server has no handle of its own; a file unlinked or renamed over while a
// process has it open must stay readable and writable through that
// descriptor, as on a native filesystem, for lower and upper files alike.
func TestOpenFileOutlivesItsName(t *testing.T) {
	f := mountLayers(t, []tree{{"low": "lower data\n", "low2": "lower two\n"}}, tree{"up": "upper data\n"})
	f.write("over", "replacement\n")
	cases := []struct {
		name, path string
		remove     func()
		want       string
	}{
		{"lower unlinked", "low", func() { must(t, os.Remove(f.p("low"))) }, "lower data\n"},
		{"upper unlinked", "up", func() { must(t, os.Remove(f.p("up"))) }, "upper data\n"},
		{"lower renamed over", "low2", func() { must(t, os.Rename(f.p("over"), f.p("low2"))) }, "lower two\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fh, err := os.OpenFile(f.p(c.path), os.O_RDWR, 0)
			must(t, err)
			defer fh.Close()
			c.remove()
			var st unix.Stat_t
			must(t, unix.Fstat(int(fh.Fd()), &st))
			if st.Nlink != 0 {
				t.Errorf("nlink after the name went: %d", st.Nlink)
			}
			if _, err := fh.WriteAt([]byte("more\n"), int64(len(c.want))); err != nil {
				t.Fatalf("write after the name went: %v", err)
			}
			buf := make([]byte, 100)
			n, _ := fh.ReadAt(buf, 0)
			if got := string(buf[:n]); got != c.want+"more\n" {
				t.Errorf("content through the descriptor: %q", got)
			}
			must(t, fh.Truncate(3))
			must(t, unix.Fstat(int(fh.Fd()), &st))
			if st.Size != 3 {
				t.Errorf("size after ftruncate: %d", st.Size)
			}
		})
	}
	if got := f.read("low2"); got != "replacement\n" {
		t.Errorf("low2 after the rename: %q", got)
	}
	ents, err := os.ReadDir(f.upper)
	must(t, err)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "cu") || e.Name() == stagingName {
			t.Errorf("left in the upper: %s", e.Name())
		}
	}
}

// TestWarmPassesCostNoRequest: with the kernel's caches warm, reading a
// file again, reading a symlink again and writing a file cost no OPEN,
// RELEASE, FLUSH, READLINK or per-write GETXATTR round trip (the requests
// issue 32 removed).
func TestWarmPassesCostNoRequest(t *testing.T) {
	rc := &RequestCounter{}
	f := mountLayers(t, []tree{{"r.txt": "lower\n", "l": "->r.txt"}}, nil, func(o *Options, _ *fixture) { o.Requests = rc })
	warm := func() {
		if got := f.read("r.txt"); got != "lower\n" {
			t.Fatalf("r.txt: %q", got)
		}
		if got, err := os.Readlink(f.p("l")); err != nil || got != "r.txt" {
			t.Fatalf("readlink: %q %v", got, err)
		}
	}
	warm()
	f.write("w.txt", "one\n") // created: the first open
	f.write("w.txt", "two\n") // opened
	before := rc.Snapshot()
	warm()
	fh, err := os.OpenFile(f.p("w.txt"), os.O_WRONLY, 0)
	must(t, err)
	for range 3 {
		_, err := fh.Write([]byte("x"))
		must(t, err)
	}
	must(t, fh.Close())
	after := rc.Snapshot()
	got := map[string]uint64{}
	for op, n := range after {
		if d := n - before[op]; d > 0 && op != "INTERRUPT" {
			got[op] = d
		}
	}
	for _, op := range []string{"OPEN", "RELEASE", "FLUSH", "READLINK", "READ", "LOOKUP"} {
		if got[op] != 0 {
			t.Errorf("a warm pass sent %s: %v", op, got)
		}
	}
	// The kernel asks for security.capability once per inode after its
	// attributes changed, not once per write.
	if got["WRITE"] != 3 || got["GETXATTR"] > 1 {
		t.Errorf("requests of three writes: %v, want WRITE 3 and at most one GETXATTR", got)
	}
}
