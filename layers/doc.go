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
// file format), needs no privileges and no namespaces, and is Linux-only
// (golang.org/x/sys/unix). The one program it runs is the git CLI, for the
// git route of publication and sync (below), and only on repositories a
// workspace holds.
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
// Git directories (contract A8, design rule 10; gitpath.go, gitroute.go,
// gitmerge.go, gitsync.go). Every path inside a directory named .git (and
// a submodule's modules/<name>) is classified by ClassifyGit:
//
//   - private state (index, logs, COMMIT_EDITMSG, locks, …) is never
//     published (git_private); protected files that can make git run a
//     program (config, hooks/, info/, alternates, …) and the removal of a
//     git directory are never published either (git_protected); neither
//     is a rejection, and a sync keeps both verbatim in the session.
//   - objects are a union: a loose object or pack the head lacks is
//     published (git_object) after verification by its name (a loose
//     object must inflate to "<type> <len>\0<data>" hashing to its name;
//     a pack's trailer must hash its content and be its name, an index's
//     trailer must hash the index and it must name that pack); a corrupt
//     one rejects the publish (git_object_invalid, naming the path). One
//     the head already has is unchanged_head; the deletion of an object
//     (gc, repack) is the session's own business (git_private).
//   - refs are read by value (loose refs over packed-refs; HEAD) from
//     base, head and session and never merged as text; the ref files a
//     session changed are listed as git_ref and plan.git_refs lists every
//     decision. The session's branch is the one the base's HEAD names (HEAD
//     itself when detached). When head still has the base's tip it
//     fast-forwards (the session may have rewritten its own history: it
//     was the only writer); otherwise per GitOptions.RefMode: merge (a
//     commit whose parents are head's tip and the session's, authored by
//     the agent, committed by the user), rebase (the session's non-merge
//     commits replayed onto head's tip with their messages, authors and
//     author dates; one that does not apply cleanly turns the publish into
//     a merge, said in the decision's note) or branch (head's branch stays,
//     the session's tip becomes refs/heads/sandbox/<agent>-<session>). The
//     tree of a merge or replay is computed per path from the commits:
//     a path one side left as the merge base takes the other's entry,
//     regular files both changed go through Merge3 and the §9.5 mode rule,
//     and anything else takes what this very publication resolved in the
//     work tree (the planner's result, with the same strategies), so a
//     resolved conflict of files is the commit's content too. Every other
//     ref publishes as it is when head has its base value (create, update,
//     delete); one both sides moved differently is a conflict listed like
//     a path (changed_on_both_sides), settled by ours or theirs. A ref the
//     session publishes must name an object the session or head has
//     (git_ref_invalid otherwise). refs/stash, refs/bisect/, refs/worktree/,
//     refs/rewritten/ and refs/prefetch/ are private; the head's HEAD is
//     never changed by a session (its checked-out branch stays the user's).
//     New ref values are written as loose refs (they override packed-refs;
//     a deletion also rewrites packed-refs without the ref).
//   - when the head's HEAD commit moves, the layer also gets a new head
//     index: read-tree of the new commit's tree, its cached stat data
//     copied from the head's current index for every file the publication
//     leaves as it is (restatHeadIndex; the files it changes stay zero and
//     are re-read once), so git status on the head shows exactly the
//     uncommitted changes published, at stat speed.
//     Staged-but-uncommitted state of the head's old index is not kept.
//   - a session that removed or replaced a whole git directory (deleted
//     .git, or rm -rf .git && git init: an opaque directory) publishes
//     nothing of it; the head keeps its repository.
//   - a sync (SyncUpper) does the reverse: the session's branch fast-
//     forwards to head's tip when it has no commits of its own (or head
//     already contains them, after publish keep:true), else a merge commit
//     (first parent the session's tip) or a replay onto head's tip (branch
//     mode merges: the session needs head's commits); refs the session
//     left as its base had them take head's value as loose refs (the
//     session's own packed-refs may hide head's); refs the session changed
//     keep its value; when the session's HEAD commit moves its private
//     index is rebuilt from the new commit (staged changes become
//     unstaged).
//
// Git runs only through gitExec (gitexec.go): no user or system config,
// core.hooksPath=/dev/null, no fsmonitor, no auto gc, in a scratch git
// directory below staging/ (removed at the end of the plan, and by Sweep
// after a crash) whose objects directory receives the session's verified
// objects and every object the route writes, with each base and head
// layer's objects directory as an alternate. Objects the route writes are
// committed with the layer, so a crash leaves the previous or the next
// manifest with its objects and refs together.
//
// It must never read a session-controlled tree by a joined host path.
package layers
