// Package nsholder is the holder process mode of sandbox-supervisor: the
// code that runs inside a session's user, mount, PID, IPC and UTS namespaces,
// assembles its root, mounts the workspace overlay and serves requests from
// the supervisor. The supervisor never joins namespaces itself (design rule
// 2); it starts this mode with clone flags and talks to it.
//
// This version holds the start-up probe: a short-lived child in a fresh user
// and mount namespace that proves (or disproves, with the kernel's reason)
// that kernel OverlayFS mounts with userxattr on the data directory's
// filesystem, with lowerdir+ or the option-string fallback.
package nsholder
