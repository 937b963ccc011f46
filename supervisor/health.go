package supervisor

import (
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/doctor"
)

func (s *Supervisor) health(c *call) (any, error) {
	storeStatus, storeErr := "ok", any(nil)
	if err := s.store.Ping(c.ctx); err != nil {
		storeStatus, storeErr = "error", err.Error()
	}
	var free uint64
	var sfs unix.Statfs_t
	if unix.Statfs(s.dirs.Data, &sfs) == nil {
		free = sfs.Bavail * uint64(sfs.Bsize)
	}
	s.mu.Lock()
	nSandboxes, failed := len(s.sandboxes), false
	for _, sb := range s.sandboxes {
		sb.mu.Lock()
		failed = failed || sb.rec.State == stateFailed
		sb.mu.Unlock()
	}
	s.mu.Unlock()
	status := "ok"
	switch {
	case !s.probes.UserNS.Available || (!s.probes.KernelOverlay.Available && !s.probes.FuseOverlay.Available):
		status = "unavailable"
	case storeStatus != "ok" || failed:
		status = "degraded"
	}
	cgroup := map[string]any{"delegated": false, "path": nil, "reason": s.cgroups.reasonOr("")}
	if s.cgroups != nil && s.cgroups.delegated {
		cgroup = map[string]any{"delegated": true, "path": s.cgroups.root, "reason": nil}
	}
	return map[string]any{
		"status": status, "version": s.version, "uptime_s": time.Since(s.started).Seconds(), "uid": os.Geteuid(),
		"kernel":          doctor.KernelRelease(),
		"overlay_drivers": map[string]any{"kernel": s.probes.KernelOverlay, "fuse": s.probes.FuseOverlay},
		"fuse":            map[string]any{"available": s.probes.FuseDevice.Available, "device": "/dev/fuse", "reason": s.probes.FuseDevice.Reason},
		"user_namespaces": s.probes.UserNS,
		"cgroup":          cgroup,
		"docker":          map[string]any{"available": s.docker.Available, "reason": s.docker.Reason},
		"network":         s.netHelperStatus(),
		"store":           map[string]any{"status": storeStatus, "data_dir": s.dirs.Data, "free_bytes": free, "error": storeErr},
		"counts":          map[string]any{"sandboxes": nSandboxes, "workspace_sessions": s.sessionCount(), "running_commands": s.runningCommands()},
		"event_store":     s.obsStats(nil),
	}, nil
}
