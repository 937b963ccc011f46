// Package catalog owns the public operation contract of Ephemeral Sandbox:
// every operation's ID, group, family, scope and arguments (kind, default,
// limits, help), the wire envelope and its error kinds, argument validation,
// endpoint resolution and a small client for the supervisor's socket.
//
// Everything that projects the operations — the three CLIs, the MCP servers,
// the supervisor's dispatcher and docs/operations.md — reads the declarations
// here, so an operation is described exactly once. Validation messages are
// the contract's (§2.6); where the contract gives no wording for a range
// violation we say "<name> must be between A and B" (or "at least"/"at most").
//
// It must never know how an operation is implemented: nothing of this module is imported here.
package catalog

//go:generate go run ./internal/gendoc -o ../docs/operations.md
