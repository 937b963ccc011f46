package resources

// cgroup v2 use when the supervisor's own cgroup is delegated (§10.2, §4.2,
// §5.6): a systemd user unit with Delegate=yes gives the user a writable
// subtree. The supervisor then moves itself into a leaf "supervisor"
// (cgroup v2 forbids processes in a cgroup whose controllers are enabled for
// its children), enables the available controllers, and keeps one cgroup
// per sandbox with one leaf per workspace session; a session's holder is
// moved into its leaf right after it starts, so every process of the
// session (and the FUSE overlay served by the holder) is charged there.
//
// Without delegation (cgroup v1 or hybrid hierarchies, or a cgroup we may
// not write) nothing is created: the sampler sums /proc instead and
// metrics_source says "proc" with the reason in cgroup_error.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Cgroups is the supervisor's view of its delegated cgroup subtree. Its
// exported fields are set once by SetupCgroups and only read afterwards.
type Cgroups struct {
	Delegated bool
	Root      string // absolute path of the supervisor's (parent) cgroup
	Reason    string // why delegation is not used ("" when delegated)

	mu       sync.Mutex
	sessions map[string]string // workspace session ID → its leaf cgroup
}

// wantControllers are the controllers the samples read.
var wantControllers = []string{"cpu", "memory", "io", "pids"}

// SetupCgroups detects delegation of this process's cgroup under mount
// (normally /sys/fs/cgroup, with selfFile /proc/self/cgroup) and, when it is
// delegated, prepares the subtree. Any failure leaves delegated false with
// the reason.
func SetupCgroups(mount, selfFile string) *Cgroups {
	cg := &Cgroups{sessions: map[string]string{}}
	var sfs unix.Statfs_t
	if err := unix.Statfs(mount, &sfs); err != nil || int64(sfs.Type) != unix.CGROUP2_SUPER_MAGIC {
		cg.Reason = mount + " is not a cgroup v2 mount (cgroup v1 or hybrid hierarchy); resource samples come from /proc"
		return cg
	}
	b, err := os.ReadFile(selfFile)
	if err != nil {
		cg.Reason = "cannot read " + selfFile + ": " + err.Error()
		return cg
	}
	rel := ""
	for l := range strings.SplitSeq(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			rel = strings.TrimSpace(p)
		}
	}
	if rel == "" {
		cg.Reason = "no cgroup v2 path in " + selfFile
		return cg
	}
	root := filepath.Join(mount, rel)
	if unix.Access(root, unix.W_OK) != nil || unix.Access(filepath.Join(root, "cgroup.subtree_control"), unix.W_OK) != nil ||
		unix.Access(filepath.Join(root, "cgroup.procs"), unix.W_OK) != nil {
		cg.Reason = "cgroup " + rel + " is not delegated to uid " + strconv.Itoa(os.Geteuid()) +
			" (run the supervisor as a systemd user unit with Delegate=yes); resource samples come from /proc"
		return cg
	}
	if err := cg.prepare(root); err != nil {
		cg.Reason = "cgroup " + rel + " is writable but cannot be prepared: " + err.Error()
		return cg
	}
	cg.Delegated, cg.Root = true, root
	return cg
}

// prepare moves this process into root/supervisor and enables the wanted
// controllers that root offers for its children.
func (cg *Cgroups) prepare(root string) error {
	leaf := filepath.Join(root, "supervisor")
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return fmt.Errorf("move the supervisor into %s: %w", leaf, err)
	}
	return enableControllers(root)
}

// enableControllers writes +c for every wanted controller dir offers.
func enableControllers(dir string) error {
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, c := range strings.Fields(string(avail)) {
		have[c] = true
	}
	var ctl []string
	for _, c := range wantControllers {
		if have[c] {
			ctl = append(ctl, "+"+c)
		}
	}
	if len(ctl) == 0 {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(ctl, " ")), 0); err != nil {
		return fmt.Errorf("enable controllers in %s: %w", dir, err)
	}
	return nil
}

// SandboxPath is the sandbox's cgroup ("" without delegation).
func (cg *Cgroups) SandboxPath(sandboxID string) string {
	if cg == nil || !cg.Delegated {
		return ""
	}
	return filepath.Join(cg.Root, sandboxID)
}

// SessionPath is the session's leaf cgroup once its holder was attached.
func (cg *Cgroups) SessionPath(sessionID string) string {
	if cg == nil || !cg.Delegated {
		return ""
	}
	cg.mu.Lock()
	defer cg.mu.Unlock()
	return cg.sessions[sessionID]
}

// Attach creates the sandbox and session cgroups and moves the holder pid
// into the session's leaf. Without delegation it does nothing.
func (cg *Cgroups) Attach(sandboxID, sessionID string, pid int) error {
	if cg == nil || !cg.Delegated {
		return nil
	}
	sbDir := cg.SandboxPath(sandboxID)
	if err := os.Mkdir(sbDir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := enableControllers(sbDir); err != nil {
		return err
	}
	leaf := filepath.Join(sbDir, sessionID)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("move holder %d into %s: %w", pid, leaf, err)
	}
	cg.mu.Lock()
	cg.sessions[sessionID] = leaf
	cg.mu.Unlock()
	return nil
}

// RemoveSession kills what is left in the session's leaf and removes it.
func (cg *Cgroups) RemoveSession(sessionID string) {
	if cg == nil || !cg.Delegated {
		return
	}
	cg.mu.Lock()
	leaf := cg.sessions[sessionID]
	delete(cg.sessions, sessionID)
	cg.mu.Unlock()
	if leaf == "" {
		return
	}
	_ = os.WriteFile(filepath.Join(leaf, "cgroup.kill"), []byte("1"), 0)
	_ = os.Remove(leaf) // fails (EBUSY) while dying processes remain; the sandbox removal retries
}

// RemoveSandbox removes the sandbox's cgroup and any leaves left in it.
func (cg *Cgroups) RemoveSandbox(sandboxID string) {
	dir := cg.SandboxPath(sandboxID)
	if dir == "" {
		return
	}
	if names, err := ReadNames(dir, 4096); err == nil {
		for _, n := range names {
			p := filepath.Join(dir, n)
			if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
				_ = os.WriteFile(filepath.Join(p, "cgroup.kill"), []byte("1"), 0)
				_ = os.Remove(p)
			}
		}
	}
	_ = os.Remove(dir)
}

// ReadCgroupMetrics reads §10.2's metrics of one cgroup directory.
func ReadCgroupMetrics(dir string) (Metrics, error) {
	m := Metrics{MetricsSource: "cgroup", CgroupAvailable: true}
	p := dir
	m.CgroupPath = &p
	b, err := ReadSmall(filepath.Join(dir, "cpu.stat"), 4096)
	if err != nil {
		return m, err
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
			m.CPUUsec, _ = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	if b, err = ReadSmall(filepath.Join(dir, "memory.current"), 64); err != nil {
		return m, err
	}
	m.MemCur, _ = strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if b, err = ReadSmall(filepath.Join(dir, "memory.max"), 64); err == nil {
		if v := string(bytes.TrimSpace(b)); v == "max" {
			m.MemMaxUnlimited = true
		} else if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			m.MemMax = &n
		}
	} else {
		m.MemMaxUnlimited = true // the root-most cgroups have no memory.max
	}
	if b, err = ReadSmall(filepath.Join(dir, "io.stat"), 64<<10); err == nil {
		for l := range strings.SplitSeq(string(b), "\n") {
			for _, f := range strings.Fields(l) {
				k, v, ok := strings.Cut(f, "=")
				if !ok {
					continue
				}
				n, _ := strconv.ParseUint(v, 10, 64)
				switch k {
				case "rbytes":
					m.IORBytes += n
				case "wbytes":
					m.IOWBytes += n
				}
			}
		}
	}
	if b, err = ReadSmall(filepath.Join(dir, "pids.current"), 64); err == nil {
		n, _ := strconv.Atoi(string(bytes.TrimSpace(b)))
		m.PidsCur = n
	}
	return m, nil
}
