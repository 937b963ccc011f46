package doctor

import (
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
)

// TestResolveOverlay: §4.2 step 1 for every combination of probed drivers
// and requested overlay.
func TestResolveOverlay(t *testing.T) {
	both := Probes{KernelOverlay: avail(true, ""), FuseOverlay: avail(true, "")}
	kernelOnly := Probes{KernelOverlay: avail(true, ""), FuseOverlay: avail(false, "no /dev/fuse")}
	fuseOnly := Probes{KernelOverlay: avail(false, "old kernel"), FuseOverlay: avail(true, "")}
	neither := Probes{KernelOverlay: avail(false, "old kernel"), FuseOverlay: avail(false, "no /dev/fuse")}
	for _, tc := range []struct {
		name      string
		p         Probes
		want, got string // got: the driver, or a substring of the error
	}{
		{"auto, both", both, "auto", "kernel"},
		{"auto, fuse only", fuseOnly, "auto", "fuse"},
		{"auto, kernel only", kernelOnly, "auto", "kernel"},
		{"auto, neither", neither, "auto", "overlay driver auto is unavailable: neither kernel OverlayFS"},
		{"kernel, fuse only", fuseOnly, "kernel", "overlay driver kernel is unavailable: old kernel"},
		{"fuse, kernel only", kernelOnly, "fuse", "overlay driver fuse is unavailable: no /dev/fuse"},
		{"fuse, both", both, "fuse", "fuse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			driver, err := tc.p.ResolveOverlay(tc.want)
			if err == nil {
				if driver != tc.got {
					t.Fatalf("driver %q, want %q", driver, tc.got)
				}
				return
			}
			if err.Kind != catalog.OperationFailed || !strings.Contains(err.Message, tc.got) || err.Details["overlay"] == nil {
				t.Fatalf("error %+v, want operation_failed containing %q with overlay details", err, tc.got)
			}
		})
	}
}

// TestProbeKnobs: the documented test knobs turn a passed probe into a
// failed one that says why, and leave it alone otherwise.
func TestProbeKnobs(t *testing.T) {
	ok := nsholder.ProbeResult{UserNamespaces: true, KernelOverlay: true, LowerdirPlus: true, FuseOverlay: true}
	env := map[string]string{}
	get := func(k string) string { return env[k] }
	if r := applyProbeKnobs(ok, get); r != ok {
		t.Fatalf("no knobs: %+v", r)
	}
	env[envProbeFailKernel] = "1"
	r := applyProbeKnobs(ok, get)
	if r.KernelOverlay || r.LowerdirPlus || !r.FuseOverlay || !strings.Contains(r.OverlayReason, envProbeFailKernel) {
		t.Fatalf("kernel knob: %+v", r)
	}
	env[envProbeFailFuse] = "1"
	r = applyProbeKnobs(ok, get)
	if r.KernelOverlay || r.FuseOverlay || !strings.Contains(r.FuseReason, envProbeFailFuse) {
		t.Fatalf("both knobs: %+v", r)
	}
}
