package nsholder

// Freezing a session (issue 19): the supervisor stops every session
// process while it reads or replaces the session's upper (a sync, a fork's
// copy, a publish that keeps working) and moves the session onto another
// chain, then thaws it.
//
// A freeze is SIGSTOP of every session process (freezeSession, as the
// kernel swap does), then a flush of what the session wrote so a reader of
// the upper directory on the host sees it:
//
//   - fuse: writes through file descriptors reach the server, and with it
//     the upper, before write(2) returns (no writeback cache), but stores
//     through a shared writable mapping stay dirty pages of the FUSE mount
//     until writeback. syncfs(2) is not enough: the kernel does not wait in
//     sync for FUSE writeback that someone else started (the flusher, under
//     dirty-page pressure on the host), and newer kernels do not wait for
//     FUSE writeback in sync at all. fsync(2) does wait (fuse_fsync waits
//     for every write of the inode), so every /workspace file a session
//     process maps shared is fsynced (flushMappings), then syncfs catches
//     the rest, and the overlay's buffered provenance records are passed on.
//   - kernel: OverlayFS hands reads, writes and mappings of a copied-up
//     file to the upper file itself, so the session's data are pages of
//     the upper's own inodes, which a host reader shares: nothing to flush.
//
// A freeze ends with Thaw, with a Quiesce or shutdown, when the holder
// exits (the control channel closing, e.g. the supervisor died, makes the
// holder exit, and the kernel kills the whole PID namespace, stopped
// processes too), or after a safety limit (freezeLimit), logged on the
// holder's stderr and reported by the next Thaw as ErrFreezeExpired, so a
// session is never left stopped by a caller that forgot it.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/internal/beneath"
)

// freezeLimit is how long a freeze lasts at most without a Thaw.
const freezeLimit = 60 * time.Second

// ErrFreezeExpired: the freeze that Thaw was to end had already ended at
// the safety limit; the session ran meanwhile.
var ErrFreezeExpired = &opError{"freeze expired at its safety limit"}

// ChainInfo is what a holder serves now: the host paths of its lower
// layers (newest first), as sent with the setup or the last swap, and the
// device and inode number of its upper directory.
type ChainInfo struct {
	Lowers   []string `json:"lowers"`
	UpperDev uint64   `json:"upper_dev"`
	UpperIno uint64   `json:"upper_ino"`
}

// set records a swap: paths are the new lowers; upper, when not nil, the
// new upper (caller holds wsMu exclusively).
func (ci *ChainInfo) set(paths []string, upper *os.File) {
	ci.Lowers = slices.Clone(paths)
	if upper == nil {
		return
	}
	var st unix.Stat_t
	if unix.Fstat(int(upper.Fd()), &st) == nil {
		ci.UpperDev, ci.UpperIno = st.Dev, st.Ino
	}
}

type freezeHeader struct {
	BudgetNS int64 `json:"budget_ns,omitempty"`
	LimitNS  int64 `json:"limit_ns,omitempty"` // tests only: 0 is freezeLimit
}

// freezer is the holder's freeze state.
type freezer struct {
	mu      sync.Mutex
	on      bool
	stopped []int // stopped by this freeze: continued at its end
	timer   *time.Timer
	seq     uint64 // which freeze the timer belongs to
	expired bool   // the safety limit ended the last freeze
}

// end continues what the freeze stopped (caller holds z.mu).
func (z *freezer) end() {
	thaw(z.stopped)
	z.stopped, z.on = nil, false
	if z.timer != nil {
		z.timer.Stop()
		z.timer = nil
	}
}

// Freeze stops every process of the session (SIGSTOP; each must stop
// within budget, 0 means 0.5 s, else ErrFreezeTimeout and the ones
// stopped are continued) and flushes what the session wrote to the upper
// (see freeze.go). The session stays stopped until Thaw, Quiesce, Close,
// the holder's end, or the safety limit of 60 s. Freeze while frozen is
// not an error: it stops whatever runs again (a command spawned since:
// Freeze does not hold back Spawn, the caller keeps the session's gate)
// and restarts the limit; freezes do not nest, one Thaw ends it.
// SwapLower while frozen leaves the session frozen.
func (c *Client) Freeze(ctx context.Context, budget time.Duration) error {
	_, err := c.do(ctx, &ctlHeader{Op: opFreeze, Freeze: &freezeHeader{BudgetNS: int64(budget), LimitNS: int64(c.freezeLimit)}}, nil)
	return err
}

// Thaw continues the processes Freeze stopped (those stopped before it,
// e.g. by a job-control signal, stay stopped). Thaw when not frozen is
// nil, unless the last freeze ended at its safety limit: then it returns
// ErrFreezeExpired once.
func (c *Client) Thaw(ctx context.Context) error {
	_, err := c.do(ctx, &ctlHeader{Op: opThaw}, nil)
	return err
}

// Chain reports the chain the holder serves now (after a swap: the new
// one), so the supervisor's start-up recovery can tell whether a swap
// happened.
func (c *Client) Chain(ctx context.Context) (ChainInfo, error) {
	r, err := c.do(ctx, &ctlHeader{Op: opChain}, nil)
	if err != nil {
		return ChainInfo{}, err
	}
	if r.hdr.Chain == nil {
		return ChainInfo{}, fmt.Errorf("holder chain: reply without a chain")
	}
	return *r.hdr.Chain, nil
}

func (s *server) freeze(req *freezeHeader) error {
	budget, limit := swapFreezeBudget, freezeLimit
	if req != nil && req.BudgetNS > 0 {
		budget = time.Duration(req.BudgetNS)
	}
	if req != nil && req.LimitNS > 0 {
		limit = time.Duration(req.LimitNS)
	}
	// No spawn half done and no file operation of the holder in flight.
	s.gate.Lock()
	defer s.gate.Unlock()
	s.wsMu.Lock()
	defer s.wsMu.Unlock()
	if s.stopping {
		return fmt.Errorf("freeze: holder is shutting down")
	}
	z := &s.frz
	z.mu.Lock()
	defer z.mu.Unlock()
	stopped, err := freezeSession(budget)
	z.stopped = append(z.stopped, stopped...)
	if err != nil {
		z.end()
		return fmt.Errorf("freeze: %w", err)
	}
	z.on, z.expired = true, false
	z.seq++
	seq := z.seq
	if z.timer != nil {
		z.timer.Stop()
	}
	z.timer = time.AfterFunc(limit, func() {
		z.mu.Lock()
		defer z.mu.Unlock()
		if z.seq != seq || !z.on {
			return
		}
		slog.Warn("nsholder: freeze ended at its safety limit without a thaw", "limit", limit, "processes", len(z.stopped))
		z.end()
		z.expired = true
	})
	if fm := s.root.fuse; fm != nil {
		if err := s.flushMappings(); err != nil {
			z.end()
			return fmt.Errorf("freeze: %w", err)
		}
		if err := unix.Syncfs(int(s.root.workspace.Fd())); err != nil {
			z.end()
			return fmt.Errorf("freeze: flush /workspace: %w", err)
		}
		fm.flush()
	}
	return nil
}

// flushMappings fsyncs every /workspace file that a session process maps
// shared (from /proc/<pid>/maps), which waits until the server has written
// its dirty pages to the upper. A mapped file deleted since has no name to
// open and nothing to keep in the upper; one renamed is listed under its
// new name. Caller holds wsMu (no holder file operation in flight).
func (s *server) flushMappings() error {
	seen := map[string]bool{}
	for _, p := range listProcs() {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/maps")
		if err != nil {
			continue // gone
		}
		for _, line := range strings.Split(string(b), "\n") {
			// address perms offset dev inode path; the path may hold spaces.
			f := strings.Fields(line)
			if len(f) < 6 || len(f[1]) < 4 || f[1][3] != 's' {
				continue
			}
			rel, ok := strings.CutPrefix(strings.Join(f[5:], " "), "/workspace/")
			if ok && !strings.HasSuffix(rel, " (deleted)") {
				seen[rel] = true
			}
		}
	}
	for rel := range seen {
		fd, err := beneath.Open(int(s.root.workspace.Fd()), rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
		if err != nil {
			continue // gone or not a plain path beneath /workspace
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			err = unix.Fsync(fd)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("flush the mapping of /workspace/%s: %w", rel, err)
		}
	}
	return nil
}

func (s *server) thawSession() error {
	z := &s.frz
	z.mu.Lock()
	defer z.mu.Unlock()
	if !z.on {
		if z.expired {
			z.expired = false
			return fmt.Errorf("thaw: %w", ErrFreezeExpired)
		}
		return nil
	}
	z.end()
	return nil
}

// endFreeze ends a freeze without a Thaw (Quiesce, shutdown).
func (s *server) endFreeze() {
	s.frz.mu.Lock()
	s.frz.end()
	s.frz.mu.Unlock()
}

// freezeForSwap stops the session for a kernel swap. Frozen already, it
// stops only what runs again and leaves everything stopped; else release
// continues what it stopped. release must be called, also after an
// error; until then neither Thaw nor the safety limit can end the freeze.
func (s *server) freezeForSwap(budget time.Duration) (release func(), err error) {
	z := &s.frz
	z.mu.Lock()
	stopped, err := freezeSession(budget)
	if z.on {
		z.stopped = append(z.stopped, stopped...)
		return z.mu.Unlock, err
	}
	return func() {
		thaw(stopped)
		z.mu.Unlock()
	}, err
}

func (s *server) chainInfo() ChainInfo {
	s.wsMu.RLock()
	defer s.wsMu.RUnlock()
	ci := s.root.chain
	ci.Lowers = slices.Clone(ci.Lowers)
	return ci
}
