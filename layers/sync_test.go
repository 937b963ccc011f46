package layers

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// sessionView is what a session sees after a sync: the upper dir as the
// top layer over the chain of m (the same merge rules as the overlays).
func sessionView(s *Stack, m Manifest, upper string) *View {
	v := s.View(m)
	top := viewLayer{id: "upper", root: upper, mu: &sync.Mutex{}, dirs: map[string]probeResult{}}
	v.layers = append([]viewLayer{top}, v.layers...)
	return v
}

func sessionTree(t *testing.T, v *View) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(string)
	walk = func(rel string) {
		es, err := v.ReadDir(rel)
		if err != nil {
			t.Fatalf("ReadDir(%q): %v", rel, err)
		}
		for _, e := range es {
			switch e.Kind {
			case KindDir:
				out[e.Path] = fmt.Sprintf("dir %o", e.Mode)
				walk(e.Path)
			case KindFile:
				out[e.Path] = fmt.Sprintf("file %o %s", e.Mode, readString(t, v, e.Path))
			case KindSymlink:
				out[e.Path] = "symlink " + e.Target
			default:
				out[e.Path] = "other"
			}
		}
	}
	walk("")
	return out
}

// dirState records a host tree exactly: kind, mode, content or target,
// rdev, xattrs, times and inode sharing (hard links), by relative path.
func dirState(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	inodes := map[uint64]string{}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("mode %o rdev %d mtime %d.%09d", st.Mode, st.Rdev, st.Mtim.Sec, st.Mtim.Nsec)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %q", data)
			if st.Nlink > 1 {
				if first, ok := inodes[st.Ino]; ok {
					desc += " link-of " + first
				} else {
					inodes[st.Ino] = rel
				}
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			buf := make([]byte, 4096)
			n, err := unix.Llistxattr(p, buf)
			if err != nil && !errors.Is(err, unix.ENOTSUP) {
				return err
			}
			names := strings.Split(string(buf[:max(n, 0)]), "\x00")
			slices.Sort(names)
			for _, a := range names {
				if !strings.HasPrefix(a, "user.") {
					continue
				}
				vb := make([]byte, 256)
				m, err := unix.Lgetxattr(p, a, vb)
				if err != nil {
					return err
				}
				desc += fmt.Sprintf(" %s=%q", a, vb[:m])
			}
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("state of %s: %v", root, err)
	}
	return out
}

// syncFixture is stdStack with a session upper made over the head, then
// another agent's changes published.
type syncFixture struct {
	s            *Stack
	base, target Manifest
	upper        string
}

func newSyncFixture(t *testing.T, session func(upper string), head ...Change) *syncFixture {
	t.Helper()
	s := stdStack(t)
	base := mustHead(t, s)
	upper := filepath.Join(tempDir(t), "sess", "upper")
	mkdir(t, upper, 0o755)
	session(upper)
	target := base
	if len(head) > 0 {
		target = advance(t, s, head...)
	}
	return &syncFixture{s: s, base: base, target: target, upper: upper}
}

func (f *syncFixture) sync(opt SyncOptions) (*Plan, SyncResult, error) {
	opt.Base, opt.Target, opt.Upper = f.base, f.target, f.upper
	return f.s.SyncUpper(context.Background(), opt)
}

// leftovers lists the sync's staging and journal names beside the upper.
func leftovers(t *testing.T, upper string) []string {
	t.Helper()
	names, err := os.ReadDir(filepath.Dir(upper))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if n.Name() != filepath.Base(upper) {
			out = append(out, n.Name())
		}
	}
	return out
}

func TestSyncUpper(t *testing.T) {
	requireOverlayFormat(t)
	const multiHead = "1 head\n2\n3\n4\n5\n6\n7\n"
	cases := []struct {
		name    string
		session func(t *testing.T, upper string)
		head    []Change
		opt     SyncOptions
		want    map[string]string // path → state in the session's view after the sync ("" = absent)
		upper   map[string]bool   // path → present in the new upper
		outcome map[string]string // plan path → outcome
	}{
		{
			name: "head-only changes show, session-only changes stay",
			session: func(t *testing.T, u string) {
				writeFile(t, filepath.Join(u, "src", "new.go"), "package new\n", 0o644)
				writeFile(t, filepath.Join(u, "README.md"), "session readme\n", 0o644)
			},
			head: []Change{pwrite("src/lib/head.go", "package head\n"), pwrite("docs/a.md", "a head\n"), pdel("docs/b.md")},
			want: map[string]string{
				"src/lib/head.go": "file 644 package head\n", "docs/a.md": "file 644 a head\n", "docs/b.md": "",
				"src/new.go": "file 644 package new\n", "README.md": "file 644 session readme\n",
			},
			upper:   map[string]bool{"src/new.go": true, "README.md": true, "src/lib/head.go": false, "docs": false},
			outcome: map[string]string{"src/new.go": OutcomeUnchangedHead, "README.md": OutcomeUnchangedHead},
		},
		{
			name: "the session's git-private and git-protected files stay as they are",
			session: func(t *testing.T, u string) {
				writeFile(t, filepath.Join(u, ".git", "config"), "[core]\n\tfsmonitor = x\n", 0o644)
				writeFile(t, filepath.Join(u, ".git", "index"), "DIRC session\n", 0o644)
				writeFile(t, filepath.Join(u, ".git", "hooks", "pre-commit"), "#!/bin/sh\n", 0o755)
			},
			head: []Change{pwrite("README.md", "hello from head\n")},
			want: map[string]string{".git/config": "file 644 [core]\n\tfsmonitor = x\n", ".git/index": "file 644 DIRC session\n",
				".git/hooks/pre-commit": "file 755 #!/bin/sh\n", "README.md": "file 644 hello from head\n"},
			upper: map[string]bool{".git/config": true, ".git/index": true, ".git/hooks/pre-commit": true},
			outcome: map[string]string{".git/config": OutcomeGitProtected, ".git/index": OutcomeGitPrivate,
				".git/hooks/pre-commit": OutcomeGitProtected},
		},
		{
			name: "both changed merge by lines",
			session: func(t *testing.T, u string) {
				writeFile(t, filepath.Join(u, "multi.txt"), "1\n2\n3\n4\n5\n6\n7 session\n", 0o644)
			},
			head:    []Change{pwrite("multi.txt", multiHead)},
			want:    map[string]string{"multi.txt": "file 644 1 head\n2\n3\n4\n5\n6\n7 session\n"},
			upper:   map[string]bool{"multi.txt": true},
			outcome: map[string]string{"multi.txt": OutcomeMerged},
		},
		{
			name: "a copy-up of an unchanged file no longer hides the head's edit",
			session: func(t *testing.T, u string) {
				writeFile(t, filepath.Join(u, "README.md"), "hello\n", 0o644)
			},
			head:  []Change{pwrite("README.md", "hello from head\n")},
			want:  map[string]string{"README.md": "file 644 hello from head\n"},
			upper: map[string]bool{"README.md": false},
		},
		{
			name: "a whiteout over a path the head did not change stays",
			session: func(t *testing.T, u string) {
				mkdir(t, filepath.Join(u, "docs"), 0o755)
				chardev00(t, filepath.Join(u, "docs", "a.md"))
			},
			head:  []Change{pwrite("docs/b.md", "b head\n")},
			want:  map[string]string{"docs/a.md": "", "docs/b.md": "file 644 b head\n"},
			upper: map[string]bool{"docs/a.md": true},
		},
		{
			name: "a whiteout over a path the head also deleted",
			session: func(t *testing.T, u string) {
				mkdir(t, filepath.Join(u, "docs"), 0o755)
				chardev00(t, filepath.Join(u, "docs", "a.md"))
			},
			head:    []Change{pdel("docs/a.md")},
			want:    map[string]string{"docs/a.md": "", "docs/b.md": "file 644 b\n"},
			outcome: map[string]string{"docs/a.md": OutcomeMerged},
		},
		{
			name: "a whiteout over a path the head changed, resolved theirs",
			session: func(t *testing.T, u string) {
				mkdir(t, filepath.Join(u, "docs"), 0o755)
				chardev00(t, filepath.Join(u, "docs", "a.md"))
			},
			head:    []Change{pwrite("docs/a.md", "a head\n")},
			opt:     SyncOptions{Resolutions: map[string]Strategy{"docs/a.md": StrategyTheirs}},
			want:    map[string]string{"docs/a.md": "file 644 a head\n"},
			upper:   map[string]bool{"docs/a.md": false},
			outcome: map[string]string{"docs/a.md": OutcomeTheirs},
		},
		{
			name: "a whiteout over a path the head changed, resolved ours",
			session: func(t *testing.T, u string) {
				mkdir(t, filepath.Join(u, "docs"), 0o755)
				chardev00(t, filepath.Join(u, "docs", "a.md"))
			},
			head:    []Change{pwrite("docs/a.md", "a head\n")},
			opt:     SyncOptions{Resolutions: map[string]Strategy{"docs/a.md": StrategyOurs}},
			want:    map[string]string{"docs/a.md": ""},
			upper:   map[string]bool{"docs/a.md": true},
			outcome: map[string]string{"docs/a.md": OutcomeOurs},
		},
		{
			name: "an overlapping edit resolved ours keeps the session's file",
			session: func(t *testing.T, u string) {
				writeFile(t, filepath.Join(u, "multi.txt"), "1 session\n2\n3\n4\n5\n6\n7\n", 0o644)
			},
			head:    []Change{pwrite("multi.txt", multiHead)},
			opt:     SyncOptions{Resolutions: map[string]Strategy{"multi.txt": StrategyOurs}},
			want:    map[string]string{"multi.txt": "file 644 1 session\n2\n3\n4\n5\n6\n7\n"},
			outcome: map[string]string{"multi.txt": OutcomeOurs},
		},
		{
			name: "an overlapping edit resolved theirs by default strategy takes the head's",
			session: func(t *testing.T, u string) {
				writeFile(t, filepath.Join(u, "multi.txt"), "1 session\n2\n3\n4\n5\n6\n7\n", 0o644)
				writeFile(t, filepath.Join(u, "mine.txt"), "mine\n", 0o600)
			},
			head:    []Change{pwrite("multi.txt", multiHead)},
			opt:     SyncOptions{DefaultStrategy: StrategyTheirs},
			want:    map[string]string{"multi.txt": "file 644 " + multiHead, "mine.txt": "file 600 mine\n"},
			upper:   map[string]bool{"multi.txt": false, "mine.txt": true},
			outcome: map[string]string{"multi.txt": OutcomeTheirs},
		},
		{
			name: "an opaque directory stays opaque; the head's change elsewhere shows",
			session: func(t *testing.T, u string) {
				mkdir(t, filepath.Join(u, "docs"), 0o755)
				setx(t, filepath.Join(u, "docs"), "user.overlay.opaque", "y")
				writeFile(t, filepath.Join(u, "docs", "only.md"), "only\n", 0o644)
			},
			head: []Change{pwrite("src/lib/head.go", "package head\n")},
			want: map[string]string{"docs/a.md": "", "docs/b.md": "", "docs/only.md": "file 644 only\n",
				"src/lib/head.go": "file 644 package head\n"},
		},
		{
			name: "a FIFO of the session is carried over",
			session: func(t *testing.T, u string) {
				if err := unix.Mkfifo(filepath.Join(u, "pipe"), 0o640); err != nil {
					t.Fatal(err)
				}
			},
			head:  []Change{pwrite("docs/a.md", "a head\n")},
			want:  map[string]string{"pipe": "other", "docs/a.md": "file 644 a head\n"},
			upper: map[string]bool{"pipe": true},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newSyncFixture(t, func(u string) { tc.session(t, u) }, tc.head...)
			plan, res, err := f.sync(tc.opt)
			if err != nil {
				t.Fatalf("SyncUpper: %v", err)
			}
			if res.Revision != f.target.Revision() || plan.Rejection != nil {
				t.Errorf("result %+v, rejection %+v", res, plan.Rejection)
			}
			for p, o := range tc.outcome {
				if got := planPath(t, plan, p).Outcome; got != o {
					t.Errorf("plan %s: outcome %q, want %q", p, got, o)
				}
			}
			if err := CompleteSync(f.upper); err != nil {
				t.Fatalf("CompleteSync: %v", err)
			}
			if l := leftovers(t, f.upper); len(l) != 0 {
				t.Errorf("left beside the upper: %v", l)
			}
			got := sessionTree(t, sessionView(f.s, f.target, f.upper))
			for p, w := range tc.want {
				if got[p] != w {
					t.Errorf("session view %s: %q, want %q", p, got[p], w)
				}
			}
			for p, present := range tc.upper {
				_, err := os.Lstat(filepath.Join(f.upper, p))
				if (err == nil) != present {
					t.Errorf("new upper %s: present %v, want %v", p, err == nil, present)
				}
			}
		})
	}
}

func TestSyncUpperWhiteoutEncodings(t *testing.T) {
	requireOverlayFormat(t)
	// The new upper keeps a whiteout as the kernel reads it: a 0:0
	// character device.
	f := newSyncFixture(t, func(u string) {
		writeFile(t, filepath.Join(u, "README.md"), "", 0o600)
		setx(t, filepath.Join(u, "README.md"), "user.overlay.whiteout", "y")
	}, pwrite("docs/a.md", "a head\n"))
	if _, _, err := f.sync(SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(f.upper, "README.md"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("README.md in the new upper: mode %o rdev %d, want a 0:0 character device", st.Mode, st.Rdev)
	}
}

func TestSyncUpperRejectsAllConflicts(t *testing.T) {
	requireOverlayFormat(t)
	session := func(u string) {
		writeFile(t, filepath.Join(u, "multi.txt"), "1 session\n2\n3\n4\n5\n6\n7\n", 0o644)
		mkdir(t, filepath.Join(u, "docs"), 0o755)
		chardev00(t, filepath.Join(u, "docs", "a.md"))
		writeFile(t, filepath.Join(u, "src", "main.go"), "package session\n", 0o644)
		writeFile(t, filepath.Join(u, "fine.txt"), "fine\n", 0o644)
	}
	head := []Change{pwrite("multi.txt", "1 head\n2\n3\n4\n5\n6\n7\n"), pwrite("docs/a.md", "a head\n"),
		pwrite("src/main.go", "package head\n")}
	for _, dry := range []bool{false, true} {
		t.Run(fmt.Sprintf("dry_run=%v", dry), func(t *testing.T) {
			f := newSyncFixture(t, session, head...)
			before := dirState(t, filepath.Dir(f.upper))
			plan, _, err := f.sync(SyncOptions{DryRun: dry})
			var rej *Rejection
			if dry {
				if err != nil {
					t.Fatalf("dry run: %v", err)
				}
				rej = plan.Rejection
			} else if !errors.As(err, &rej) {
				t.Fatalf("SyncUpper: %v, want a *Rejection", err)
			}
			if rej == nil || rej.Reason != RejectSourceConflict {
				t.Fatalf("rejection %+v", rej)
			}
			var paths []string
			for _, c := range rej.Conflicts {
				paths = append(paths, c.Path)
			}
			if want := []string{"docs/a.md", "multi.txt", "src/main.go"}; !reflect.DeepEqual(paths, want) {
				t.Errorf("rejected paths %v, want %v", paths, want)
			}
			if got := planPath(t, plan, "docs/a.md").ConflictReason; got != ConflictReasonDeleteModify {
				t.Errorf("docs/a.md conflict reason %q", got)
			}
			if got := dirState(t, filepath.Dir(f.upper)); !reflect.DeepEqual(got, before) {
				t.Errorf("the session dir changed\n got %v\nwant %v", got, before)
			}
		})
	}
}

func TestSyncUpperDryRun(t *testing.T) {
	requireOverlayFormat(t)
	f := newSyncFixture(t, func(u string) {
		writeFile(t, filepath.Join(u, "multi.txt"), "1\n2\n3\n4\n5\n6\n7 session\n", 0o644)
		writeFile(t, filepath.Join(u, "new.txt"), "new\n", 0o644)
	}, pwrite("multi.txt", "1 head\n2\n3\n4\n5\n6\n7\n"))
	before := dirState(t, filepath.Dir(f.upper))
	plan, res, err := f.sync(SyncOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !plan.WouldCommit || !res.Changed || plan.HeadRevision != f.target.Revision() || plan.BaseRevision != f.base.Revision() {
		t.Errorf("dry-run plan %+v, result %+v", plan, res)
	}
	wantOutcome(t, plan, "multi.txt", OutcomeMerged, "")
	wantOutcome(t, plan, "new.txt", OutcomeUnchangedHead, "")
	if got := dirState(t, filepath.Dir(f.upper)); !reflect.DeepEqual(got, before) {
		t.Errorf("dry run changed the session dir\n got %v\nwant %v", got, before)
	}
	if _, _, err := f.sync(SyncOptions{Resolutions: map[string]Strategy{"nope": StrategyOurs}}); !errors.As(err, new(*ResolutionError)) {
		t.Errorf("unknown resolution path: %v", err)
	}
	if got := dirState(t, filepath.Dir(f.upper)); !reflect.DeepEqual(got, before) {
		t.Errorf("an invalid resolution changed the session dir")
	}
}

// TestSyncUpperCrash injects a crash after each step: the upper's name
// holds the old or the new tree whole, RecoverSync says which and leaves
// nothing else beside it.
func TestSyncUpperCrash(t *testing.T) {
	requireOverlayFormat(t)
	session := func(u string) {
		writeFile(t, filepath.Join(u, "multi.txt"), "1\n2\n3\n4\n5\n6\n7 session\n", 0o644)
		writeFile(t, filepath.Join(u, "README.md"), "hello\n", 0o644) // a copy-up the sync drops
	}
	head := []Change{pwrite("multi.txt", "1 head\n2\n3\n4\n5\n6\n7\n"), pwrite("README.md", "hello head\n")}
	// The state the new upper has, from a sync without a crash.
	ref := newSyncFixture(t, session, head...)
	if _, _, err := ref.sync(SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := CompleteSync(ref.upper); err != nil {
		t.Fatal(err)
	}
	wantNew := sessionTree(t, sessionView(ref.s, ref.target, ref.upper))

	cases := []struct {
		step      syncStep
		found     bool
		synced    bool
		completed bool // CompleteSync instead of a crash
		aborted   bool // AbortSync after the exchange
	}{
		{step: syncStepBuilt},
		{step: syncStepJournaled, found: true},
		{step: syncStepExchanged, found: true, synced: true},
		{completed: true, synced: true},
		{aborted: true},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("step=%d completed=%v aborted=%v", tc.step, tc.completed, tc.aborted), func(t *testing.T) {
			f := newSyncFixture(t, session, head...)
			oldState := dirState(t, f.upper)
			f.s.syncHook = func(st syncStep) bool { return st == tc.step }
			_, _, err := f.sync(SyncOptions{})
			if tc.step != 0 {
				if !errors.Is(err, errSimulatedCrash) {
					t.Fatalf("SyncUpper: %v, want the simulated crash", err)
				}
				if _, _, err := f.sync(SyncOptions{}); !errors.Is(err, ErrSyncPending) {
					t.Errorf("a second sync before recovery: %v, want ErrSyncPending", err)
				}
				rec, err := RecoverSync(f.upper)
				if err != nil {
					t.Fatalf("RecoverSync: %v", err)
				}
				if rec.Found != tc.found || rec.Synced != tc.synced {
					t.Errorf("recovery %+v, want found %v synced %v", rec, tc.found, tc.synced)
				}
				if tc.found && (rec.Base.Revision() != f.base.Revision() || rec.Target.Revision() != f.target.Revision()) {
					t.Errorf("recovery manifests %v %v", rec.Base.Revision(), rec.Target.Revision())
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if tc.completed {
					err = CompleteSync(f.upper)
				} else {
					err = AbortSync(f.upper)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if l := leftovers(t, f.upper); len(l) != 0 {
				t.Errorf("left beside the upper: %v", l)
			}
			if tc.synced {
				if got := sessionTree(t, sessionView(f.s, f.target, f.upper)); !reflect.DeepEqual(got, wantNew) {
					t.Errorf("after recovery\n got %v\nwant %v", got, wantNew)
				}
			} else if got := dirState(t, f.upper); !reflect.DeepEqual(got, oldState) {
				t.Errorf("the old upper changed\n got %v\nwant %v", got, oldState)
			}
			// Settled: syncing again works.
			f.s.syncHook = nil
			if !tc.synced {
				if _, _, err := f.sync(SyncOptions{}); err != nil {
					t.Errorf("sync after recovery: %v", err)
				}
			}
		})
	}
}

func TestCopyUpper(t *testing.T) {
	requireOverlayFormat(t)
	src := filepath.Join(tempDir(t), "upper")
	mkdir(t, src, 0o751)
	writeFile(t, filepath.Join(src, "a.txt"), "alpha\n", 0o640)
	writeFile(t, filepath.Join(src, "bin", "tool"), "#!/bin/sh\n", 0o755)
	chmodRaw(t, filepath.Join(src, "bin", "tool"), 0o4755)
	if err := os.Link(filepath.Join(src, "a.txt"), filepath.Join(src, "bin", "a-link")); err != nil {
		t.Fatal(err)
	}
	symlink(t, "../a.txt", filepath.Join(src, "bin", "rel-link"))
	symlink(t, "/etc/passwd", filepath.Join(src, "abs-link"))
	chardev00(t, filepath.Join(src, "gone"))
	writeFile(t, filepath.Join(src, "gone-x"), "", 0o600)
	setx(t, filepath.Join(src, "gone-x"), "user.overlay.whiteout", "y")
	mkdir(t, filepath.Join(src, "opq"), 0o700)
	setx(t, filepath.Join(src, "opq"), "user.overlay.opaque", "y")
	writeFile(t, filepath.Join(src, "opq", "in"), "in\n", 0o644)
	setx(t, filepath.Join(src, "opq", "in"), "user.note", "kept")
	mkdir(t, filepath.Join(src, "tmp"), 0o777)
	chmodRaw(t, filepath.Join(src, "tmp"), 0o1777)
	if err := unix.Mkfifo(filepath.Join(src, "tmp", "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(src, "tmp", "sock"))
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	mkdir(t, filepath.Join(src, "empty"), 0o500)
	// Distinct times, set last (children first), so a copy that drops
	// them shows.
	for i, p := range []string{"a.txt", "bin/tool", "bin/rel-link", "gone", "opq/in", "opq", "tmp/fifo", "tmp", "empty", "bin", "."} {
		ts := unix.NsecToTimespec(int64(1_600_000_000+i*1000)*1e9 + int64(i))
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(src, p), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
	want := dirState(t, src)

	dst := filepath.Join(tempDir(t), "fork")
	if err := CopyUpper(context.Background(), src, dst); err != nil {
		t.Fatalf("CopyUpper: %v", err)
	}
	if got := dirState(t, dst); !reflect.DeepEqual(got, want) {
		for p := range want {
			if got[p] != want[p] {
				t.Errorf("%s:\n got %s\nwant %s", p, got[p], want[p])
			}
		}
		for p := range got {
			if _, ok := want[p]; !ok {
				t.Errorf("%s: extra in the copy", p)
			}
		}
	}

	// Independent: writing the copy leaves the source as it was.
	if err := os.WriteFile(filepath.Join(dst, "a.txt"), []byte("changed\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dst, "opq", "in")); err != nil {
		t.Fatal(err)
	}
	if got := dirState(t, src); !reflect.DeepEqual(got, want) {
		t.Errorf("the source changed with the copy")
	}
	if data, _ := os.ReadFile(filepath.Join(dst, "bin", "a-link")); string(data) != "changed\n" {
		t.Errorf("the copy's hard link: %q, want the linked file's new content", data)
	}

	// Refusals: an existing destination, a symlink as the source, a path
	// through a symlink; none leaves anything behind.
	if err := CopyUpper(context.Background(), src, dst); !errors.Is(err, fs.ErrExist) {
		t.Errorf("existing destination: %v", err)
	}
	linkDir := filepath.Join(tempDir(t), "link")
	symlink(t, src, linkDir)
	dst2 := filepath.Join(tempDir(t), "fork2")
	if err := CopyUpper(context.Background(), linkDir, dst2); err == nil {
		t.Errorf("a symlinked source was followed")
	}
	if _, err := os.Lstat(dst2); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused copy left %s: %v", dst2, err)
	}
}
