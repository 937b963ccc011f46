package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// TestMCPOutputSchemas calls every tool that declares an outputSchema, on
// each overlay driver, and validates what it returned in structuredContent
// against that schema with a JSON Schema validator, as a client that checks
// outputSchema (the MCP TypeScript SDK) does. Error results are validated
// too: clients check structuredContent whenever it is present.
func TestMCPOutputSchemas(t *testing.T) {
	forDrivers(t, func(t *testing.T) {
		e := newEnv(t)
		e.start()
		root := e.project(map[string]string{"src/app.txt": "one\ntwo\nthree\n", "README": "hi\n"})
		c := e.mcpIn("", bin("sandbox-mcp"))
		c.initialize()
		schemas := map[string]*jsonschema.Schema{}
		for _, tl := range c.send("tools/list", nil, false)["result"].(map[string]any)["tools"].([]any) {
			m := tl.(map[string]any)
			name := m["name"].(string)
			out, ok := m["outputSchema"]
			if !ok {
				continue
			}
			raw, _ := json.Marshal(out)
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			comp := jsonschema.NewCompiler()
			if err := comp.AddResource("mem://"+name, doc); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			sch, err := comp.Compile("mem://" + name)
			if err != nil {
				t.Fatalf("%s: outputSchema does not compile: %v", name, err)
			}
			schemas[name] = sch
		}
		called := map[string]bool{}
		// call validates one result against its tool's outputSchema; the
		// validator wants the result as decoded by its own JSON reader
		// (json.Number), so it re-reads the structuredContent.
		call := func(tool string, args map[string]any, wantErr bool) map[string]any {
			t.Helper()
			isErr, sc := c.call(tool, args)
			if isErr != wantErr {
				t.Fatalf("%s %v: isError=%v %v", tool, args, isErr, sc)
			}
			raw, _ := json.Marshal(sc)
			if os.Getenv("ESBX_MCP_DUMP") != "" {
				t.Logf("%s → %s", tool, raw)
			}
			sch, ok := schemas[tool]
			if !ok {
				return sc
			}
			called[tool] = true
			inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			if err := sch.Validate(inst); err != nil {
				t.Errorf("%s: structuredContent does not match its outputSchema: %v\n%s", tool, err, raw)
			}
			return sc
		}

		args := map[string]any{"workspace_root": root}
		if d := driverOf(t); d != "" {
			args["overlay"] = d
		}
		sbx := call("create_sandbox", args, false)
		id := sbx["id"].(string)
		args["count"] = 2
		call("create_sandbox", args, false)
		call("list_sandboxes", map[string]any{}, false)
		call("inspect_sandbox", map[string]any{"sandbox_id": id}, false)
		call("inspect_sandbox", map[string]any{"sandbox_id": "sbx-missing"}, true)
		call("health", map[string]any{}, false)

		ws := call("create_workspace_session", map[string]any{"sandbox_id": id, "agent": "schema"}, false)
		wsID := ws["workspace_session_id"].(string)
		in := func(m map[string]any) map[string]any { m["sandbox_id"] = id; return m }
		call("list_workspace_sessions", in(map[string]any{}), false)
		call("file_write", in(map[string]any{"path": "src/new.txt", "content": "new\n", "workspace_session_id": wsID}), false)
		call("file_write", in(map[string]any{"path": "README", "content": "hello\n"}), false) // sessionless: publishes
		call("file_edit", in(map[string]any{"path": "src/app.txt", "workspace_session_id": wsID,
			"edits": []any{map[string]any{"old_string": "two", "new_string": "TWO"}}}), false)
		call("file_edit", in(map[string]any{"path": "README",
			"edits": []any{map[string]any{"old_string": "hello", "new_string": "HELLO"}}}), false)
		call("file_read", in(map[string]any{"path": "src/app.txt", "workspace_session_id": wsID}), false)
		call("file_read", in(map[string]any{"path": "src/app.txt", "limit": 1}), false)
		call("file_read", in(map[string]any{"path": "missing.txt"}), true)
		call("file_list", in(map[string]any{}), false)
		call("file_list", in(map[string]any{"path": "src", "workspace_session_id": wsID}), false)
		call("diff_workspace_session", in(map[string]any{"workspace_session_id": wsID}), false)
		call("diff_workspace_session", in(map[string]any{"workspace_session_id": wsID, "against": "head"}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": wsID, "dry_run": true}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": wsID}), false)
		call("file_blame", in(map[string]any{"path": "src/app.txt"}), false)
		call("file_blame", in(map[string]any{"path": "src/app.txt", "format": "agent-trace"}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": wsID}), true) // gone
		// A conflict: the dry run reports it, the publish is refused.
		conf := call("create_workspace_session", in(map[string]any{}), false)["workspace_session_id"]
		call("file_write", in(map[string]any{"path": "README", "content": "mine\n", "workspace_session_id": conf}), false)
		call("file_write", in(map[string]any{"path": "README", "content": "theirs\n"}), false)
		dry := call("publish_workspace_session", in(map[string]any{"workspace_session_id": conf, "dry_run": true, "default_strategy": "reject"}), false)
		if dry["would_commit"] != false {
			t.Errorf("conflicting dry run: %v", dry)
		}
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": conf, "default_strategy": "reject"}), true)
		// Live sessions (#19): the same conflict on a sync (dry run, refused,
		// then resolved), a fork, and a publish that keeps the session.
		call("sync_workspace_session", in(map[string]any{"workspace_session_id": conf, "dry_run": true, "default_strategy": "reject"}), false)
		call("sync_workspace_session", in(map[string]any{"workspace_session_id": conf, "default_strategy": "reject"}), true)
		call("sync_workspace_session", in(map[string]any{"workspace_session_id": conf,
			"resolutions": []any{map[string]any{"path": "README", "strategy": "ours"}}}), false)
		fork := call("fork_workspace_session", in(map[string]any{"workspace_session_id": conf, "agent": "forked"}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": fork["workspace_session_id"], "keep": true}), false)
		// Refused before the supervisor: the same envelope.
		call("file_read", in(map[string]any{"path": "README", "frobnicate": true}), true)
		// A session without changes publishes nothing.
		idle := call("create_workspace_session", in(map[string]any{"network_profile": "offline"}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": idle["workspace_session_id"], "dry_run": true}), false)
		call("publish_workspace_session", in(map[string]any{"workspace_session_id": idle["workspace_session_id"]}), false)
		call("list_workspace_sessions", in(map[string]any{}), false)

		var missed []string
		for name := range schemas {
			if !called[name] {
				missed = append(missed, name)
			}
		}
		sort.Strings(missed)
		if len(missed) > 0 {
			t.Errorf("tools with an outputSchema this test does not call: %s", strings.Join(missed, ", "))
		}
		if len(schemas) < 13 {
			t.Errorf("%d tools declare an outputSchema, want at least the 13 of issue 17", len(schemas))
		}
	})
}
