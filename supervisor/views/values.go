package views

import "github.com/ephemeral-ai-lab/sandbox/layers"

// Session is what the views show of one live workspace session, copied
// under the session's lock.
type Session struct {
	ID             string
	Agent          *string
	State          string // finalization state
	NetworkProfile string
	FinalizePolicy string
	OverlayDriver  string
	Lease          []layers.LayerRef // the leased chain, newest first
	HolderPid      int               // 0 without a live holder
}

// NonNil is s, or an empty slice for nil, so that JSON shows [] not null.
func NonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
