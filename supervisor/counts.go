package supervisor

// Counts is a snapshot of what the supervisor holds, for status lines.
type Counts struct {
	Sandboxes int   // known sandboxes, any state
	Ready     int   // sandboxes in state ready
	Sessions  int   // live workspace sessions
	Requests  int64 // requests being executed
}

func (s *Supervisor) counts() Counts {
	s.mu.Lock()
	sbs := make([]*sandbox, 0, s.sandboxes.Len())
	for _, sb := range s.sandboxes.All() {
		sbs = append(sbs, sb)
	}
	s.mu.Unlock()
	c := Counts{Sandboxes: len(sbs), Requests: s.active.Load()}
	for _, sb := range sbs {
		sb.Mu.Lock()
		if sb.Rec.State == stateReady {
			c.Ready++
		}
		c.Sessions += len(sb.Work.Sessions)
		sb.Mu.Unlock()
	}
	return c
}
