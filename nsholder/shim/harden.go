// Package shim is command hardening (contract §6.2, §12): every command a
// session holder starts goes through the exec shim
//
//	sandbox-exec-shim [-C DIR] -- ARGV...
//
// which runs as uid 0 of the session's user namespace (with every
// capability of that namespace), drops what a command must not have and
// then execs ARGV.
//
// The package owns what hardening means: the kept capabilities and the
// seccomp rules are tables below, and the per-architecture system call
// numbers are in archtables.go, so they can be audited line by line against
// §6.2. Two programs enforce them. The installed sandbox-exec-shim is
// freestanding C (cmd/sandbox-exec-shim/shim.c), because every command pays
// its start and a Go runtime costs about 1 ms of it; it writes no rule of
// its own but includes harden.h, which CHeader renders from these tables
// (go generate ./nsholder/shim; TestCHeaderIsCurrent fails when the
// committed header is stale). Run is the same in Go: the fallback,
// `sandbox-supervisor nsholder shim -- ARGV...`, when the C shim is not
// installed next to the supervisor. The behaviour tests run both.
//
// It must never let a command run unhardened (any failure: one line and
// exit 126), and Run must not allocate after the filter is on.
package shim

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shimFailureExit is the exit status of a shim that could not harden or exec
// its command. The command never runs unhardened.
const shimFailureExit = 126

// keptCapabilities are the only capabilities a command keeps, in its
// effective, permitted, inheritable and bounding sets (§6.2). They are all
// relative to the session's user namespace. Everything else, up to
// /proc/sys/kernel/cap_last_cap, is dropped; the ambient set is cleared.
var keptCapabilities = []struct {
	Name string
	Bit  uint
}{
	{"CAP_CHOWN", unix.CAP_CHOWN},
	{"CAP_DAC_OVERRIDE", unix.CAP_DAC_OVERRIDE},
	{"CAP_DAC_READ_SEARCH", unix.CAP_DAC_READ_SEARCH},
	{"CAP_FOWNER", unix.CAP_FOWNER},
	{"CAP_FSETID", unix.CAP_FSETID},
	{"CAP_SETUID", unix.CAP_SETUID},
	{"CAP_SETGID", unix.CAP_SETGID},
	{"CAP_SETFCAP", unix.CAP_SETFCAP},
	{"CAP_KILL", unix.CAP_KILL},
	{"CAP_NET_BIND_SERVICE", unix.CAP_NET_BIND_SERVICE},
	{"CAP_NET_RAW", unix.CAP_NET_RAW},
	{"CAP_MKNOD", unix.CAP_MKNOD},
}

// keptCapMask is keptCapabilities as a bit mask (0x880024ff), the value
// /proc/PID/status shows in CapEff, CapPrm, CapInh and CapBnd of a command.
func keptCapMask() uint64 {
	var m uint64
	for _, c := range keptCapabilities {
		m |= 1 << c.Bit
	}
	return m
}

// seccompAction is what the filter does with a matching system call.
type seccompAction int

const (
	// actEPERM fails the call with EPERM.
	actEPERM seccompAction = iota
	// actENOSYS fails the call with ENOSYS (clone3: libc falls back to clone).
	actENOSYS
	// actEPERMIfNewNamespace fails the call with EPERM when the low 32 bits
	// of argument Arg carry any CLONE_NEW* flag (cloneNewNamespaceFlags).
	actEPERMIfNewNamespace
	// actEPERMIfDevice fails the call with EPERM when argument Arg (a mode)
	// has file type S_IFCHR or S_IFBLK; FIFOs, sockets and regular files pass.
	actEPERMIfDevice
)

// cloneNewNamespaceFlags are the namespace flags clone(2) must not carry.
// CLONE_NEWTIME (0x80) lies inside clone(2)'s exit-signal byte (CSIGNAL), so
// in clone(2) it only ever matches an invalid exit signal ≥ 128; it is listed
// for completeness (clone3, where it is meaningful, is refused outright).
const cloneNewNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP |
	unix.CLONE_NEWTIME

// seccompRule is one line of the deny list.
type seccompRule struct {
	Name   string // system call name as in syscalls(2)
	Action seccompAction
	Arg    int // argument index for the conditional actions
}

// seccompRules is the §6.2 deny list. Every other system call is allowed.
// Calls of a foreign architecture (including i386 via int 0x80 on x86_64)
// and x32-ABI calls kill the process.
var seccompRules = []seccompRule{
	// Mounts and the new mount API.
	{Name: "mount", Action: actEPERM},
	{Name: "umount2", Action: actEPERM},
	{Name: "pivot_root", Action: actEPERM},
	{Name: "move_mount", Action: actEPERM},
	{Name: "open_tree", Action: actEPERM},
	{Name: "fsopen", Action: actEPERM},
	{Name: "fsconfig", Action: actEPERM},
	{Name: "fsmount", Action: actEPERM},
	{Name: "fspick", Action: actEPERM},
	{Name: "mount_setattr", Action: actEPERM},
	// Namespaces.
	{Name: "setns", Action: actEPERM},
	{Name: "unshare", Action: actEPERM},
	{Name: "clone", Action: actEPERMIfNewNamespace, Arg: 0}, // flags are argument 0 on x86_64 and aarch64
	{Name: "clone3", Action: actENOSYS},
	// Kernel modules, kexec, reboot.
	{Name: "init_module", Action: actEPERM},
	{Name: "finit_module", Action: actEPERM},
	{Name: "delete_module", Action: actEPERM},
	{Name: "kexec_load", Action: actEPERM},
	{Name: "kexec_file_load", Action: actEPERM},
	{Name: "reboot", Action: actEPERM},
	// BPF, perf, userfaultfd, fanotify, io_uring.
	{Name: "bpf", Action: actEPERM},
	{Name: "perf_event_open", Action: actEPERM},
	{Name: "userfaultfd", Action: actEPERM},
	{Name: "fanotify_init", Action: actEPERM},
	{Name: "io_uring_setup", Action: actEPERM},
	{Name: "io_uring_enter", Action: actEPERM},
	{Name: "io_uring_register", Action: actEPERM},
	// File handles, keyrings, swap, quotas.
	{Name: "open_by_handle_at", Action: actEPERM},
	{Name: "keyctl", Action: actEPERM},
	{Name: "add_key", Action: actEPERM},
	{Name: "request_key", Action: actEPERM},
	{Name: "swapon", Action: actEPERM},
	{Name: "swapoff", Action: actEPERM},
	{Name: "quotactl", Action: actEPERM},
	// Device nodes.
	{Name: "mknod", Action: actEPERMIfDevice, Arg: 1},   // mknod(path, mode, dev)
	{Name: "mknodat", Action: actEPERMIfDevice, Arg: 2}, // mknodat(dirfd, path, mode, dev)
}

// seccompArch describes the native architecture of the running binary.
type seccompArch struct {
	Name  string
	Audit uint32 // AUDIT_ARCH_* value seccomp_data.arch must carry
	// X32Bit, when non-zero, is the syscall-number bit of the x32 ABI; such
	// calls kill the process.
	X32Bit uint32
	// Syscalls maps every name of seccompRules to its number.
	Syscalls map[string]uint32
	// Absent lists rule names this architecture does not have (aarch64 has
	// no mknod(2), only mknodat(2)).
	Absent map[string]bool
}

// Offsets into struct seccomp_data { int nr; u32 arch; u64 ip; u64 args[6]; }.
const (
	seccompDataNr   = 0
	seccompDataArch = 4
	seccompDataArgs = 16
)

// Seccomp return values (SECCOMP_RET_*).
const (
	retAllow       = unix.SECCOMP_RET_ALLOW
	retKillProcess = unix.SECCOMP_RET_KILL_PROCESS
	retEPERM       = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS      = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// bpfAsm is a minimal classic-BPF assembler with symbolic jump targets.
type bpfAsm struct {
	insns  []unix.SockFilter
	jumps  map[int][2]string // instruction index → (true, false) labels; "" is the next instruction
	labels map[string]int
	notes  map[int]string // instruction index → what it tests (comments of the C header)
}

func newBPFAsm() *bpfAsm {
	return &bpfAsm{jumps: map[int][2]string{}, labels: map[string]int{}, notes: map[int]string{}}
}

func (a *bpfAsm) label(name string) { a.labels[name] = len(a.insns) }

// note annotates the last instruction emitted.
func (a *bpfAsm) note(s string) { a.notes[len(a.insns)-1] = s }

// labelAt returns the labels of instruction i, sorted.
func (a *bpfAsm) labelAt(i int) []string {
	var ls []string
	for l, at := range a.labels {
		if at == i {
			ls = append(ls, l)
		}
	}
	sort.Strings(ls)
	return ls
}

func (a *bpfAsm) stmt(code uint16, k uint32) {
	a.insns = append(a.insns, unix.SockFilter{Code: code, K: k})
}

// jump emits a conditional jump: to label jt when the condition holds, else
// to label jf ("" means fall through).
func (a *bpfAsm) jump(code uint16, k uint32, jt, jf string) {
	a.jumps[len(a.insns)] = [2]string{jt, jf}
	a.insns = append(a.insns, unix.SockFilter{Code: code, K: k})
}

func (a *bpfAsm) loadWord(off uint32) { a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, off) }
func (a *bpfAsm) ret(k uint32)        { a.stmt(unix.BPF_RET|unix.BPF_K, k) }
func (a *bpfAsm) jeq(k uint32, jt, jf string) {
	a.jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, k, jt, jf)
}
func (a *bpfAsm) jset(k uint32, jt, jf string) {
	a.jump(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, k, jt, jf)
}

func (a *bpfAsm) assemble() ([]unix.SockFilter, error) {
	out := append([]unix.SockFilter(nil), a.insns...)
	for i, j := range a.jumps {
		for n, l := range j {
			off := 0
			if l != "" {
				t, ok := a.labels[l]
				if !ok {
					return nil, fmt.Errorf("bpf: undefined label %q", l)
				}
				off = t - i - 1
			}
			if off < 0 || off > 255 {
				return nil, fmt.Errorf("bpf: jump from %d to %q out of range", i, l)
			}
			if n == 0 {
				out[i].Jt = uint8(off)
			} else {
				out[i].Jf = uint8(off)
			}
		}
	}
	if len(out) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("bpf: program too long (%d instructions)", len(out))
	}
	return out, nil
}

// buildSeccompFilter compiles seccompRules for arch:
//
//	arch != arch.Audit                 → KILL_PROCESS
//	nr & X32Bit (x86_64, nr != -1)     → KILL_PROCESS
//	nr == plain EPERM rule             → ERRNO(EPERM)
//	nr == clone3                       → ERRNO(ENOSYS)
//	nr == clone && lo32(arg0)&NEW*     → ERRNO(EPERM)
//	nr == mknod(at) && mode&S_IFMT ∈ {S_IFCHR, S_IFBLK} → ERRNO(EPERM)
//	otherwise                          → ALLOW
func buildSeccompFilter(arch *seccompArch) ([]unix.SockFilter, error) {
	prog, _, err := compileSeccomp(arch)
	return prog, err
}

// compileSeccomp is buildSeccompFilter that also returns, per instruction,
// its labels and what it tests, for the comments of the C header.
func compileSeccomp(arch *seccompArch) ([]unix.SockFilter, []string, error) {
	if arch == nil {
		return nil, nil, fmt.Errorf("no seccomp table for architecture %s", runtime.GOARCH)
	}
	// Arguments are u64; their low 32 bits are the first word on the
	// little-endian architectures with a table (amd64, arm64).
	argLow := func(i int) uint32 { return uint32(seccompDataArgs + 8*i) }

	a := newBPFAsm()
	a.loadWord(seccompDataArch)
	a.note("seccomp_data.arch")
	a.jeq(arch.Audit, "", "kill")
	a.note("AUDIT_ARCH of " + arch.Name)
	a.loadWord(seccompDataNr)
	a.note("seccomp_data.nr")
	if arch.X32Bit != 0 {
		// nr -1 (a tracer skipping a call) is not x32; let it through to ENOSYS.
		a.jset(arch.X32Bit, "x32", "")
		a.note("x32 ABI bit")
	}
	type argBlock struct {
		label string
		rule  seccompRule
	}
	var blocks []argBlock
	for _, r := range seccompRules {
		nr, ok := arch.Syscalls[r.Name]
		if !ok {
			if arch.Absent[r.Name] {
				continue
			}
			return nil, nil, fmt.Errorf("seccomp table for %s lacks %s", arch.Name, r.Name)
		}
		switch r.Action {
		case actEPERM:
			a.jeq(nr, "eperm", "")
		case actENOSYS:
			a.jeq(nr, "enosys", "")
		case actEPERMIfNewNamespace, actEPERMIfDevice:
			l := "arg_" + r.Name
			a.jeq(nr, l, "")
			blocks = append(blocks, argBlock{l, r})
		default:
			return nil, nil, fmt.Errorf("seccomp rule %s: unknown action %d", r.Name, r.Action)
		}
		a.note(r.Name)
	}
	a.ret(retAllow)
	for _, b := range blocks {
		a.label(b.label)
		a.loadWord(argLow(b.rule.Arg))
		a.note(fmt.Sprintf("%s: low 32 bits of args[%d]", b.rule.Name, b.rule.Arg))
		switch b.rule.Action {
		case actEPERMIfNewNamespace:
			a.jset(cloneNewNamespaceFlags, "eperm", "allow")
			a.note("CLONE_NEW*")
		case actEPERMIfDevice:
			a.stmt(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, unix.S_IFMT)
			a.note("S_IFMT")
			a.jeq(unix.S_IFCHR, "eperm", "")
			a.note("S_IFCHR")
			a.jeq(unix.S_IFBLK, "eperm", "allow")
			a.note("S_IFBLK")
		}
	}
	if arch.X32Bit != 0 {
		a.label("x32")
		a.jeq(0xffffffff, "allow", "kill")
		a.note("nr -1 (a tracer skipping a call)")
	}
	a.label("allow")
	a.ret(retAllow)
	a.label("eperm")
	a.ret(retEPERM)
	a.label("enosys")
	a.ret(retENOSYS)
	a.label("kill")
	a.ret(retKillProcess)
	prog, err := a.assemble()
	if err != nil {
		return nil, nil, err
	}
	notes := make([]string, len(prog))
	for i := range prog {
		n := strings.Join(a.labelAt(i), ", ")
		switch {
		case n == "":
			n = a.notes[i]
		case a.notes[i] == "":
			n += ":"
		default:
			n += ": " + a.notes[i]
		}
		notes[i] = n
	}
	return prog, notes, nil
}

// Run is the shim's main: args are `-- ARGV...`. It marks every
// descriptor ≥ 3 close-on-exec, hardens the calling thread and execs ARGV
// with the current environment. It returns only on failure, after printing a
// one-line reason, with status 126.
//
// Capabilities, the bounding set and no_new_privs are per thread in the
// kernel, and execve gives the new program the credentials of the thread that
// calls it. So the goroutine is locked to its thread and both hardening and
// execve happen on it; the other Go threads (still privileged, but filtered
// through TSYNC) die in execve.
func Run(args []string) int {
	runtime.LockOSThread() // never unlocked: this thread execs or the process exits
	fail := func(format string, a ...any) int {
		msg := strings.ReplaceAll(fmt.Sprintf(format, a...), "\n", " ")
		fmt.Fprintln(os.Stderr, "sandbox: cannot start command: "+msg)
		return shimFailureExit
	}
	// -C DIR: change to DIR first. The FUSE holder starts commands in "/"
	// and has the shim enter /workspace: a child between fork and exec
	// shares the holder's memory (vfork), so a FUSE request from it could
	// wait for a server that is stopped with it (a GC stop-the-world cannot
	// preempt the forking thread), and never be answered.
	// -P NPROC: RLIMIT_NPROC (the session's pids limit where no cgroup
	// enforces it), set before anything can fork.
	dir, nproc := "", ""
	for len(args) >= 2 && (args[0] == "-C" || args[0] == "-P") {
		if args[0] == "-C" {
			dir = args[1]
		} else {
			nproc = args[1]
		}
		args = args[2:]
	}
	if len(args) < 2 || args[0] != "--" || args[1] == "" {
		return fail("usage: sandbox-exec-shim [-C DIR] [-P NPROC] -- ARGV...")
	}
	if nproc != "" {
		n, err := strconv.ParseUint(nproc, 10, 64)
		if err != nil || n == 0 {
			return fail("-P: not a positive number: %s", nproc)
		}
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: n, Max: n}); err != nil {
			return fail("setrlimit RLIMIT_NPROC: %v", err)
		}
	}
	if dir != "" {
		if err := os.Chdir(dir); err != nil {
			return fail("%v", err)
		}
	}
	argv := args[1:]
	path := argv[0]
	if !strings.Contains(path, "/") {
		p, err := exec.LookPath(path)
		if err != nil {
			return fail("%v", err)
		}
		path = p
	}
	if err := markCloexecFrom(3); err != nil {
		return fail("close-on-exec: %v", err)
	}
	if err := harden(); err != nil {
		return fail("hardening: %v", err)
	}
	err := syscall.Exec(path, argv, os.Environ())
	return fail("exec %s: %v", path, err)
}

// markCloexecFrom sets FD_CLOEXEC on every descriptor ≥ first.
func markCloexecFrom(first int) error {
	err := unix.CloseRange(uint(first), ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("close_range: %w", err)
	}
	// Kernels before 5.11: walk /proc/self/fd.
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd < first || fd == int(d.Fd()) {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if errors.Is(err, unix.EBADF) {
			continue
		}
		if err != nil {
			return fmt.Errorf("fd %d: %w", fd, err)
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, flags|unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("fd %d: %w", fd, err)
		}
	}
	return nil
}

// capLastCap reads /proc/sys/kernel/cap_last_cap.
func capLastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 || n > 255 {
		return 0, fmt.Errorf("bad /proc/sys/kernel/cap_last_cap %q", strings.TrimSpace(string(b)))
	}
	return n, nil
}

// harden applies §6.2 to the calling thread, which must be locked and must
// call execve next: no_new_privs, the bounding set and ambient set dropped,
// the seccomp filter (synchronised to every thread), then effective,
// permitted and inheritable reduced to keptCapabilities. It re-reads the
// state and fails if anything is not as intended.
func harden() error {
	// Everything that can fail without side effects comes first.
	filter, err := buildSeccompFilter(nativeSeccompArch)
	if err != nil {
		return err
	}
	last, err := capLastCap()
	if err != nil {
		return err
	}
	kept := keptCapMask()

	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("PR_SET_NO_NEW_PRIVS: %w", err)
	}
	// The bounding set limits what a uid-0 execve grants, so it is the drop
	// that really counts. Dropping needs CAP_SETPCAP, so it precedes capset.
	for c := 0; c <= last; c++ {
		if c < 64 && kept&(1<<uint(c)) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("PR_CAPBSET_DROP %d: %w", c, err)
		}
	}
	// Kernels before 4.3 have no ambient set (EINVAL): nothing to clear.
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("PR_CAP_AMBIENT_CLEAR_ALL: %w", err)
	}
	if err := installSeccomp(filter); err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(kept), Permitted: uint32(kept), Inheritable: uint32(kept)},
		{Effective: uint32(kept >> 32), Permitted: uint32(kept >> 32), Inheritable: uint32(kept >> 32)},
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return verifyHardened(last, kept)
}

// installSeccomp loads filter with SECCOMP_FILTER_FLAG_TSYNC so that every
// thread of the process, not only the caller, is filtered.
func installSeccomp(filter []unix.SockFilter) error {
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER): %w", errno)
	}
	if r != 0 {
		// TSYNC reports the ID of a thread it could not synchronise.
		return fmt.Errorf("seccomp: thread %d could not be synchronised", r)
	}
	return nil
}

// verifyHardened checks the calling thread's state after harden.
func verifyHardened(last int, kept uint64) error {
	if v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0); err != nil || v != 1 {
		return fmt.Errorf("no_new_privs not set (%d, %v)", v, err)
	}
	if v, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil || v != unix.SECCOMP_MODE_FILTER {
		return fmt.Errorf("seccomp filter mode not active (%d, %v)", v, err)
	}
	for c := 0; c <= last; c++ {
		v, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err != nil {
			return fmt.Errorf("PR_CAPBSET_READ %d: %w", c, err)
		}
		want := c < 64 && kept&(1<<uint(c)) != 0
		if (v == 1) != want {
			return fmt.Errorf("capability %d in bounding set: %v, want %v", c, v == 1, want)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	join := func(lo, hi uint32) uint64 { return uint64(lo) | uint64(hi)<<32 }
	eff := join(data[0].Effective, data[1].Effective)
	prm := join(data[0].Permitted, data[1].Permitted)
	inh := join(data[0].Inheritable, data[1].Inheritable)
	if eff != kept || prm != kept || inh != kept {
		return fmt.Errorf("capabilities eff=%#x prm=%#x inh=%#x, want %#x", eff, prm, inh, kept)
	}
	return nil
}
