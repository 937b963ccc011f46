package views

import (
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/doctor"
)

// Availability is one probed capability: available, or not and why. The
// start-up probes (doctor) decide it; health only shows it.
type Availability = doctor.Availability

// Cgroup says whether the supervisor's cgroup is delegated to it.
type Cgroup struct {
	Delegated bool
	Path      string // the delegated cgroup, when delegated
	Reason    string // why not, when not
}

// HealthInput is what the health view shows: the start-up probes and the
// supervisor's counters, copied by the caller.
type HealthInput struct {
	Version string
	Started time.Time
	Kernel  string // the kernel release

	UserNS, KernelOverlay, FuseOverlay, FuseDevice Availability
	Docker                                         Availability

	StoreErr error  // the state store's ping, nil when it answered
	DataDir  string // its free space is reported

	Sandboxes, Sessions, RunningCommands int
	AnyFailed                            bool // some sandbox is in the failed state

	Cgroup     Cgroup
	Network    any // the network helpers' status
	EventStore any // the supervisor event store's counters
}

// Health is the health view. Its status is unavailable when no sandbox can
// run here, degraded when the store fails or a sandbox failed, else ok.
func Health(in HealthInput) map[string]any {
	storeStatus, storeErr := "ok", any(nil)
	if in.StoreErr != nil {
		storeStatus, storeErr = "error", in.StoreErr.Error()
	}
	var free uint64
	var sfs unix.Statfs_t
	if unix.Statfs(in.DataDir, &sfs) == nil {
		free = sfs.Bavail * uint64(sfs.Bsize)
	}
	status := "ok"
	switch {
	case !in.UserNS.Available || (!in.KernelOverlay.Available && !in.FuseOverlay.Available):
		status = "unavailable"
	case storeStatus != "ok" || in.AnyFailed:
		status = "degraded"
	}
	cgroup := map[string]any{"delegated": false, "path": nil, "reason": in.Cgroup.Reason}
	if in.Cgroup.Delegated {
		cgroup = map[string]any{"delegated": true, "path": in.Cgroup.Path, "reason": nil}
	}
	return map[string]any{
		"status": status, "version": in.Version, "uptime_s": time.Since(in.Started).Seconds(), "uid": os.Geteuid(),
		"kernel":          in.Kernel,
		"overlay_drivers": map[string]any{"kernel": in.KernelOverlay, "fuse": in.FuseOverlay},
		"fuse":            map[string]any{"available": in.FuseDevice.Available, "device": "/dev/fuse", "reason": in.FuseDevice.Reason},
		"user_namespaces": in.UserNS,
		"cgroup":          cgroup,
		"docker":          map[string]any{"available": in.Docker.Available, "reason": in.Docker.Reason},
		"network":         in.Network,
		"store":           map[string]any{"status": storeStatus, "data_dir": in.DataDir, "free_bytes": free, "error": storeErr},
		"counts":          map[string]any{"sandboxes": in.Sandboxes, "workspace_sessions": in.Sessions, "running_commands": in.RunningCommands},
		"event_store":     in.EventStore,
	}
}
