// Package buildinfo is the one answer to "which version is this binary" for
// the five binaries, and renders their man pages (manpage.go).
//
// Version order (a decision the contract leaves open):
//
//  1. the value linked in with -ldflags "-X main.version=…" (make, make
//     dist: `git describe`), when not empty;
//  2. the main module's version from debug.ReadBuildInfo: v1.2.3 for
//     `go install …@v1.2.3`, a pseudo-version for `go install …@<commit>`,
//     and, since Go 1.24, the pseudo-version `go build` stamps from the
//     checkout's VCS state (v0.0.0-<time>-<rev12>, "+dirty" when modified);
//  3. the VCS revision stamped without a module version:
//     "devel-<rev12>" ("-dirty" when modified);
//  4. "dev": built with -buildvcs=false (what CI's GOFLAGS set) outside a
//     module download, so nothing is known. No date or host name is used
//     instead: it would differ per build and break reproducible builds.
//
// It must never read anything but the binary's own build information (and,
// for a man page's date, SOURCE_DATE_EPOCH).
package buildinfo

import (
	"runtime/debug"
)

// Version returns the version of this build; linked is main.version as set
// by -X ("" when not set).
func Version(linked string) string {
	bi, _ := debug.ReadBuildInfo()
	return version(linked, bi)
}

func version(linked string, bi *debug.BuildInfo) string {
	if linked != "" {
		return linked
	}
	if bi == nil {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		return "devel-" + rev + "-dirty"
	}
	return "devel-" + rev
}
