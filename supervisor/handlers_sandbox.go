package supervisor

import (
	"context"

	"github.com/ephemeral-ai-lab/sandbox/layers"

	sbx "github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
)

// Thin handlers and wiring of the sandbox package.

func (s *Supervisor) squashLayerstacks(c *call) (any, error) {
	return s.squasher.Run(c.ctx, s.sandboxes, c.args.String("sandbox_id"), c.progress)
}

// notifyAutosquash queues an autosquash evaluation of sb (§8.6): at start
// and after every committed layer.
func (s *Supervisor) notifyAutosquash(sb *sandbox, reason string) {
	s.squasher.Notify(sb, reason)
}

// newSquasher wires the squash of the sandbox package to the supervisor's
// spans, state and live sessions.
func (s *Supervisor) newSquasher() *sbx.Squasher[*occupants] {
	return &sbx.Squasher[*occupants]{
		Log: s.log,
		Span: func(ctx context.Context, sb *sandbox, origin, name string, attrs map[string]any) (sbx.Span, context.Context) {
			sp, ctx := s.spanCtx(ctx, sb, origin, name, attrs)
			return squashSpan{sp}, ctx
		},
		Bump:      s.bump,
		Occupants: sweepOccupants,
		Threshold: s.cfg.Runtime.Layerstack.Autosquash.SquashAtNLayers,
		Draining:  s.draining.Load,
		Track: func() func() {
			s.inflight.Add(1)
			return s.inflight.Done
		},
		Bounded: boundedError,
	}
}

// squashSpan is a span as the sandbox package records steps.
type squashSpan struct{ sp *span }

func (q squashSpan) Done(err error, attrs map[string]any)    { q.sp.done(err, attrs) }
func (q squashSpan) Event(name string, attrs map[string]any) { q.sp.event(name, attrs) }

// sweepOccupants lists sb's live sessions for the squash's remount sweep.
func sweepOccupants(sb *sandbox) []sbx.Occupant {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	out := make([]sbx.Occupant, 0, len(sb.Work.sessions))
	for _, ss := range sb.Work.sessions {
		out = append(out, sweptSession{ss})
	}
	return out
}

// sweptSession is a session as the remount sweep sees it.
type sweptSession struct{ ss *session }

func (o sweptSession) ID() string            { return o.ss.id() }
func (o sweptSession) Base() layers.Manifest { return o.ss.base() }
func (o sweptSession) Gone() bool            { return o.ss.isGone() }
