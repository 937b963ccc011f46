package fuseoverlay

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func ino(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	return st.Ino
}

// TestInodeStability: st_ino of a path stays the same across lookups,
// copy-up (data, chmod, xattr), rename within the upper, and a remount of
// the same upper (for entries not copied up).
func TestInodeStability(t *testing.T) {
	lowers := []tree{{"f": "data", "d/": "", "d/g": "x", "sym": "->f", "e/": "", "e/h": "y"}}
	f := mountLayers(t, lowers, nil)
	paths := []string{"f", "d", "d/g", "sym", "e/h"}
	before := map[string]uint64{}
	for _, p := range paths {
		before[p] = ino(t, f.p(p))
	}
	// Copy-ups of every kind.
	f.write("f", "changed")
	must(t, os.Chmod(f.p("d/g"), 0o600))
	must(t, unix.Lchown(f.p("sym"), os.Getuid(), os.Getgid()))
	f.write("d/new", "n") // copies up d
	must(t, unix.Setxattr(f.p("e/h"), "user.k", []byte("v"), 0))
	for _, p := range paths {
		if got := ino(t, f.p(p)); got != before[p] {
			t.Errorf("%s: ino %d after copy-up, was %d", p, got, before[p])
		}
	}
	// Renaming a copied-up file keeps its number.
	must(t, os.Rename(f.p("f"), f.p("f2")))
	if got := ino(t, f.p("f2")); got != before["f"] {
		t.Errorf("renamed: ino %d, was %d", got, before["f"])
	}
	// A remount of the same upper (a new server, no in-memory state)
	// shows the same numbers.
	f.unmount()
	uf, err := os.Open(f.upper)
	must(t, err)
	defer uf.Close()
	lf, err := os.Open(f.lowers[0])
	must(t, err)
	defer lf.Close()
	srv, err := Mount(t.Context(), f.mnt, Options{Lowers: []*os.File{lf}, Upper: uf})
	must(t, err)
	defer srv.Unmount()
	// (A copied-up file renamed before the remount gets a new number: the
	// origin is kept in memory only, see the package doc.)
	delete(before, "f")
	for p, want := range before {
		if got := ino(t, f.p(p)); got != want {
			t.Errorf("after remount %s: ino %d, was %d", p, got, want)
		}
	}
	// Different entries never share a number.
	seen := map[uint64]string{}
	filepath.Walk(f.mnt, func(p string, fi os.FileInfo, err error) error {
		must(t, err)
		n := ino(t, p)
		if o, ok := seen[n]; ok {
			t.Errorf("ino %d shared by %s and %s", n, o, p)
		}
		seen[n] = p
		return nil
	})
}

// TestUnlinkOpenFile: an open handle keeps working after unlink, for a
// lower file (read) and an upper file (read and write).
func TestUnlinkOpenFile(t *testing.T) {
	f := mountLayers(t, []tree{{"low": "lowdata"}}, tree{"up": "updata"})
	lo, err := os.Open(f.p("low"))
	must(t, err)
	defer lo.Close()
	up, err := os.OpenFile(f.p("up"), os.O_RDWR, 0)
	must(t, err)
	defer up.Close()
	must(t, os.Remove(f.p("low")))
	must(t, os.Remove(f.p("up")))
	buf := make([]byte, 7)
	if _, err := lo.ReadAt(buf, 0); err != nil || string(buf) != "lowdata" {
		t.Errorf("read unlinked lower: %q %v", buf, err)
	}
	if _, err := up.WriteAt([]byte("UP"), 0); err != nil {
		t.Errorf("write unlinked upper: %v", err)
	}
	buf = make([]byte, 6)
	if _, err := up.ReadAt(buf, 0); err != nil || string(buf) != "UPdata" {
		t.Errorf("read unlinked upper: %q %v", buf, err)
	}
	fi, err := up.Stat()
	if err != nil || fi.Size() != 6 {
		t.Errorf("fstat unlinked: %v %v", fi, err)
	}
	checkMerged(t, f, "low", "")
	checkMerged(t, f, "up", "")
}

// TestSparseCopyUp: copy-up keeps size and holes.
func TestSparseCopyUp(t *testing.T) {
	requireNS(t)
	f := mountLayers(t, []tree{{}}, nil)
	// Make a sparse lower file: 64 MiB with data at 0 and at 32 MiB.
	lp := filepath.Join(f.lowers[0], "sparse")
	lf, err := os.Create(lp)
	must(t, err)
	_, err = lf.WriteAt([]byte("head"), 0)
	must(t, err)
	_, err = lf.WriteAt([]byte("middle"), 32<<20)
	must(t, err)
	must(t, lf.Truncate(64<<20))
	must(t, lf.Close())
	var lst unix.Stat_t
	must(t, unix.Stat(lp, &lst))
	// Append through the mount: copy-up.
	fh, err := os.OpenFile(f.p("sparse"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = fh.WriteString("tail")
	must(t, err)
	must(t, fh.Close())
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(f.upper, "sparse"), &st))
	if st.Size != 64<<20+4 {
		t.Errorf("size %d", st.Size)
	}
	if st.Blocks > lst.Blocks+64 {
		t.Errorf("holes lost: %d blocks in upper, %d in lower", st.Blocks, lst.Blocks)
	}
	b, err := os.ReadFile(f.p("sparse"))
	must(t, err)
	if string(b[:4]) != "head" || string(b[32<<20:32<<20+6]) != "middle" || string(b[len(b)-4:]) != "tail" {
		t.Errorf("content wrong after copy-up")
	}
	// SEEK_DATA / SEEK_HOLE through the mount.
	fh, err = os.Open(f.p("sparse"))
	must(t, err)
	defer fh.Close()
	hole, err := unix.Seek(int(fh.Fd()), 0, unix.SEEK_HOLE)
	if err != nil || hole >= 32<<20 {
		t.Errorf("SEEK_HOLE: %d %v", hole, err)
	}
}

// TestConcurrentCreateReaddir: listings taken while files are created
// never show duplicates or unknown names, and the final listing is full.
func TestConcurrentCreateReaddir(t *testing.T) {
	lower := tree{"dir/": ""}
	for i := 0; i < 50; i++ {
		lower[fmt.Sprintf("dir/l%03d", i)] = "l"
	}
	f := mountLayers(t, []tree{lower}, nil)
	const n = 300
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 3 {
				if err := os.WriteFile(f.p(fmt.Sprintf("dir/c%03d", i)), nil, 0o644); err != nil {
					t.Error(err)
					return
				}
			}
		}(w)
	}
	stop := make(chan struct{})
	var rwg sync.WaitGroup
	rwg.Add(1)
	go func() {
		defer rwg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			names, err := os.ReadDir(f.p("dir"))
			if err != nil {
				t.Error(err)
				return
			}
			seen := map[string]bool{}
			lowers := 0
			for _, e := range names {
				if seen[e.Name()] {
					t.Errorf("duplicate %s", e.Name())
				}
				seen[e.Name()] = true
				if strings.HasPrefix(e.Name(), "l") {
					lowers++
				}
			}
			if lowers != 50 {
				t.Errorf("listing shows %d lower entries", lowers)
			}
		}
	}()
	wg.Wait()
	close(stop)
	rwg.Wait()
	if got := len(list(t, f.p("dir"))); got != n+50 {
		t.Errorf("final listing %d entries, want %d", got, n+50)
	}
}

// TestHardLinks: links share the inode, nlink counts, and writes through
// one name show through the other.
func TestHardLinks(t *testing.T) {
	f := mountLayers(t, []tree{{"lf": "L"}}, nil)
	f.write("a", "1")
	must(t, os.Link(f.p("a"), f.p("b")))
	must(t, os.Link(f.p("lf"), f.p("lf2")))
	f.write("b", "22")
	if got := f.read("a"); got != "22" {
		t.Errorf("a = %q", got)
	}
	var sa, sb unix.Stat_t
	must(t, unix.Stat(f.p("a"), &sa))
	must(t, unix.Stat(f.p("b"), &sb))
	if sa.Ino != sb.Ino || sa.Nlink != 2 {
		t.Errorf("ino %d/%d nlink %d", sa.Ino, sb.Ino, sa.Nlink)
	}
	must(t, os.Remove(f.p("a")))
	must(t, unix.Stat(f.p("b"), &sb))
	if sb.Nlink != 1 {
		t.Errorf("nlink after unlink %d", sb.Nlink)
	}
	if got := f.read("lf2"); got != "L" {
		t.Errorf("lf2 = %q", got)
	}
}

// TestXattrsAndStatfs: overlay xattrs never show; statfs is the upper's.
func TestXattrsAndStatfs(t *testing.T) {
	f := mountLayers(t, []tree{{"d/": "opq", "d/x": "1"}}, nil)
	buf := make([]byte, 256)
	n, err := unix.Listxattr(f.p("d"), buf)
	must(t, err)
	if strings.Contains(string(buf[:n]), "overlay") {
		t.Errorf("overlay xattr listed: %q", buf[:n])
	}
	if _, err := unix.Getxattr(f.p("d"), xUserOpaque, buf); err == nil {
		t.Errorf("overlay xattr readable")
	}
	if err := unix.Setxattr(f.p("d/x"), xUserWhiteout, []byte("y"), 0); err == nil {
		t.Errorf("overlay xattr settable")
	}
	var a, b unix.Statfs_t
	must(t, unix.Statfs(f.mnt, &a))
	must(t, unix.Statfs(f.upper, &b))
	if a.Blocks != b.Blocks || a.Bsize != b.Bsize {
		t.Errorf("statfs %+v vs upper %+v", a, b)
	}
}

// TestMmapWrite: a shared mapping writes through to the file.
func TestMmapWrite(t *testing.T) {
	f := mountLayers(t, []tree{{"m": strings.Repeat("-", 4096)}}, nil)
	fh, err := os.OpenFile(f.p("m"), os.O_RDWR, 0)
	must(t, err)
	m, err := unix.Mmap(int(fh.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	must(t, err)
	copy(m, "mapped")
	must(t, unix.Munmap(m))
	must(t, fh.Close())
	f.unmount()
	b, err := os.ReadFile(filepath.Join(f.upper, "m"))
	must(t, err)
	if !strings.HasPrefix(string(b), "mapped----") {
		t.Errorf("upper after mmap write: %q", b[:16])
	}
}

// TestOpaqueRoundTrip: after remounting the same upper, whiteouts and
// opaque directories written by the driver are read back the same.
func TestRemountReadsOwnUpper(t *testing.T) {
	lowers := []tree{{"a": "1", "d/": "", "d/x": "x", "keep": "k"}}
	f := mountLayers(t, lowers, nil)
	must(t, os.Remove(f.p("a")))
	must(t, os.RemoveAll(f.p("d")))
	must(t, os.Mkdir(f.p("d"), 0o755))
	f.write("d/y", "y")
	before := walk(t, f.mnt)
	f.unmount()
	uf, err := os.Open(f.upper)
	must(t, err)
	defer uf.Close()
	var lfs []*os.File
	for _, l := range f.lowers {
		lf, err := os.Open(l)
		must(t, err)
		defer lf.Close()
		lfs = append(lfs, lf)
	}
	srv, err := Mount(t.Context(), f.mnt, Options{Lowers: lfs, Upper: uf})
	must(t, err)
	defer srv.Unmount()
	if after := walk(t, f.mnt); after != before {
		t.Errorf("after remount:\n%s\nbefore:\n%s", after, before)
	}
}

// walk renders a tree: path, type and content.
func walk(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(root, p)
		switch {
		case fi.IsDir():
			lines = append(lines, r+"/")
		case fi.Mode()&os.ModeSymlink != 0:
			tg, _ := os.Readlink(p)
			lines = append(lines, r+" -> "+tg)
		default:
			b, _ := os.ReadFile(p)
			lines = append(lines, fmt.Sprintf("%s %o %q", r, fi.Mode().Perm(), b))
		}
		return nil
	})
	must(t, err)
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestReadOnlyHandleSeesCopyUp: a handle opened read-only on a lower file
// reads what later writers (after copy-up) wrote, even once the page cache
// was dropped (O_DIRECT-free: posix_fadvise DONTNEED on the mount).
func TestReadOnlyHandleSeesCopyUp(t *testing.T) {
	f := mountLayers(t, []tree{{"f": "old-content"}}, nil)
	ro, err := os.Open(f.p("f"))
	must(t, err)
	defer ro.Close()
	f.write("f", "new-content")
	// Drop the mount's cached pages of the file so the next read reaches
	// the server through the read-only handle.
	must(t, unix.Fadvise(int(ro.Fd()), 0, 0, unix.FADV_DONTNEED))
	buf := make([]byte, 11)
	if _, err := ro.ReadAt(buf, 0); err != nil || string(buf) != "new-content" {
		t.Errorf("read-only handle after copy-up: %q %v", buf, err)
	}
}

// TestLowerHardLinks: two names of one lower inode read the same and share
// st_ino; writing one copies up that name only (as the kernel overlay does
// without index=on).
func TestLowerHardLinks(t *testing.T) {
	requireNS(t)
	f := mountLayers(t, []tree{{"h1": "same"}}, nil)
	must(t, os.Link(filepath.Join(f.lowers[0], "h1"), filepath.Join(f.lowers[0], "h2")))
	if ino(t, f.p("h1")) != ino(t, f.p("h2")) {
		t.Errorf("lower hard links show different numbers")
	}
	f.write("h1", "changed")
	if got := f.read("h2"); got != "same" {
		t.Errorf("h2 = %q after writing h1", got)
	}
	if got := f.read("h1"); got != "changed" {
		t.Errorf("h1 = %q", got)
	}
}
