// Package systemd is the supervisor's systemd integration (contract §13,
// §2.1): it renders and installs the user units ephemeral-sandbox.service
// and ephemeral-sandbox.socket, sends sd_notify readiness, status, watchdog
// and stopping messages, picks up a socket passed by socket activation
// (LISTEN_FDS) and offers a slog handler that writes to the journal.
//
// Everything here works without systemd: notifications are no-ops when
// NOTIFY_SOCKET is unset, Listener returns nil without LISTEN_FDS and
// JournalHandler returns nil outside a systemd unit. It imports nothing of
// this module.
//
// It must never need root.
package systemd
