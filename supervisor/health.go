package supervisor

import "github.com/ephemeral-ai-lab/sandbox/supervisor/views"

// availability is one probed capability: available, or not and why.
type availability = views.Availability

func avail(ok bool, reason string) availability {
	if ok {
		return availability{Available: true}
	}
	return availability{Reason: &reason}
}
