// Package statedb owns the supervisor's durable state (§8.1): the SQLite
// database in the data directory (WAL, synchronous=FULL) holding sandbox,
// session and command records as JSON documents keyed by (kind, id) and
// sandbox, and the source of the contract's ULID-based IDs.
//
// It must never interpret a record (the owners of sandboxes, sessions and
// commands encode and decode them) or import another supervisor package.
package statedb
