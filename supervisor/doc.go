// Package supervisor is the daemon behind `sandbox-supervisor serve`: it owns
// the user's Unix socket (peer uid checked with SO_PEERCRED), reads one JSON
// request line and answers one response line, dispatches operations declared
// in the catalog to their handlers, keeps the sandbox registry in the state
// database and drives each sandbox's LayerStack.
//
// Choices where the contract is silent:
//   - In-flight requests always finish at shutdown (a snapshot or publish is
//     never cut short); only requests that arrive while draining get
//     server_shutting_down.
//   - Domain errors that are not *catalog.Error become operation_failed
//     (an I/O failure of a valid request), in rpc.Mux.Error only.
//   - Resource views: window_ms is at least 1; a snapshot's resources are
//     the last 30 samples of the last minute; the fleet's current is the
//     newest sandbox sample within window_ms; the cgroup view adds
//     cgroup_path and cgroup_delegated. A sample's metrics are its
//     cgroup's when one exists for it, else /proc sums (package resources).
//   - holder.file_op spans cover reads, directory listings and writes
//     through a holder, not the lstat calls a listing makes (cheap traces);
//     holder.mount_overlay is timed inside the holder and recorded as
//     ending when the holder reported ready.
//   - The optional TCP listener (--listen, supervisor.listen) speaks the same
//     line protocol; its address is checked before anything else happens at
//     start, and listen.addr next to the socket names the bound port. The
//     gateway token is read once at start; an unauthorized request is
//     answered before envelope validation and names no token.
//   - Each start records one system event supervisor.recovered listing what
//     recovery did (sandboxes removed or failed, sessions restored, failed,
//     finalized, commands interrupted, layers and staging swept); the boot
//     sweep also records layerstack.squash {boot_sweep:true} when it removed
//     or skipped something. Explicit sessions are restored four at a time.
//   - Crash order: a session's record is deleted before its lease and
//     directory, so a destroy cut short completes at the next start; an
//     implicit session's finalization outcome is stored on the draining
//     command before the session is destroyed. A crash between a publish's
//     manifest replace and the session's close leaves the explicit session
//     active; publishing it again succeeds (its changes equal head's).
//   - Overlay drivers (health.go): the start-up probe tries kernel OverlayFS
//     and the FUSE overlay in a scratch user namespace; overlay auto picks
//     kernel, else fuse. SANDBOX_PROBE_FAIL_KERNEL_OVERLAY=1 and
//     SANDBOX_PROBE_FAIL_FUSE_OVERLAY=1 (environment of serve and doctor)
//     make a probe report failure, for tests of the fallback.
//   - File activity (activity.go, fuseattr.go) is a table of the state
//     database, trimmed per sandbox to observability.file_activity.
//     max_records after every append. The kernel driver's capture state
//     (what the upper held at the previous checkpoint) is
//     sessions/<id>/activity.json; a file copied up from the base whose
//     bytes are unchanged but whose mode differs is a chmod, one that
//     shrank a truncate, else a write. Session file operations are
//     recorded by the supervisor (the holder's own FUSE writes are not
//     reported), with source after the driver and their request_id.
//   - Live attribution under fuse (fuseattr.go): write ranges reported by
//     the holder are kept per path until that path's next checkpoint (at
//     each release of a written handle, each rename destination and each
//     command end); a new line goes to the command whose range covers its
//     bytes, else to the releasing command as a guess that a later range
//     re-attributes. Ranges move with a rename, so an editor's
//     temp-file save credits the writer of the temporary file for exactly
//     the lines that differ from the destination's previous content.
//   - A transcript that cannot be written (a full disk) keeps recording in
//     memory, the newest runtime.command.max_transcript_window_bytes of
//     rows, and every command output of that command then carries
//     transcript_lost:true and transcript_error (the reason, e.g. "write
//     transcript: no space left on device"): the rows are returned but are
//     not stored, and are gone after a supervisor restart. Optional fields,
//     like the others of §3.3, rather than an error kind: the command ran,
//     and its status, exit code and output are still known.
//   - Admission (workspace/admission.go) reserves a slot under one lock before a
//     command or session starts, so concurrent requests never exceed a cap
//     together; a failed start gives its slot back.
//   - At its descriptor limit (RLIMIT_NOFILE) the supervisor still answers
//     (fdguard.go): a reserve of descriptors accepts the waiting client,
//     health is served, every other operation is refused with server_busy
//     and details.max_open_files (the limit), and such a client has 2 s
//     to send its request.
//   - A request is cancelled when its client closes the connection (POLLHUP
//     on our end; a half-close is not a close) only for operations that
//     read: diff_workspace_session, export_changes, file_read, file_list,
//     file_blame, list_workspace_directories and the observability group.
//     Its span then ends "cancelled". Everything else completes (§2.4). A
//     cancelled directory export keeps the files it had renamed into place;
//     an archive export leaves nothing.
//   - destroy_sandbox stops every writer of the sandbox's directory before
//     removing it: sessions first, then it waits for background work (holder
//     event loops, implicit finalization) and seals the sandbox's event,
//     span and resource stores, whose later appends are dropped.
package supervisor
