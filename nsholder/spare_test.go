package nsholder

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSpare: a spare holder becomes exactly one session's holder, a
// session that does not fit it is refused, and an unused spare is killed
// by Close.
func TestSpare(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("serves one session", func(t *testing.T) {
		f := newFixture(t)
		sp, err := StartSpare(ctx, testSelf, "", false)
		if err != nil {
			t.Fatal(err)
		}
		defer sp.Close()
		pid := sp.Pid()
		if pid == 0 || !alive(pid) {
			t.Fatalf("spare pid %d not running", pid)
		}
		h, err := sp.Setup(ctx, f.config("sess-spare"))
		if err != nil {
			t.Fatalf("Setup: %v", err)
		}
		if h.Pid() != pid {
			t.Errorf("session holder pid %d, want the spare's %d", h.Pid(), pid)
		}
		s := sessionOf(t, h)
		if got := s.ok("cat /workspace/hello.txt"); got != "hello from lower" {
			t.Errorf("cat: %q", got)
		}
		// Handed over once: a second session cannot take the same process.
		if _, err := sp.Setup(ctx, newFixture(t).config("sess-second")); !errors.Is(err, ErrSpareUsed) {
			t.Errorf("second Setup: %v, want ErrSpareUsed", err)
		}
		if sp.Pid() != 0 {
			t.Errorf("used spare still reports pid %d", sp.Pid())
		}
		sp.Close() // a no-op once used: the session's holder lives on
		if got := s.ok("echo still"); got != "still" {
			t.Errorf("after Close of the used spare: %q", got)
		}
	})

	t.Run("refuses a session that does not fit", func(t *testing.T) {
		f := newFixture(t)
		sp, err := StartSpare(ctx, testSelf, "", false)
		if err != nil {
			t.Fatal(err)
		}
		pid := sp.Pid()
		cfg := f.config("sess-isolated")
		cfg.IsolatedNetwork = true
		if sp.Fits(cfg) {
			t.Error("Fits an isolated session; the spare shares the network")
		}
		if _, err := sp.Setup(ctx, cfg); err == nil {
			t.Fatal("Setup of a session that does not fit succeeded")
		}
		if alive(pid) {
			t.Errorf("spare %d still running after a refused Setup", pid)
		}
	})

	t.Run("Close kills an unused spare", func(t *testing.T) {
		sp, err := StartSpare(ctx, testSelf, IDMappingSingle, false)
		if err != nil {
			t.Fatal(err)
		}
		pid := sp.Pid()
		sp.Close()
		if alive(pid) {
			t.Errorf("spare %d still running after Close", pid)
		}
		if _, err := sp.Setup(ctx, newFixture(t).config("sess-late")); !errors.Is(err, ErrSpareUsed) {
			t.Errorf("Setup after Close: %v, want ErrSpareUsed", err)
		}
	})
}
