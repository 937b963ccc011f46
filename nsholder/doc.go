// Package nsholder is the holder process mode of sandbox-supervisor: the
// code that runs inside a session's user, mount, PID, IPC and UTS namespaces
// (plus a network namespace of its own for the offline and isolated network
// profiles; net.go: the isolated profile's helper and port relays), assembles
// its root, mounts the workspace overlay and serves requests from the
// supervisor. The supervisor never joins namespaces itself (design rule 2);
// it starts this mode with clone flags and talks to it.
//
// What the package owns:
//
//   - Start (client.go): starts `self nsholder serve` with
//     CLONE_NEWUSER|NEWNS|NEWPID|NEWIPC|NEWUTS (+NEWNET), a single-ID map of
//     the caller (setgroups deny), Pdeathsig SIGKILL and its own session,
//     hands it the Config over an inherited socketpair (fd 3) and waits for
//     the ready handshake. Failures are *SetupError with the stage
//     (spawn, handshake, mount_root, mount_overlay, pivot_root, ready) and
//     leave no process. The returned *Client is the supervisor's handle.
//   - RemoveMapped (rmtree.go): `self nsholder rmtree DIR` removes a tree
//     holding entries of the caller's subordinate IDs from inside a user
//     namespace mapped as a subid holder is; it never touches anything
//     outside DIR.
//   - The holder (holder.go): PID 1 of the session, non-dumpable, reaps
//     every child and orphan with its own wait4(-1) loop (SIGCHLD plus a
//     poll while a command's group outlives its root), exits at EOF of the
//     channel (the kernel then kills the whole PID namespace, and the mount
//     namespace with the overlay goes with its last process).
//   - Root assembly (root.go, §5.4 image "host"); see the order there.
//   - The FUSE driver (fuse.go, Config.Overlay "fuse"): the holder mounts
//     package fuseoverlay on /workspace before pivot_root and serves it for
//     the session's life. A FUSE request's pid is mapped to its command by
//     session ID (every command root is a session leader), else by walking
//     the parent chain to one, with a per-pid cache checked against the
//     process start time; pid 0 (mmap write-back) and strangers are "".
//     Records and released-handle notices go out as Event.FS in the event
//     FIFO; the overlay is flushed before every Exited and Done, so a
//     command's records always precede its end. The holder's own file
//     operations (pid 1) are not reported. At exit the holder flushes and
//     detaches /workspace.
//   - Commands: a PTY per command (creack/pty on the session's devpts),
//     Setsid+Setctty, cwd and environment from the request, exec'd through
//     the exec shim (package nsholder/shim) as /proc/self/fd/3: the static
//     C sandbox-exec-shim of Config.Shim, or the holder's own binary
//     (`nsholder shim`, the Go twin) when that is "", opened before
//     pivot_root; in a root without the host's libraries (an image) a
//     dynamically linked holder binary starts through the host's loader
//     with its libraries preloaded, all by descriptor (Config.Loader,
//     goshim.go). The PTY
//     master goes to the supervisor with SCM_RIGHTS. Events: Exited when the root is reaped (wait status),
//     then Done once kill(-pgid, 0) says the process group is empty.
//   - File operations on an fd of /workspace (files.go).
//   - The control protocol (proto.go); a swap's layers (and new upper)
//     travel as descriptors in a multi-descriptor frame. Ops for live
//     sessions: swaplower (SwapLower), freeze and thaw (Freeze, Thaw;
//     freeze.go), chain (Chain: the lowers' host paths and the upper's
//     device and inode the holder serves now, for the supervisor's
//     start-up recovery of a crashed sync).
//
// Decisions the contract leaves open:
//
//   - Terminal hangup: the shell is the session leader and controlling
//     process of its PTY, so when it exits the kernel sends SIGHUP to the
//     terminal's foreground process group, which is the command's group.
//     Background children that do not ignore SIGHUP therefore end with the
//     shell, as on any terminal; those that do (nohup, trap "" HUP) keep the
//     command open (not Done) until they exit. A child that calls setsid
//     before the shell exits leaves the command and lives on until Quiesce
//     or Close.
//   - Signal(id) goes to the command's process group, to every process
//     still in its session (the root is a session leader, so this catches
//     children that only changed their process group) and to every
//     descendant of those, found through /proc at the time of the call.
//   - Signals from the session: as PID 1, the holder receives a signal from
//     inside only if it has a handler; it has one for every catchable
//     signal (os/signal.Notify into a drained channel, not SIG_IGN, which
//     the commands would inherit), so kill -TERM/-SEGV 1 do nothing. Since
//     the holder cannot tell the supervisor's SIGTERM from a session's,
//     Client.Close sends a shutdown request instead of SIGTERM: the holder
//     SIGTERMs every session process, waits up to grace for them, and
//     exits; Close SIGKILLs it if it is still there after grace.
//   - Event order: per command, Exited precedes Done; no event of a
//     command is delivered on Events before Spawn has returned its Process
//     (the caller must still register the ID before it processes events,
//     e.g. under the same lock as its event handler).
//   - Events must be drained: the queue behind Events is unbounded so the
//     channel reader never blocks, and it is closed after the holder's exit
//     once everything queued was delivered.
//   - Quiesce is kill(-1, SIGKILL) from PID 1 (every process of the
//     namespace but the holder) repeated until /proc lists only the holder;
//     the resulting Exited/Done events are sent before its reply.
//
// Lower-chain swap (swap.go, Holder.SwapLower; measured on Linux 6.18.44,
// rootless, in the holder's user and mount namespaces):
//
//   - fuse: the holder's fuseoverlay swaps in place; commands keep running
//     with their cwd and open files in /workspace, open files read what
//     they opened, and everything looked up after sees the new chain.
//   - kernel: proven workable. Two overlays over one upper may be mounted
//     at once (index=off, the default: the kernel only warns, "accessing
//     files from both mounts will result in undefined behavior"), even with
//     a work directory below the old one's; the new overlay is mounted
//     beneath /workspace with move_mount(MOVE_MOUNT_BENEATH) (6.5+) and the
//     old one detached from above it, so path lookups never see a gap.
//     OverlayFS clones each layer's mount, which works only for mounts of
//     the caller's namespace or detached trees the caller made (6.15+): the
//     holder's host mounts are gone after pivot_root and the supervisor's
//     are another namespace's, so before the pivot the holder keeps
//     open_tree(OPEN_TREE_CLONE) clones of the directory holding upper and
//     work and, read-only, of the layers' directory, and resolves the new
//     chain (sent as descriptors, checked by inode) through them.
//     What a process left in the old overlay sees (TestSwapKernelOldView):
//     its cwd resolves names in the old chain, it does not see files the
//     new view creates, and its writes to files the new view copied up
//     fail (EEXIST); a file opened before keeps its content. Since that is
//     the "undefined behaviour", the swap freezes the session (SIGSTOP of
//     every process, 0.5 s budget, ErrFreezeTimeout) and is refused with a
//     *PinnedError naming pid, command, and cwd/root/fd/mapping while any
//     process uses the old overlay; then nothing changes. A kernel without
//     MOVE_MOUNT_BENEATH or without detached-tree layers gets
//     ErrSwapUnsupported with the reason.
//   - A new upper (SwapRequest.Upper, issue 19's sync and publish with
//     keep): the supervisor replaces the directory at the session's upper
//     path (layers.SyncUpper's RENAME_EXCHANGE) and names that path, which
//     must be Config.Upper (else fs.ErrInvalid); the client sends its
//     descriptor with the lowers. fuse: fuseoverlay.Swap replaces upper
//     and lowers in one critical section and re-resolves every known node
//     against both, so a path whose upper entry appeared, vanished or is
//     another file (whiteouts and opaque directories included) is
//     invalidated like a lower change; every file in the old upper is
//     another file in the new one (a copy), so each cached one is dropped.
//     It is refused with a *PinnedError of kind "fd" (path, owner, and the
//     pid /proc shows holding it) while any handle is open for writing:
//     its writes would land in the replaced upper. Read-only handles keep
//     reading what they opened. kernel: the new overlay takes the upper
//     by name through the holder's clone; the directory there must be the
//     one sent (device and inode, checked before and after the mount),
//     else fs.ErrInvalid and nothing changes. A kernel swap without Upper
//     checks the name still holds the upper the session has, so a
//     replaced upper is never picked up unannounced (the fuse driver
//     keeps serving the upper it has by descriptor).
//   - What a process sees: on fuse, a command running across a swap (cwd
//     inside /workspace included) sees the new view from its next lookup;
//     its open files are the old ones. On the kernel driver no process may
//     be in the old overlay (the pin check), so only processes outside
//     /workspace run across a swap, and they see the new view.
//
// Freeze (freeze.go): Client.Freeze stops every session process with
// SIGSTOP (all must stop within the budget, else ErrFreezeTimeout and the
// ones stopped are continued) and then flushes what the session wrote so
// a reader of the upper on the host sees it: fuse syncfs()s /workspace
// (stores through a shared mapping are dirty pages of the FUSE mount until
// writeback; TestFreezeThaw shows the host reading the old bytes without
// it) and passes the buffered provenance records on; the kernel overlay
// needs nothing (a copied-up file's reads, writes and mappings are the
// upper inode's own, whose pages a host reader shares). The freeze lasts
// until Thaw, Quiesce, shutdown or the holder's end (the supervisor's end
// of the channel closing makes the holder exit, and the kernel kills the
// PID namespace, stopped processes too), at most freezeLimit (60 s): then
// the holder continues the session, logs it, and the next Thaw returns
// ErrFreezeExpired. Freeze while frozen is accepted (it stops whatever
// runs again and restarts the limit); freezes do not nest, one Thaw ends
// it; Thaw when not frozen is nil. Freeze does not hold back Spawn (the
// supervisor keeps the session's gate). A kernel SwapLower while frozen
// stops anything that runs again and leaves the session frozen for the
// caller's Thaw; the fuse swap stops nothing.
//
// The start-up probe (probe.go) is a short-lived child in a fresh user and
// mount namespace that proves (or disproves, with the kernel's reason) that
// kernel OverlayFS mounts with userxattr on the data directory's
// filesystem, with lowerdir+ or the option-string fallback, and that the
// FUSE overlay mounts there, serves a lower file and creates into the
// upper (bounded by a timeout, since the child serves its own mount).
package nsholder
