// Package fuseoverlay is the FUSE overlay driver: a copy-on-write view of a
// read-only lower chain and a private upper directory, served with go-fuse
// where the kernel refuses OverlayFS in a user namespace. The upper
// directory is written in the kernel's on-disk format (whiteouts as 0:0
// character devices or the user.overlay.whiteout xattr form, opaque
// directories with user.overlay.opaque=y), so capture, publication and
// recovery read it exactly as they read a kernel upper.
//
// Because every write passes through it, the driver also records who wrote
// what: files are opened without OPEN (noopen.go), so each WRITE is
// credited to the command of the process that sends it; a write through a
// shared mapping, which the kernel sends without a process, to the process
// whose fsync or msync follows it (else to no command); a file made by
// CREATE before the first OPEN was refused keeps a handle (handle.go),
// credited to its creator. The records are buffered, coalesced and
// flushed at fsync, Flush and on a timer.
//
// All access to the layers goes through directory descriptors opened before
// the mount (the holder pivot_roots afterwards, so host paths are gone).
//
// Semantics, matching the kernel overlay in userxattr mode without
// redirect_dir (a differential test compares the two):
//   - merged lookup and readdir: the newest layer with a name decides;
//     whiteouts (0:0 character device, or an empty file with
//     (user|trusted).overlay.whiteout), OCI .wh.<name> entries in lowers and
//     opaque directories (overlay.opaque=y, or an OCI .wh..wh..opq entry)
//     hide what is below. Names starting with .wh. are reserved (§8.4).
//   - writes copy the entry up first (data with holes kept, mode, owner
//     where permitted, xattrs except overlay.*, times). Deleting a name a
//     lower layer has leaves a whiteout (mknod 0:0, else the xattr form);
//     a directory made where a whiteout was is opaque (user.overlay.opaque=y,
//     like the kernel; the .wh..wh..opq entry only where user xattrs are
//     refused). Renaming a directory that has lower content fails with
//     EXDEV, so tools fall back to copy and delete; RENAME_EXCHANGE is
//     EINVAL.
//   - modes: a new entry gets exactly the mode of the request (the kernel
//     applied the caller's umask; the server's own umask is undone), and
//     attributes carry the real mode, 0000 included, since the mount's
//     default_permissions makes the kernel check access against them.
//   - paths longer than PATH_MAX from a layer root are resolved by walking
//     directory descriptors without following symlinks (at.go); shorter
//     ones still take a single *at() call.
//   - copy-up stages in Options.Work, or else in a directory ".esbx-tmp" in
//     the upper root that exists only while one copy-up runs, is hidden
//     from lookup and readdir, and is removed at mount if a crash left it.
//   - inode numbers: an entry shows its backing inode number (folded with
//     the device for layers on another filesystem); a copied-up entry keeps
//     its lower number (in memory, and after a remount for entries still at
//     their lower path). Lower files with several links get one node per
//     name, since copy-up is per name.
//   - caching: entries and attributes are cached for a minute, pages are
//     kept across opens and directory listings are cached by the kernel:
//     lowers never change and the upper changes only through this mount
//     (a swap invalidates what it changes); so are symlink targets, which
//     never change in place. Files are opened without
//     OPEN, RELEASE or FLUSH (noopen.go); the server clears set-id bits
//     itself (FUSE_HANDLE_KILLPRIV_V2, killpriv.go), which spares the
//     kernel's GETXATTR security.capability per write(2). There is no
//     passthrough and no writeback cache (design rule 5): passthrough
//     needs CAP_SYS_ADMIN in the initial namespace and hides writes from
//     the recorder, the writeback cache sends every write without its
//     process; FUSE over io_uring needs a module parameter users cannot
//     set. Reads of a lower file share one descriptor per node (rofd.go).
//   - lower swap: Server.SwapLower moves the live mount onto another lower
//     chain under the same upper (a squash, or a newer head) in one
//     critical section, then invalidates exactly the kernel's entries,
//     listings and attributes whose lookup result changed; directories
//     keep their node, files backed by another file get a new one, open
//     files keep reading what they opened (swap.go, noopen.go). Server.Swap
//     can replace the upper in the same critical section (a sync rewrote
//     it); it is refused while a file is open for writing (a handle, or a
//     descriptor of the mount that /proc shows open for writing).
//
// Requests per workload of tests/bench part 6 (bench -fuse-requests; one
// fresh mount, the cold passes then the warm ones), before and after the
// round trips issue 32 removed (an OPEN and a RELEASE per file opened, a
// GETXATTR per write):
//
//	workload (bench)             before   after  what remains
//	read 2,000 × 4 KiB, cold      8,020   4,023  LOOKUP, READ per file
//	read, warm                    4,002       0
//	git status 5,000 files, cold 23,095  13,070  LOOKUP, READ per file; OPENDIR, 2 READDIRPLUS, RELEASEDIR per dir
//	git status, warm             11,558   1,517  GETATTR, OPENDIR, RELEASEDIR per directory
//	stat 20,000 files, cold      20,202  20,202  LOOKUP per file
//	stat, warm                        1       0
//	write 200 MiB (1 MiB writes)    403     203  WRITE per MiB (MaxWrite)
//
// Directories are still opened: go-fuse serves a listing from the
// handle's stream. The warm git status's GETATTRs are the directories'
// atime, which the cold pass's listing invalidated.
//
// Locking: one RWMutex orders namespace changes and copy-up (exclusive)
// against lookup, readdir and opens (shared); reads and writes on open
// handles take no lock. A copy-up of a large file therefore stalls other
// namespace operations for its duration.
package fuseoverlay

import (
	"context"
	"errors"
	"os"
	"time"
)

// Options configure one mount.
type Options struct {
	// Lowers are the read-only layer directories, newest first. Their
	// content never changes, so it may be cached aggressively; the chain
	// itself may be replaced with Server.SwapLower. The caller keeps them
	// open while they are in use and closes them.
	Lowers []*os.File
	// Upper is the private, writable upper directory (kernel overlay format).
	Upper *os.File
	// Work is a scratch directory on Upper's filesystem for atomic copy-up;
	// nil means copy-up stages inside Upper under a hidden name.
	Work *os.File

	// Owner maps the pid of a process writing, creating or changing a file
	// (in the FUSE server's PID namespace) to the command that owns it; ""
	// when unknown. Called per namespace operation, and for writes once
	// per pid and second (noopen.go). The pid is
	// the one the kernel puts in the FUSE request: the id of the calling
	// task, which for a multi-threaded caller is a thread id (look up its
	// Tgid in /proc/<pid>/status if the process is needed). The server must
	// not mmap files of its own mount: a page fault there would wait on
	// the server from inside it.
	Owner func(pid uint32) string
	// Sink receives provenance records in batches, in the order the
	// operations happened. nil disables recording.
	Sink func([]Record)
	// Released is called once the records of a finished writer were passed
	// to Sink, with the path and the writer's command: after a handle that
	// wrote is released, and at every Flush for each path and command that
	// wrote without a handle since the last one (noopen.go). The holder
	// uses it to have a line-attribution checkpoint taken.
	Released func(path, command string)
	// CoalesceInterval bounds how long write records stay buffered
	// (observability.file_activity.coalesce_ms); 0 means one second.
	CoalesceInterval time.Duration

	// Name appears as the filesystem's fsname in /proc/mounts.
	Name string
	// Debug logs every FUSE request to stderr.
	Debug bool
	// Requests, when set, counts the requests served by opcode (a
	// measuring instrument: it replaces Debug's log and slows every
	// request down).
	Requests *RequestCounter
}

// Record is one provenance record (contract §11.4, source "fuse").
type Record struct {
	Time    time.Time
	Command string // the handle's owner; "" when unknown
	Op      string // create, write, truncate, rename, unlink, mkdir, rmdir, symlink, chmod
	Path    string // slash-separated, relative to the mount root, no leading slash
	NewPath string // rename target
	Offset  int64  // write: first byte; truncate: new size
	Length  int64  // write: bytes in the coalesced range
}

// ServerProcs is the GOMAXPROCS a process serving a mount should run with
// (the holder sets it; it is process-wide, so Mount leaves it alone).
// go-fuse reads requests on goroutines blocked in read(2) on /dev/fuse and
// starts another reader whenever none is left waiting, so a close (an
// asynchronous RELEASE) followed by the next open wakes two readers and
// spawns a third; with a second P every such hand-off also wakes an idle
// P's thread. Measured on 2 CPUs, server in its own process, 50 warm reads
// of 2,000 files: with one P the server spends 40% less CPU per request
// (about 6.5 instead of 11 µs) and half the voluntary context switches,
// and a warm git status of 5,000 files takes half the time. Requests still
// run in parallel while their handlers are in system calls.
const ServerProcs = 1

// Server is one mounted overlay.
type Server struct {
	impl serverImpl
}

type serverImpl interface {
	flush()
	unmount() error
	wait()
	swap(ctx context.Context, c Chain) error
}

// Mount mounts the overlay at mountpoint and serves it until Unmount or until
// the kernel drops the connection. It opens /dev/fuse itself and mounts
// directly (mount(2)), which works for the root of a user namespace.
func Mount(ctx context.Context, mountpoint string, opts Options) (*Server, error) {
	return mount(ctx, mountpoint, opts)
}

// Flush passes every buffered record to Sink now (at command end).
func (s *Server) Flush() { s.impl.flush() }

// Unmount detaches the filesystem and stops serving.
func (s *Server) Unmount() error { return s.impl.unmount() }

// Wait blocks until the server stops serving.
func (s *Server) Wait() { s.impl.wait() }

// ErrNotImplemented was returned before the driver was complete; it is kept
// for callers that test for it.
var ErrNotImplemented = errors.New("fuseoverlay: not implemented")
