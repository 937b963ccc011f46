package views

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// source is a SnapshotSource over fixed values; the supervisor's own
// source is exercised end to end by tests/views_test.go.
type source struct {
	sb       Sandbox
	sbRes    map[string]any
	wsRes    map[string]map[string]any
	resErr   error
	panicMsg string
}

func (s source) Sandbox() Sandbox { return s.sb }
func (s source) Resources() (map[string]any, map[string]map[string]any, error) {
	if s.panicMsg != "" {
		panic(s.panicMsg)
	}
	return s.sbRes, s.wsRes, s.resErr
}
func (s source) EventStore() any   { return map[string]any{"dropped_storage": 0} }
func (s source) NoSamples() string { return "no samples yet" }

func TestViewSnapshotNode(t *testing.T) {
	ws := t.TempDir()
	writeTree(t, ws, map[string]string{"a.txt": "hello\n"})
	st, _, err := layers.Create(context.Background(), filepath.Join(t.TempDir(), "layerstack"), ws, layers.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.Head()
	if err != nil {
		t.Fatal(err)
	}
	sessions := []Session{
		{ID: "ws-b", State: "active", Lease: m.Layers, HolderPid: 4242},
		{ID: "ws-a", State: "active", Lease: m.Layers},
	}
	running := []Command{{SessionID: "ws-b", ID: "cs-2", Cmd: "sleep 2"}, {SessionID: "ws-b", ID: "cs-1", Cmd: "sleep 1"}}
	sampled := map[string]any{"latest": map[string]any{"cpu_usec": 1}, "history": []any{}}
	for _, tc := range []struct {
		name         string
		src          source
		availability string
		errs         []string
		stack        bool
	}{
		{"available", source{sb: Sandbox{ID: "sb-1", State: "ready", Stack: st, Sessions: sessions, Running: running}, sbRes: sampled},
			"available", []string{}, true},
		{"no samples", source{sb: Sandbox{ID: "sb-1", State: "ready", Stack: st}, sbRes: map[string]any{"latest": nil, "history": []any{}}},
			"partial", []string{"no samples yet"}, true},
		{"resources fail", source{sb: Sandbox{ID: "sb-1", State: "ready", Stack: st}, resErr: errors.New("store gone")},
			"partial", []string{"store gone"}, true},
		{"failed sandbox", source{sb: Sandbox{ID: "sb-1", State: "failed", Failed: true, Error: "disk full", Stack: st}, sbRes: sampled},
			"unavailable", []string{"sandbox failed: disk full"}, true},
		{"no stack", source{sb: Sandbox{ID: "sb-1", State: "ready"}, sbRes: sampled},
			"unavailable", []string{"no layer stack"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := SnapshotNode(tc.src, 1024, 64)
			if node["sandbox_id"] != "sb-1" || node["availability"] != tc.availability || !reflect.DeepEqual(node["errors"], tc.errs) {
				t.Fatalf("node: availability %v errors %v", node["availability"], node["errors"])
			}
			if (node["stack"] != nil) != tc.stack {
				t.Fatalf("stack block: %v", node["stack"])
			}
			if res := node["resources"].(map[string]any); res["history"] == nil {
				t.Fatalf("resources block without history: %v", res)
			}
		})
	}
	node := SnapshotNode(source{sb: Sandbox{ID: "sb-1", State: "ready", Stack: st, Sessions: sessions, Running: running}, sbRes: sampled}, 1024, 64)
	wss := node["workspaces"].([]map[string]any)
	if len(wss) != 2 || wss[0]["workspace_id"] != "ws-a" || wss[1]["workspace_id"] != "ws-b" {
		t.Fatalf("workspaces not sorted by ID: %v", wss)
	}
	if wss[0]["holder_pid"] != nil || wss[0]["namespace_fd_count"] != 0 || len(wss[0]["active_namespace_executions"].([]map[string]any)) != 0 {
		t.Fatalf("holderless workspace: %v", wss[0])
	}
	execs := wss[1]["active_namespace_executions"].([]map[string]any)
	if wss[1]["holder_pid"] != 4242 || wss[1]["namespace_fd_count"] != 3 || len(execs) != 2 ||
		execs[0]["namespace_execution_id"] != "cs-1" || execs[1]["command"] != "sleep 2" {
		t.Fatalf("workspace with a holder and two commands: %v", wss[1])
	}
	if l := wss[1]["layers"].(map[string]any); l["layer_count"] != 1 || l["base_root_hash"] != m.RootHash() {
		t.Fatalf("layers block: %v (head %s)", l, m.RootHash())
	}
	if s := node["stack"].(map[string]any); s["layer_count"] != 1 || s["layers_bytes"] != int64(6) || s["estimated"] != false {
		t.Fatalf("stack block: %v", s)
	}
}

func TestViewSnapshotRecoversAFailingSandbox(t *testing.T) {
	srcs := []SnapshotSource{
		source{sb: Sandbox{ID: "sb-bad", State: "ready"}, panicMsg: strings.Repeat("x", 2*4096)},
		source{sb: Sandbox{ID: "sb-good", State: "ready"}, sbRes: map[string]any{"latest": nil, "history": []any{}}},
	}
	nodes := Snapshot(srcs, 16, 4)["sandboxes"].([]map[string]any)
	if len(nodes) != 2 {
		t.Fatalf("nodes: %v", nodes)
	}
	bad := nodes[0]
	if bad["sandbox_id"] != "sb-bad" || bad["availability"] != "unavailable" ||
		!strings.HasPrefix(bad["error"].(string), "building the snapshot failed: xxx") || len(bad["error"].(string)) > 4096 {
		t.Fatalf("failing node: %v", bad)
	}
	if nodes[1]["sandbox_id"] != "sb-good" || nodes[1]["workspaces"] == nil {
		t.Fatalf("the node after a failing one: %v", nodes[1])
	}
}
