package nsholder

import (
	"context"
	"errors"
	"sync"
)

// Spare is a holder started ahead of the session that will use it: the
// process runs in its new namespaces (mapped, for subordinate IDs) and
// waits for its session's Config. Starting a holder is most of a session's
// creation (the supervisor binary's start and its namespaces), so a spare
// taken by the next session leaves that session only the setup: mounts and
// the root. A spare serves exactly one session: Setup hands it over once.
type Spare struct {
	idMapping string
	isolated  bool

	mu sync.Mutex
	c  *Client // nil once set up or closed
}

// ErrSpareUsed is Setup on a spare that was already set up or closed.
var ErrSpareUsed = errors.New("spare holder already used")

// StartSpare starts a spare holder for a later session whose Config has
// this IDMapping and IsolatedNetwork.
func StartSpare(ctx context.Context, self, idMapping string, isolatedNetwork bool) (*Spare, error) {
	c, err := spawn(ctx, self, Config{IDMapping: idMapping, IsolatedNetwork: isolatedNetwork}, defaultStartOptions)
	if err != nil {
		return nil, err
	}
	return &Spare{idMapping: normIDMapping(idMapping), isolated: isolatedNetwork, c: c}, nil
}

// Fits reports whether a session with cfg can use the spare: the
// namespaces and ID mapping were chosen when it started.
func (s *Spare) Fits(cfg Config) bool {
	return s.idMapping == normIDMapping(cfg.IDMapping) && s.isolated == cfg.IsolatedNetwork
}

// Pid is the spare holder's process ID (0 once used or closed).
func (s *Spare) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c == nil {
		return 0
	}
	return s.c.Pid()
}

// Setup makes the spare the holder of cfg's session, as Start would have
// started it. It fails if the spare does not fit cfg, was used already or
// has died; a failed spare is killed. Either way the spare is used up.
func (s *Spare) Setup(ctx context.Context, cfg Config) (*Client, error) {
	s.mu.Lock()
	c := s.c
	s.c = nil
	s.mu.Unlock()
	if c == nil {
		return nil, ErrSpareUsed
	}
	if !s.Fits(cfg) {
		c.kill()
		return nil, errors.New("spare holder does not fit the session's id mapping or network")
	}
	if err := c.setup(ctx, cfg); err != nil {
		return nil, err
	}
	return c, nil
}

// Close kills an unused spare and waits for it to exit; a no-op once used.
func (s *Spare) Close() {
	s.mu.Lock()
	c := s.c
	s.c = nil
	s.mu.Unlock()
	if c != nil {
		c.kill()
	}
}

func normIDMapping(m string) string {
	if m == "" {
		return IDMappingSingle
	}
	return m
}
