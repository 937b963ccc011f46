package supervisor

import (
	"context"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
)

// availability is one probed capability: available, or not and why.
type availability struct {
	Available bool    `json:"available"`
	Reason    *string `json:"reason"`
}

func avail(ok bool, reason string) availability {
	if ok {
		return availability{Available: true}
	}
	return availability{Reason: &reason}
}

// probes are taken once at start (§4.5) and never re-run: health reports
// them and create_sandbox resolves overlay: auto with them.
type probes struct {
	userNS        availability
	kernelOverlay availability
	fuseDevice    availability
	fuseOverlay   availability
	lowerdirPlus  bool
}

// Test knobs (documented in the README): they make the start-up probe
// report a driver as unavailable, so tests can show overlay: auto falling
// back to fuse (or failing) on a host where both drivers work.
const (
	envProbeFailKernel = "SANDBOX_PROBE_FAIL_KERNEL_OVERLAY"
	envProbeFailFuse   = "SANDBOX_PROBE_FAIL_FUSE_OVERLAY"
)

// applyProbeKnobs turns a passed probe into a failed one when its knob is 1.
func applyProbeKnobs(r nsholder.ProbeResult, getenv func(string) string) nsholder.ProbeResult {
	if getenv(envProbeFailKernel) == "1" {
		r.KernelOverlay, r.LowerdirPlus = false, false
		r.OverlayReason = "disabled by " + envProbeFailKernel + "=1 (test knob)"
	}
	if getenv(envProbeFailFuse) == "1" {
		r.FuseOverlay = false
		r.FuseReason = "disabled by " + envProbeFailFuse + "=1 (test knob)"
	}
	return r
}

func runProbes(ctx context.Context, self, data string, log *slog.Logger) probes {
	r := applyProbeKnobs(nsholder.Probe(ctx, self, data), os.Getenv)
	p := probes{
		userNS:        avail(r.UserNamespaces, r.UserNSReason),
		kernelOverlay: avail(r.KernelOverlay, r.OverlayReason),
		lowerdirPlus:  r.LowerdirPlus,
	}
	if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		p.fuseDevice = avail(false, "cannot open /dev/fuse: "+err.Error()+" (fix: load the fuse module and make /dev/fuse mode 0666, as distributions ship it)")
	} else {
		f.Close()
		p.fuseDevice = avail(true, "")
	}
	p.fuseOverlay = avail(r.FuseOverlay, r.FuseReason)
	log.Info("probes", "user_namespaces", r.UserNamespaces, "kernel_overlay", r.KernelOverlay,
		"kernel_overlay_reason", r.OverlayReason, "lowerdir_plus", r.LowerdirPlus, "fuse_device", p.fuseDevice.Available,
		"fuse_overlay", r.FuseOverlay, "fuse_overlay_reason", r.FuseReason)
	return p
}

// resolveOverlay applies §4.2 step 1.
func (p probes) resolveOverlay(want string) (string, *catalog.Error) {
	unavailable := func(driver string, a availability) *catalog.Error {
		reason := ""
		if a.Reason != nil {
			reason = *a.Reason
		}
		return catalog.Errorf(catalog.OperationFailed, "overlay driver %s is unavailable: %s", driver, reason).
			With("overlay", map[string]any{"driver": driver, "reason": reason})
	}
	switch want {
	case "kernel":
		if !p.kernelOverlay.Available {
			return "", unavailable("kernel", p.kernelOverlay)
		}
		return "kernel", nil
	case "fuse":
		if !p.fuseOverlay.Available {
			return "", unavailable("fuse", p.fuseOverlay)
		}
		return "fuse", nil
	}
	switch {
	case p.kernelOverlay.Available:
		return "kernel", nil
	case p.fuseOverlay.Available:
		return "fuse", nil
	}
	return "", unavailable("auto", avail(false, "neither kernel OverlayFS in a user namespace nor the FUSE overlay works here"))
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

func (s *Supervisor) health(c *call) (any, error) {
	storeStatus, storeErr := "ok", any(nil)
	if err := s.store.ping(c.ctx); err != nil {
		storeStatus, storeErr = "error", err.Error()
	}
	var free uint64
	var sfs unix.Statfs_t
	if unix.Statfs(s.dirs.Data, &sfs) == nil {
		free = sfs.Bavail * uint64(sfs.Bsize)
	}
	s.mu.Lock()
	nSandboxes, failed := s.sandboxes.Len(), false
	for _, sb := range s.sandboxes.All() {
		sb.Mu.Lock()
		failed = failed || sb.Rec.State == stateFailed
		sb.Mu.Unlock()
	}
	s.mu.Unlock()
	status := "ok"
	switch {
	case !s.probes.userNS.Available || (!s.probes.kernelOverlay.Available && !s.probes.fuseOverlay.Available):
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
		"kernel":          kernelRelease(),
		"overlay_drivers": map[string]any{"kernel": s.probes.kernelOverlay, "fuse": s.probes.fuseOverlay},
		"fuse":            map[string]any{"available": s.probes.fuseDevice.Available, "device": "/dev/fuse", "reason": s.probes.fuseDevice.Reason},
		"user_namespaces": s.probes.userNS,
		"cgroup":          cgroup,
		"docker":          map[string]any{"available": s.docker.Available, "reason": s.docker.Reason},
		"network":         s.netHelperStatus(),
		"store":           map[string]any{"status": storeStatus, "data_dir": s.dirs.Data, "free_bytes": free, "error": storeErr},
		"counts":          map[string]any{"sandboxes": nSandboxes, "workspace_sessions": s.sessionCount(), "running_commands": s.runningCommands()},
		"event_store":     s.obsStats(nil),
	}, nil
}
