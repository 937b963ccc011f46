package views

import "github.com/ephemeral-ai-lab/sandbox/layers"

// nodeErrorMax bounds the error string of an unavailable snapshot node.
const nodeErrorMax = 4 << 10

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

// BoundedError cuts an error string to 4 KiB on a UTF-8 boundary.
func BoundedError(msg string) string {
	if len(msg) <= nodeErrorMax {
		return msg
	}
	cut := nodeErrorMax
	for cut > 0 && (msg[cut]&0xC0) == 0x80 {
		cut--
	}
	return msg[:cut]
}

// NonNil is s, or an empty slice for nil, so that JSON shows [] not null.
func NonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
