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
//   - A workspace_session_id on a file operation names a session; this
//     version has none, so it is not_found.
//   - Domain errors that are not *catalog.Error become operation_failed
//     (an I/O failure of a valid request), in toError only.
//   - Resource views: window_ms is at least 1; a snapshot's resources are
//     the last 30 samples of the last minute; the fleet's current is the
//     newest sandbox sample within window_ms; the cgroup view adds
//     cgroup_path and cgroup_delegated. A sample's metrics are its
//     cgroup's when one exists for it, else /proc sums (resources.go).
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
package supervisor
