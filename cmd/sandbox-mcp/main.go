// Command sandbox-mcp serves Ephemeral Sandbox operations as MCP tools over
// stdio: `sandbox-mcp [--set all|management|runtime|observability]
// [--sandbox-id ID]`. See cmd/internal/mcpserver.
package main

import (
	"os"

	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/mcpserver"
)

// version is set at build time with -ldflags "-X main.version=…" (Makefile)
// and reported as serverInfo.version.
var version = ""

func main() { os.Exit(mcpserver.Main(os.Args[1:], version, os.Stdin, os.Stdout, os.Stderr)) }
