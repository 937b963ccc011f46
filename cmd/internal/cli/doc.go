// Package cli projects one catalog group into a cobra command tree: the
// shared implementation of sandbox-manager-cli, sandbox-runtime-cli and
// sandbox-observability-cli (contract §3.1). It also holds the client
// plumbing sandbox-mcp shares with the CLIs (endpoint, token, scope,
// request ids).
//
// The projection is table-driven: every operation of the group becomes a
// subcommand named by its ID, every argument a flag (Arg.FlagName plus
// Arg.FlagAliases) or, when Arg.Positional is set, a positional. Flag text is
// converted by kind (§2.6) and then checked with op.Validate, which also
// fills in the catalog defaults, so a usage error never reaches the
// supervisor.
//
// Output is exactly one JSON line: a success on stdout (exit 0); a
// supervisor error envelope, connection_error or protocol_error on stderr
// (exit 1); a usage or configuration error — unknown operation or flag,
// missing or mistyped argument, bad --sandbox-id/--request-id, config_error
// (endpoint, token file) — on stderr with stdout empty (exit 2).
//
// Decisions where the contract is silent:
//   - `help` output is plain text on stdout (exit 0); -h/--help print the
//     same help. Cobra's completion command, suggestions and usage/error
//     printing are disabled.
//   - sandbox-manager-cli --progress sets _stream_logs:true on whatever
//     operation is called; §2.5 says operations other than create_sandbox,
//     destroy_sandbox, squash_layerstacks and export_changes ignore it, so
//     no per-operation list is needed here.
//   - --sandbox-id (runtime) and --request-id are checked against the ID
//     rule locally; --sandbox-id given after the operation is refused.
//   - Observability operations that declare sandbox_id send it both as the
//     argument and in a sandbox scope (equal, as §2.3 allows) when the
//     operation accepts a sandbox scope.
//   - A TCP endpoint with no token from --auth-token, the environment or a
//     readable one-line token file is a config_error.
//   - Every Unix endpoint, chosen or resolved, is held to the supervisor's
//     own socket-directory rule (real directory, the user's, mode 0700) and
//     its listener must be the user (SO_PEERCRED) before the request is
//     sent; either failure is a config_error (catalog.Client). A failed
//     autostart is a connection_error with details.reason and details.log.
//   - A JsonArray flag must hold JSON text of an array; an Integer flag
//     decimal digits only; a Boolean flag --flag, --flag=true or
//     --flag=false.
package cli
