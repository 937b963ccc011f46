package workspace

import (
	"fmt"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
)

// ChainDepthError is a session that would run on a lower chain longer than
// runtime.workspace.max_chain_depth (§5.2): a new session or a fork over
// such a chain, a sync or publish-keep onto such a head, a remount onto a
// deeper chain. The limit exists because the kernel overlay stacks at most
// 500 lowers and every lower costs each lookup; the cure is a squash, so
// the error says that, whatever the path it surfaced on (issue 36: a sync
// onto a too-deep head used to fail in the kernel with a message about
// kernel versions).
type ChainDepthError struct {
	Layers int    // the chain's layers, base included
	Max    int    // runtime.workspace.max_chain_depth
	Chain  string // whose chain: "the head", "the source session's chain"
}

func (e *ChainDepthError) Error() string {
	return fmt.Sprintf("layer chain too deep: %s has %d layers (base included), more than runtime.workspace.max_chain_depth %d; run squash_layerstacks (or let autosquash run) to shorten it",
		e.Chain, e.Layers, e.Max)
}

// Envelope is the contract's error for e (operation_failed "layer chain too
// deep", details layer_count and max_chain_depth, §5.2).
func (e *ChainDepthError) Envelope() *catalog.Error {
	return catalog.Wrap(catalog.OperationFailed, e, "%s", e.Error()).
		With("layer_count", e.Layers).With("max_chain_depth", e.Max).With("reason", "chain_too_deep")
}

// checkDepth refuses a chain of n layers deeper than the configured limit.
func checkDepth(cfg *config.Config, n int, chain string) error {
	if limit := cfg.Runtime.Workspace.MaxChainDepth; n > limit {
		return &ChainDepthError{Layers: n, Max: limit, Chain: chain}
	}
	return nil
}
