// Command sandbox-manager-cli is the CLI of the management operations of Ephemeral Sandbox: a
// projection of the catalog (see cmd/internal/cli). Run `sandbox-manager-cli help`.
package main

import (
	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/cli"
)

func main() { cli.Main(catalog.Management) }
