// Package rpc owns the supervisor's request line (§2.4): reading it off a
// connection, parsing, the authentication hook, decoding, request IDs, the
// normalisation of the request scope, the registry of handlers keyed by the
// catalog's operation declarations (streaming, span name and cancellability
// come from the declaration), each request's context (derived from its
// connection, cancelled by a hang-up only for the operations that may stop)
// and the one mapping of errors to the contract's envelope: handlers and the
// domain packages return typed errors, and only Mux.Error turns them into a
// *catalog.Error, keeping the domain error as its Cause.
//
// It must never import the supervisor or a domain package: it knows only the
// catalog, and domain error types reach it through translators its user
// registers (As).
package rpc
