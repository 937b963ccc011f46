// Command sandbox-mcp serves one domain of Ephemeral Sandbox operations as
// MCP tools over stdio: `sandbox-mcp --set management|runtime|observability`.
// See cmd/internal/mcpserver.
package main

import (
	"os"

	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/mcpserver"
)

func main() { os.Exit(mcpserver.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
