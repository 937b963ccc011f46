package fuseoverlay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newLayer builds a layer directory next to the fixture's and opens it.
func (f *fixture) newLayer(name string, tr tree) (string, *os.File) {
	f.t.Helper()
	d := filepath.Join(filepath.Dir(f.mnt), name)
	must(f.t, os.Mkdir(d, 0o755))
	build(f.t, d, tr)
	fh, err := os.Open(d)
	must(f.t, err)
	f.t.Cleanup(func() { fh.Close() })
	return d, fh
}

func (f *fixture) openLower(i int) *os.File {
	f.t.Helper()
	fh, err := os.Open(f.lowers[i])
	must(f.t, err)
	f.t.Cleanup(func() { fh.Close() })
	return fh
}

func (f *fixture) swap(lowers ...*os.File) {
	f.t.Helper()
	if err := f.srv.SwapLower(f.t.Context(), lowers); err != nil {
		f.t.Fatalf("SwapLower: %v", err)
	}
}

func statOf(t *testing.T, p string) (unix.Stat_t, error) {
	t.Helper()
	var st unix.Stat_t
	err := unix.Lstat(p, &st)
	return st, err
}

func pattern(c byte, n int) string { return string(bytes.Repeat([]byte{c}, n)) }

// TestSwapLowerNewHead moves a mount onto a newer chain (a layer on top of
// the old one, as a sync onto the head does) after the kernel cached
// entries, attributes, pages and listings of the old one, and checks every
// kind of path through the mount: the kernel's caches must have been
// invalidated where the lookup result changed, and only there.
func TestSwapLowerNewHead(t *testing.T) {
	big := 1 << 20
	old := tree{
		"a": "a-old", "keep": "same", "gone": "gone", "up": "up-lower-old", "wh": "wh-old",
		"d/": "", "d/x": "x-old", "d/y": "y", "big": pattern('o', big), "kind": "file",
		"dirgone/": "", "dirgone/f": "f",
	}
	f := mountLayers(t, []tree{old}, tree{"up": "upper", "wh": "=wh"})

	// Cache the old chain: dentries, attributes, pages, listings and
	// negative dentries (1-minute timeouts).
	for _, p := range []string{"a", "keep", "gone", "up", "d/x", "d/y", "kind", "dirgone/f"} {
		f.read(p)
	}
	for _, p := range []string{"new", "d/z", "wh"} {
		if _, err := statOf(t, f.p(p)); !errors.Is(err, unix.ENOENT) {
			t.Fatalf("%s before the swap: %v, want ENOENT", p, err)
		}
	}
	list(t, f.mnt)
	list(t, f.p("d"))
	keepIno := ino(t, f.p("keep"))
	dIno := ino(t, f.p("d"))
	// A handle opened before the swap, read only in part, and a directory
	// descriptor (like a cwd) inside the mount.
	bh, err := os.Open(f.p("big"))
	must(t, err)
	defer bh.Close()
	head := make([]byte, 4096)
	_, err = io.ReadFull(bh, head)
	must(t, err)
	dfd, err := unix.Open(f.p("d"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(dfd)

	_, top := f.newLayer("head", tree{
		"a": "a-newer!", "up": "up-lower-new", "wh": "wh-new", "d/": "", "d/x": "x-newer", "d/z": "z-new",
		"new": "new", "gone": "=wh", "big": pattern('n', big), "kind/": "", "kind/k": "k", "dirgone": "=wh",
	})
	f.swap(top, f.openLower(0))

	for p, want := range map[string]string{
		"a": "a-newer!", "keep": "same", "up": "upper", "d/x": "x-newer", "d/y": "y", "d/z": "z-new",
		"new": "new", "kind/k": "k",
	} {
		st, err := statOf(t, f.p(p))
		if err != nil {
			t.Errorf("stat %s after the swap: %v", p, err)
			continue
		}
		if st.Size != int64(len(want)) {
			t.Errorf("stat %s after the swap: size %d, want %d (a stale attribute)", p, st.Size, len(want))
		}
		if got := f.read(p); got != want {
			t.Errorf("read %s after the swap: %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"gone", "wh", "dirgone", "dirgone/f"} {
		if _, err := statOf(t, f.p(p)); !errors.Is(err, unix.ENOENT) {
			t.Errorf("%s after the swap: %v, want ENOENT", p, err)
		}
	}
	if st, err := statOf(t, f.p("kind")); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Errorf("kind after the swap: %v, mode %o, want a directory", err, st.Mode)
	}
	if got, want := list(t, f.mnt), []string{"a", "big", "d", "keep", "kind", "new", "up"}; !slices.Equal(got, want) {
		t.Errorf("root listing after the swap: %q, want %q", got, want)
	}
	if got, want := list(t, f.p("d")), []string{"x", "y", "z"}; !slices.Equal(got, want) {
		t.Errorf("d listing after the swap: %q, want %q", got, want)
	}
	// Unchanged entries keep their identity.
	if got := ino(t, f.p("keep")); got != keepIno {
		t.Errorf("keep: ino %d after the swap, was %d", got, keepIno)
	}
	if got := ino(t, f.p("d")); got != dIno {
		t.Errorf("d: ino %d after the swap, was %d", got, dIno)
	}
	// The handle opened before reads the old file to its end.
	rest, err := io.ReadAll(bh)
	must(t, err)
	if string(head)+string(rest) != pattern('o', big) {
		t.Errorf("handle opened before the swap: read %d bytes, not the old content", len(head)+len(rest))
	}
	if _, err := bh.ReadAt(head, 0); err != nil || string(head) != pattern('o', 4096) {
		t.Errorf("handle opened before the swap, pread at 0: %q…, %v", head[:8], err)
	}
	if got := f.read("big"); got != pattern('n', big) {
		t.Errorf("a new open of big reads %q…, want the new content", got[:8])
	}
	// The directory opened before resolves names in the new chain.
	if got := readAt(t, dfd, "x"); got != "x-newer" {
		t.Errorf("openat(d, x) after the swap: %q", got)
	}

	// Writes copy up from the new chain (its layer numbering).
	fh, err := os.OpenFile(f.p("keep"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = fh.WriteString("+more")
	must(t, err)
	must(t, fh.Close())
	f.write("d/new", "n")
	if got := f.read("keep"); got != "same+more" {
		t.Errorf("keep after an append: %q", got)
	}
	for p, want := range map[string]string{"keep": "file", "d": "dir", "d/new": "file", "d/x": "absent"} {
		if got := upperKind(t, filepath.Join(f.upper, p)); got != want {
			t.Errorf("upper %s: %s, want %s", p, got, want)
		}
	}
	if got, want := list(t, f.p("d")), []string{"new", "x", "y", "z"}; !slices.Equal(got, want) {
		t.Errorf("d listing after a create: %q, want %q", got, want)
	}
	f.write("d/z", "z2") // copy-up of a file only the new lower has
	if got := f.read("d/z"); got != "z2" {
		t.Errorf("d/z after a write: %q", got)
	}
}

// TestSwapLowerSquash moves a mount onto a squash of its own chain (one
// layer whose files are hardlinks of the old layers' files): the view is
// the same, inode numbers included, and the mount keeps working.
func TestSwapLowerSquash(t *testing.T) {
	lowers := []tree{
		{"a": "a1", "d/": "", "d/x": "x1", "d/old": "=wh"},
		{"a": "a0", "b": "b0", "d/": "", "d/old": "old", "d/y": "y0", "e/": "", "e/f": "f0"},
	}
	f := mountLayers(t, lowers, tree{"u": "upper"})
	paths := []string{"a", "b", "d", "d/x", "d/y", "e", "e/f", "u"}
	before := map[string]uint64{}
	for _, p := range paths {
		before[p] = ino(t, f.p(p))
	}
	rootList, dList := list(t, f.mnt), list(t, f.p("d"))

	sq, sqf := f.newLayer("squash", tree{"d/": "", "e/": ""})
	for _, l := range []struct {
		layer int
		p     string
	}{{0, "a"}, {0, "d/x"}, {1, "b"}, {1, "d/y"}, {1, "e/f"}} {
		must(t, os.Link(filepath.Join(f.lowers[l.layer], l.p), filepath.Join(sq, l.p)))
	}
	f.swap(sqf)

	for _, p := range paths {
		if got := ino(t, f.p(p)); got != before[p] {
			t.Errorf("%s: ino %d after the squash swap, was %d", p, got, before[p])
		}
	}
	if got := list(t, f.mnt); !slices.Equal(got, rootList) {
		t.Errorf("root listing %q, was %q", got, rootList)
	}
	if got := list(t, f.p("d")); !slices.Equal(got, dList) {
		t.Errorf("d listing %q, was %q", got, dList)
	}
	for p, want := range map[string]string{"a": "a1", "b": "b0", "d/x": "x1", "d/y": "y0", "e/f": "f0", "u": "upper"} {
		if got := f.read(p); got != want {
			t.Errorf("%s: %q, want %q", p, got, want)
		}
	}
	f.write("e/f", "f1")
	if got := upperKind(t, filepath.Join(f.upper, "e/f")); got != "file" {
		t.Errorf("upper e/f after a write: %s", got)
	}
}

// TestSwapLowerRefusesBadInput: a nil or non-directory layer is an error
// and the mount keeps its chain.
func TestSwapLowerRefusesBadInput(t *testing.T) {
	f := mountLayers(t, []tree{{"a": "a"}}, nil)
	_, good := f.newLayer("good", tree{"a": "b"})
	file := filepath.Join(filepath.Dir(f.mnt), "file")
	must(t, os.WriteFile(file, nil, 0o644))
	ff, err := os.Open(file)
	must(t, err)
	defer ff.Close()
	for name, lowers := range map[string][]*os.File{"nil": {good, nil}, "file": {good, ff}} {
		err := f.srv.SwapLower(t.Context(), lowers)
		if err == nil {
			t.Errorf("%s: SwapLower succeeded", name)
		}
		if got := f.read("a"); got != "a" {
			t.Errorf("%s: a reads %q after a refused swap", name, got)
		}
	}
}

// TestSwapLowerConcurrent swaps back and forth between two chains while
// other goroutines read, list, create and copy up through the mount (run
// it with -race): every read shows one chain's content (or fails with
// ESTALE, see swap.go), and the final state is the last chain's.
func TestSwapLowerConcurrent(t *testing.T) {
	base := tree{"f": "fa", "d/": ""}
	for i := range 8 {
		base[fmt.Sprintf("d/c%d", i)] = "c"
	}
	f := mountLayers(t, []tree{base}, nil)
	a := f.openLower(0)
	_, b := f.newLayer("b", tree{"f": "fb-longer", "g": "g"})
	stop := make(chan struct{})
	errs := make(chan error, 64)
	var wg sync.WaitGroup
	loop := func(fn func(i int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := fn(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	loop(func(int) error {
		got, err := os.ReadFile(f.p("f"))
		if errors.Is(err, unix.ESTALE) {
			// The open raced the switch of f itself and the VFS's one
			// retry raced the next swap (they follow each other here).
			return nil
		}
		if err != nil {
			return fmt.Errorf("read f: %w", err)
		}
		if s := string(got); s != "fa" && s != "fb-longer" {
			return fmt.Errorf("read f: %q, from neither chain", s)
		}
		return nil
	})
	loop(func(int) error {
		_, err := os.ReadDir(f.mnt)
		return err
	})
	loop(func(i int) error {
		p := f.p(fmt.Sprintf("d/n%d", i%4))
		if err := os.WriteFile(p, []byte("n"), 0o644); err != nil {
			return err
		}
		return os.Remove(p)
	})
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		for i := range 8 {
			fh, err := os.OpenFile(f.p(fmt.Sprintf("d/c%d", i)), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				errs <- fmt.Errorf("copy-up c%d: %w", i, err)
				return
			}
			_, err = fh.WriteString("+")
			fh.Close()
			if err != nil {
				errs <- fmt.Errorf("append to c%d: %w", i, err)
				return
			}
		}
	}()
	for i := 0; ; i++ {
		if i%2 == 0 {
			f.swap(b, a)
		} else {
			f.swap(a)
		}
		select {
		case <-copied:
		default:
			continue
		}
		if i >= 40 {
			break
		}
	}
	f.swap(b, a)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := f.read("f"); got != "fb-longer" {
		t.Errorf("f after the last swap: %q", got)
	}
	if got := f.read("g"); got != "g" {
		t.Errorf("g after the last swap: %q", got)
	}
	for i := range 8 {
		if got := f.read(fmt.Sprintf("d/c%d", i)); got != "c+" {
			t.Errorf("d/c%d: %q, want c+", i, got)
		}
	}
}

// swapNotes swaps f's mount onto lowers like SwapLower and returns the
// invalidations it sent, as "kind dir/name" strings.
func (f *fixture) swapNotes(lowers ...*os.File) []string {
	f.t.Helper()
	s := f.srv.impl.(*server)
	notes, err := s.o.swap(Chain{Lowers: lowers})
	must(f.t, err)
	must(f.t, notify(notes))
	var out []string
	for _, nt := range notes {
		dir := "/" + nt.dir.Path(nil)
		kind := map[noticeKind]string{noticeEntry: "entry", noticeDelete: "delete", noticeContent: "content", noticeAttr: "attr"}[nt.kind]
		if nt.kind == noticeContent || nt.kind == noticeAttr {
			out = append(out, kind+" "+dir)
		} else {
			out = append(out, kind+" "+filepath.Join(dir, nt.name))
		}
	}
	slices.Sort(out)
	return out
}

// TestSwapLowerInvalidatesOnlyWhatDiffers: the invalidations a swap sends
// are exactly those of the paths whose lookup (or listing, or shown
// directory attributes) changed; a squash of the same content sends no
// entry invalidation at all.
func TestSwapLowerInvalidatesOnlyWhatDiffers(t *testing.T) {
	old := tree{"a": "a", "keep": "k", "gone": "g", "d/": "", "d/x": "x", "d/y": "y", "e/": "", "e/f": "f"}
	f := mountLayers(t, []tree{old}, nil)
	cacheAll := func() {
		filepath.Walk(f.mnt, func(p string, fi os.FileInfo, err error) error {
			must(t, err)
			if fi.Mode().IsRegular() {
				_, err = os.ReadFile(p)
				must(t, err)
			}
			return nil
		})
	}
	cacheAll()
	_, head := f.newLayer("head", tree{"a": "a2", "d/": "", "d/x": "x2", "new": "n", "gone": "=wh"})
	got := f.swapNotes(head, f.openLower(0))
	want := []string{"content /", "content /d", "delete /gone", "entry /a", "entry /d/x", "entry /new"}
	if !slices.Equal(got, want) {
		t.Errorf("head swap invalidated %q, want %q", got, want)
	}

	// A squash of that chain (hardlinks, new directories): no entry changes.
	cacheAll()
	sq, sqf := f.newLayer("squash", tree{"d/": "", "e/": ""})
	for _, l := range []struct {
		dir, p string
	}{{"head", "a"}, {"head", "d/x"}, {"head", "new"}, {"lower0", "keep"}, {"lower0", "d/y"}, {"lower0", "e/f"}} {
		must(t, os.Link(filepath.Join(filepath.Dir(f.mnt), l.dir, l.p), filepath.Join(sq, l.p)))
	}
	for _, n := range f.swapNotes(sqf) {
		if !strings.HasPrefix(n, "attr ") {
			t.Errorf("squash swap invalidated %q (only directory attributes may differ)", n)
		}
	}
	if got := f.read("d/x"); got != "x2" {
		t.Errorf("d/x after the squash: %q", got)
	}
}

// exchange swaps the names a and b (renameat2 RENAME_EXCHANGE), the way
// layers.SyncUpper puts a rewritten upper in place.
func exchange(t *testing.T, a, b string) {
	t.Helper()
	must(t, unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE))
}

// TestSwapUpper replaces the upper and the lower chain of a live mount in
// one swap, as a sync does (a new upper renamed into place with
// RENAME_EXCHANGE, then the chain of the head), after the kernel cached
// entries, attributes, pages and listings of the old view, with a handle
// and a directory descriptor open inside: afterwards every path shows
// exactly the new upper over the new chain (changed files of the same
// size and mtime, whiteouts and an opaque directory that appeared or
// vanished), the old handle reads what it opened, and writes land in the
// new upper.
func TestSwapUpper(t *testing.T) {
	lower := tree{"a": "a-lower", "b": "b-lower", "c": "c-lower", "d/": "", "d/x": "x-lower", "e/": "", "e/y": "y-lower", "keep": "k"}
	f := mountLayers(t, []tree{lower}, tree{"a": "a-old-up", "gone": "g", "b": "=wh", "d/": "", "d/x": "x-old-up"})
	for _, p := range []string{"a", "c", "d/x", "e/y", "gone", "keep"} {
		f.read(p)
	}
	for _, p := range []string{"b", "new"} {
		if _, err := statOf(t, f.p(p)); !errors.Is(err, unix.ENOENT) {
			t.Fatalf("%s before the swap: %v, want ENOENT", p, err)
		}
	}
	list(t, f.mnt)
	list(t, f.p("d"))
	list(t, f.p("e"))
	ah, err := os.Open(f.p("a"))
	must(t, err)
	defer ah.Close()
	dfd, err := unix.Open(f.p("d"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(dfd)

	// The rewritten upper: same-size edits with the old times (so no
	// attribute change gives the kernel a hint), a whiteout gone and one
	// new, an opaque directory over a lower one.
	next := filepath.Join(filepath.Dir(f.upper), "upper-next")
	must(t, os.Mkdir(next, 0o755))
	build(t, next, tree{"a": "a-new-up", "b": "b-back", "c": "=wh", "d/": "", "d/x": "x-new-up", "e/": "opq", "new": "n"})
	for _, p := range []string{"a", "d/x"} {
		st, err := statOf(t, filepath.Join(f.upper, p))
		must(t, err)
		mt := time.Unix(st.Mtim.Unix())
		must(t, os.Chtimes(filepath.Join(next, p), mt, mt))
	}
	exchange(t, next, f.upper)
	up, err := os.Open(f.upper)
	must(t, err)
	defer up.Close()
	_, head := f.newLayer("head", tree{"h": "head", "keep": "k2"})
	if err := f.srv.Swap(t.Context(), Chain{Upper: up, Lowers: []*os.File{head, f.openLower(0)}}); err != nil {
		t.Fatalf("Swap: %v", err)
	}

	for p, want := range map[string]string{"a": "a-new-up", "b": "b-back", "d/x": "x-new-up", "new": "n", "h": "head", "keep": "k2"} {
		st, err := statOf(t, f.p(p))
		if err != nil {
			t.Errorf("stat %s after the swap: %v", p, err)
			continue
		}
		if st.Size != int64(len(want)) {
			t.Errorf("stat %s after the swap: size %d, want %d", p, st.Size, len(want))
		}
		if got := f.read(p); got != want {
			t.Errorf("read %s after the swap: %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"c", "gone", "e/y"} {
		if _, err := statOf(t, f.p(p)); !errors.Is(err, unix.ENOENT) {
			t.Errorf("%s after the swap: %v, want ENOENT", p, err)
		}
	}
	if got, want := list(t, f.mnt), []string{"a", "b", "d", "e", "h", "keep", "new"}; !slices.Equal(got, want) {
		t.Errorf("root listing after the swap: %q, want %q", got, want)
	}
	if got := list(t, f.p("e")); len(got) != 0 {
		t.Errorf("opaque e lists %q", got)
	}
	if got := readAt(t, dfd, "x"); got != "x-new-up" {
		t.Errorf("openat(d, x) after the swap: %q", got)
	}
	buf := make([]byte, 64)
	n, _ := ah.ReadAt(buf, 0)
	if got := string(buf[:n]); got != "a-old-up" {
		t.Errorf("handle opened before the swap reads %q, want the old upper's a", got)
	}

	// Writes go to the new upper (now at the upper's name), not the old.
	f.write("w", "w")
	fh, err := os.OpenFile(f.p("h"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = fh.WriteString("+")
	must(t, err)
	must(t, fh.Close())
	for p, want := range map[string]string{"w": "w", "h": "head+"} {
		if b, err := os.ReadFile(filepath.Join(f.upper, p)); err != nil || string(b) != want {
			t.Errorf("new upper %s: %q %v, want %q", p, b, err, want)
		}
		if _, err := os.Lstat(filepath.Join(next, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("old upper %s: %v, want absent", p, err)
		}
	}
}

// TestSwapUpperRefused: an upper swap while a handle is open for writing
// (its writes would go to the replaced upper), onto a non-directory or
// onto another filesystem fails and changes nothing; read-only handles do
// not block it.
func TestSwapUpperRefused(t *testing.T) {
	f := mountLayers(t, []tree{{"a": "a-lower"}}, tree{"u": "upper"})
	alt := filepath.Join(filepath.Dir(f.upper), "alt")
	must(t, os.Mkdir(alt, 0o755))
	build(t, alt, tree{"u": "alt"})
	altf, err := os.Open(alt)
	must(t, err)
	defer altf.Close()
	low := f.openLower(0)
	check := func(what string) {
		t.Helper()
		if got := f.read("u"); got != "upper" {
			t.Errorf("%s: u reads %q, want the unchanged upper", what, got)
		}
		f.write("probe", what)
		if b, err := os.ReadFile(filepath.Join(f.upper, "probe")); err != nil || string(b) != what {
			t.Errorf("%s: a write went elsewhere: %q %v", what, b, err)
		}
	}

	wh, err := os.OpenFile(f.p("a"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	rh, err := os.Open(f.p("u"))
	must(t, err)
	defer rh.Close()
	err = f.srv.Swap(t.Context(), Chain{Upper: altf, Lowers: []*os.File{low}})
	var we *WriteHandlesError
	if !errors.Is(err, ErrWriteHandles) || !errors.As(err, &we) || len(we.Handles) != 1 || we.Handles[0].Path != "a" {
		t.Fatalf("upper swap with a handle open for writing: %v, want a WriteHandlesError naming a", err)
	}
	check("write handle")
	// A lower swap (same upper) does not mind writers.
	if err := f.srv.SwapLower(t.Context(), []*os.File{low}); err != nil {
		t.Errorf("lower swap with a writer: %v", err)
	}
	must(t, wh.Close())

	file := filepath.Join(filepath.Dir(f.upper), "file")
	must(t, os.WriteFile(file, nil, 0o644))
	ff, err := os.Open(file)
	must(t, err)
	defer ff.Close()
	proc, err := os.Open("/proc")
	must(t, err)
	defer proc.Close()
	for name, up := range map[string]*os.File{"file": ff, "other filesystem": proc} {
		if err := f.srv.Swap(t.Context(), Chain{Upper: up, Lowers: []*os.File{low}}); err == nil {
			t.Errorf("%s: upper swap succeeded", name)
		}
		check(name)
	}
	// With only a read-only handle open, the swap goes through.
	if err := f.srv.Swap(t.Context(), Chain{Upper: altf, Lowers: []*os.File{low}}); err != nil {
		t.Fatalf("upper swap with a read-only handle: %v", err)
	}
	if got := f.read("u"); got != "alt" {
		t.Errorf("u after the swap: %q", got)
	}
}
