// Command genheader writes the C exec shim's header
// (cmd/sandbox-exec-shim/harden.h) from the tables of package nsholder/shim
// (go generate ./nsholder/shim). It adds nothing of its own: every rule,
// number and mask comes from shim.CHeader.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/ephemeral-ai-lab/sandbox/nsholder/shim"
)

func main() {
	out := flag.String("o", shim.CHeaderPath, "output file")
	flag.Parse()
	b, err := shim.CHeader()
	if err == nil {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "genheader:", err)
		os.Exit(1)
	}
}
