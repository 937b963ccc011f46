package mcpserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/clitest"
)

// TestToolSchemasEveryClientAccepts lists the tools of the default server
// (every set) and of one with a default sandbox, as a client would, and
// checks every input schema twice: it must compile as a JSON Schema (a real
// validator, draft 2020-12, the MCP default), and it must pass the strictest
// rules clients publish: a top-level object, no $ref (so no cycles), and
// items on every array at any depth. Every tool has a title and all four
// annotations, equal to what the catalog declares.
func TestToolSchemasEveryClientAccepts(t *testing.T) {
	sup := clitest.NewUnix(t, clitest.Echo)
	for _, opts := range []Options{{}, {SandboxID: "sbx-default"}} {
		s := startWith(t, "", catalog.Ops(), sup, opts)
		s.initialize("2025-06-18")
		list, _ := s.rpc("tools/list", map[string]any{})["result"].(map[string]any)
		tools, _ := list["tools"].([]any)
		if len(tools) != len(catalog.Ops()) {
			t.Fatalf("%d tools, want every operation (%d)", len(tools), len(catalog.Ops()))
		}
		for _, tl := range tools {
			tm := tl.(map[string]any)
			name := tm["name"].(string)
			op, _ := catalog.Lookup(name)
			raw, _ := json.Marshal(tm["inputSchema"])
			c := jsonschema.NewCompiler()
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := c.AddResource("mem://"+name+".json", doc); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if _, err := c.Compile("mem://" + name + ".json"); err != nil {
				t.Errorf("%s: schema does not compile: %v", name, err)
			}
			sch := tm["inputSchema"].(map[string]any)
			if sch["type"] != "object" {
				t.Errorf("%s: top-level type %v", name, sch["type"])
			}
			for _, p := range strictViolations(sch, "inputSchema") {
				t.Errorf("%s: %s", name, p)
			}
			checkOutputSchema(t, name, op, tm)
			if tm["title"] != op.DisplayTitle() {
				t.Errorf("%s: title %v", name, tm["title"])
			}
			ann, _ := tm["annotations"].(map[string]any)
			h := op.Hints()
			want := map[string]any{"title": op.DisplayTitle(), "readOnlyHint": h.ReadOnly, "destructiveHint": h.Destructive,
				"idempotentHint": h.Idempotent, "openWorldHint": h.OpenWorld}
			if fmt.Sprint(ann) != fmt.Sprint(want) {
				t.Errorf("%s: annotations %v, want %v", name, ann, want)
			}
			if op.Group == catalog.Runtime {
				req := fmt.Sprint(sch["required"])
				if has := strings.Contains(req, "sandbox_id"); has != (opts.SandboxID == "") {
					t.Errorf("%s with default sandbox %q: required %s", name, opts.SandboxID, req)
				}
			}
		}
		s.close()
	}
	// What the issue found: reads looked destructive, arrays had no items.
	for id, readOnly := range map[string]bool{"file_read": true, "list_sandboxes": true, "file_write": false} {
		op, _ := catalog.Lookup(id)
		if op.Hints().ReadOnly != readOnly {
			t.Errorf("%s: readOnly %v", id, op.Hints().ReadOnly)
		}
	}
}

// checkOutputSchema: a tool whose operation declares an exact result sends
// it as outputSchema, and that schema compiles, is a top-level object, has
// items on every array and no $ref; command-output tools, which return no
// structuredContent, send none.
func checkOutputSchema(t *testing.T, name string, op *catalog.Op, tm map[string]any) {
	t.Helper()
	out, has := tm["outputSchema"]
	if has != (op.Output != nil) {
		t.Errorf("%s: outputSchema sent %v, catalog declares one %v", name, has, op.Output != nil)
	}
	if isCommandOutput(op) && has {
		t.Errorf("%s: a command-output tool declares an outputSchema", name)
	}
	if !has {
		return
	}
	raw, _ := json.Marshal(out)
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("mem://"+name+".out.json", doc); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if _, err := c.Compile("mem://" + name + ".out.json"); err != nil {
		t.Errorf("%s: outputSchema does not compile: %v", name, err)
	}
	if sch, _ := out.(map[string]any); sch["type"] != "object" {
		t.Errorf("%s: outputSchema top-level type %v", name, sch["type"])
	}
	for _, p := range arrayOrRefViolations(out, "outputSchema") {
		t.Errorf("%s: %s", name, p)
	}
}

// arrayOrRefViolations is strictViolations without the object rules:
// output schemas allow additional properties on purpose.
func arrayOrRefViolations(v any, at string) []string {
	var out []string
	for _, p := range strictViolations(v, at) {
		if !strings.HasSuffix(p, ": object allows additional properties") && !strings.HasSuffix(p, ": object without properties") {
			out = append(out, p)
		}
	}
	return out
}

// strictViolations walks a schema the way strict clients do.
func strictViolations(v any, at string) []string {
	var out []string
	switch n := v.(type) {
	case map[string]any:
		if _, ok := n["$ref"]; ok {
			out = append(out, at+": $ref")
		}
		if n["type"] == "array" {
			if _, ok := n["items"]; !ok {
				out = append(out, at+": array schema missing items")
			}
		}
		if n["type"] == "object" {
			if _, ok := n["properties"].(map[string]any); !ok {
				out = append(out, at+": object without properties")
			}
			if n["additionalProperties"] != false {
				out = append(out, at+": object allows additional properties")
			}
		}
		for k, c := range n {
			out = append(out, strictViolations(c, at+"/"+k)...)
		}
	case []any:
		for i, c := range n {
			out = append(out, strictViolations(c, fmt.Sprintf("%s/%d", at, i))...)
		}
	}
	return out
}
