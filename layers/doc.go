// Package layers is the LayerStack of one sandbox as a plain storage library
// (contract §8). It owns, below one directory (sandboxes/<id>/layerstack):
//
//   - the workspace snapshot into the base layer B000001-base (Create,
//     CreateSibling) and workspace.json;
//   - manifest.json (schema_version 1, layers newest first), its atomic
//     replacement, and the digests of §8.3: manifest root hash, layer digest,
//     base root hash, each layer's .layer-metadata sidecars;
//   - the merged, read-only View of a manifest (whiteouts in both on-disk
//     encodings plus OCI names, opaque directories, ancestor blocking);
//   - publication of one new layer per Update under the exclusive writer flock
//     (.storage-writer.lock) with the durability order of §8.8, the no-op
//     rule (same digest and same modes as the head layer) and the
//     fail-next-publish test failpoint;
//   - leases pinning manifest snapshots, garbage collection on release and the
//     fail-closed start-up Sweep (§8.5, §8.7);
//   - the storage steps of live sessions (sync.go, copyupper.go): SyncUpper
//     rewrites a session's upper for a newer head through the publish
//     planner, swapped in with one renameat2(RENAME_EXCHANGE) and a journal
//     (RecoverSync, CompleteSync, AbortSync); CopyUpper copies an upper
//     exactly for a fork;
//   - the git index a session starts from (gitrestat.go, issue #28): the
//     snapshot rewrites every git index in the workspace so its cached
//     stat data are what a session on either overlay driver sees (one
//     index fits both: the session sees the layer file's inode, ctime and
//     mtime, and the supervisor's ids as 0); RestatGitIndexInView is the
//     same for a head index a publish writes. Hard links keep an index
//     valid (squash and CreateSibling need no rewrite) because sessions
//     run git with core.trustCtime=false.
//
// It imports nothing of this module but the leaves internal/beneath (the
// module's one resolver beneath a root) and layers/gitindex (the index
// file format), needs no privileges and no
// namespaces, and is Linux-only (golang.org/x/sys/unix).
//
// upperfmt.go is the one upper-format module: every decision of what a
// whiteout, an opaque directory, an OCI marker name or a carrier is, and
// the writers of whiteouts and opaque directories (UpperFormat for a
// session's upper dir, LayerFormat for layers). fuseoverlay keeps an
// fd-based twin; internal/upperfmtcases holds both to one table.
//
// Decisions where the contract is silent:
//
//   - Directories created implicitly for the parents of a change are written
//     with the merged view's mode when the view has a directory there (a
//     carrier) and 0755 otherwise; they are part of the layer (and of the
//     no-op mode comparison) but never of the layer digest, which covers
//     exactly the changes returned to Update. Callers should therefore not pass
//     carrier directories as changes.
//   - Change.Mode is used as given (files keep 0o777 bits, directories 0o777
//     and the sticky bit); no default is substituted for 0.
//   - A layer's root directory gets the mode of the view's root (0755 when the
//     stack is empty); the base root keeps the workspace root's mode.
//   - A whiteout is a 0:0 character device; where mknod is refused, an empty
//     file with user.overlay.whiteout=y; where user xattrs are refused too, an
//     OCI .wh.<name> file. An opaque directory gets user.overlay.opaque=y, or
//     the .wh..wh..opq marker only where user xattrs are refused: not both,
//     as §8.4 asks, because the kernel lists the marker in a directory that
//     only one layer has (seen on Linux 6.18). Readers honour both.
//   - The base snapshot is made durable with one syncfs before its rename;
//     published layers fsync every file and directory as §8.8 requires.
//   - Garbage collection and Sweep never run without a parsable manifest; the
//     in-memory leases of the Stack are honoured by Sweep as well.
//   - Trees a session controls (its upper dir, a recovery artifact) are read
//     only through a Root (root.go, on internal/beneath): paths are
//     resolved descriptor-relative with openat2(RESOLVE_BENEATH|
//     RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS), or one O_NOFOLLOW openat
//     per component where openat2 is missing, and a symlink is never
//     followed in any component, even one pointing elsewhere inside the
//     root (os.Root would follow that one): the upper-dir format records a
//     symlink as a symlink, and a session can swap any directory for a link
//     at any moment. Capture walks by directory descriptor; its writes carry
//     the Root and a Root-relative Source, read with Change.OpenSource.
//     Published layers are written by the supervisor alone and are read by
//     host path (last component not followed).
//
// Exports (export.go) never write, delete or archive a git directory's
// private files (index, logs, locks: the destination's own describe its
// work tree) or protected ones (config, hooks, info, alternates, gitlinks:
// they make git run programs), whichever layer holds them; Fold.KeptOut
// names them. An existing destination directory keeps its mode. The
// destination itself is opened beneath an allowed root by OpenDestBeneath.
//
// It must never read a session-controlled tree by a joined host path.
package layers
