package views

import (
	"errors"
	"testing"
	"time"
)

func TestViewHealthStatus(t *testing.T) {
	yes, no := Availability{Available: true}, func(why string) Availability { return Availability{Reason: &why} }
	base := func() HealthInput {
		return HealthInput{Version: "v", Started: time.Now(), DataDir: t.TempDir(),
			UserNS: yes, KernelOverlay: yes, FuseOverlay: yes, FuseDevice: yes, Docker: no("no engine"),
			Cgroup: Cgroup{Reason: "not delegated"}}
	}
	for _, tc := range []struct {
		name   string
		edit   func(*HealthInput)
		status string
	}{
		{"all available", func(*HealthInput) {}, "ok"},
		{"only fuse", func(in *HealthInput) { in.KernelOverlay = no("old kernel") }, "ok"},
		{"no overlay driver", func(in *HealthInput) { in.KernelOverlay, in.FuseOverlay = no("k"), no("f") }, "unavailable"},
		{"no user namespaces", func(in *HealthInput) { in.UserNS = no("sysctl") }, "unavailable"},
		{"store fails", func(in *HealthInput) { in.StoreErr = errors.New("locked") }, "degraded"},
		{"a failed sandbox", func(in *HealthInput) { in.AnyFailed = true }, "degraded"},
		{"unavailable wins over degraded", func(in *HealthInput) { in.UserNS, in.AnyFailed = no("sysctl"), true }, "unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base()
			tc.edit(&in)
			h := Health(in)
			if h["status"] != tc.status {
				t.Fatalf("status = %v, want %s", h["status"], tc.status)
			}
			store := h["store"].(map[string]any)
			if (in.StoreErr != nil) != (store["status"] == "error") || store["free_bytes"].(uint64) == 0 {
				t.Fatalf("store block: %v", store)
			}
		})
	}
	h := Health(base())
	if cg := h["cgroup"].(map[string]any); cg["delegated"] != false || cg["path"] != nil || cg["reason"] != "not delegated" {
		t.Fatalf("undelegated cgroup: %v", cg)
	}
	in := base()
	in.Cgroup = Cgroup{Delegated: true, Path: "/sys/fs/cgroup/x"}
	if cg := Health(in)["cgroup"].(map[string]any); cg["delegated"] != true || cg["path"] != "/sys/fs/cgroup/x" || cg["reason"] != nil {
		t.Fatalf("delegated cgroup: %v", cg)
	}
	if d := h["docker"].(map[string]any); d["available"] != false || *d["reason"].(*string) != "no engine" {
		t.Fatalf("docker block: %v", d)
	}
}
