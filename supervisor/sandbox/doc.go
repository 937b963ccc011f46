// Package sandbox owns the sandbox registry of the supervisor: the live
// entries (their persisted record, their gate, their directory and layer
// stack, their background work), the rules that resolve a sandbox for a
// request (§2.4 step 7), the checks of a workspace root, and layer-stack
// work on a whole sandbox such as squash (§8.6).
//
// What lives in a sandbox — sessions, commands — belongs to the workspace
// layer; an entry carries it as an opaque per-sandbox value W that this
// package never looks into. Where an operation here needs those occupants
// (the squash's remount sweep), the caller passes them through the small
// interfaces declared here.
//
// It must never import the workspace layer or the root supervisor package.
package sandbox
