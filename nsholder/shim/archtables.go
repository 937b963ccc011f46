package shim

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// seccompArches are the system call tables of every architecture the
// filter knows, keyed by GOARCH. They are plain data on every architecture
// (no build constraint) because the C exec shim's header is generated from
// all of them on whatever machine runs go generate; TestSeccompArchNumbers
// holds every number to golang.org/x/sys/unix's table for that
// architecture, so a typo cannot pass.
var seccompArches = map[string]*seccompArch{
	// x86_64. Foreign-arch calls (i386 via int 0x80) and x32-ABI calls are
	// killed by the filter.
	"amd64": {
		Name:   "x86_64",
		Audit:  unix.AUDIT_ARCH_X86_64,
		X32Bit: 0x40000000, // __X32_SYSCALL_BIT
		Syscalls: map[string]uint32{
			"mount":             165,
			"umount2":           166,
			"pivot_root":        155,
			"move_mount":        429,
			"open_tree":         428,
			"fsopen":            430,
			"fsconfig":          431,
			"fsmount":           432,
			"fspick":            433,
			"mount_setattr":     442,
			"setns":             308,
			"unshare":           272,
			"clone":             56,
			"clone3":            435,
			"init_module":       175,
			"finit_module":      313,
			"delete_module":     176,
			"kexec_load":        246,
			"kexec_file_load":   320,
			"reboot":            169,
			"bpf":               321,
			"perf_event_open":   298,
			"userfaultfd":       323,
			"fanotify_init":     300,
			"io_uring_setup":    425,
			"io_uring_enter":    426,
			"io_uring_register": 427,
			"open_by_handle_at": 304,
			"keyctl":            250,
			"add_key":           248,
			"request_key":       249,
			"swapon":            167,
			"swapoff":           168,
			"quotactl":          179,
			"mknod":             133,
			"mknodat":           259,
		},
	},
	// aarch64. AArch32 compat calls (another audit arch) are killed by the
	// filter; aarch64 has no mknod(2), only mknodat(2).
	"arm64": {
		Name:  "aarch64",
		Audit: unix.AUDIT_ARCH_AARCH64,
		Syscalls: map[string]uint32{
			"mount":             40,
			"umount2":           39,
			"pivot_root":        41,
			"move_mount":        429,
			"open_tree":         428,
			"fsopen":            430,
			"fsconfig":          431,
			"fsmount":           432,
			"fspick":            433,
			"mount_setattr":     442,
			"setns":             268,
			"unshare":           97,
			"clone":             220,
			"clone3":            435,
			"init_module":       105,
			"finit_module":      273,
			"delete_module":     106,
			"kexec_load":        104,
			"kexec_file_load":   294,
			"reboot":            142,
			"bpf":               280,
			"perf_event_open":   241,
			"userfaultfd":       282,
			"fanotify_init":     262,
			"io_uring_setup":    425,
			"io_uring_enter":    426,
			"io_uring_register": 427,
			"open_by_handle_at": 265,
			"keyctl":            219,
			"add_key":           217,
			"request_key":       218,
			"swapon":            224,
			"swapoff":           225,
			"quotactl":          60,
			"mknodat":           33,
		},
		Absent: map[string]bool{"mknod": true},
	},
}

// nativeSeccompArch is the table of the running binary's architecture; nil
// on an architecture without one, where hardening fails closed.
var nativeSeccompArch = seccompArches[runtime.GOARCH]
