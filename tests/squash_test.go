package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// layerDirs lists the layer directories of a sandbox on disk.
func (e *env) layerDirs(id string) []string {
	e.t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.data(), "sandboxes", id, "layerstack", "layers"))
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, d := range ents {
		out = append(out, d.Name())
	}
	return out
}

// publishCmd runs cmd in a new explicit session and publishes it: one layer,
// committed before it returns (an implicit session finalizes after its
// command's response).
func (e *env) publishCmd(id, cmd string) {
	e.t.Helper()
	ws := e.session(id)
	if r := e.exec(id, "--workspace-session-id", ws, cmd); r["status"] == "running" {
		e.waitDone(id, r["command_session_id"].(string))
	}
	e.rt(id, "publish_workspace_session", "--workspace-session-id", ws) // destroys the session
}

func (e *env) manifestLayers(id string) []string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.data(), "sandboxes", id, "layerstack", "manifest.json"))
	if err != nil {
		e.t.Fatal(err)
	}
	var m struct {
		Layers []struct {
			LayerID string `json:"layer_id"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		e.t.Fatalf("manifest: %v\n%s", err, b)
	}
	var ids []string
	for _, l := range m.Layers {
		ids = append(ids, l.LayerID)
	}
	return ids
}

// TestSquashLayerstacks: a compact stack answers with empty lists; a stack
// of published layers with a live session in the middle squashes into two
// blocks, the head's content is unchanged, the session is remounted onto
// the squashed chain with its view unchanged (so every replaced layer is
// reclaimed at once) and publishes afterwards.
func TestSquashLayerstacks(t *testing.T) {
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"a.txt": "a0\n", "gone.txt": "bye\n", "src/m.go": "package m\n"})
	id := e.createSandbox(root)

	compact := e.mgr("squash_layerstacks", "--sandbox-id", id)
	if got, _ := json.Marshal(compact); string(got) != `{"manifest_version":1,"squashed_blocks":[],"swept_sessions":[]}` {
		t.Fatalf("compact stack: %s", got)
	}

	for i := 1; i <= 3; i++ {
		e.rt(id, "file_write", "--path", "a.txt", "--content", fmt.Sprintf("a%d\n", i))
	}
	e.publishCmd(id, "rm gone.txt && mkdir -p d && echo x > d/x")
	ws := e.session(id)
	e.rt(id, "file_write", "--path", "b.txt", "--content", "b\n")
	e.rt(id, "file_write", "--path", "a.txt", "--content", "a5\n")
	before := map[string]string{}
	e.headTree(id, "", before)
	layersBefore := e.manifestLayers(id)
	blameBefore, _ := json.Marshal(e.rt(id, "file_blame", "--path", "a.txt")["ranges"])

	res := e.mgr("squash_layerstacks", "--sandbox-id", id)
	blocks, _ := res["squashed_blocks"].([]any)
	if len(blocks) != 2 {
		t.Fatalf("want 2 blocks (split at the session's newest layer): %v", res)
	}
	for _, b := range blocks {
		m := b.(map[string]any)
		if !strings.HasPrefix(m["squashed_layer_id"].(string), "S") || len(m["replaced_layer_ids"].([]any)) < 2 {
			t.Fatalf("block %v", m)
		}
		// The session below the upper block moved off its replaced layers.
		if _, ok := m["blocked_reasons"]; ok || m["replaced_layers"] != "reclaimed" {
			t.Fatalf("block not reclaimed: %v", m)
		}
	}
	swept, _ := res["swept_sessions"].([]any)
	if len(swept) != 1 || swept[0].(map[string]any)["session_id"] != ws || swept[0].(map[string]any)["disposition"] != "remounted" {
		t.Fatalf("swept_sessions %v", swept)
	}
	layersAfter := e.manifestLayers(id)
	if len(layersAfter) != 3 || layersAfter[2] != "B000001-base" || len(layersBefore) != 7 {
		t.Fatalf("layers %v → %v", layersBefore, layersAfter)
	}
	if got, want := e.layerDirs(id), slices.Sorted(slices.Values(layersAfter)); !slices.Equal(got, want) {
		t.Fatalf("layer dirs right after the squash %v, head %v", got, want)
	}
	if num(t, res["manifest_version"]) != 8 {
		t.Fatalf("manifest_version %v", res["manifest_version"])
	}
	after := map[string]string{}
	e.headTree(id, "", after)
	sameTree(t, "head after squash", after, before)
	if got, _ := json.Marshal(e.rt(id, "file_blame", "--path", "a.txt")["ranges"]); string(got) != string(blameBefore) {
		t.Fatalf("blame changed by the squash:\n%s\nwas\n%s", got, blameBefore)
	}

	// The session still sees its view and can publish.
	out := e.rt(id, "exec_command", "--workspace-session-id", ws, "cat a.txt; ls; echo s > s.txt")
	if o := out["output"].(string); !strings.Contains(o, "a3") || strings.Contains(o, "b.txt") || strings.Contains(o, "gone.txt") {
		t.Fatalf("session view after squash: %q", o)
	}
	e.rt(id, "publish_workspace_session", "--workspace-session-id", ws) // destroys the session
	final := map[string]string{}
	e.headTree(id, "", final)
	before["s.txt"] = "file s"
	sameTree(t, "head after the session's publish", final, before)
	// Nothing pins the replaced layers any more.
	head := e.manifestLayers(id)
	for _, l := range e.layerDirs(id) {
		if !slices.Contains(head, l) {
			t.Errorf("layer %s is on disk but not in head %v", l, head)
		}
	}

	e.fail(1, "not_found", "sandbox-manager-cli", "squash_layerstacks", "--sandbox-id", "sbx-00000000000000000000000000")
	e.fail(2, "invalid_request", "sandbox-manager-cli", "squash_layerstacks")
}

// TestSquashCrash kills the supervisor at random moments of a squash: after
// each restart the manifest parses, the head's content is unchanged, and no
// layer outside the manifest remains.
func TestSquashCrash(t *testing.T) {
	e := newEnv(t)
	e.start()
	files := map[string]string{}
	for i := range 200 {
		files[fmt.Sprintf("f/%03d.txt", i)] = fmt.Sprintf("%d\n", i)
	}
	id := e.createSandbox(e.project(files))
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for round := range 4 {
		for i := range 3 {
			e.publishCmd(id, fmt.Sprintf("for f in f/*.txt; do echo %d-%d >> $f; done; echo %d > r%d-%d", round, i, i, round, i))
		}
		before := map[string]string{}
		e.headTree(id, "f", before)
		done := make(chan result, 1)
		go func() { done <- e.run("sandbox-manager-cli", "squash_layerstacks", "--sandbox-id", id) }()
		delay := time.Duration(rng.IntN(300)) * time.Millisecond
		time.Sleep(delay)
		e.kill9()
		<-done
		e.checkNoHolders(t)
		e.start()
		after := map[string]string{}
		e.headTree(id, "f", after)
		sameTree(t, fmt.Sprintf("round %d", round), after, before)
		head := e.manifestLayers(id)
		t.Logf("round %d: killed after %v; layers %v", round, delay, head)
		for _, l := range e.layerDirs(id) {
			if !slices.Contains(head, l) {
				t.Errorf("round %d: layer %s left outside the manifest %v", round, l, head)
			}
		}
	}
	// A squash that is not interrupted leaves a compact stack.
	e.mgr("squash_layerstacks", "--sandbox-id", id)
	if l := e.manifestLayers(id); len(l) != 2 {
		t.Fatalf("after a full squash: %v", l)
	}
}

// TestAutosquash: with squash_at_n_layers 4, the publish that makes the
// stack four layers deep is followed by an automatic squash back to S+B,
// reported by triggered and completed events; a config below 3 is refused.
func TestAutosquash(t *testing.T) {
	e := newEnv(t)
	writeConfig(t, e, "runtime:\n  layerstack:\n    autosquash:\n      squash_at_n_layers: 4\n")
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a.txt": "0\n"}))
	e.rt(id, "file_write", "--path", "a.txt", "--content", "1\n")
	e.rt(id, "file_write", "--path", "b.txt", "--content", "b\n")
	time.Sleep(600 * time.Millisecond) // past the 250 ms coalescing delay: 3 layers stay
	if l := e.manifestLayers(id); len(l) != 3 {
		t.Fatalf("below the threshold: %v", l)
	}
	e.rt(id, "file_write", "--path", "a.txt", "--content", "3\n")
	var layers []string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if layers = e.manifestLayers(id); len(layers) == 2 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(layers) != 2 || !strings.HasPrefix(layers[0], "S") {
		t.Fatalf("no autosquash: %v", layers)
	}
	if got := e.rt(id, "file_read", "--path", "a.txt")["content"]; got != "3\n" && got != "3" {
		t.Fatalf("a.txt after autosquash: %q", got)
	}
	var completed map[string]any
	for time.Now().Before(deadline) && completed == nil {
		for _, ev := range eventRecords(t, e.obsCLI("events", "--sandbox-id", id, "--name", "layerstack.autosquash.completed")) {
			completed = ev
		}
		time.Sleep(50 * time.Millisecond)
	}
	attrs, _ := completed["attrs"].(map[string]any)
	if attrs == nil || attrs["trigger_reason"] != "layer_committed" || num(t, attrs["before_layers"]) != 4 || num(t, attrs["after_layers"]) != 2 {
		t.Fatalf("completed event: %v", completed)
	}
	if n := len(eventRecords(t, e.obsCLI("events", "--sandbox-id", id, "--name", "layerstack.autosquash.triggered"))); n != 1 {
		t.Fatalf("%d triggered events", n)
	}
	e.stop()

	writeConfig(t, e, "runtime:\n  layerstack:\n    autosquash:\n      squash_at_n_layers: 2\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin("sandbox-supervisor"), "serve")
	cmd.Env = e.environ()
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "squash_at_n_layers") {
		t.Fatalf("squash_at_n_layers 2 accepted (err %v): %s", err, out)
	}
}
