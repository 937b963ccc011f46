// Package views owns the read-only observability views of §3.7 and §10.3:
// health, daemon, topology, layerstack and snapshot, computed from plain
// values the supervisor copies out of its sandboxes and sessions (and, for
// snapshot, through the small SnapshotSource interface), from bounded walks
// of layer directories, and from bounded scans of /proc. None of them
// appends to a store, samples on demand or keeps history in memory.
//
// It must never import the supervisor, its workspace or sandbox packages,
// nor change anything it shows: every function here only reads.
package views
