package views

import (
	"os"
	"testing"
	"time"
)

func TestViewDaemon(t *testing.T) {
	// This process stands in for a live holder; a PID no process has (above
	// pid_max's ceiling) for one that exited since it was listed.
	gone := 1 << 23
	out := Daemon(DaemonInput{Scope: "sandbox", Started: time.Now(), Usage: RuntimeUsage{ActiveRequests: 1, LiveSessions: 2},
		Holders: []Holder{{"sb-1", "ws-a", os.Getpid()}, {"sb-1", "ws-b", gone}, {"sb-1", "ws-c", 0}}})
	if out["view"] != "daemon" || out["scope"] != "sandbox" {
		t.Fatalf("header: %v", out)
	}
	d := out["daemon"].(map[string]any)
	if d["available"] != true || d["pid"] != os.Getpid() || d["resident_bytes"].(int64) <= 0 || d["file_descriptor_count"].(int) <= 0 {
		t.Fatalf("daemon block: %v", d)
	}
	if u := d["runtime_usage"].(map[string]any); u["active_requests"] != int64(1) || u["live_sessions"] != 2 {
		t.Fatalf("runtime_usage: %v", u)
	}
	hs := d["holders"].([]map[string]any)
	if len(hs) != 2 {
		t.Fatalf("holders (the one without a PID is not listed): %v", hs)
	}
	if hs[0]["workspace_session_id"] != "ws-a" || hs[0]["state"] == "unavailable" || hs[0]["resident_bytes"].(int64) <= 0 {
		t.Fatalf("live holder: %v", hs[0])
	}
	if hs[1]["pid"] != gone || hs[1]["state"] != "unavailable" || hs[1]["resident_bytes"] != nil {
		t.Fatalf("exited holder: %v", hs[1])
	}
}
