// Package workspace owns what lives in a sandbox: workspace sessions and
// their holders, commands and their transcripts, file operations, publish,
// diff, finalization, teardown and port forwards (contract §5, §6, §8).
//
// The move out of the root package is under way. Here: the session and
// command types and a sandbox's Tables of them (the registry entry's Work
// value); the holder interfaces; Admission (check-and-reserve of commands
// and sessions); Commands (spawn with its environment, holder events, end,
// kill, retention, lookup, restore at start); Teardown (a session's destroy,
// the stop of a sandbox's sessions); Diff; the file views, path rules and
// edit engine; the publish objects; the transcript (§6.3) and the
// port-forward listeners and relays (§3.6, §5.7); Holders (session
// creation, holder start and watch, holder death, restore at start), whose
// image cache, cgroup and attribution needs come in as fields the root
// sets; Publisher (publish and implicit finalization), whose attribution
// and audit calls go through PublishHooks. Still in the root package: the
// handlers and the attribution glue behind SessionHooks and PublishHooks.
//
// An implicit session's exec_command (§5.1, §6.6) keeps off its reply's
// path what no client can observe, where the contract is silent on the
// order (#18): the session's record is stored in the commit of its first
// command's running record, before that command starts, so nothing the
// command writes exists without it (a crash earlier leaves an orphan
// directory that the next start removes); finalization quiesces the
// session (every process but the holder SIGKILLed and reaped) before the
// capture, stores the draining command's terminal record with the session
// record's removal in one commit, and answers; the holder, which runs
// nothing of the session's, is killed afterwards in the background,
// before the session's directory is removed and the sandbox's next spare
// holder is started (a crash in between: the holder dies with the
// supervisor, the directory is trash the next start empties).
//
// Git in a command's environment (issue #28), where §6.1 predates the
// session-private index (A8): commands no longer get GIT_OPTIONAL_LOCKS=0.
// The session's .git/index is its own and never published, so git may
// refresh it as it does on a host: a `git status` that had to re-hash a file
// (one touched without a change, one a sync brought in) stores its new stat
// data and the next status only stats. They get core.trustCtime=false
// (GIT_CONFIG_COUNT/KEY_0/VALUE_0; a command's own GIT_CONFIG_COUNT
// replaces it): the head's index is written with the stat data a session
// sees (layers.RestatGitIndex), but hard links made after it was written
// (create_sandbox count > 1, squash) move the layer files' ctimes, which
// would make every status re-hash; inode, mtime, size and owner, which git
// still compares, survive a hard link.
//
// A diff's "--- "/"+++ " headers name the file through
// layers.QuoteDiffPath (git's core.quotePath=true quoting), so a header is
// always one line whatever the name holds; the files' path fields stay as
// they are (#27 item 5).
//
// runtime.workspace.max_chain_depth (§5.2) is checked wherever a session
// would go onto a deeper chain, not only at creation: a fork (the source's
// chain), a sync and a publish with keep (the head, before anything is
// frozen or committed beyond the publish itself), and Remount onto a chain
// longer than the session's. All say ChainDepthError ("layer chain too
// deep", the count, the limit, the squash that cures it); a remount onto a
// shorter chain (a squash's sweep) is never refused, so a squash always
// cures a lowered limit (issue 36).
//
// It must never import the root supervisor package or decide how a sandbox
// itself is created, squashed or removed (that is supervisor/sandbox).
package workspace
