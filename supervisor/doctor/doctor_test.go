package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
)

// doctorOptions isolates Run from the host: a fake probe, an empty
// PATH, no Docker sockets, an empty sysctl tree.
func doctorOptions(t *testing.T, probe nsholder.ProbeResult) Options {
	t.Helper()
	tmp := t.TempDir()
	return Options{
		Self:          "/opt/esbx/bin/sandbox-supervisor",
		DataDir:       filepath.Join(tmp, "data"),
		Env:           []string{"PATH=" + filepath.Join(tmp, "emptybin")},
		ProcSys:       filepath.Join(tmp, "proc-sys"),
		DockerSockets: []string{filepath.Join(tmp, "docker.sock")},
		Probe:         func(context.Context, string) nsholder.ProbeResult { return probe },
	}
}

var probeOK = nsholder.ProbeResult{UserNamespaces: true, KernelOverlay: true}

func TestDoctorFuseDeviceUnreadable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root opens a mode-000 file")
	}
	opt := doctorOptions(t, probeOK)
	opt.FuseDevice = filepath.Join(t.TempDir(), "fuse")
	if err := os.WriteFile(opt.FuseDevice, nil, 0o000); err != nil {
		t.Fatal(err)
	}
	r := Run(context.Background(), opt)
	c := r.Check("fuse_device")
	if c.ID == "" || c.OK || c.Required {
		t.Fatalf("fuse_device = %+v, want an optional failure", c)
	}
	if c.Fix != "sudo chmod 0666 "+opt.FuseDevice {
		t.Errorf("fix = %q", c.Fix)
	}
	if !r.OK {
		t.Errorf("an optional failure made the report fail: %+v", r)
	}
	var out bytes.Buffer
	r.WriteText(&out)
	if !strings.Contains(out.String(), "WARN fuse_device: cannot open "+opt.FuseDevice) ||
		!strings.Contains(out.String(), "    fix: sudo chmod 0666 "+opt.FuseDevice+"\n") {
		t.Errorf("text output:\n%s", out.String())
	}
}

func TestDoctorSubIDWithoutNewuidmap(t *testing.T) {
	r := Run(context.Background(), doctorOptions(t, probeOK))
	c := r.Check("subid")
	if c.OK || c.Required || !strings.Contains(c.Detail, "newuidmap and newgidmap not found on PATH") {
		t.Fatalf("subid = %+v", c)
	}
	if !strings.HasPrefix(c.Fix, "sudo apt-get install uidmap") {
		t.Errorf("fix = %q", c.Fix)
	}
	if !r.OK {
		t.Errorf("report not ok: %+v", r)
	}
	var out bytes.Buffer
	r.WriteText(&out)
	if !strings.Contains(out.String(), "WARN subid: ") || !strings.Contains(out.String(), "    fix: sudo apt-get install uidmap") {
		t.Errorf("text output:\n%s", out.String())
	}

	// sandbox.id_mapping: subid makes it required.
	opt := doctorOptions(t, probeOK)
	opt.Config = config.Default()
	opt.Config.Sandbox.IDMapping = "subid"
	r = Run(context.Background(), opt)
	if c := r.Check("subid"); !c.Required || c.OK || r.OK {
		t.Errorf("with id_mapping subid: ok=%v subid=%+v", r.OK, c)
	}
	out.Reset()
	r.WriteText(&out)
	if !strings.Contains(out.String(), "FAIL subid: ") {
		t.Errorf("text output:\n%s", out.String())
	}
}

func TestDoctorSubIDRanges(t *testing.T) {
	opt := doctorOptions(t, probeOK)
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"newuidmap", "newgidmap"} {
		if err := os.WriteFile(filepath.Join(bin, h), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opt.Env = []string{"PATH=" + bin}
	dir := t.TempDir()
	opt.SubUIDFile, opt.SubGIDFile = filepath.Join(dir, "subuid"), filepath.Join(dir, "subgid")
	if err := os.WriteFile(opt.SubUIDFile, []byte("someoneelse:100000:65536\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := Run(context.Background(), opt).Check("subid")
	if c.OK || !strings.HasPrefix(c.Fix, "sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 ") {
		t.Fatalf("subid without a range = %+v", c)
	}
	line := []byte(strconv.Itoa(os.Geteuid()) + ":200000:65536\n")
	for _, f := range []string{opt.SubUIDFile, opt.SubGIDFile} {
		if err := os.WriteFile(f, line, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c = Run(context.Background(), opt).Check("subid")
	if !c.OK || !strings.Contains(c.Detail, "subuid 200000-265535") || !strings.Contains(c.Detail, "subgid 200000-265535") {
		t.Fatalf("subid with ranges = %+v", c)
	}
}

func TestDoctorUserNSAppArmor(t *testing.T) {
	opt := doctorOptions(t, nsholder.ProbeResult{UserNSReason: "cannot start a process in a new user namespace: fork/exec: permission denied"})
	knob := filepath.Join(opt.ProcSys, "kernel", "apparmor_restrict_unprivileged_userns")
	if err := os.MkdirAll(filepath.Dir(knob), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(knob, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(opt.ProcSys, "kernel", "unprivileged_userns_clone"), []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := Run(context.Background(), opt)
	if r.OK {
		t.Fatal("report ok without user namespaces")
	}
	c := r.Check("userns")
	if c.OK || !c.Required || !strings.Contains(c.Detail, "AppArmor") || !strings.Contains(c.Detail, "kernel.unprivileged_userns_clone is 0") {
		t.Fatalf("userns = %+v", c)
	}
	for _, want := range []string{
		"sudo sysctl -w kernel.unprivileged_userns_clone=1",
		"profile sandbox-supervisor /opt/esbx/bin/sandbox-supervisor flags=(unconfined) {\n  userns,",
		"sudo apparmor_parser -r /etc/apparmor.d/sandbox-supervisor",
		"sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
	} {
		if !strings.Contains(c.Fix, want) {
			t.Errorf("fix lacks %q:\n%s", want, c.Fix)
		}
	}
	if o := r.Check("kernel_overlay"); o.OK || !o.Required {
		t.Errorf("kernel_overlay = %+v", o)
	}
	var out bytes.Buffer
	r.WriteText(&out)
	if !strings.Contains(out.String(), "FAIL userns: ") || !strings.Contains(out.String(), "\n         profile sandbox-supervisor ") {
		t.Errorf("text output:\n%s", out.String())
	}
}

func TestDoctorOverlayFailure(t *testing.T) {
	r := Run(context.Background(), doctorOptions(t, nsholder.ProbeResult{UserNamespaces: true, OverlayReason: "mount overlay with userxattr: invalid argument"}))
	c := r.Check("kernel_overlay")
	if r.OK || c.OK || !strings.Contains(c.Detail, "mount overlay with userxattr: invalid argument") || c.Fix == "" {
		t.Fatalf("ok=%v kernel_overlay=%+v", r.OK, c)
	}
	if u := r.Check("userns"); !u.OK {
		t.Errorf("userns = %+v", u)
	}
}

func TestDoctorJSONShape(t *testing.T) {
	r := Run(context.Background(), doctorOptions(t, probeOK))
	var buf bytes.Buffer
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var got struct {
		OK     *bool            `json:"ok"`
		Checks []map[string]any `json:"checks"`
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	if got.OK == nil || !*got.OK {
		t.Fatalf("ok = %v\n%s", got.OK, buf.String())
	}
	var ids []string
	for _, c := range got.Checks {
		if len(c) != 5 {
			t.Errorf("check has keys %v, want id, required, ok, detail, fix", c)
		}
		for k, typ := range map[string]string{"id": "string", "required": "bool", "ok": "bool", "detail": "string", "fix": "string"} {
			switch c[k].(type) {
			case string:
				if typ != "string" {
					t.Errorf("%v: %s is a string", c["id"], k)
				}
			case bool:
				if typ != "bool" {
					t.Errorf("%v: %s is a bool", c["id"], k)
				}
			default:
				t.Errorf("%v: %s = %#v", c["id"], k, c[k])
			}
		}
		ids = append(ids, c["id"].(string))
	}
	want := "userns kernel_overlay fuse_device fuse_overlay subid cgroup_delegation docker systemd_user net_helper net_tun exec_shim"
	if strings.Join(ids, " ") != want {
		t.Errorf("ids = %v, want %s", ids, want)
	}
}

// TestDoctorFuseFallback: with overlay auto, a failed kernel overlay is not
// fatal when the FUSE overlay works; the FUSE check is then the required one.
func TestDoctorFuseFallback(t *testing.T) {
	tests := []struct {
		name           string
		probe          nsholder.ProbeResult
		ok             bool
		kernelRequired bool
		fuseRequired   bool
	}{
		{"both", nsholder.ProbeResult{UserNamespaces: true, KernelOverlay: true, FuseOverlay: true}, true, true, false},
		{"fuse only", nsholder.ProbeResult{UserNamespaces: true, OverlayReason: "no", FuseOverlay: true}, true, false, true},
		{"kernel only", nsholder.ProbeResult{UserNamespaces: true, KernelOverlay: true, FuseReason: "no"}, true, true, false},
		{"neither", nsholder.ProbeResult{UserNamespaces: true, OverlayReason: "no", FuseReason: "no fuse"}, false, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Run(context.Background(), doctorOptions(t, tc.probe))
			k, f := r.Check("kernel_overlay"), r.Check("fuse_overlay")
			if r.OK != tc.ok || k.Required != tc.kernelRequired || f.Required != tc.fuseRequired || f.OK != tc.probe.FuseOverlay {
				t.Fatalf("ok=%v kernel=%+v fuse=%+v", r.OK, k, f)
			}
			if !f.OK && (f.Fix == "" || !strings.Contains(f.Detail, tc.probe.FuseReason)) {
				t.Errorf("fuse_overlay failure without reason or fix: %+v", f)
			}
		})
	}
}

// TestDoctorNetwork: the helper and /dev/net/tun checks are optional and
// name the fix: the package to install, the device mode.
func TestDoctorNetwork(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root opens a mode-000 file")
	}
	for _, tc := range []struct {
		name              string
		bins              []string
		helper            string
		tunMode           os.FileMode // 0: absent
		helperOK, tunOK   bool
		helperFix, tunFix string
	}{
		{name: "nothing", helperFix: "sudo apt-get install passt (pasta; or slirp4netns)", tunFix: "sudo modprobe tun; "},
		{name: "pasta, tun 0600", bins: []string{"pasta"}, tunMode: 0o200, helperOK: true, tunFix: "sudo chmod 0666 "},
		{name: "slirp4netns, tun ok", bins: []string{"slirp4netns"}, tunMode: 0o600, helperOK: true, tunOK: true},
		{name: "wanted slirp4netns missing", bins: []string{"pasta"}, helper: "slirp4netns", tunMode: 0o600, tunOK: true, helperFix: "sudo apt-get install slirp4netns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt := doctorOptions(t, probeOK)
			bin := filepath.Join(t.TempDir(), "bin")
			if err := os.MkdirAll(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, b := range tc.bins {
				if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			opt.Env = []string{"PATH=" + bin}
			opt.TunDevice = filepath.Join(t.TempDir(), "tun")
			if tc.tunMode != 0 {
				if err := os.WriteFile(opt.TunDevice, nil, tc.tunMode); err != nil {
					t.Fatal(err)
				}
			}
			if tc.helper != "" {
				opt.Config = config.Default()
				opt.Config.Network.Isolated.Helper = tc.helper
			}
			r := Run(context.Background(), opt)
			h, tun := r.Check("net_helper"), r.Check("net_tun")
			if h.ID == "" || h.Required || h.OK != tc.helperOK || !strings.HasPrefix(h.Fix, tc.helperFix) || (tc.helperFix == "") != (h.Fix == "") {
				t.Errorf("net_helper = %+v", h)
			}
			if tun.ID == "" || tun.Required || tun.OK != tc.tunOK || !strings.HasPrefix(tun.Fix, tc.tunFix) || (tc.tunFix == "") != (tun.Fix == "") {
				t.Errorf("net_tun = %+v", tun)
			}
			if !r.OK {
				t.Errorf("optional network checks failed the report: %+v", r)
			}
		})
	}
}

// TestDoctorExecShim: the exec shim next to the supervisor is found when it
// is an executable file; a missing or non-executable one is reported, not
// required, with the command that builds it.
func TestDoctorExecShim(t *testing.T) {
	cases := []struct {
		name string
		mode os.FileMode // 0: no file
		ok   bool
	}{
		{"installed", 0o755, true},
		{"missing", 0, false},
		{"not executable", 0o644, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opt := doctorOptions(t, probeOK)
			dir := t.TempDir()
			opt.Self = filepath.Join(dir, "sandbox-supervisor")
			if tc.mode != 0 {
				if err := os.WriteFile(filepath.Join(dir, nsholder.ExecShimName), []byte("#!/bin/sh\n"), tc.mode); err != nil {
					t.Fatal(err)
				}
			}
			r := Run(context.Background(), opt)
			c := r.Check("exec_shim")
			if c.ID != "exec_shim" || c.Required || c.OK != tc.ok {
				t.Fatalf("check = %+v, want ok %v, not required", c, tc.ok)
			}
			if !tc.ok && (!strings.Contains(c.Fix, "build.sh "+filepath.Join(dir, nsholder.ExecShimName)) || !strings.Contains(c.Detail, "slower")) {
				t.Fatalf("fix/detail do not say how: %+v", c)
			}
			if !r.OK {
				t.Fatalf("a missing shim failed the report: %+v", r)
			}
		})
	}
}
