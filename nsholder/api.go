package nsholder

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// Config is everything a holder needs to build a session's root. All paths
// are host paths; they are opened before pivot_root and never visible inside.
type Config struct {
	SessionID string   `json:"session_id"` // also the UTS hostname
	Lowers    []string `json:"lowers"`     // layer directories of the leased chain, newest first
	Upper     string   `json:"upper"`      // sessions/<id>/upper
	Work      string   `json:"work"`       // sessions/<id>/work (fresh per holder)
	Scratch   string   `json:"scratch"`    // sessions/<id>/scratch: backs /tmp, /var/tmp, /root, /run
	// HostPaths are bind-mounted read-only when they exist (image "host");
	// top-level symlinks such as /bin → usr/bin are reproduced as symlinks.
	HostPaths []string `json:"host_paths"`
	// HiddenPaths are covered with an empty read-only tmpfs (mode 000)
	// wherever they would be visible (the supervisor's own directories).
	HiddenPaths []string `json:"hidden_paths"`
	// IsolatedNetwork gives the session its own network namespace with lo
	// up (profiles offline and isolated); Egress then connects it (net.go).
	IsolatedNetwork bool `json:"isolated_network"`
	// BlockPrivate installs prohibit routes for the private and link-local
	// ranges in that namespace (network.isolated.allow_private: false).
	BlockPrivate bool `json:"block_private,omitempty"`
	// ResolvConf, when set, replaces the session's /etc/resolv.conf.
	ResolvConf string `json:"resolv_conf,omitempty"`
	// Egress, when set, is started for the holder once it is ready (profile
	// isolated); setup fails at stage "network" when it cannot start. It
	// stays on the supervisor side.
	Egress *Egress `json:"-"`
	// IDMapping is sandbox.id_mapping: "single" (or "") maps only 0 to the
	// caller; "subid" also maps 1… to the caller's /etc/subuid and
	// /etc/subgid ranges through newuidmap/newgidmap (§5.4 Identity).
	IDMapping string `json:"id_mapping,omitempty"`
	// Shim is the host path of the sandbox-exec-shim binary every command
	// is exec'd through (static, freestanding C: cmd/sandbox-exec-shim);
	// "" uses the holder's own binary (`sandbox-supervisor nsholder shim`,
	// the Go shim.Run), which costs about 1 ms more per command.
	Shim string `json:"shim,omitempty"`
	// Loader, with Shim "", starts the Go shim through the host's dynamic
	// loader and libraries (ShimLoader, GoShimLoader): for an image root,
	// which need not have them. nil execs the holder's binary directly.
	Loader *ShimLoader `json:"loader,omitempty"`
	// Image, when set, makes "/" an overlay of an image's cached rootfs
	// instead of host binds (§5.4 image rootfs); HostPaths are then unused.
	// The image root is always a kernel overlay; Overlay applies to
	// /workspace only.
	Image *ImageRoot `json:"image,omitempty"`
	// Overlay is the /workspace driver: OverlayKernel ("" too) or
	// OverlayFuse (the holder serves the FUSE overlay in-process and
	// reports file activity as Event.FS notices).
	Overlay string `json:"overlay,omitempty"`
	// CoalesceMs bounds how long the FUSE overlay buffers write records
	// (observability.file_activity.coalesce_ms); 0 = the driver's default.
	CoalesceMs int `json:"coalesce_ms,omitempty"`
	// NoActivity turns provenance records off (observability or
	// file_activity disabled); Released notices are still sent, since line
	// attribution needs them.
	NoActivity bool `json:"no_activity,omitempty"`
	// PidsMax, when > 0, is every command's RLIMIT_NPROC (the shim's -P):
	// the kernel counts a user's tasks per user namespace, so it bounds
	// the session's processes and threads (the holder's own included in
	// the count, though the holder itself is not limited) where no pids
	// cgroup does — a fork bomb gets EAGAIN instead of the user's whole
	// process limit.
	PidsMax int64 `json:"pids_max,omitempty"`
}

// Workspace overlay drivers (Config.Overlay).
const (
	OverlayKernel = "kernel"
	OverlayFuse   = "fuse"
)

// ImageRoot is the root of an image sandbox's session: a kernel overlay of
// Rootfs (read-only lower, shared by every session of the image) and a
// private upper under Scratch, discarded with the session.
type ImageRoot struct {
	Rootfs string `json:"rootfs"`
	// Files are written into the session root after pivot_root (absolute
	// session path → content): /etc/hosts, /etc/hostname, /etc/resolv.conf.
	Files map[string]string `json:"files,omitempty"`
}

// SetupError says at which stage holder setup failed (§5.2 "workspace setup
// failed at <stage>"): spawn, id_mapping, handshake, mount_root, mount_overlay,
// pivot_root, ready.
type SetupError struct {
	Stage string
	Err   string
}

func (e *SetupError) Error() string { return "workspace setup failed at " + e.Stage + ": " + e.Err }

// SpawnRequest starts one command: /bin/bash --noprofile --norc -c Cmd, or
// /bin/sh -c Cmd when the root has no bash (ErrNoShell when neither).
type SpawnRequest struct {
	Cmd        string   `json:"cmd"`
	Env        []string `json:"env"` // the complete environment
	Dir        string   `json:"dir"` // working directory inside the session, normally /workspace
	Rows, Cols uint16
	// Owner names the command (its command_session_id) in FUSE provenance:
	// every handle a process of this command opens is attributed to it.
	Owner string `json:"owner,omitempty"`
}

// Process is a spawned command. PTY is the master side of its terminal:
// the caller reads output from it and writes stdin to it, and closes it.
type Process struct {
	ID  uint64 // holder-assigned, unique per holder
	Pid int    // the root process's PID inside the session's PID namespace
	PTY *os.File
}

// Event reports command progress from the holder.
type Event struct {
	ID uint64
	// Exited is set when the root process has been reaped; Status is its wait status.
	Exited bool
	Status syscall.WaitStatus
	// Done is set once the root process has exited and no other process of
	// its process group is alive (§6.5): the command is complete.
	Done bool
	// FS is set (and ID is 0) for a notice of the FUSE overlay: provenance
	// records and released written handles. Notices keep their order
	// relative to command events: the records of a command are flushed
	// before its Exited and Done events.
	FS *FSNotice
}

// FSNotice is what the FUSE overlay reported since the previous notice.
type FSNotice struct {
	Records  []FileRecord   `json:"records,omitempty"`
	Released []ReleasedFile `json:"released,omitempty"`
}

// FileRecord is one provenance record of the FUSE overlay (§11.4 source
// "fuse"). Command is the SpawnRequest.Owner of the command whose process
// opened the handle, "" when unknown. The holder's own file operations
// (file_write and file_edit) are not reported: the supervisor records them
// itself, with their request_id.
type FileRecord struct {
	TimeUnixNs int64  `json:"t"`
	Command    string `json:"c,omitempty"`
	Op         string `json:"op"`
	Path       string `json:"p"`
	NewPath    string `json:"np,omitempty"`
	Offset     int64  `json:"off,omitempty"`
	Length     int64  `json:"len,omitempty"`
}

// ReleasedFile says a handle that wrote Path was released; Command owned it.
type ReleasedFile struct {
	Path    string `json:"p"`
	Command string `json:"c,omitempty"`
}

// FileInfo describes one entry below /workspace.
type FileInfo struct {
	Name string      `json:"name"` // base name
	Kind string      `json:"kind"` // "file", "directory", "symlink", "other"
	Mode fs.FileMode `json:"mode"` // permission bits
	Size int64       `json:"size"`
}

// Errors returned by file operations, matched with errors.Is.
var (
	ErrNotExist   = fs.ErrNotExist
	ErrNotDir     = &opError{"a parent component is not a directory"}
	ErrSymlink    = &opError{"a path component is a symlink"}
	ErrNotRegular = &opError{"not a regular file"}
	ErrTooLarge   = &opError{"file is too large"}
	ErrNoShell    = &opError{"no shell in rootfs"}
	ErrExited     = &opError{"holder exited"}
)

type opError struct{ msg string }

// SymlinkError says that resolving Path met a symlink at Component (a
// workspace-relative prefix of Path; Path itself when the last component
// is the symlink and the operation needed a directory there). It matches
// ErrSymlink with errors.Is. Naming the component is the point: the
// supervisor reports it to the caller as the reason, on both overlay
// drivers and for every file operation alike.
type SymlinkError struct{ Path, Component string }

func (e *SymlinkError) Error() string {
	return fmt.Sprintf("path %q: component %q is a symlink", e.Path, e.Component)
}

func (e *SymlinkError) Is(target error) bool { return target == ErrSymlink }

func (e *opError) Error() string { return e.msg }
