package layers

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// viewDump renders a merged view: every path with kind, mode, content or
// target, in walk order.
func viewDump(t *testing.T, v *View) string {
	t.Helper()
	var b strings.Builder
	var walk func(dir string)
	walk = func(dir string) {
		es, err := v.ReadDir(dir)
		if err != nil {
			t.Fatalf("readdir %q: %v", dir, err)
		}
		for _, e := range es {
			fmt.Fprintf(&b, "%s %s %o", e.Path, e.Kind, e.Mode.Perm())
			switch e.Kind {
			case KindFile:
				fmt.Fprintf(&b, " %q", readString(t, v, e.Path))
			case KindSymlink:
				fmt.Fprintf(&b, " -> %s", e.Target)
			}
			b.WriteByte('\n')
			if e.Kind == KindDir {
				walk(e.Path)
			}
		}
	}
	walk("")
	return b.String()
}

func del(p string) Change { return Change{Kind: ChangeDelete, Path: p} }
func mkd(p string, mode fs.FileMode) Change {
	return Change{Kind: ChangeDirectory, Path: p, Mode: mode}
}
func opq(p string) Change         { return Change{Kind: ChangeOpaqueDir, Path: p, Mode: 0o755} }
func sym(p, target string) Change { return Change{Kind: ChangeSymlink, Path: p, Target: target} }

func TestSquashKeepsTheMergedView(t *testing.T) {
	cases := []struct {
		name    string
		history [][]Change
		// lease pins the head after this many publishes (0: no lease).
		leaseAfter int
		// wantBlocks is the number of blocks squashed.
		wantBlocks int
		// absent paths must stay absent, present ones present.
		absent, present []string
		// notInLayer: names the S layer must not hold at all (whiteouts
		// of names nothing below the block shows).
		notInLayer []string
	}{
		{name: "rewrites of one file", history: [][]Change{
			{write("README.md", "1\n", 0o644)}, {write("README.md", "2\n", 0o600)}, {write("new.txt", "n\n", 0o644)},
		}, wantBlocks: 1, present: []string{"README.md", "new.txt"}},
		{name: "delete of a base file survives as a whiteout", history: [][]Change{
			{write("x", "x\n", 0o644)}, {del("docs/a.md")},
		}, wantBlocks: 1, absent: []string{"docs/a.md"}, present: []string{"docs/b.md", "x"}},
		{name: "create then delete inside the block leaves nothing", history: [][]Change{
			{write("tmp/t.txt", "t\n", 0o644)}, {del("tmp/t.txt")}, {write("y", "y\n", 0o644)},
		}, wantBlocks: 1, absent: []string{"tmp/t.txt"}, notInLayer: []string{"tmp/t.txt"}},
		{name: "a directory deleted and recreated is opaque", history: [][]Change{
			{write("z", "z\n", 0o644)}, {del("src")}, {mkd("src", 0o700), write("src/new.go", "package x\n", 0o644)},
		}, wantBlocks: 1, absent: []string{"src/main.go", "src/lib"}, present: []string{"src/new.go"}},
		{name: "opaque directory inside the block", history: [][]Change{
			{write("docs/c.md", "c\n", 0o644)}, {opq("docs"), write("docs/only.md", "o\n", 0o644)}, {write("docs/later.md", "l\n", 0o644)},
		}, wantBlocks: 1, absent: []string{"docs/a.md", "docs/c.md"}, present: []string{"docs/only.md", "docs/later.md"}},
		{name: "a file replaced by a directory and back", history: [][]Change{
			{del("README.md"), mkd("README.md", 0o755), write("README.md/inner", "i\n", 0o644)},
			{del("README.md"), write("README.md", "file again\n", 0o640)},
		}, wantBlocks: 1, present: []string{"README.md"}},
		{name: "symlinks and modes", history: [][]Change{
			{sym("link", "src/main.go"), mkd("docs", 0o700)}, {sym("link", "docs/b.md"), write("docs/b.md", "bb\n", 0o600)},
		}, wantBlocks: 1, present: []string{"link"}},
		{name: "a lease boundary splits the run", history: [][]Change{
			{write("a1", "1\n", 0o644)}, {write("a2", "2\n", 0o644)}, {write("a3", "3\n", 0o644)}, {del("a1")}, {write("a4", "4\n", 0o644)},
		}, leaseAfter: 3, wantBlocks: 2, absent: []string{"a1"}},
		{name: "one layer only", history: [][]Change{{write("solo", "s\n", 0o644)}}, wantBlocks: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStack(t)
			var lease *Lease
			for i, cs := range tc.history {
				publish(t, s, cs...)
				if i+1 == tc.leaseAfter {
					var err error
					if lease, err = s.Acquire("workspace_session:ws-test"); err != nil {
						t.Fatal(err)
					}
				}
			}
			before := mustHead(t, s)
			want := viewDump(t, s.View(before))
			var leaseWant string
			if lease != nil {
				leaseWant = viewDump(t, s.View(lease.Manifest()))
			}

			res, err := s.Squash(context.Background())
			if err != nil {
				t.Fatalf("Squash: %v", err)
			}
			if len(res.Blocks) != tc.wantBlocks {
				t.Fatalf("%d blocks, want %d: %+v", len(res.Blocks), tc.wantBlocks, res.Blocks)
			}
			after := mustHead(t, s)
			if tc.wantBlocks == 0 {
				if after.Version != before.Version {
					t.Fatalf("a compact stack changed version %d → %d", before.Version, after.Version)
				}
				return
			}
			if after.Version != before.Version+1 {
				t.Fatalf("version %d → %d", before.Version, after.Version)
			}
			if got := viewDump(t, s.View(after)); got != want {
				t.Fatalf("merged view changed:\n--- before\n%s--- after\n%s", want, got)
			}
			for _, p := range tc.absent {
				if _, err := s.View(after).Lstat(p); !isNotExist(err) {
					t.Errorf("%s: %v, want absent", p, err)
				}
			}
			for _, p := range tc.present {
				if _, err := s.View(after).Lstat(p); err != nil {
					t.Errorf("%s: %v", p, err)
				}
			}
			for _, p := range tc.notInLayer {
				for _, b := range res.Blocks {
					if _, err := os.Lstat(filepath.Join(s.Dir(), "layers", b.SquashedLayerID, p)); !os.IsNotExist(err) {
						t.Errorf("%s holds %s: %v", b.SquashedLayerID, p, err)
					}
				}
			}
			for _, b := range res.Blocks {
				if !strings.HasPrefix(b.SquashedLayerID, "S") {
					t.Errorf("squashed layer %s", b.SquashedLayerID)
				}
				if d, err := s.StoredDigest(b.SquashedLayerID); err != nil || len(d) != 64 {
					t.Errorf("digest of %s: %q %v", b.SquashedLayerID, d, err)
				}
			}
			if got := len(after.Layers); got != len(before.Layers)-countReplaced(res)+len(res.Blocks) {
				t.Errorf("%d layers after, %d before", got, len(before.Layers))
			}
			// The manifest on disk parses and names existing layers only.
			for _, l := range after.Layers {
				if _, err := os.Stat(s.LayerDir(l)); err != nil {
					t.Errorf("layer %s: %v", l.LayerID, err)
				}
			}
			if lease == nil {
				// Everything replaced is reclaimed at once.
				for _, b := range res.Blocks {
					for _, id := range b.ReplacedLayerIDs {
						if _, err := os.Stat(filepath.Join(s.Dir(), "layers", id)); !os.IsNotExist(err) {
							t.Errorf("replaced layer %s still on disk: %v", id, err)
						}
					}
				}
				return
			}
			// The lease's view is intact (its layers are pinned) and its
			// chain rewritten by substitution gives the same view.
			if got := viewDump(t, s.View(lease.Manifest())); got != leaseWant {
				t.Fatalf("leased view changed")
			}
			sub, changed := res.Substitute(lease.Manifest())
			if !changed {
				t.Fatalf("the lease's chain was not rewritten: %v", lease.Manifest().LayerIDs())
			}
			if got := viewDump(t, s.View(sub)); got != leaseWant {
				t.Fatalf("substituted lease view differs:\n%s\nwant\n%s", got, leaseWant)
			}
			s.LeasedBy(&res)
			leased := 0
			for _, b := range res.Blocks {
				leased += len(b.Leased)
			}
			if leased == 0 {
				t.Fatalf("no block reports the live lease: %+v", res.Blocks)
			}
			if _, err := lease.Release(); err != nil {
				t.Fatal(err)
			}
			// With the lease gone, the replaced layers are collected.
			for _, b := range res.Blocks {
				for _, id := range b.ReplacedLayerIDs {
					if _, err := os.Stat(filepath.Join(s.Dir(), "layers", id)); !os.IsNotExist(err) {
						t.Errorf("replaced layer %s still on disk after release: %v", id, err)
					}
				}
			}
			if got := viewDump(t, s.View(mustHead(t, s))); got != want {
				t.Fatalf("head view changed after GC")
			}
		})
	}
}

// A squash that fails before its manifest rename leaves the old manifest
// and no S layer behind.
func TestSquashCanceledLeavesNothing(t *testing.T) {
	s := newTestStack(t)
	publish(t, s, write("a", "1\n", 0o644))
	publish(t, s, write("b", "2\n", 0o644))
	before := mustHead(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Squash(ctx); err == nil {
		t.Fatal("a canceled squash succeeded")
	}
	if after := mustHead(t, s); after.RootHash() != before.RootHash() || after.Version != before.Version {
		t.Fatalf("manifest changed: %v → %v", before.LayerIDs(), after.LayerIDs())
	}
	for _, d := range []string{"layers", "staging"} {
		for _, n := range names(t, filepath.Join(s.Dir(), d)) {
			if strings.HasPrefix(n, "S") {
				t.Errorf("%s/%s left behind", d, n)
			}
		}
	}
}
