package supervisor

import (
	"context"
)

// shutdown stops every sandbox's sessions when the supervisor exits.
func (s *Supervisor) shutdown(ctx context.Context) {
	s.mu.Lock()
	all := make([]*sandbox, 0, s.sandboxes.Len())
	for _, sb := range s.sandboxes.All() {
		all = append(all, sb)
	}
	s.mu.Unlock()
	for _, sb := range all {
		s.teardown.StopSessions(ctx, sb, false, func(string) {})
	}
}
