package doctor

import (
	"context"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
)

// Availability is one probed capability: available, or not and why.
type Availability struct {
	Available bool    `json:"available"`
	Reason    *string `json:"reason"`
}

func avail(ok bool, reason string) Availability {
	if ok {
		return Availability{Available: true}
	}
	return Availability{Reason: &reason}
}

// Probes are taken once at start (§4.5) and never re-run: health reports
// them and create_sandbox resolves overlay: auto with them.
type Probes struct {
	UserNS        Availability
	KernelOverlay Availability
	FuseDevice    Availability
	FuseOverlay   Availability
	LowerdirPlus  bool
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

// RunProbes runs the host probe of nsholder (the running binary self in a
// scratch directory under data), with the test knobs applied, and opens
// /dev/fuse.
func RunProbes(ctx context.Context, self, data string, log *slog.Logger) Probes {
	r := applyProbeKnobs(nsholder.Probe(ctx, self, data), os.Getenv)
	p := Probes{
		UserNS:        avail(r.UserNamespaces, r.UserNSReason),
		KernelOverlay: avail(r.KernelOverlay, r.OverlayReason),
		LowerdirPlus:  r.LowerdirPlus,
	}
	if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		p.FuseDevice = avail(false, "cannot open /dev/fuse: "+err.Error()+" (fix: load the fuse module and make /dev/fuse mode 0666, as distributions ship it)")
	} else {
		f.Close()
		p.FuseDevice = avail(true, "")
	}
	p.FuseOverlay = avail(r.FuseOverlay, r.FuseReason)
	log.Info("probes", "user_namespaces", r.UserNamespaces, "kernel_overlay", r.KernelOverlay,
		"kernel_overlay_reason", r.OverlayReason, "lowerdir_plus", r.LowerdirPlus, "fuse_device", p.FuseDevice.Available,
		"fuse_overlay", r.FuseOverlay, "fuse_overlay_reason", r.FuseReason)
	return p
}

// ResolveOverlay applies §4.2 step 1: the driver a sandbox asking for want
// (kernel, fuse or auto) gets, or why it gets none.
func (p Probes) ResolveOverlay(want string) (string, *catalog.Error) {
	unavailable := func(driver string, a Availability) *catalog.Error {
		reason := ""
		if a.Reason != nil {
			reason = *a.Reason
		}
		return catalog.Errorf(catalog.OperationFailed, "overlay driver %s is unavailable: %s", driver, reason).
			With("overlay", map[string]any{"driver": driver, "reason": reason})
	}
	switch want {
	case "kernel":
		if !p.KernelOverlay.Available {
			return "", unavailable("kernel", p.KernelOverlay)
		}
		return "kernel", nil
	case "fuse":
		if !p.FuseOverlay.Available {
			return "", unavailable("fuse", p.FuseOverlay)
		}
		return "fuse", nil
	}
	switch {
	case p.KernelOverlay.Available:
		return "kernel", nil
	case p.FuseOverlay.Available:
		return "fuse", nil
	}
	return "", unavailable("auto", avail(false, "neither kernel OverlayFS in a user namespace nor the FUSE overlay works here"))
}

// KernelRelease is uname -r.
func KernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
