package catalog

import "sort"

// Output schemas: the exact JSON Schema of what a success returns, for the
// operations whose results are small and stable. Op.Result stays the prose
// for help and docs; Op.Output feeds MCP's outputSchema, which makes
// clients validate every structuredContent against it. So a schema only
// requires what the supervisor always sends, and every object allows
// additional properties: a field added later must not break a client.

// object is a JSON Schema object with these properties, of which required
// are always present; more properties are allowed.
func object(props map[string]any, required ...string) map[string]any {
	if required == nil {
		required = []string{}
	}
	return map[string]any{"type": "object", "properties": props, "required": required, "additionalProperties": true}
}

// all is object with every property required.
func all(props map[string]any) map[string]any {
	req := make([]string, 0, len(props))
	for k := range props {
		req = append(req, k)
	}
	sort.Strings(req)
	return object(props, req...)
}

func typed(t string) map[string]any       { return map[string]any{"type": t} }
func orNull(t string) map[string]any      { return map[string]any{"type": []any{t, "null"}} }
func arrayOf(items any) map[string]any    { return map[string]any{"type": "array", "items": items} }
func oneOfStr(v ...string) map[string]any { return map[string]any{"type": "string", "enum": v} }
func anyOf(s ...any) map[string]any       { return map[string]any{"type": "object", "anyOf": s} }

// The leaf schemas are functions, not shared maps: every schema owns its
// maps, so nothing a caller does to one reaches another.
func str() map[string]any             { return typed("string") }
func integer() map[string]any         { return map[string]any{"type": "integer", "minimum": 0} }
func number() map[string]any          { return typed("number") }
func boolean() map[string]any         { return typed("boolean") }
func anyObj() map[string]any          { return object(map[string]any{}) }
func drivers() map[string]any         { return oneOfStr("kernel", "fuse") }
func networkProfiles() map[string]any { return oneOfStr("shared", "isolated", "offline") }

// revisionOut is a published revision {layer_count, manifest_version, root_hash}.
func revisionOut() map[string]any {
	return all(map[string]any{"layer_count": integer(), "manifest_version": integer(), "root_hash": str()})
}

// sandboxRecordOut is the sandbox record of contract §4.1.
func sandboxRecordOut() map[string]any {
	return object(map[string]any{
		"id":                      str(),
		"name":                    orNull("string"),
		"workspace_root":          str(),
		"image":                   str(),
		"rootfs":                  str(),
		"overlay_driver":          drivers(),
		"state":                   oneOfStr("creating", "ready", "stopping", "stopped", "failed"),
		"activity_revision":       integer(),
		"created_at":              str(),
		"layer_count":             integer(),
		"live_workspace_sessions": arrayOf(str()),
		"shared_base":             all(map[string]any{"source": str(), "target": str(), "root_hash": str(), "readonly": boolean()}),
		"resource_profile": all(map[string]any{"name": str(), "nano_cpus": orNull("integer"), "memory_high_bytes": orNull("integer"),
			"memory_max_bytes": orNull("integer"), "pids_max": orNull("integer"), "enforced": boolean()}),
		"recovery_artifacts": arrayOf(object(map[string]any{"workspace_session_id": str(), "created_at": str(), "reason": str(), "bytes": integer()})),
		"error":              str(),
	}, "id", "name", "workspace_root", "image", "rootfs", "overlay_driver", "state", "activity_revision", "created_at",
		"layer_count", "live_workspace_sessions", "shared_base", "resource_profile", "recovery_artifacts")
}

func sandboxesOut() map[string]any {
	return object(map[string]any{"sandboxes": arrayOf(sandboxRecordOut())}, "sandboxes")
}

// sessionOut is what create_workspace_session returns; list_workspace_sessions
// adds the live fields.
func sessionOut(extra map[string]any, extraRequired ...string) map[string]any {
	props := map[string]any{
		"workspace_session_id": str(),
		"network_profile":      networkProfiles(),
		"finalize_policy":      str(),
		"agent":                orNull("string"),
		"created_at":           str(),
		"base_revision":        revisionOut(),
		"overlay_driver":       drivers(),
	}
	for k, v := range extra {
		props[k] = v
	}
	return object(props, append([]string{"workspace_session_id", "network_profile", "finalize_policy", "agent",
		"created_at", "base_revision", "overlay_driver"}, extraRequired...)...)
}

func sessionsOut() map[string]any {
	live := map[string]any{"state": str(), "active_command_session_ids": arrayOf(str()), "upper_bytes": orNull("integer"),
		"holder_pid": orNull("integer"), "forwards": arrayOf(anyObj())}
	return object(map[string]any{"workspace_sessions": arrayOf(sessionOut(live, "state", "active_command_session_ids"))}, "workspace_sessions")
}

// writeOut is a file_write or file_edit result; revision and layer_id come
// with sessionless writes, which publish.
func writeOut(types map[string]any, props map[string]any, required ...string) map[string]any {
	props["type"] = types
	props["path"] = str()
	props["bytes_written"] = integer()
	props["revision"] = revisionOut()
	props["layer_id"] = str()
	return object(props, append([]string{"type", "path", "bytes_written"}, required...)...)
}

func fileWriteOut() map[string]any {
	return writeOut(oneOfStr("create", "update"), map[string]any{})
}

func fileEditOut() map[string]any {
	return writeOut(oneOfStr("edit"), map[string]any{"edits_applied": integer(), "replacements": integer()}, "edits_applied", "replacements")
}

func healthOut() map[string]any {
	return object(map[string]any{
		"status":          str(),
		"version":         str(),
		"uptime_s":        number(),
		"uid":             integer(),
		"kernel":          str(),
		"overlay_drivers": anyObj(),
		"fuse":            anyObj(),
		"user_namespaces": anyObj(),
		"cgroup":          anyObj(),
		"docker":          anyObj(),
		"network":         anyObj(),
		"store":           anyObj(),
		"counts":          all(map[string]any{"running_commands": integer(), "sandboxes": integer(), "workspace_sessions": integer()}),
		"event_store":     anyObj(),
	}, "status", "version", "uptime_s", "uid", "kernel", "overlay_drivers", "fuse", "user_namespaces", "cgroup",
		"docker", "store", "counts", "event_store")
}

func fileReadOut() map[string]any {
	return all(map[string]any{"path": str(), "content": str(), "start_line": integer(), "num_lines": integer(), "total_lines": integer(),
		"bytes_read": integer(), "total_bytes": integer(), "next_offset": orNull("integer"), "truncated": boolean()})
}

func fileListOut() map[string]any {
	return all(map[string]any{
		"path":      str(),
		"entries":   arrayOf(all(map[string]any{"name": str(), "kind": oneOfStr("file", "directory", "symlink", "other"), "size": orNull("integer")})),
		"truncated": boolean(),
	})
}

func diffOut() map[string]any {
	file := object(map[string]any{
		"path": str(), "status": str(), "kind": str(), "route": str(), "binary": boolean(),
		"mode":           object(map[string]any{"old": orNull("string"), "new": orNull("string")}),
		"diff":           orNull("string"),
		"diff_truncated": boolean(),
	}, "path", "status", "kind", "route", "binary", "diff_truncated")
	return all(map[string]any{
		"workspace_session_id": str(),
		"against":              oneOfStr("base", "head"),
		"base_revision":        revisionOut(),
		"head_revision":        revisionOut(),
		"files":                arrayOf(file),
		"head_changed_paths":   arrayOf(str()),
		"truncated":            boolean(),
	})
}

func publishOut() map[string]any {
	counts := map[string]any{"type": "object", "additionalProperties": integer(), "properties": map[string]any{}}
	publish := object(map[string]any{
		"no_op":           boolean(),
		"revision":        revisionOut(),
		"route_summary":   counts,
		"outcome_summary": counts,
		"summary": object(map[string]any{"result": str(), "changed_paths": integer(), "published_paths": integer(),
			"merged_paths": integer(), "kept_head_paths": integer(), "conflict_paths": integer()}, "result"),
		"layer_id":       orNull("string"),
		"resolved_paths": arrayOf(anyObj()),
	}, "no_op", "revision", "route_summary", "outcome_summary", "summary")
	return object(map[string]any{
		"workspace_session_id":       str(),
		"dry_run":                    boolean(),
		"destroyed":                  boolean(),
		"kept":                       boolean(),
		"base_revision":              revisionOut(),
		"publish":                    publish,
		"would_commit":               boolean(),
		"plan":                       anyObj(),
		"evicted_upperdir_bytes":     integer(),
		"active_command_session_ids": arrayOf(str()),
	}, "workspace_session_id", "dry_run", "destroyed", "publish")
}

// syncOut is sync_workspace_session's result: the publish counts of the
// session's changes against the head it synced onto, and the base move.
func syncOut() map[string]any {
	counts := map[string]any{"type": "object", "additionalProperties": integer(), "properties": map[string]any{}}
	sync := object(map[string]any{
		"no_op":                  boolean(),
		"result":                 str(),
		"base_revision":          revisionOut(),
		"previous_base_revision": revisionOut(),
		"changed_paths":          integer(),
		"merged_paths":           integer(),
		"kept_head_paths":        integer(),
		"conflict_paths":         integer(),
		"route_summary":          counts,
		"outcome_summary":        counts,
		"resolved_paths":         arrayOf(anyObj()),
	}, "no_op", "result", "base_revision", "previous_base_revision", "changed_paths", "merged_paths", "kept_head_paths", "conflict_paths")
	return object(map[string]any{
		"workspace_session_id":       str(),
		"dry_run":                    boolean(),
		"sync":                       sync,
		"would_commit":               boolean(),
		"plan":                       anyObj(),
		"active_command_session_ids": arrayOf(str()),
	}, "workspace_session_id", "dry_run", "sync")
}

// blameOut is either format: ranges (the default) or an Agent Trace record.
func blameOut() map[string]any {
	ranges := all(map[string]any{
		"path":                 str(),
		"view":                 str(),
		"workspace_session_id": orNull("string"),
		"revision":             revisionOut(),
		"line_count":           integer(),
		"ranges":               arrayOf(object(map[string]any{"start_line": integer(), "line_count": integer(), "owner": str()}, "start_line", "line_count", "owner")),
	})
	trace := object(map[string]any{
		"version": str(), "id": str(), "timestamp": str(),
		"files":    arrayOf(object(map[string]any{"path": str(), "conversations": arrayOf(anyObj())}, "path", "conversations")),
		"tool":     anyObj(),
		"metadata": anyObj(),
	}, "version", "id", "timestamp", "files")
	return anyOf(ranges, trace)
}
