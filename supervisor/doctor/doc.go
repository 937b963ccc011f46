// Package doctor owns host diagnosis: the probes the supervisor takes once
// at start (user namespaces, the kernel overlay, the FUSE device and
// overlay; §4.5) and resolves a sandbox's overlay driver with, and the
// checks of `sandbox-supervisor doctor` (§13), each with pass or fail and
// the exact fix.
//
// It must never change the host: checks only look (the overlay probe
// works in a scratch directory it removes again), and it never imports
// another supervisor package but config.
package doctor
