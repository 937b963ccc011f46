// Command gendoc writes docs/operations.md from the catalog (go generate ./catalog).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

func main() {
	out := flag.String("o", "docs/operations.md", "output file")
	flag.Parse()
	if err := os.WriteFile(*out, []byte(catalog.Markdown()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
