package tests

import (
	"fmt"
	"strings"
	"testing"
)

// TestChainDepthErrors: with runtime.workspace.max_chain_depth small, every
// way a session can meet a chain deeper than the limit says so — "layer
// chain too deep", the chain's layer count, the limit and the squash that
// cures it, with details.layer_count and details.max_chain_depth — and
// changes nothing; a squash cures it, and moves a session whose chain is
// beyond the limit onto the shorter one. Issue 36: a sync onto a head past
// the kernel overlay's 500 lowers failed with "it needs Linux 6.15"; below
// that a sync went deeper than the limit without a word.
func TestChainDepthErrors(t *testing.T) {
	e := newEnv(t)
	writeConfig(t, e, "runtime:\n  workspace:\n    max_chain_depth: 4\n  layerstack:\n    autosquash:\n      squash_at_n_layers: null\n")
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	syncer := e.session(id)
	keeper := e.session(id)
	e.exec(id, "--workspace-session-id", keeper, "echo k > k.txt")
	for i := range 4 {
		e.rt(id, "file_write", "--path", fmt.Sprintf("w%d.txt", i), "--content", "w\n")
	}
	tooDeep := func(what string, r map[string]any, err error, layers int) map[string]any {
		t.Helper()
		msg := errMsg(r)
		body, _ := r["error"].(map[string]any)
		details, _ := body["details"].(map[string]any)
		if err != nil || errKind(r) != "operation_failed" || details == nil ||
			!strings.Contains(msg, "layer chain too deep") || !strings.Contains(msg, fmt.Sprintf("has %d layers", layers)) ||
			!strings.Contains(msg, "max_chain_depth 4") || !strings.Contains(msg, "squash_layerstacks") || strings.Contains(msg, "Linux") ||
			details["layer_count"] != float64(layers) || details["max_chain_depth"] != float64(4) || details["reason"] != "chain_too_deep" {
			t.Fatalf("%s over a %d-layer chain: %v %v, want layer chain too deep naming %d layers and the limit 4", what, layers, r, err, layers)
		}
		return details
	}

	r, err := e.call("create_workspace_session", id, nil)
	tooDeep("create_workspace_session", r, err, 5)
	r, err = e.call("exec_command", id, map[string]any{"cmd": "true"})
	tooDeep("an implicit exec_command", r, err, 5)
	r, err = e.call("sync_workspace_session", id, map[string]any{"workspace_session_id": syncer})
	if d := tooDeep("sync_workspace_session", r, err, 5); d["session_retained"] != true {
		t.Fatalf("sync refusal without session_retained: %v", r)
	}
	if v := e.sessionBaseVersion(id, syncer); v != 1 {
		t.Fatalf("a refused sync moved the session to base %d", v)
	}
	if got := e.sessionRead(id, syncer, "w0.txt"); got != "" {
		t.Fatalf("a refused sync shows the head's w0.txt: %q", got)
	}
	// Publish and keep: the layer is committed (head 6), the move refused.
	r, err = e.call("publish_workspace_session", id, map[string]any{"workspace_session_id": keeper, "keep": true})
	if d := tooDeep("publish_workspace_session keep", r, err, 6); d["publish_completed"] != true || d["recovery_operation"] != "sync_workspace_session" {
		t.Fatalf("publish keep refusal: %v", r)
	}
	if got := e.rt(id, "file_read", "--path", "k.txt")["content"]; got != "k" && got != "k\n" {
		t.Fatalf("the kept session's publish is not in head: %q", got)
	}

	// A squash cures it: both sessions' tips are the base, so head becomes S+B.
	e.mgr("squash_layerstacks", "--sandbox-id", id)
	if l := e.manifestLayers(id); len(l) != 2 {
		t.Fatalf("after a squash: %v", l)
	}
	e.rt(id, "sync_workspace_session", "--workspace-session-id", syncer)
	if got := e.sessionRead(id, syncer, "k.txt"); got != "k" {
		t.Fatalf("synced after the squash, k.txt: %q", got)
	}

	// A session on a chain beyond a lowered limit: forking it is refused
	// naming its chain; a squash moves it onto a shorter chain, after
	// which the fork works.
	e.stop()
	writeConfig(t, e, "runtime:\n  workspace:\n    max_chain_depth: 8\n  layerstack:\n    autosquash:\n      squash_at_n_layers: null\n")
	e.start()
	for i := range 4 {
		e.rt(id, "file_write", "--path", fmt.Sprintf("x%d.txt", i), "--content", "x\n")
	}
	deep := e.session(id) // 6 layers
	e.stop()
	writeConfig(t, e, "runtime:\n  workspace:\n    max_chain_depth: 4\n  layerstack:\n    autosquash:\n      squash_at_n_layers: null\n")
	e.start()
	r, err = e.call("fork_workspace_session", id, map[string]any{"workspace_session_id": deep})
	tooDeep("fork_workspace_session", r, err, 6)
	if !strings.Contains(errMsg(r), "the source session's chain") {
		t.Fatalf("fork refusal does not say whose chain: %v", r)
	}
	sq := e.mgr("squash_layerstacks", "--sandbox-id", id)
	moved := false
	for _, s := range sq["swept_sessions"].([]any) {
		if s := s.(map[string]any); s["session_id"] == deep && s["disposition"] == "remounted" {
			moved = true
		}
	}
	if !moved {
		t.Fatalf("the squash did not move the deep session onto its shorter chain: %v", sq)
	}
	fork := e.rt(id, "fork_workspace_session", "--workspace-session-id", deep)
	if got := e.sessionRead(id, fork["workspace_session_id"].(string), "x3.txt"); got != "x" {
		t.Fatalf("the fork after the squash, x3.txt: %q", got)
	}
}
