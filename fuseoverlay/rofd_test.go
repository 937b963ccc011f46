package fuseoverlay

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// readUncached reads the whole file at p after dropping its clean pages
// from the page cache, so the data comes from the server's descriptor
// (FOPEN_KEEP_CACHE would otherwise answer from the cache).
func readUncached(t *testing.T, p string) string {
	t.Helper()
	fh, err := os.Open(p)
	must(t, err)
	defer fh.Close()
	must(t, unix.Fadvise(int(fh.Fd()), 0, 0, unix.FADV_DONTNEED))
	b := make([]byte, 4096)
	n, err := unix.Pread(int(fh.Fd()), b, 0)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return string(b[:n])
}

// Read-only opens of a lower file share one descriptor (rofd.go). These
// are the rules that sharing relies on.
func TestSharedReadOnlyDescriptor(t *testing.T) {
	t.Run("copy-up ends sharing", func(t *testing.T) {
		// A read-only open after a write must read the upper copy, not the
		// lower file the shared descriptor still points at.
		f := mountLayers(t, []tree{{"a": "lower"}}, nil)
		if got := readUncached(t, f.p("a")); got != "lower" {
			t.Fatalf("before: %q", got)
		}
		f.write("a", "upper")
		if got := readUncached(t, f.p("a")); got != "upper" {
			t.Fatalf("read-only open after the copy-up reads %q, want the upper copy", got)
		}
	})
	t.Run("handles keep the descriptor after another closes", func(t *testing.T) {
		f := mountLayers(t, []tree{{"a": "lower"}}, nil)
		h1, err := os.Open(f.p("a"))
		must(t, err)
		h2, err := os.Open(f.p("a"))
		must(t, err)
		defer h2.Close()
		must(t, h1.Close())
		must(t, unix.Fadvise(int(h2.Fd()), 0, 0, unix.FADV_DONTNEED))
		b := make([]byte, 64)
		n, err := unix.Pread(int(h2.Fd()), b, 0)
		if err != nil || string(b[:n]) != "lower" {
			t.Fatalf("read through the second handle: %q, %v", b[:n], err)
		}
	})
	t.Run("garbage collection does not close it", func(t *testing.T) {
		// The server runs in this process: handles of earlier opens are
		// collected here, and none of them may own the shared descriptor.
		f := mountLayers(t, []tree{{"a": "lower", "b": "other"}}, nil)
		for i := 0; i < 20; i++ {
			if got := readUncached(t, f.p("a")); got != "lower" {
				t.Fatalf("pass %d: %q", i, got)
			}
			runtime.GC()
			runtime.GC()
			// Descriptors freed by a wrong close would be reused here.
			if got := readUncached(t, f.p("b")); got != "other" {
				t.Fatalf("pass %d: b reads %q", i, got)
			}
		}
	})
	t.Run("past the bound opens get their own descriptor", func(t *testing.T) {
		f := mountLayers(t, []tree{{"a": "A", "b": "B", "c": "C"}}, nil)
		o := f.srv.impl.(*server).o
		o.maxSharedFds = 1
		var hs []*os.File
		for _, name := range []string{"a", "b", "c"} {
			h, err := os.Open(f.p(name))
			must(t, err)
			t.Cleanup(func() { h.Close() }) // before the unmount
			hs = append(hs, h)
		}
		for i, name := range []string{"A", "B", "C"} {
			must(t, unix.Fadvise(int(hs[i].Fd()), 0, 0, unix.FADV_DONTNEED))
			b := make([]byte, 8)
			n, err := unix.Pread(int(hs[i].Fd()), b, 0)
			if err != nil || string(b[:n]) != name {
				t.Fatalf("file %d reads %q, %v", i, b[:n], err)
			}
		}
		if got := o.sharedFds.Load(); got != 1 {
			t.Fatalf("%d shared descriptors held, want the bound, 1", got)
		}
	})
	t.Run("writers get their own descriptor", func(t *testing.T) {
		// Opening for write while a reader shares the lower descriptor
		// copies up; the write is recorded for the writer's handle.
		f := mountLayers(t, []tree{{"a": "lower"}}, nil, withSink())
		r, err := os.Open(f.p("a"))
		must(t, err)
		defer r.Close()
		w, err := os.OpenFile(f.p("a"), os.O_WRONLY, 0)
		must(t, err)
		_, err = w.WriteAt([]byte("UP"), 0)
		must(t, err)
		must(t, w.Close())
		f.srv.Flush()
		if got := readUncached(t, f.p("a")); got != "UPwer" {
			t.Fatalf("after write: %q", got)
		}
		b := make([]byte, 64)
		must(t, unix.Fadvise(int(r.Fd()), 0, 0, unix.FADV_DONTNEED))
		n, err := unix.Pread(int(r.Fd()), b, 0)
		if err != nil || string(b[:n]) != "UPwer" {
			t.Fatalf("reader opened before the copy-up reads %q, %v", b[:n], err)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		found := false
		for _, rec := range f.records {
			if rec.Op == "write" && rec.Path == "a" && rec.Offset == 0 && rec.Length == 2 {
				found = true
			}
		}
		if !found {
			t.Fatalf("write not recorded: %+v", f.records)
		}
	})
}
