package nsholder

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestFuseOverlay: with Overlay "fuse" the holder serves /workspace itself;
// a command's file changes come back as FS notices owned by the command
// (also through a child that called setsid), all before the command's
// Exited and Done events, with a Released notice per written file; the
// holder's own WriteFile reports nothing; the upper has the kernel format.
func TestFuseOverlay(t *testing.T) {
	f := newFixture(t)
	cfg := f.config("sess-fuse")
	cfg.Overlay = OverlayFuse
	cfg.CoalesceMs = 10000 // records must come from the flushes, not the timer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := Start(ctx, testSelf, cfg)
	if err != nil {
		if strings.Contains(err.Error(), "/dev/fuse") {
			t.Skipf("no FUSE here: %v", err)
		}
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { h.Close(2 * time.Second) })
	if d := h.OverlayDriver(); d != OverlayFuse {
		t.Fatalf("driver %q", d)
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TERM=dumb"}
	// The holder's own writes, from many of its threads at once (FUSE
	// reports thread IDs): none may be reported.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := "byholder.txt"
			if i > 0 {
				name = fmt.Sprintf("byholder-%d.txt", i)
			}
			if _, err := h.WriteFile(ctx, name, []byte("holder\n"), nil); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	run := func(owner, cmd string) (recs []FileRecord, rel []ReleasedFile) {
		t.Helper()
		p, err := h.Spawn(ctx, SpawnRequest{Cmd: cmd, Env: env, Dir: "/workspace", Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		defer p.PTY.Close()
		go func() { _, _ = io.Copy(io.Discard, p.PTY) }()
		exited := false
		for {
			select {
			case e, ok := <-h.Events():
				if !ok {
					t.Fatal("holder exited")
				}
				switch {
				case e.FS != nil:
					if exited {
						t.Errorf("FS notice after Exited: %+v", e.FS)
					}
					recs = append(recs, e.FS.Records...)
					rel = append(rel, e.FS.Released...)
				case e.ID == p.ID && e.Exited:
					exited = true
				case e.ID == p.ID && e.Done:
					return recs, rel
				}
			case <-ctx.Done():
				t.Fatalf("%q did not finish", cmd)
			}
		}
	}
	recs, rel := run("cmd-a", "echo hi > a.txt && echo more >> hello.txt && setsid sh -c 'echo x > s.txt' && mkdir d")
	type key struct{ op, path, cmd string }
	var got []key
	for _, r := range recs {
		got = append(got, key{r.Op, r.Path, r.Command})
		if strings.Contains(r.Path, "byholder") || strings.Contains(r.Path, ".esbx-tmp") || strings.Contains(r.NewPath, "byholder") {
			t.Errorf("the holder's own write was reported: %+v", r)
		}
	}
	for _, want := range []key{{"create", "a.txt", "cmd-a"}, {"write", "a.txt", "cmd-a"}, {"write", "hello.txt", "cmd-a"},
		{"create", "s.txt", "cmd-a"}, {"mkdir", "d", "cmd-a"}} {
		if !slices.Contains(got, want) {
			t.Errorf("no record %+v in %+v", want, got)
		}
	}
	for _, r := range rel {
		if r.Command != "cmd-a" {
			t.Errorf("release not owned by the command: %+v", r)
		}
	}
	for _, p := range []string{"a.txt", "hello.txt", "s.txt"} {
		if !slices.Contains(rel, ReleasedFile{Path: p, Command: "cmd-a"}) {
			t.Errorf("no release of %s in %+v", p, rel)
		}
	}
	if recs, _ := run("cmd-b", "true"); len(recs) != 0 {
		t.Errorf("records of nothing: %+v", recs)
	}
	for p, want := range map[string]string{"a.txt": "hi\n", "hello.txt": "hello from lower\nmore\n", "byholder.txt": "holder\n"} {
		if b, err := os.ReadFile(filepath.Join(f.upper, p)); err != nil || string(b) != want {
			t.Errorf("upper %s: %q %v", p, b, err)
		}
	}
}
