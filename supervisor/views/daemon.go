package views

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/resources"
)

// Holder is one live session holder the daemon view lists.
type Holder struct {
	SandboxID   string
	WorkspaceID string
	Pid         int
}

// RuntimeUsage is the supervisor's own load counters.
type RuntimeUsage struct {
	ActiveRequests int64
	ActiveCommands int
	LiveSessions   int
	AdmissionInUse int // connection slots of max_concurrent_connections in use
}

// DaemonInput is what the daemon view shows beyond this process's /proc.
type DaemonInput struct {
	Scope   string    // "supervisor" or "sandbox"
	Started time.Time // when the supervisor started: the uptime when /proc is unreadable
	Usage   RuntimeUsage
	Holders []Holder // of the sandboxes in scope, with a live holder, in order
}

// Daemon is the daemon view: this process's /proc/self, Go runtime
// counters and the state of every listed holder.
func Daemon(in DaemonInput) map[string]any {
	d := map[string]any{"available": true, "error": nil, "sampled_at_unix_ms": time.Now().UnixMilli()}
	p, err := resources.ReadProc("/proc/self")
	if err != nil {
		d["available"], d["error"] = false, obs.BoundedError(err.Error())
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var uptime any = time.Since(in.Started).Seconds()
	if up, ok := processUptime(p.StartTicks); err == nil && ok {
		uptime = up
	}
	d["pid"] = os.Getpid()
	d["name"] = p.Name
	d["state"] = p.State
	d["uptime_s"] = uptime
	d["resident_bytes"] = p.VMRSS
	d["virtual_bytes"] = p.VMSize
	d["peak_resident_bytes"] = p.VMHWM
	d["anonymous_bytes"] = p.RSSAnon
	d["cpu_time_us"] = p.CPUTimeUs()
	d["thread_count"] = p.Threads
	d["goroutines"] = runtime.NumGoroutine()
	d["file_descriptor_count"] = countFDs()
	d["go_heap_alloc_bytes"] = ms.HeapAlloc
	d["go_heap_sys_bytes"] = ms.HeapSys
	d["gc_cycles"] = ms.NumGC
	d["runtime_usage"] = map[string]any{
		"active_requests":  in.Usage.ActiveRequests,
		"active_commands":  in.Usage.ActiveCommands,
		"live_sessions":    in.Usage.LiveSessions,
		"admission_in_use": in.Usage.AdmissionInUse,
	}
	holders := []map[string]any{}
	for _, hd := range in.Holders {
		if hd.Pid <= 0 {
			continue
		}
		h := map[string]any{"sandbox_id": hd.SandboxID, "workspace_session_id": hd.WorkspaceID, "pid": hd.Pid,
			"state": "unavailable", "resident_bytes": nil, "cpu_time_us": nil}
		if hp, err := resources.ReadProc("/proc/" + strconv.Itoa(hd.Pid)); err == nil {
			h["state"], h["resident_bytes"], h["cpu_time_us"] = hp.State, hp.VMRSS, hp.CPUTimeUs()
		}
		holders = append(holders, h)
	}
	d["holders"] = holders
	return map[string]any{"view": "daemon", "scope": in.Scope, "daemon": d}
}

// processUptime converts a start time in ticks since boot to seconds of age.
func processUptime(startTicks uint64) (float64, bool) {
	b, err := resources.ReadSmall("/proc/uptime", 128)
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	boot, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, false
	}
	return max(0, boot-float64(startTicks)/resources.ClockTicks), true
}

// countFDs counts the supervisor's open descriptors (minus the one used to list them).
func countFDs() int {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return -1
	}
	defer f.Close()
	n := 0
	for {
		names, err := f.Readdirnames(256)
		n += len(names)
		if err != nil {
			break
		}
	}
	return max(0, n-1)
}
