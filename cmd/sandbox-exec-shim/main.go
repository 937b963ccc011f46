// Command sandbox-exec-shim is the internal exec shim of session commands:
// a session holder runs every command as `sandbox-exec-shim -- ARGV...`,
// which hardens itself (no_new_privs, capabilities, seccomp; package
// nsholder/shim) and execs ARGV. It is a separate, small binary so that
// each command pays only a minimal Go start; `sandbox-supervisor nsholder
// shim` does the same when it is not installed.
package main

import (
	"os"

	"github.com/ephemeral-ai-lab/sandbox/nsholder/shim"
)

func main() {
	os.Exit(shim.Run(os.Args[1:]))
}
