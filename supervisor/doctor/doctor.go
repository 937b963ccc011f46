package doctor

// `sandbox-supervisor doctor` (§13): every host capability of §4.5, each
// with pass or fail and the exact fix. The checks only look; nothing on the
// host is changed (the overlay probe works in a scratch directory it
// removes again).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
)

// Options are the host lookups of Run; zero fields take the real
// host's values, tests replace them.
type Options struct {
	// Self is the sandbox-supervisor binary run for the overlay probe
	// (default os.Executable) and named in the AppArmor profile.
	Self string
	// DataDir is where sessions will live; the probe runs in it, or in its
	// nearest existing ancestor when it does not exist yet (default: the
	// resolved data directory).
	DataDir string
	// Config is the configuration to judge against (nil: the defaults).
	// sandbox.id_mapping: subid makes the subid check required;
	// images.docker_host is tried first.
	Config *config.Config
	// ConfigErr is a configuration that failed to load: reported as a
	// failed required check.
	ConfigErr error
	// Env is the process environment (PATH, USER, XDG_RUNTIME_DIR,
	// DOCKER_HOST); default os.Environ().
	Env []string
	// FuseDevice defaults to /dev/fuse.
	FuseDevice string
	// TunDevice defaults to /dev/net/tun (network_profile isolated).
	TunDevice string
	// SubUIDFile and SubGIDFile default to /etc/subuid and /etc/subgid.
	SubUIDFile, SubGIDFile string
	// ProcSys defaults to /proc/sys (sysctls).
	ProcSys string
	// CgroupRoot defaults to /sys/fs/cgroup, SelfCgroup to /proc/self/cgroup.
	CgroupRoot, SelfCgroup string
	// DockerSockets are the default Docker sockets tried after
	// images.docker_host and DOCKER_HOST (default /var/run/docker.sock and
	// $XDG_RUNTIME_DIR/docker.sock).
	DockerSockets []string
	// Probe replaces nsholder.Probe(ctx, Self, scratchParent).
	Probe func(ctx context.Context, scratchParent string) nsholder.ProbeResult
}

// Check is one line of the report.
type Check struct {
	ID       string `json:"id"`
	Required bool   `json:"required"`
	OK       bool   `json:"ok"`
	Detail   string `json:"detail"`
	Fix      string `json:"fix"` // the exact command or configuration change; "" when OK
}

// Report is the result: OK when every required check passed.
type Report struct {
	OK     bool    `json:"ok"`
	Checks []Check `json:"checks"`
}

// Check returns the check with that id (zero value if absent).
func (r Report) Check(id string) Check {
	for _, c := range r.Checks {
		if c.ID == id {
			return c
		}
	}
	return Check{}
}

// WriteText prints `PASS|FAIL|WARN <id>: <detail>`, an indented fix under
// every check that did not pass, and a summary line.
func (r Report) WriteText(w io.Writer) {
	for _, c := range r.Checks {
		status := "PASS"
		switch {
		case !c.OK && c.Required:
			status = "FAIL"
		case !c.OK:
			status = "WARN"
		}
		fmt.Fprintf(w, "%s %s: %s\n", status, c.ID, c.Detail)
		if !c.OK && c.Fix != "" {
			lines := strings.Split(c.Fix, "\n")
			fmt.Fprintf(w, "    fix: %s\n", lines[0])
			for _, l := range lines[1:] {
				fmt.Fprintf(w, "         %s\n", l)
			}
		}
	}
	if r.OK {
		fmt.Fprintln(w, "ok: everything the configuration needs is present (WARN lines are optional features)")
	} else {
		fmt.Fprintln(w, "not ok: fix the FAIL lines above; the supervisor cannot create sandboxes until then")
	}
}

// WriteJSON prints the report as one JSON object.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

type doctor struct {
	opt  Options
	env  map[string]string
	user string
}

// Run runs every check.
func Run(ctx context.Context, opt Options) Report {
	if opt.Env == nil {
		opt.Env = os.Environ()
	}
	d := &doctor{opt: opt, env: map[string]string{}}
	for _, kv := range opt.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			d.env[k] = v
		}
	}
	if d.opt.Self == "" {
		if p, err := os.Executable(); err == nil {
			d.opt.Self = p
		}
	}
	if p, err := filepath.EvalSymlinks(d.opt.Self); err == nil {
		d.opt.Self = p
	}
	if d.opt.DataDir == "" {
		if dirs, err := catalog.ResolveDirs(); err == nil {
			d.opt.DataDir = dirs.Data
		}
	}
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&d.opt.FuseDevice, "/dev/fuse")
	def(&d.opt.TunDevice, "/dev/net/tun")
	def(&d.opt.SubUIDFile, "/etc/subuid")
	def(&d.opt.SubGIDFile, "/etc/subgid")
	def(&d.opt.ProcSys, "/proc/sys")
	def(&d.opt.CgroupRoot, "/sys/fs/cgroup")
	def(&d.opt.SelfCgroup, "/proc/self/cgroup")
	if d.opt.DockerSockets == nil {
		// §4.2 order: rootless Docker's socket first, then the system one.
		d.opt.DockerSockets = []string{}
		if x := d.env["XDG_RUNTIME_DIR"]; x != "" {
			d.opt.DockerSockets = append(d.opt.DockerSockets, filepath.Join(x, "docker.sock"))
		}
		d.opt.DockerSockets = append(d.opt.DockerSockets, "/var/run/docker.sock")
	}
	if d.opt.Probe == nil {
		self := d.opt.Self
		d.opt.Probe = func(ctx context.Context, dir string) nsholder.ProbeResult {
			return applyProbeKnobs(nsholder.Probe(ctx, self, dir), func(k string) string { return d.env[k] })
		}
	}
	d.user = strconv.Itoa(os.Geteuid())
	if u, err := user.LookupId(d.user); err == nil && u.Username != "" {
		d.user = u.Username
	}

	var r Report
	if opt.ConfigErr != nil {
		r.Checks = append(r.Checks, Check{ID: "config", Required: true, Detail: opt.ConfigErr.Error(),
			Fix: "correct the key named above in the configuration file (unknown keys and invalid values are refused)"})
	}
	userns, overlay, fuseOverlay := d.checkNamespacesAndOverlay(ctx)
	r.Checks = append(r.Checks, userns, overlay, d.checkFuse(), fuseOverlay, d.checkSubID(),
		d.checkCgroup(), d.checkDocker(ctx), d.checkSystemdUser(ctx), d.checkNetHelper(), d.checkTun(), d.checkExecShim())
	r.OK = true
	for _, c := range r.Checks {
		if c.Required && !c.OK {
			r.OK = false
		}
	}
	return r
}

func (d *doctor) sysctl(name string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(d.opt.ProcSys, strings.ReplaceAll(name, ".", "/")))
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// persist is the command that keeps a sysctl across reboots.
func persist(kv string) string {
	return fmt.Sprintf("echo '%s' | sudo tee /etc/sysctl.d/90-ephemeral-sandbox.conf", kv)
}

// appArmorFix is the profile that lets the supervisor binary create user
// namespaces under Ubuntu's restriction, and how to load it.
func (d *doctor) appArmorFix() string {
	self := d.opt.Self
	if self == "" {
		self = "/usr/local/bin/sandbox-supervisor"
	}
	return "install this AppArmor profile as /etc/apparmor.d/sandbox-supervisor:\n" +
		"abi <abi/4.0>,\n" +
		"include <tunables/global>\n" +
		"profile sandbox-supervisor " + self + " flags=(unconfined) {\n" +
		"  userns,\n" +
		"  include if exists <local/sandbox-supervisor>\n" +
		"}\n" +
		"then load it: sudo apparmor_parser -r /etc/apparmor.d/sandbox-supervisor\n" +
		"(or lift the restriction for everyone: sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 && " +
		persist("kernel.apparmor_restrict_unprivileged_userns=0") + ")"
}

// inContainer reports whether this process looks like it runs in a container.
func inContainer() bool {
	for _, p := range []string{"/.dockerenv", "/run/.containerenv"} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// probeDir is the data directory or its nearest existing ancestor.
func (d *doctor) probeDir() string {
	dir := d.opt.DataDir
	if dir == "" {
		return os.TempDir()
	}
	for {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir
		}
		dir = parent
	}
}

// checkNamespacesAndOverlay runs the probe once and judges user namespaces,
// the kernel overlay and the FUSE overlay. The default configuration
// (overlay: auto) needs one of the two drivers: kernel_overlay is required
// unless it failed and fuse_overlay works, fuse_overlay only when the
// kernel overlay failed; sandbox.default_overlay naming a driver makes
// just that one required.
func (d *doctor) checkNamespacesAndOverlay(ctx context.Context) (userns, overlay, fuseOverlay Check) {
	userns = Check{ID: "userns", Required: true}
	overlay = Check{ID: "kernel_overlay", Required: true}
	fuseOverlay = Check{ID: "fuse_overlay", Required: true}
	dir := d.probeDir()
	res := d.opt.Probe(ctx, dir)
	defer func() {
		want := "auto"
		if d.opt.Config != nil && d.opt.Config.Sandbox.DefaultOverlay != "" {
			want = d.opt.Config.Sandbox.DefaultOverlay
		}
		switch want {
		case "kernel":
			fuseOverlay.Required = false
		case "fuse":
			overlay.Required = false
		default:
			// auto: the kernel overlay is the one wanted; when it fails,
			// the FUSE overlay is the fallback that must work instead.
			overlay.Required = overlay.OK || !fuseOverlay.OK
			fuseOverlay.Required = !overlay.OK
		}
	}()
	switch {
	case !res.UserNamespaces:
		fuseOverlay.Detail = "not probed: needs a user namespace"
		fuseOverlay.Fix = "fix the userns check first"
	case res.FuseOverlay:
		fuseOverlay.OK = true
		fuseOverlay.Detail = "the FUSE overlay mounts in a user namespace on " + fsName(dir) + " at " + probedAt(d, dir) + ", reads a lower file and creates into the upper"
	default:
		fuseOverlay.Detail = res.FuseReason + " (probed on " + fsName(dir) + " at " + probedAt(d, dir) + ")"
		if _, err := os.Stat(d.opt.FuseDevice); err != nil {
			fuseOverlay.Fix = "sudo modprobe fuse; " + d.opt.FuseDevice + " must exist with mode 0666"
		} else {
			fuseOverlay.Fix = "sudo chmod 0666 " + d.opt.FuseDevice + " (unprivileged FUSE mounts in a user namespace need Linux ≥ 4.18 and a readable, writable /dev/fuse)"
		}
	}
	where := dir
	if d.opt.DataDir != "" && dir != d.opt.DataDir {
		where = dir + " (the data directory " + d.opt.DataDir + " does not exist yet)"
	}

	if res.UserNamespaces {
		userns.OK, userns.Detail = true, "unprivileged user namespaces work (a probe process ran as root of its own user namespace)"
	} else {
		userns.Detail = res.UserNSReason
		if userns.Detail == "" {
			userns.Detail = "cannot start a process in a new user namespace"
		}
		var why, fixes []string
		if v, ok := d.sysctl("kernel.unprivileged_userns_clone"); ok && v == "0" {
			why = append(why, "kernel.unprivileged_userns_clone is 0")
			fixes = append(fixes, "sudo sysctl -w kernel.unprivileged_userns_clone=1 && "+persist("kernel.unprivileged_userns_clone=1"))
		}
		if v, ok := d.sysctl("user.max_user_namespaces"); ok && v == "0" {
			why = append(why, "user.max_user_namespaces is 0")
			fixes = append(fixes, "sudo sysctl -w user.max_user_namespaces=65536 && "+persist("user.max_user_namespaces=65536"))
		}
		if v, ok := d.sysctl("kernel.apparmor_restrict_unprivileged_userns"); ok && v == "1" {
			why = append(why, "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)")
			fixes = append(fixes, d.appArmorFix())
		}
		if len(why) > 0 {
			userns.Detail += "; cause: " + strings.Join(why, ", ")
		} else if inContainer() {
			userns.Detail += "; this looks like a container whose seccomp profile or capabilities forbid user namespaces"
			fixes = append(fixes, "run on the host, or start the container with --security-opt seccomp=unconfined --security-opt apparmor=unconfined (or --privileged)")
		}
		if len(fixes) == 0 {
			fixes = append(fixes, "enable unprivileged user namespaces: the kernel needs CONFIG_USER_NS=y, and `unshare -Ur true` must work as "+d.user)
		}
		userns.Fix = strings.Join(fixes, "\n")
	}

	switch {
	case !res.UserNamespaces:
		overlay.Detail = "not probed: needs a user namespace"
		overlay.Fix = "fix the userns check first"
	case res.KernelOverlay:
		overlay.OK = true
		overlay.Detail = "OverlayFS with userxattr mounts in a user namespace on " + fsName(dir) + " at " + where + ", whiteouts and user.overlay.opaque work"
		if res.LowerdirPlus {
			overlay.Detail += ", lowerdir+ available"
		}
	default:
		overlay.Detail = res.OverlayReason + " (probed on " + fsName(dir) + " at " + where + "; kernel " + KernelRelease() + ")"
		var fixes []string
		if !kernelAtLeast(KernelRelease(), 5, 11) {
			fixes = append(fixes, "upgrade to Linux ≥ 5.11 (OverlayFS in a user namespace with userxattr); this kernel is "+KernelRelease())
		}
		if !goodOverlayFS(dir) {
			fixes = append(fixes, "put the data directory on ext4, xfs or btrfs: set XDG_DATA_HOME (or EPHEMERAL_SANDBOX_HOME) to a directory on such a filesystem; "+dir+" is "+fsName(dir))
		}
		if v, ok := d.sysctl("kernel.apparmor_restrict_unprivileged_userns"); ok && v == "1" && strings.Contains(res.OverlayReason, "not permitted") {
			fixes = append(fixes, d.appArmorFix())
		}
		if inContainer() {
			fixes = append(fixes, "this looks like a container: it must allow mount(2) in user namespaces (e.g. --security-opt seccomp=unconfined --security-opt apparmor=unconfined), or run on the host")
		}
		if len(fixes) == 0 {
			fixes = append(fixes, "use Linux ≥ 5.11 with the data directory on ext4, xfs or btrfs, not inside a container that forbids mounts in user namespaces")
		}
		overlay.Fix = strings.Join(fixes, "\n")
	}
	return userns, overlay, fuseOverlay
}

// where names the probed directory for a detail line.
func probedAt(d *doctor, dir string) string {
	if d.opt.DataDir != "" && dir != d.opt.DataDir {
		return dir + " (the data directory " + d.opt.DataDir + " does not exist yet)"
	}
	return dir
}

func fsName(dir string) string {
	var s unix.Statfs_t
	if unix.Statfs(dir, &s) != nil {
		return "unknown filesystem"
	}
	switch int64(s.Type) {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	case unix.FUSE_SUPER_MAGIC:
		return "fuse"
	}
	return fmt.Sprintf("filesystem type %#x", s.Type)
}

func goodOverlayFS(dir string) bool {
	switch fsName(dir) {
	case "ext4", "xfs", "btrfs":
		return true
	}
	return false
}

// kernelAtLeast compares the leading "major.minor" of a release string.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return true // unknown: do not blame the kernel
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return true
	}
	return ma > major || (ma == major && mi >= minor)
}

func (d *doctor) checkFuse() Check {
	c := Check{ID: "fuse_device", Required: false}
	dev := d.opt.FuseDevice
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err == nil {
		f.Close()
		c.OK, c.Detail = true, dev+" opens read-write (the FUSE overlay driver needs it; whether that driver mounts is the fuse_overlay check)"
		return c
	}
	msg := err.Error()
	var pe *fs.PathError
	if errors.As(err, &pe) {
		msg = pe.Err.Error()
	}
	c.Detail = "cannot open " + dev + ": " + msg + " (only the FUSE overlay driver needs it)"
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.Fix = "sudo modprobe fuse (and make it permanent: echo fuse | sudo tee /etc/modules-load.d/fuse.conf); " + dev + " must then exist with mode 0666"
	default:
		c.Fix = "sudo chmod 0666 " + dev
	}
	return c
}

// checkExecShim: every command starts through the exec shim installed
// next to the supervisor (a small C program, built by `make`); without it
// commands fall back to the supervisor's own Go shim, which starts slower.
// Optional: sandboxes work either way.
func (d *doctor) checkExecShim() Check {
	c := Check{ID: "exec_shim"}
	want := filepath.Join(filepath.Dir(d.selfOr()), nsholder.ExecShimName)
	if p := nsholder.ExecShimNextTo(d.selfOr()); p != "" {
		c.OK, c.Detail = true, p+" starts every session command"
		return c
	}
	c.Detail = "no executable " + want + ": commands start through `sandbox-supervisor nsholder shim` instead, which starts each command slower"
	c.Fix = "make install from the source tree (it builds the shim with a C compiler: sudo apt-get install gcc linux-libc-dev), or sh cmd/sandbox-exec-shim/build.sh " + want
	return c
}

// HelperPackage names the Debian package of a network helper binary
// ("" for one we do not know).
func HelperPackage(helper string) string {
	switch helper {
	case nsholder.HelperPasta:
		return "passt"
	case nsholder.HelperSlirp4netns:
		return "slirp4netns"
	}
	return ""
}

// checkNetHelper: network_profile isolated needs pasta or slirp4netns
// (optional: shared and offline sessions need neither).
func (d *doctor) checkNetHelper() Check {
	c := Check{ID: "net_helper"}
	want := "auto"
	if d.opt.Config != nil && d.opt.Config.Network.Isolated.Helper != "" {
		want = d.opt.Config.Network.Isolated.Helper
	}
	names := []string{nsholder.HelperPasta, nsholder.HelperSlirp4netns}
	if want != "auto" {
		names = []string{want}
	}
	for i, n := range names {
		if p, ok := d.lookPath(n); ok {
			c.OK, c.Detail = true, "network_profile isolated uses "+n+" ("+p+")"
			if want == "auto" && i == 0 {
				if _, ok := d.lookPath(nsholder.HelperSlirp4netns); !ok {
					c.Detail += "; slirp4netns, the alternative, is not installed (sudo apt-get install slirp4netns)"
				}
			} else if want == "auto" {
				c.Detail += "; pasta is preferred where installed (sudo apt-get install passt)"
			}
			return c
		}
	}
	c.Detail = "neither pasta nor slirp4netns is on PATH: network_profile isolated sessions cannot be created (shared and offline work)"
	c.Fix = "sudo apt-get install passt (pasta; or slirp4netns)"
	if want != "auto" {
		c.Detail = want + " (network.isolated.helper) is not on PATH: network_profile isolated sessions cannot be created"
		c.Fix = "sudo apt-get install " + HelperPackage(want)
	}
	return c
}

// checkTun: both helpers open /dev/net/tun inside the session's namespace;
// a 0600 device makes pasta fail with "Failed to open tun socket in
// namespace".
func (d *doctor) checkTun() Check {
	c := Check{ID: "net_tun"}
	dev := d.opt.TunDevice
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err == nil {
		f.Close()
		c.OK, c.Detail = true, dev+" opens read-write (network_profile isolated needs it)"
		return c
	}
	msg := err.Error()
	var pe *fs.PathError
	if errors.As(err, &pe) {
		msg = pe.Err.Error()
	}
	c.Detail = "cannot open " + dev + ": " + msg + " (only network_profile isolated needs it)"
	if errors.Is(err, fs.ErrNotExist) {
		c.Fix = "sudo modprobe tun; " + dev + " must then exist with mode 0666"
	} else {
		c.Fix = "sudo chmod 0666 " + dev + " (as distributions ship it)"
	}
	return c
}

// lookPath finds name on the PATH of the doctor's environment.
func (d *doctor) lookPath(name string) (string, bool) {
	for _, dir := range filepath.SplitList(d.env["PATH"]) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

func (d *doctor) checkSubID() Check {
	required := d.opt.Config != nil && d.opt.Config.Sandbox.IDMapping == nsholder.IDMappingSubID
	c := Check{ID: "subid", Required: required}
	why := "needed only for sandbox.id_mapping: subid"
	if required {
		why = "the configuration sets sandbox.id_mapping: subid"
	}
	var missing []string
	var found []string
	for _, h := range []string{"newuidmap", "newgidmap"} {
		if p, ok := d.lookPath(h); ok {
			found = append(found, p)
		} else {
			missing = append(missing, h)
		}
	}
	if len(missing) > 0 {
		c.Detail = strings.Join(missing, " and ") + " not found on PATH (" + why + ")"
		c.Fix = "sudo apt-get install uidmap (Fedora/RHEL: sudo dnf install shadow-utils; Arch: sudo pacman -S shadow)"
		return c
	}
	uid := os.Geteuid()
	var ranges, bad []string
	for _, file := range []string{d.opt.SubUIDFile, d.opt.SubGIDFile} {
		start, count, err := nsholder.SubIDRange(file, d.user, uid)
		if err != nil {
			msg := err.Error()
			var se *nsholder.SetupError
			if errors.As(err, &se) {
				msg = se.Err
			}
			bad = append(bad, msg)
			continue
		}
		ranges = append(ranges, fmt.Sprintf("%s %d-%d", filepath.Base(file), start, uint64(start)+uint64(count)-1))
	}
	if len(bad) > 0 {
		c.Detail = strings.Join(bad, "; ") + " (" + why + ")"
		c.Fix = "sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 " + d.user
		return c
	}
	c.OK = true
	c.Detail = strings.Join(found, ", ") + "; " + d.user + ": " + strings.Join(ranges, ", ") + " (" + why + ")"
	return c
}

func (d *doctor) checkCgroup() Check {
	c := Check{ID: "cgroup_delegation", Required: false}
	const note = " (optional: resource profiles other than unlimited need it)"
	unitFix := "run the supervisor as a systemd user service with Delegate=yes, e.g. systemd-run --user --unit=sandbox-supervisor -p Delegate=yes " + d.selfOr() + " serve"
	var s unix.Statfs_t
	if err := unix.Statfs(d.opt.CgroupRoot, &s); err != nil || int64(s.Type) != unix.CGROUP2_SUPER_MAGIC {
		c.Detail = d.opt.CgroupRoot + " is not a cgroup v2 mount (cgroup v1 or hybrid hierarchy)" + note
		c.Fix = "boot with the unified hierarchy: add systemd.unified_cgroup_hierarchy=1 to the kernel command line (e.g. GRUB_CMDLINE_LINUX in /etc/default/grub, then sudo update-grub and reboot)"
		return c
	}
	b, err := os.ReadFile(d.opt.SelfCgroup)
	rel := ""
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			rel = p
		}
	}
	if err != nil || rel == "" {
		c.Detail = "cannot find this process's cgroup v2 path in " + d.opt.SelfCgroup + note
		c.Fix = unitFix
		return c
	}
	dir := filepath.Join(d.opt.CgroupRoot, rel)
	controllers, _ := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	ctl := strings.Fields(string(controllers))
	var problems []string
	if unix.Access(dir, unix.W_OK) != nil {
		problems = append(problems, "cannot create child cgroups")
	}
	if unix.Access(filepath.Join(dir, "cgroup.subtree_control"), unix.W_OK) != nil {
		problems = append(problems, "cgroup.subtree_control is not writable")
	}
	for _, want := range []string{"memory", "pids", "cpu"} {
		if !contains(ctl, want) {
			problems = append(problems, "controller "+want+" not delegated")
		}
	}
	if len(problems) > 0 {
		c.Detail = "cgroup " + rel + ": " + strings.Join(problems, ", ") + note
		c.Fix = unitFix
		return c
	}
	c.OK = true
	c.Detail = "cgroup " + rel + " is delegated (controllers: " + strings.Join(ctl, " ") + ")"
	return c
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func (d *doctor) selfOr() string {
	if d.opt.Self != "" {
		return d.opt.Self
	}
	return "sandbox-supervisor"
}
