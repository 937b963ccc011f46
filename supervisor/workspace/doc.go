// Package workspace owns what lives in a sandbox: workspace sessions and
// their holders, commands and their transcripts, file operations, publish,
// diff, finalization, teardown and port forwards (contract §5, §6, §8).
//
// The move out of the root package is under way: the session and command
// types and a sandbox's Tables of them (the registry entry's Work value),
// the holder interfaces, the transcript (§6.3) and the port-forward
// listeners and relays (§3.6, §5.7) are here; the session operations still
// live in the root package.
//
// It must never import the root supervisor package or decide how a sandbox
// itself is created, squashed or removed (that is supervisor/sandbox).
package workspace
