// Package attribution owns line attribution and file activity (contract
// §11): session checkpoints (which command wrote which line), file_blame's
// owners of a head or session file, the append-only audit records of
// publishes, file_activity capture and storage, and the FUSE overlay's
// write ranges. It works from plain values — an upper dir, a layers.View
// of the base, a session ID and agent, a state directory, a *sql.DB — and
// a session holds its state in one Tracker. Lines are split and diffed by
// the layers module's one line diff, so blame agrees with the publish merge.
//
// It must never import the supervisor, its workspace or sandbox packages,
// or reach into a session object.
package attribution
