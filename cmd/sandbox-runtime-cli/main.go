// Command sandbox-runtime-cli is the CLI of the runtime operations of Ephemeral Sandbox: a
// projection of the catalog (see cmd/internal/cli). Run `sandbox-runtime-cli help`.
package main

import (
	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/cli"
)

func main() { cli.Main(catalog.Runtime) }
