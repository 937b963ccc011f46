// Command fssem is the filesystem-semantics probe of tests/fssemantics_test.go.
// It performs one scripted sequence of filesystem operations in a directory and
// writes a canonical JSON report: per step the result (ok or the errno name),
// facts the step measured (booleans and small values, never raw inode numbers
// or device ids, which legitimately differ between a native directory and an
// overlay) and the resulting state of the paths it touched; then the state of
// the whole tree. The same report from a native directory, a kernel-overlay
// session and a FUSE-overlay session must match except for the documented
// overlay differences the test applies.
//
//	fssem prepare DIR          lower content, layer 1 (the sandbox's workspace root)
//	fssem prepare2 DIR         layer 2: deletions, an opaque replacement, a rewrite
//	fssem run DIR OUT          the scripted operations; the report goes to OUT ("-": stdout)
//	fssem otheruid DIR OUT     mode-0000 entries made by this user, then opened by
//	                           another: uid/gid 65534 (root in a subordinate-ID
//	                           session), or $FSSEM_OTHER_SUDO through sudo (natively)
//	fssem access DIR           (internal) the other user's side of otheruid
//
// It is built static (CGO_ENABLED=0) so it runs inside any session root.
package main

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: fssem prepare|prepare2 DIR | fssem run DIR OUT")
		os.Exit(2)
	}
	// A fixed umask: sessions and the test process may differ.
	unix.Umask(0o022)
	dir := os.Args[2]
	var err error
	switch os.Args[1] {
	case "prepare":
		err = prepare(dir)
	case "prepare2":
		err = prepare2(dir)
	case "run":
		if len(os.Args) != 4 {
			err = errors.New("run needs DIR and OUT")
			break
		}
		err = runAll(dir, os.Args[3])
	case "otheruid":
		if len(os.Args) != 4 {
			err = errors.New("otheruid needs DIR and OUT")
			break
		}
		err = otherUID(dir, os.Args[3])
	case "access":
		err = access(dir)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fssem:", err)
		os.Exit(1)
	}
}

// ---------------------------------------------------------------- lower content

// The lower content uses only what a layer snapshot keeps (regular files,
// directories, symlinks, the 0o777 mode bits): no xattrs, no hardlinks, no
// holes, so the native directory and the sandbox's layers start identical.
func prepare(dir string) error {
	files := map[string]string{
		"a.txt":                 "alpha\n",
		"b.txt":                 "bravo\n",
		"trunc.txt":             strings.Repeat("0123456789abcdef", 256),
		"chmod.txt":             "chmod\n",
		"utimes.txt":            "utimes\n",
		"append.txt":            "line1\n",
		"mmap.txt":              strings.Repeat("m", 8192),
		"ino.txt":               "inode\n",
		"open-unlink.txt":       "open and unlinked\n",
		"xattr.txt":             "xattr\n",
		"over-src.txt":          "over source\n",
		"over-dst.txt":          "over destination\n",
		"rm.txt":                "to be removed\n",
		"cross/src.txt":         "crossing\n",
		"dir-lower/f1":          "f1\n",
		"dir-lower/f2":          "f2\n",
		"dir-lower/sub/f3":      "f3\n",
		"dir-mv/x":              "x\n",
		"dir-mv/y/z":            "z\n",
		"dir-del/g1":            "g1\n",
		"dir-del/g2":            "g2\n",
		"dir-rm-nonempty/k":     "k\n",
		"l2-gone.txt":           "gone in layer 2\n",
		"l2-dir/q1":             "q1\n",
		"l2-dir/q2":             "q2\n",
		"l2-modified.txt":       "v1\n",
		"concurrent/base-0":     "0\n",
		"concurrent/base-1":     "1\n",
		"concurrent/base-2":     "2\n",
		"merged/lower-file.txt": "lower\n",
	}
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "utimes.txt"), 0o755); err != nil {
		return err
	}
	for _, d := range []string{"dir-empty-lower", "merged/sub"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Symlink("a.txt", filepath.Join(dir, "sym-lower")); err != nil {
		return err
	}
	return os.Symlink("nowhere", filepath.Join(dir, "sym-dangling"))
}

// prepare2 is run by a command whose session is published, so its deletions
// reach the next session as whiteouts and an opaque directory in a lower layer.
func prepare2(dir string) error {
	if err := os.Remove(filepath.Join(dir, "l2-gone.txt")); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(dir, "l2-dir")); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dir, "l2-dir"), 0o755); err != nil {
		return err
	}
	for p, c := range map[string]string{"l2-dir/q3": "q3\n", "l2-modified.txt": "v2\n", "l2-new.txt": "new in layer 2\n"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ---------------------------------------------------------------- report

// Report is the canonical result of one run.
type Report struct {
	Steps []Step  `json:"steps"`
	Final []Entry `json:"final"`
}

// Step is one scripted operation.
type Step struct {
	Name   string         `json:"name"`
	Result string         `json:"result"` // "ok" or an errno name (EXDEV, ENOENT, …)
	Facts  map[string]any `json:"facts,omitempty"`
	State  []Entry        `json:"state,omitempty"`
}

// Entry is the observable state of one path (never raw inode or device numbers).
type Entry struct {
	Path   string            `json:"path"`
	Type   string            `json:"type"` // file, dir, symlink, fifo, other, missing
	Mode   string            `json:"mode,omitempty"`
	Size   *int64            `json:"size,omitempty"`   // files and symlinks
	Nlink  uint64            `json:"nlink,omitempty"`  // non-directories
	Digest string            `json:"digest,omitempty"` // files: sha256 prefix
	Target string            `json:"target,omitempty"`
	Xattrs map[string]string `json:"xattrs,omitempty"` // user.* except the overlay's own
	Names  []string          `json:"names,omitempty"`  // directories: sorted entries
}

type runner struct {
	dir string
	rep Report
}

func (r *runner) p(rel string) string { return filepath.Join(r.dir, rel) }

// step runs f, records its result and facts and the state of paths afterwards.
func (r *runner) step(name string, paths []string, f func(facts map[string]any) error) {
	facts := map[string]any{}
	err := f(facts)
	s := Step{Name: name, Result: errName(err)}
	if len(facts) > 0 {
		s.Facts = facts
	}
	for _, p := range paths {
		s.State = append(s.State, r.entry(p))
	}
	r.rep.Steps = append(r.rep.Steps, s)
}

func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		if n := unix.ErrnoName(errno); n != "" {
			return strings.ToUpper(n)
		}
		return fmt.Sprintf("errno %d", int(errno))
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Sprintf("exit %d", ee.ExitCode())
	}
	return "error: " + err.Error()
}

func (r *runner) entry(rel string) Entry {
	full := r.p(rel)
	e := Entry{Path: rel}
	var st unix.Stat_t
	if err := unix.Lstat(full, &st); err != nil {
		e.Type = "missing"
		if !errors.Is(err, unix.ENOENT) {
			e.Type = "lstat " + errName(err)
		}
		return e
	}
	size := st.Size
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type, e.Size, e.Nlink = "file", &size, uint64(st.Nlink)
		e.Mode = fmt.Sprintf("%04o", st.Mode&0o7777)
		data, err := os.ReadFile(full)
		if err != nil {
			e.Digest = "read " + errName(err)
		} else {
			sum := sha256.Sum256(data)
			e.Digest = hex.EncodeToString(sum[:8])
		}
	case unix.S_IFDIR:
		e.Type = "dir"
		e.Mode = fmt.Sprintf("%04o", st.Mode&0o7777)
		names, err := listNames(full)
		if err != nil {
			e.Names = []string{"readdir " + errName(err)}
		} else {
			e.Names = names
		}
	case unix.S_IFLNK:
		e.Type, e.Size, e.Nlink = "symlink", &size, uint64(st.Nlink)
		t, err := os.Readlink(full)
		if err != nil {
			t = "readlink " + errName(err)
		}
		e.Target = t
	case unix.S_IFIFO:
		e.Type, e.Nlink = "fifo", uint64(st.Nlink)
		e.Mode = fmt.Sprintf("%04o", st.Mode&0o7777)
	default:
		e.Type = "other"
	}
	if e.Type != "symlink" {
		e.Xattrs = userXattrs(full)
	}
	return e
}

// listNames returns a directory's sorted names, or an error for duplicates
// (a merged readdir must never list a name twice).
func listNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	for i := 1; i < len(names); i++ {
		if names[i] == names[i-1] {
			return nil, fmt.Errorf("duplicate entry %q", names[i])
		}
	}
	if names == nil {
		names = []string{}
	}
	return names, nil
}

// userXattrs lists user.* xattrs; user.overlay.* belongs to the overlay
// driver (the kernel hides it in userxattr mode, and so must FUSE).
func userXattrs(path string) map[string]string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(path, buf)
	if err != nil || n == 0 {
		return nil
	}
	out := map[string]string{}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if !strings.HasPrefix(name, "user.") || strings.HasPrefix(name, "user.overlay.") {
			continue
		}
		v := make([]byte, 4096)
		m, err := unix.Lgetxattr(path, name, v)
		if err != nil {
			out[name] = "getxattr " + errName(err)
			continue
		}
		out[name] = string(v[:m])
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func ino(path string) uint64 {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}

// direntIno returns the d_ino readdir reports for name in dir.
func direntIno(dir, name string) uint64 {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil || n <= 0 {
			return 0
		}
		for off := 0; off < n; {
			// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
			d := buf[off:n]
			reclen := int(d[16]) | int(d[17])<<8
			nameb := d[19:reclen]
			if i := bytes.IndexByte(nameb, 0); i >= 0 {
				nameb = nameb[:i]
			}
			if string(nameb) == name {
				var v uint64
				for i := 7; i >= 0; i-- {
					v = v<<8 | uint64(d[i])
				}
				return v
			}
			off += reclen
		}
	}
}

func appendTo(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeAt(path string, flags int, data []byte, off int64) error {
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(data, off); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ---------------------------------------------------------------- the script

func runAll(dir, out string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	r := &runner{dir: abs}
	r.lookups()
	r.whiteoutsAndOpaque()
	r.copyUp()
	r.createAndRemove()
	r.modes()
	r.longPaths()
	r.renames()
	r.links()
	r.xattrs()
	r.statfsFsyncAppend()
	r.sparseAndMmap()
	r.inodes()
	r.openUnlinked()
	r.concurrentReaddir()
	final, err := r.walk()
	if err != nil {
		return err
	}
	r.rep.Final = final
	data, err := r.rep.encode()
	if err != nil {
		return err
	}
	if out == "-" {
		_, err = os.Stdout.Write(data)
		return err
	}
	return os.WriteFile(out, data, 0o644)
}

// encode writes one step or entry per line: the report is read back through
// file_read (a line window) and diffs of it stay readable.
func (rep *Report) encode() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("{\"steps\":[\n")
	for i, s := range rep.Steps {
		line, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		b.Write(line)
		if i < len(rep.Steps)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("],\"final\":[\n")
	for i, e := range rep.Final {
		line, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		b.Write(line)
		if i < len(rep.Final)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("]}\n")
	return b.Bytes(), nil
}

// walk records every path below the directory, sorted.
func (r *runner) walk() ([]Entry, error) {
	var out []Entry
	err := filepath.WalkDir(r.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == r.dir {
			return nil
		}
		rel, _ := filepath.Rel(r.dir, p)
		out = append(out, r.entry(rel))
		if strings.HasPrefix(rel, "concurrent") {
			return fs.SkipDir // its hundreds of names are in the entry; the steps checked them
		}
		return nil
	})
	return out, err
}

func (r *runner) lookups() {
	r.step("lookup-layers", []string{".", "l2-gone.txt", "l2-dir", "l2-modified.txt", "l2-new.txt", "sym-lower", "sym-dangling"}, func(f map[string]any) error {
		_, err := os.Stat(r.p("l2-gone.txt"))
		f["stat l2-gone.txt"] = errName(err)
		_, err = os.Open(r.p("l2-dir/q1"))
		f["open l2-dir/q1"] = errName(err)
		return nil
	})
	r.step("readlink-lower", []string{"sym-lower"}, func(f map[string]any) error {
		data, err := os.ReadFile(r.p("sym-lower"))
		f["content via link"] = string(data)
		return err
	})
	r.step("open-dangling-symlink", nil, func(map[string]any) error {
		_, err := os.Open(r.p("sym-dangling"))
		return err
	})
}

func (r *runner) whiteoutsAndOpaque() {
	r.step("unlink-lower-file", []string{".", "rm.txt"}, func(map[string]any) error { return unix.Unlink(r.p("rm.txt")) })
	r.step("open-unlinked-lower", nil, func(map[string]any) error {
		_, err := os.Open(r.p("rm.txt"))
		return err
	})
	r.step("recreate-after-unlink", []string{"rm.txt"}, func(map[string]any) error {
		return os.WriteFile(r.p("rm.txt"), []byte("recreated\n"), 0o600)
	})
	r.step("rmdir-lower-nonempty", []string{"dir-rm-nonempty"}, func(map[string]any) error {
		return unix.Rmdir(r.p("dir-rm-nonempty"))
	})
	r.step("rmdir-lower-empty", []string{"dir-empty-lower"}, func(map[string]any) error {
		return unix.Rmdir(r.p("dir-empty-lower"))
	})
	r.step("recreate-lower-dir-opaque", []string{"dir-del", "dir-del/new", "dir-del/g1"}, func(map[string]any) error {
		if err := os.RemoveAll(r.p("dir-del")); err != nil {
			return err
		}
		if err := unix.Mkdir(r.p("dir-del"), 0o700); err != nil {
			return err
		}
		return os.WriteFile(r.p("dir-del/new"), []byte("new\n"), 0o644)
	})
	r.step("mkdir-over-lower-file-whiteout", []string{"l2-modified.txt"}, func(map[string]any) error {
		if err := unix.Unlink(r.p("l2-modified.txt")); err != nil {
			return err
		}
		if err := unix.Mkdir(r.p("l2-modified.txt"), 0o755); err != nil {
			return err
		}
		return os.WriteFile(r.p("l2-modified.txt/inside"), []byte("inside\n"), 0o644)
	})
	r.step("merged-dir-add-upper", []string{"merged", "merged/upper-file.txt"}, func(map[string]any) error {
		return os.WriteFile(r.p("merged/upper-file.txt"), []byte("upper\n"), 0o644)
	})
}

func (r *runner) copyUp() {
	r.step("write-copyup", []string{"a.txt"}, func(f map[string]any) error {
		before := ino(r.p("a.txt"))
		err := writeAt(r.p("a.txt"), os.O_WRONLY, []byte("ALPHA"), 0)
		f["ino same after copy-up"] = before != 0 && before == ino(r.p("a.txt"))
		return err
	})
	r.step("truncate-copyup", []string{"trunc.txt"}, func(f map[string]any) error {
		before := ino(r.p("trunc.txt"))
		err := unix.Truncate(r.p("trunc.txt"), 100)
		f["ino same after copy-up"] = before != 0 && before == ino(r.p("trunc.txt"))
		return err
	})
	r.step("truncate-extend-open", []string{"trunc.txt"}, func(map[string]any) error {
		f, err := os.OpenFile(r.p("trunc.txt"), os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Truncate(5000)
	})
	r.step("chmod-copyup", []string{"chmod.txt"}, func(f map[string]any) error {
		before := ino(r.p("chmod.txt"))
		err := unix.Chmod(r.p("chmod.txt"), 0o600)
		f["ino same after copy-up"] = before != 0 && before == ino(r.p("chmod.txt"))
		return err
	})
	r.step("utimes-copyup", []string{"utimes.txt"}, func(f map[string]any) error {
		before := ino(r.p("utimes.txt"))
		want := time.Date(2001, 2, 3, 4, 5, 6, 700000000, time.UTC)
		err := os.Chtimes(r.p("utimes.txt"), want, want)
		var st unix.Stat_t
		if serr := unix.Lstat(r.p("utimes.txt"), &st); serr == nil {
			f["mtime"] = time.Unix(st.Mtim.Unix()).UTC().Format(time.RFC3339Nano)
			f["atime"] = time.Unix(st.Atim.Unix()).UTC().Format(time.RFC3339Nano)
		}
		f["ino same after copy-up"] = before != 0 && before == ino(r.p("utimes.txt"))
		return err
	})
	r.step("read-after-copyup", nil, func(f map[string]any) error {
		data, err := os.ReadFile(r.p("a.txt"))
		f["content"] = string(data)
		return err
	})
}

func (r *runner) createAndRemove() {
	r.step("create-excl", []string{"new.txt"}, func(map[string]any) error {
		return writeAt(r.p("new.txt"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, []byte("new\n"), 0)
	})
	r.step("create-excl-existing-lower", nil, func(map[string]any) error {
		return writeAt(r.p("b.txt"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, []byte("x"), 0)
	})
	r.step("create-trunc-lower", []string{"over-dst.txt"}, func(map[string]any) error {
		return os.WriteFile(r.p("over-dst.txt"), []byte("replaced destination\n"), 0o600)
	})
	r.step("mkdir", []string{"newdir"}, func(map[string]any) error { return unix.Mkdir(r.p("newdir"), 0o750) })
	r.step("mkdir-existing-lower", nil, func(map[string]any) error { return unix.Mkdir(r.p("dir-lower"), 0o755) })
	r.step("mkdir-missing-parent", nil, func(map[string]any) error { return unix.Mkdir(r.p("nope/sub"), 0o755) })
	r.step("unlink-missing", nil, func(map[string]any) error { return unix.Unlink(r.p("missing.txt")) })
	r.step("unlink-dir", nil, func(map[string]any) error { return unix.Unlink(r.p("dir-lower")) })
	r.step("rmdir-file", nil, func(map[string]any) error { return unix.Rmdir(r.p("b.txt")) })
	r.step("rmdir-upper", []string{"newdir-rm"}, func(map[string]any) error {
		if err := unix.Mkdir(r.p("newdir-rm"), 0o755); err != nil {
			return err
		}
		return unix.Rmdir(r.p("newdir-rm"))
	})
	r.step("mknod-fifo", []string{"fifo"}, func(map[string]any) error { return unix.Mkfifo(r.p("fifo"), 0o644) })
}

// modes creates under other umasks than the probe's 022 (the FUSE server
// must not apply its own on top) and reports mode 0000 (go-fuse would show
// 0644/0755 unless told not to).
func (r *runner) modes() {
	withUmask := func(mask int, f func() error) error {
		old := unix.Umask(mask)
		defer unix.Umask(old)
		return f()
	}
	r.step("umask-002-touch-mkdir", []string{"um2.txt", "um2-dir"}, func(map[string]any) error {
		return withUmask(0o002, func() error {
			fd, err := unix.Open(r.p("um2.txt"), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o666) // as touch does
			if err != nil {
				return err
			}
			unix.Close(fd)
			return unix.Mkdir(r.p("um2-dir"), 0o777)
		})
	})
	r.step("umask-0-create-mkdir-mknod", []string{"um0-0620.txt", "um0-dir", "um0-fifo", "um0-sticky"}, func(map[string]any) error {
		return withUmask(0, func() error {
			fd, err := unix.Open(r.p("um0-0620.txt"), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o620)
			if err != nil {
				return err
			}
			unix.Close(fd)
			if err := unix.Mkdir(r.p("um0-dir"), 0o777); err != nil {
				return err
			}
			if err := unix.Mkfifo(r.p("um0-fifo"), 0o666); err != nil {
				return err
			}
			return unix.Mkdir(r.p("um0-sticky"), 0o1777)
		})
	})
	// Reading or listing a mode-0000 entry depends on who asks (the probe
	// is root in a session, an ordinary user natively), so the step reports
	// lstat modes only and restores the modes before the tree is walked.
	r.step("chmod-0000", nil, func(f map[string]any) error {
		if err := os.WriteFile(r.p("zero.txt"), []byte("zero\n"), 0o644); err != nil {
			return err
		}
		if err := unix.Mkdir(r.p("zero-dir"), 0o755); err != nil {
			return err
		}
		// New upper entries, a copied-up lower file and a lower directory.
		for _, p := range []string{"zero.txt", "zero-dir", "chmod.txt", "dir-lower/sub"} {
			var st unix.Stat_t
			if err := unix.Lstat(r.p(p), &st); err != nil {
				return err
			}
			if err := unix.Chmod(r.p(p), 0); err != nil {
				return err
			}
			var zst unix.Stat_t
			err := unix.Lstat(r.p(p), &zst)
			if rerr := unix.Chmod(r.p(p), st.Mode&0o7777); err == nil {
				err = rerr
			}
			if err != nil {
				return err
			}
			f[p+" mode"] = fmt.Sprintf("%04o", zst.Mode&0o7777)
		}
		return nil
	})
}

// longPaths works below a chain of directories whose path is longer than
// PATH_MAX (pjdfstest */03.t, rename/02): every call is relative to a
// descriptor of a deep directory, as a process working down there would
// make it. The chain is removed again: the final walk uses whole paths.
func (r *runner) longPaths() {
	const depth = 20 // 20 names of 255 bytes: about 5,100 bytes
	r.step("long-path", []string{"deep"}, func(f map[string]any) error {
		if err := unix.Mkdir(r.p("deep"), 0o755); err != nil {
			return err
		}
		fds := []int{}
		defer func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}()
		cur, err := unix.Open(r.p("deep"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		fds = append(fds, cur)
		name := func(i int) string { return fmt.Sprintf("%03d", i) + strings.Repeat("d", 252) }
		for i := range depth {
			if err := unix.Mkdirat(cur, name(i), 0o755); err != nil {
				return fmt.Errorf("mkdir at depth %d: %w", i, err)
			}
			next, err := unix.Openat(cur, name(i), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open at depth %d: %w", i, err)
			}
			fds = append(fds, next)
			cur = next
		}
		fd, err := unix.Openat(cur, "file", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return fmt.Errorf("create at the bottom: %w", err)
		}
		_, err = unix.Write(fd, []byte("deep\n"))
		unix.Close(fd)
		if err != nil {
			return err
		}
		if err := unix.Mkdirat(cur, "sub", 0o755); err != nil {
			return err
		}
		if err := unix.Renameat(cur, "file", cur, "sub/renamed"); err != nil {
			return fmt.Errorf("rename at the bottom: %w", err)
		}
		if err := unix.Symlinkat("sub/renamed", cur, "link"); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstatat(cur, "link", &st, 0); err != nil {
			return fmt.Errorf("stat through a symlink at the bottom: %w", err)
		}
		f["size"] = st.Size
		f["mode"] = fmt.Sprintf("%04o", st.Mode&0o7777)
		names, err := listNames(fmt.Sprintf("/proc/self/fd/%d", cur))
		if err != nil {
			return err
		}
		f["names"] = names
		// Remove bottom-up, each directory relative to its parent's descriptor.
		for _, n := range []string{"sub/renamed", "link"} {
			if err := unix.Unlinkat(cur, n, 0); err != nil {
				return err
			}
		}
		if err := unix.Unlinkat(cur, "sub", unix.AT_REMOVEDIR); err != nil {
			return err
		}
		for i := depth - 1; i >= 0; i-- {
			if err := unix.Unlinkat(fds[i], name(i), unix.AT_REMOVEDIR); err != nil {
				return fmt.Errorf("rmdir at depth %d: %w", i, err)
			}
		}
		return nil
	})
}

func (r *runner) renames() {
	r.step("rename-lower-over-lower", []string{"over-src.txt", "over-dst.txt"}, func(f map[string]any) error {
		before := ino(r.p("over-src.txt"))
		err := unix.Rename(r.p("over-src.txt"), r.p("over-dst.txt"))
		f["ino follows the file"] = before != 0 && before == ino(r.p("over-dst.txt"))
		return err
	})
	r.step("rename-upper-over-upper", []string{"up1", "up2"}, func(map[string]any) error {
		if err := os.WriteFile(r.p("up1"), []byte("up1\n"), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(r.p("up2"), []byte("up2\n"), 0o644); err != nil {
			return err
		}
		return unix.Rename(r.p("up1"), r.p("up2"))
	})
	r.step("rename-across-dirs", []string{"cross", "cross/src.txt", "newdir/moved.txt"}, func(map[string]any) error {
		return unix.Rename(r.p("cross/src.txt"), r.p("newdir/moved.txt"))
	})
	r.step("rename-back-to-whiteout", []string{"cross/src.txt", "newdir/moved.txt"}, func(map[string]any) error {
		return unix.Rename(r.p("newdir/moved.txt"), r.p("cross/src.txt"))
	})
	r.step("rename-file-over-dir", nil, func(map[string]any) error { return unix.Rename(r.p("b.txt"), r.p("dir-lower")) })
	r.step("rename-dir-over-file", nil, func(map[string]any) error { return unix.Rename(r.p("dir-lower"), r.p("b.txt")) })
	r.step("rename-noreplace-existing", nil, func(map[string]any) error {
		return unix.Renameat2(unix.AT_FDCWD, r.p("b.txt"), unix.AT_FDCWD, r.p("a.txt"), unix.RENAME_NOREPLACE)
	})
	r.step("rename-upper-dir", []string{"updir", "updir2", "updir2/sub/f"}, func(map[string]any) error {
		if err := os.MkdirAll(r.p("updir/sub"), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(r.p("updir/sub/f"), []byte("f\n"), 0o644); err != nil {
			return err
		}
		return unix.Rename(r.p("updir"), r.p("updir2"))
	})
	r.step("rename-upper-dir-over-empty-dir", []string{"updir2", "updir3"}, func(map[string]any) error {
		if err := unix.Mkdir(r.p("updir3"), 0o755); err != nil {
			return err
		}
		return unix.Rename(r.p("updir2"), r.p("updir3"))
	})
	r.step("rename-dir-over-nonempty-dir", nil, func(map[string]any) error {
		if err := unix.Mkdir(r.p("updir4"), 0o755); err != nil {
			return err
		}
		err := unix.Rename(r.p("updir4"), r.p("updir3"))
		_ = unix.Rmdir(r.p("updir4"))
		return err
	})
	// A directory with lower content: the overlays refuse with EXDEV (the
	// documented difference); natively it succeeds and is renamed back so the
	// trees stay comparable.
	r.step("rename-lower-dir", nil, func(map[string]any) error {
		err := unix.Rename(r.p("dir-lower"), r.p("dir-lower-renamed"))
		if err == nil {
			if err := unix.Rename(r.p("dir-lower-renamed"), r.p("dir-lower")); err != nil {
				return fmt.Errorf("rename back: %w", err)
			}
		}
		return err
	})
	r.step("rename-merged-dir", nil, func(map[string]any) error {
		err := unix.Rename(r.p("merged"), r.p("merged-renamed"))
		if err == nil {
			if err := unix.Rename(r.p("merged-renamed"), r.p("merged")); err != nil {
				return fmt.Errorf("rename back: %w", err)
			}
		}
		return err
	})
	// coreutils mv falls back to copy+delete on EXDEV.
	r.step("mv-lower-dir", []string{"dir-mv", "dir-mv-moved", "dir-mv-moved/x", "dir-mv-moved/y", "dir-mv-moved/y/z"}, func(f map[string]any) error {
		cmd := exec.Command("mv", r.p("dir-mv"), r.p("dir-mv-moved"))
		out, err := cmd.CombinedOutput()
		if len(out) > 0 {
			f["output"] = string(out)
		}
		return err
	})
	r.step("rename-lower-symlink", []string{"sym-dangling", "sym-moved"}, func(map[string]any) error {
		return unix.Rename(r.p("sym-dangling"), r.p("sym-moved"))
	})
	r.step("rename-same-name", []string{"b.txt"}, func(map[string]any) error { return unix.Rename(r.p("b.txt"), r.p("b.txt")) })
}

func (r *runner) links() {
	r.step("symlink", []string{"newlink"}, func(f map[string]any) error {
		if err := unix.Symlink("newdir", r.p("newlink")); err != nil {
			return err
		}
		st, err := os.Stat(r.p("newlink"))
		if err == nil {
			f["follows to dir"] = st.IsDir()
		}
		return err
	})
	r.step("symlink-existing", nil, func(map[string]any) error { return unix.Symlink("x", r.p("sym-lower")) })
	r.step("hardlink-lower", []string{"b.txt", "b-link.txt"}, func(f map[string]any) error {
		if err := unix.Link(r.p("b.txt"), r.p("b-link.txt")); err != nil {
			return err
		}
		f["same ino"] = ino(r.p("b.txt")) == ino(r.p("b-link.txt"))
		if err := appendTo(r.p("b-link.txt"), []byte("via link\n")); err != nil {
			return err
		}
		data, err := os.ReadFile(r.p("b.txt"))
		f["write via link visible"] = string(data) == "bravo\nvia link\n"
		return err
	})
	r.step("hardlink-upper", []string{"h1", "h2"}, func(f map[string]any) error {
		if err := os.WriteFile(r.p("h1"), []byte("h\n"), 0o644); err != nil {
			return err
		}
		if err := unix.Link(r.p("h1"), r.p("h2")); err != nil {
			return err
		}
		f["same ino"] = ino(r.p("h1")) == ino(r.p("h2"))
		var st unix.Stat_t
		if err := unix.Lstat(r.p("h1"), &st); err != nil {
			return err
		}
		f["nlink h1 after link"] = st.Nlink
		return nil
	})
	r.step("unlink-one-hardlink", []string{"h1", "h2"}, func(map[string]any) error { return unix.Unlink(r.p("h1")) })
	r.step("hardlink-existing", nil, func(map[string]any) error { return unix.Link(r.p("a.txt"), r.p("b.txt")) })
	r.step("hardlink-dir", nil, func(map[string]any) error { return unix.Link(r.p("dir-lower"), r.p("dir-link")) })
}

func (r *runner) xattrs() {
	r.step("setxattr-lower-copyup", []string{"xattr.txt"}, func(f map[string]any) error {
		before := ino(r.p("xattr.txt"))
		err := unix.Setxattr(r.p("xattr.txt"), "user.test", []byte("v1"), 0)
		f["ino same after copy-up"] = before != 0 && before == ino(r.p("xattr.txt"))
		return err
	})
	r.step("setxattr-new-file", []string{"new.txt"}, func(map[string]any) error {
		if err := unix.Setxattr(r.p("new.txt"), "user.a", []byte("1"), 0); err != nil {
			return err
		}
		return unix.Setxattr(r.p("new.txt"), "user.b", []byte("2"), 0)
	})
	r.step("setxattr-dir", []string{"newdir"}, func(map[string]any) error {
		return unix.Setxattr(r.p("newdir"), "user.dir", []byte("d"), 0)
	})
	r.step("setxattr-create-existing", nil, func(map[string]any) error {
		return unix.Setxattr(r.p("xattr.txt"), "user.test", []byte("v2"), unix.XATTR_CREATE)
	})
	r.step("setxattr-replace-missing", nil, func(map[string]any) error {
		return unix.Setxattr(r.p("xattr.txt"), "user.none", []byte("v2"), unix.XATTR_REPLACE)
	})
	r.step("removexattr", []string{"new.txt"}, func(map[string]any) error { return unix.Removexattr(r.p("new.txt"), "user.a") })
	r.step("getxattr-missing", nil, func(map[string]any) error {
		_, err := unix.Getxattr(r.p("new.txt"), "user.a", make([]byte, 64))
		return err
	})
	r.step("getxattr-size-probe", nil, func(f map[string]any) error {
		n, err := unix.Getxattr(r.p("xattr.txt"), "user.test", nil)
		f["size"] = n
		return err
	})
	r.step("xattr-survives-rename", []string{"xattr-renamed.txt"}, func(map[string]any) error {
		return unix.Rename(r.p("xattr.txt"), r.p("xattr-renamed.txt"))
	})
}

func (r *runner) statfsFsyncAppend() {
	r.step("statfs", nil, func(f map[string]any) error {
		var s unix.Statfs_t
		if err := unix.Statfs(r.dir, &s); err != nil {
			return err
		}
		f["bsize > 0"] = s.Bsize > 0
		f["blocks > 0"] = s.Blocks > 0
		f["bavail <= bfree <= blocks"] = s.Bavail <= s.Bfree && s.Bfree <= s.Blocks
		f["namelen >= 255"] = s.Namelen >= 255
		return nil
	})
	r.step("fsync", []string{"fsync.txt"}, func(f map[string]any) error {
		file, err := os.OpenFile(r.p("fsync.txt"), os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		defer file.Close()
		if _, err := file.Write([]byte("synced\n")); err != nil {
			return err
		}
		f["fsync"] = errName(unix.Fsync(int(file.Fd())))
		f["fdatasync"] = errName(unix.Fdatasync(int(file.Fd())))
		d, err := os.Open(r.dir)
		if err != nil {
			return err
		}
		defer d.Close()
		f["fsync dir"] = errName(unix.Fsync(int(d.Fd())))
		return file.Close()
	})
	r.step("fsync-lower-readonly", nil, func(map[string]any) error {
		file, err := os.Open(r.p("ino.txt"))
		if err != nil {
			return err
		}
		defer file.Close()
		return unix.Fsync(int(file.Fd()))
	})
	r.step("append-lower", []string{"append.txt"}, func(f map[string]any) error {
		file, err := os.OpenFile(r.p("append.txt"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		defer file.Close()
		if _, err := file.Write([]byte("line2\n")); err != nil {
			return err
		}
		// pwrite on an O_APPEND descriptor appends on Linux, whatever the offset.
		if _, err := unix.Pwrite(int(file.Fd()), []byte("line3\n"), 0); err != nil {
			return err
		}
		return file.Close()
	})
	r.step("append-two-descriptors", []string{"append2.txt"}, func(map[string]any) error {
		a, err := os.OpenFile(r.p("append2.txt"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		defer a.Close()
		b, err := os.OpenFile(r.p("append2.txt"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		defer b.Close()
		for i := 0; i < 3; i++ {
			if _, err := a.Write([]byte("a\n")); err != nil {
				return err
			}
			if _, err := b.Write([]byte("b\n")); err != nil {
				return err
			}
		}
		return nil
	})
}

func (r *runner) sparseAndMmap() {
	const hole = 8 << 20
	r.step("sparse-write-past-end", []string{"sparse.bin"}, func(f map[string]any) error {
		file, err := os.OpenFile(r.p("sparse.bin"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		defer file.Close()
		if _, err := file.WriteAt([]byte{'E'}, hole); err != nil {
			return err
		}
		return sparseFacts(file, hole+1, f)
	})
	r.step("sparse-ftruncate-extend", []string{"sparse2.bin"}, func(f map[string]any) error {
		file, err := os.OpenFile(r.p("sparse2.bin"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		defer file.Close()
		if err := file.Truncate(2 * hole); err != nil {
			return err
		}
		return sparseFacts(file, 2*hole, f)
	})
	r.step("mmap-write-new-file", []string{"mmap-new.bin"}, func(f map[string]any) error {
		return mmapWrite(r.p("mmap-new.bin"), os.O_RDWR|os.O_CREATE, 8192, f)
	})
	r.step("mmap-write-lower-copyup", []string{"mmap.txt"}, func(f map[string]any) error {
		before := ino(r.p("mmap.txt"))
		err := mmapWrite(r.p("mmap.txt"), os.O_RDWR, 0, f)
		f["ino same after copy-up"] = before != 0 && before == ino(r.p("mmap.txt"))
		return err
	})
}

func sparseFacts(file *os.File, size int64, f map[string]any) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(file.Fd()), &st); err != nil {
		return err
	}
	f["size"] = st.Size
	f["allocated < size"] = st.Blocks*512 < st.Size
	buf := make([]byte, 4096)
	if _, err := file.ReadAt(buf, size/2); err != nil {
		return err
	}
	f["hole reads zeros"] = bytes.Count(buf, []byte{0}) == len(buf)
	return nil
}

// mmapWrite maps the file shared, writes through the mapping and checks that
// read(2) on another descriptor sees the bytes, before and after msync.
func mmapWrite(path string, flags int, size int64, f map[string]any) error {
	file, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return err
	}
	defer file.Close()
	if size > 0 {
		if err := file.Truncate(size); err != nil {
			return err
		}
	}
	st, err := file.Stat()
	if err != nil {
		return err
	}
	m, err := unix.Mmap(int(file.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	copy(m[4096:], "written through mmap")
	check := func() bool {
		other, err := os.Open(path)
		if err != nil {
			return false
		}
		defer other.Close()
		buf := make([]byte, 20)
		_, err = other.ReadAt(buf, 4096)
		return err == nil && string(buf) == "written through mmap"
	}
	f["visible to read before msync"] = check()
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		_ = unix.Munmap(m)
		return err
	}
	f["visible to read after msync"] = check()
	if err := unix.Munmap(m); err != nil {
		return err
	}
	return file.Close()
}

func (r *runner) inodes() {
	r.step("inode-stability", []string{"ino.txt", "merged"}, func(f map[string]any) error {
		file, dir := r.p("ino.txt"), r.p("merged")
		i1, d1 := ino(file), ino(dir)
		f["stable across lookups"] = i1 != 0 && i1 == ino(file)
		f["readdir d_ino == st_ino (lower)"] = direntIno(r.dir, "ino.txt") == i1
		if err := appendTo(file, []byte("more\n")); err != nil {
			return err
		}
		f["file ino same after copy-up"] = ino(file) == i1
		f["readdir d_ino == st_ino (copied up)"] = direntIno(r.dir, "ino.txt") == ino(file)
		if err := os.WriteFile(filepath.Join(dir, "sub", "x"), []byte("x\n"), 0o644); err != nil {
			return err
		}
		f["dir ino same after copy-up"] = ino(dir) == d1
		f["distinct inos"] = ino(file) != ino(r.p("a.txt")) && ino(r.p("a.txt")) != ino(r.p("b.txt"))
		return nil
	})
}

func (r *runner) openUnlinked() {
	for _, tc := range []struct{ name, path string }{
		{"unlink-open-lower-file", "open-unlink.txt"},
		{"unlink-open-new-file", "open-unlink-new.txt"},
	} {
		r.step(tc.name, []string{tc.path}, func(f map[string]any) error {
			path := r.p(tc.path)
			file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				return err
			}
			defer file.Close()
			if err := unix.Unlink(path); err != nil {
				return err
			}
			var st unix.Stat_t
			if err := unix.Fstat(int(file.Fd()), &st); err != nil {
				return fmt.Errorf("fstat: %w", err)
			}
			f["nlink after unlink"] = st.Nlink
			if _, err := file.WriteAt([]byte("written after unlink\n"), st.Size); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			data := make([]byte, st.Size+21)
			n, err := file.ReadAt(data, 0)
			if err != nil && n != len(data) {
				return fmt.Errorf("read: %w", err)
			}
			f["content via fd"] = string(data[:n])
			if err := file.Truncate(5); err != nil {
				return fmt.Errorf("ftruncate: %w", err)
			}
			if err := unix.Fstat(int(file.Fd()), &st); err != nil {
				return err
			}
			f["size after ftruncate"] = st.Size
			return file.Close()
		})
	}
}

// concurrentReaddir: writers create files in a merged directory while a
// reader lists it repeatedly. Every listing must hold the lower files, no
// duplicates, only names that were created, and every name whose create
// returned before the listing started.
func (r *runner) concurrentReaddir() {
	lower := []string{"base-0", "base-1", "base-2"}
	r.racingReaddir("readdir-under-concurrent-creates", "concurrent", "w", lower)
	r.racingReaddir("readdir-under-concurrent-creates-upper-dir", "concurrent-new", "w", nil)
	// A second round in the same merged directory, now with 400 upper entries.
	r.racingReaddir("readdir-under-concurrent-creates-again", "concurrent", "x", append(lower, names("w", 4, 100)...))
}

func names(prefix string, writers, perWriter int) []string {
	var out []string
	for w := 0; w < writers; w++ {
		for i := 0; i < perWriter; i++ {
			out = append(out, fmt.Sprintf("%s%d-%03d", prefix, w, i))
		}
	}
	return out
}

func (r *runner) racingReaddir(step, rel, prefix string, base []string) {
	const writers, perWriter = 4, 100
	r.step(step, []string{rel}, func(f map[string]any) error {
		dir := r.p(rel)
		if base == nil {
			if err := unix.Mkdir(dir, 0o755); err != nil {
				return err
			}
		}
		var mu sync.Mutex
		done := map[string]bool{}
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < perWriter; i++ {
					name := fmt.Sprintf("%s%d-%03d", prefix, w, i)
					if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
						errs <- err
						return
					}
					mu.Lock()
					done[name] = true
					mu.Unlock()
				}
			}(w)
		}
		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
		listings, consistent := 0, true
		var problem string
		for {
			stop := false
			select {
			case <-finished:
				stop = true
			default:
			}
			mu.Lock()
			before := make([]string, 0, len(done))
			for n := range done {
				before = append(before, n)
			}
			mu.Unlock()
			names, err := listNames(dir)
			listings++
			if err != nil {
				consistent = false
				problem = cmp.Or(problem, err.Error())
			} else {
				set := map[string]bool{}
				for _, n := range names {
					set[n] = true
					if !slices.Contains(base, n) && !strings.HasPrefix(n, prefix) {
						consistent = false
						problem = cmp.Or(problem, "unexpected name "+n)
					}
				}
				for _, n := range append(before, base...) {
					if !set[n] {
						consistent = false
						problem = cmp.Or(problem, "listing misses "+n)
					}
				}
			}
			if stop {
				break
			}
		}
		close(errs)
		for err := range errs {
			return err
		}
		f["every listing consistent"] = consistent
		if problem != "" {
			f["first problem"] = problem
		}
		f["several listings"] = listings > 1
		names, err := listNames(dir)
		f["final count"] = len(names)
		return err
	})
}

// ---------------------------------------------------------------- another uid

// otherPaths are what the other user tries, with what it tries.
var otherPaths = []struct{ path, how string }{
	{"open.txt", "open"},      // the control: mode 0644, readable by all
	{"zero.txt", "open"},      // mode 0000
	{"zdir", "opendir"},       // mode 0000
	{"zdir/in.txt", "open"},   // 0644, but in a mode-0000 directory
	{"zdir/in.txt", "stat"},   // search permission is needed for stat too
	{"zero.txt", "write"},     // mode 0000, for writing
	{"rdir/in.txt", "unlink"}, // a directory of mode 0555 (no write)
}

// otherUID makes DIR with mode-0000 entries, has another user try them, and
// writes {"modes": the lstat modes, "other": path how → result} to OUT.
func otherUID(dir, out string) error {
	if err := os.MkdirAll(filepath.Join(dir, "zdir"), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "rdir"), 0o755); err != nil {
		return err
	}
	for p, m := range map[string]os.FileMode{"open.txt": 0o644, "zero.txt": 0o644, "zdir/in.txt": 0o644, "rdir/in.txt": 0o644} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(p+"\n"), m); err != nil {
			return err
		}
	}
	modes := map[string]uint32{"zero.txt": 0, "zdir": 0, "rdir": 0o555, ".": 0o755}
	for p, m := range modes {
		if err := os.Chmod(filepath.Join(dir, p), os.FileMode(m)); err != nil {
			return err
		}
	}
	// Restored afterwards, so the tree can be removed.
	defer func() {
		_ = os.Chmod(filepath.Join(dir, "zdir"), 0o755)
		_ = os.Chmod(filepath.Join(dir, "rdir"), 0o755)
	}()
	rep := map[string]any{}
	got := map[string]string{}
	for p := range modes {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, p), &st); err != nil {
			return err
		}
		got[p] = fmt.Sprintf("%04o", st.Mode&0o7777)
	}
	rep["modes"] = got
	self, err := os.Executable()
	if err != nil {
		return err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	var cmd *exec.Cmd
	if u := os.Getenv("FSSEM_OTHER_SUDO"); u != "" {
		cmd = exec.Command("sudo", "-n", "-u", u, self, "access", abs)
	} else {
		cmd = exec.Command(self, "access", abs)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("run the other user's side: %w", err)
	}
	var other map[string]string
	if err := json.Unmarshal(stdout.Bytes(), &other); err != nil {
		return fmt.Errorf("other user's report %q: %w", stdout.String(), err)
	}
	rep["other"] = other
	data, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

// access is the other user's side: it tries each of otherPaths in DIR and
// prints "path how" → result as JSON.
func access(dir string) error {
	res := map[string]string{"not root": fmt.Sprint(os.Getuid() != 0)}
	for _, c := range otherPaths {
		p := filepath.Join(dir, c.path)
		var err error
		switch c.how {
		case "open", "opendir", "write":
			flags := unix.O_RDONLY
			if c.how == "write" {
				flags = unix.O_WRONLY
			}
			var fd int
			fd, err = unix.Open(p, flags|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(fd)
			}
		case "stat":
			var st unix.Stat_t
			err = unix.Lstat(p, &st)
		case "unlink":
			err = unix.Unlink(p)
		}
		res[c.path+" "+c.how] = errName(err)
	}
	data, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(data)
	return err
}
