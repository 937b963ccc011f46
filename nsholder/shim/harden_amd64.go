package shim

import "golang.org/x/sys/unix"

// x86_64 table. Foreign-arch calls (i386 via int 0x80) and x32-ABI calls are
// killed by the filter; numbers come from golang.org/x/sys/unix.
func init() {
	nativeSeccompArch = &seccompArch{
		Name:   "x86_64",
		Audit:  unix.AUDIT_ARCH_X86_64,
		X32Bit: 0x40000000, // __X32_SYSCALL_BIT
		Syscalls: map[string]uint32{
			"mount":             unix.SYS_MOUNT,
			"umount2":           unix.SYS_UMOUNT2,
			"pivot_root":        unix.SYS_PIVOT_ROOT,
			"move_mount":        unix.SYS_MOVE_MOUNT,
			"open_tree":         unix.SYS_OPEN_TREE,
			"fsopen":            unix.SYS_FSOPEN,
			"fsconfig":          unix.SYS_FSCONFIG,
			"fsmount":           unix.SYS_FSMOUNT,
			"fspick":            unix.SYS_FSPICK,
			"mount_setattr":     unix.SYS_MOUNT_SETATTR,
			"setns":             unix.SYS_SETNS,
			"unshare":           unix.SYS_UNSHARE,
			"clone":             unix.SYS_CLONE,
			"clone3":            unix.SYS_CLONE3,
			"init_module":       unix.SYS_INIT_MODULE,
			"finit_module":      unix.SYS_FINIT_MODULE,
			"delete_module":     unix.SYS_DELETE_MODULE,
			"kexec_load":        unix.SYS_KEXEC_LOAD,
			"kexec_file_load":   unix.SYS_KEXEC_FILE_LOAD,
			"reboot":            unix.SYS_REBOOT,
			"bpf":               unix.SYS_BPF,
			"perf_event_open":   unix.SYS_PERF_EVENT_OPEN,
			"userfaultfd":       unix.SYS_USERFAULTFD,
			"fanotify_init":     unix.SYS_FANOTIFY_INIT,
			"io_uring_setup":    unix.SYS_IO_URING_SETUP,
			"io_uring_enter":    unix.SYS_IO_URING_ENTER,
			"io_uring_register": unix.SYS_IO_URING_REGISTER,
			"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT,
			"keyctl":            unix.SYS_KEYCTL,
			"add_key":           unix.SYS_ADD_KEY,
			"request_key":       unix.SYS_REQUEST_KEY,
			"swapon":            unix.SYS_SWAPON,
			"swapoff":           unix.SYS_SWAPOFF,
			"quotactl":          unix.SYS_QUOTACTL,
			"mknod":             unix.SYS_MKNOD,
			"mknodat":           unix.SYS_MKNODAT,
		},
		Absent: nil,
	}
}
