// Package beneath owns the one way this module opens a path below a
// directory that someone else controls (a session's workspace or upper dir,
// a layer, an export source): every component is resolved relative to a
// descriptor, and no symlink is followed in any component, the last one
// included, not even one that stays inside the directory. It must never
// follow a symlink or a magic link, never accept ".." or an absolute path,
// and never import another package of this module.
//
// Resolution is openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
// RESOLVE_NO_MAGICLINKS); where the kernel lacks openat2 (before 5.6, or a
// seccomp filter refuses it) it is one openat(O_PATH|O_NOFOLLOW) per
// component, each checked with fstat to be a directory, so a component that
// is (or just became) a symlink fails the walk instead of being followed.
//
// It is a leaf package at the module root (internal/, not under
// supervisor/ or layers/) because its users sit on both sides of the
// package map: nsholder may import only fuseoverlay, layers may import
// nothing of ours, and the supervisor's attribution reads upper dirs
// through layers.Root. A leaf both may import is the only place one copy
// can live.
//
// github.com/cyphar/filepath-securejoin (in go.sum through a dependency)
// was considered: its OpenInRoot/OpenatInRoot resolve symlinks met inside
// the root, scoped to it, and return O_PATH handles. That is the right
// answer for a container runtime and the wrong one here: a symlink in a
// session's tree is a path the session chose (it may be swapped at any
// moment, and the upper-dir format records a symlink as a symlink), so
// every symlink is refused, which securejoin has no mode for. For the same
// reason os.Root (Go 1.24+) is not used: it refuses escapes but follows
// symlinks that stay inside.
package beneath
