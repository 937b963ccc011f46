package catalog

// families lists every help heading in catalog order (§3), capability
// headings included. Families get operations as later work declares them.
var families = []Family{
	{Group: Management, Name: "management", Help: "Sandboxes: create, inspect, destroy, squash and export."},
	{Group: Runtime, Name: "command", Help: "Shell commands inside workspace sessions."},
	{Group: Runtime, Name: "file", Help: "File operations on the published head (sessionless) or inside a session."},
	{Group: Runtime, Name: "workspace_session", Help: "Private copy-on-write views and their publication."},
	{Group: Runtime, Name: "network", Help: "Port forwarding into sessions."},
	{Group: Runtime, Name: "supervisor_http", Capability: true, Help: "The optional loopback HTTP listener: UI, /api/rpc and /forward/… routes."},
	{Group: Runtime, Name: "network_isolation", Capability: true, Help: "shared sessions use the user's network; isolated ones see only their own loopback."},
	{Group: Runtime, Name: "reserved_paths", Capability: true, Help: "Path components starting with .wh. are reserved and refused at publish."},
	{Group: Runtime, Name: "shell_security", Capability: true, Help: "Every command runs with no_new_privs, a capability drop and a seccomp deny-list."},
	{Group: Observability, Name: "health", Help: "The supervisor's own health and host capabilities."},
	{Group: Observability, Name: "resource_isolation", Capability: true, Help: "Per-sandbox and per-session cgroups when the supervisor's cgroup is delegated."},
	{Group: Observability, Name: "resource_efficiency", Capability: true, Help: "Bounded disk-only stores; reads never write or sample."},
}

var sessionIDArg = Arg{Name: "workspace_session_id", Kind: String, ID: true,
	Help: "Work inside this workspace session; without it the operation is sessionless (reads see head, writes publish one layer)."}

var sandboxIDArg = Arg{Name: "sandbox_id", Kind: String, Required: true, ID: true, Help: "The sandbox."}

var ops = []Op{
	{
		ID: "create_sandbox", Group: Management, Family: "management", Scope: ScopeSystem,
		Summary: "Create sandboxes from a workspace directory.",
		Help: "Snapshots the workspace directory into the base layer B000001-base of a new LayerStack. " +
			"The host directory is read once and never written (except by export_changes).",
		Result: "one sandbox record when count is 1, else {\"sandboxes\":[record,…]} in creation order",
		Args: []Arg{
			{Name: "image", Kind: String, Default: "host", Help: "Root filesystem of the sessions: host (read-only host system directories)."},
			{Name: "workspace_root", Kind: Path, Required: true, Flag: "workspace-bind-root", FlagAliases: []string{"workspace-root"},
				Help: "Absolute existing directory to snapshot (not /, not inside or containing the supervisor's directories)."},
			{Name: "count", Kind: Integer, Default: uint64(1), Min: u64(1), DefaultDoc: "1",
				Help: "How many sandboxes to create from the same snapshot (≤ manager.max_create_count, 16)."},
			{Name: "overlay", Kind: String, Enum: []string{"auto", "kernel", "fuse"}, DefaultDoc: `sandbox.default_overlay ("auto")`,
				Help: "Overlay driver of the sandbox's sessions."},
			{Name: "name", Kind: String, MaxLen: 128, NoControl: true, Help: "Free-text label; not unique."},
		},
	},
	{
		ID: "list_workspace_directories", Group: Management, Family: "management", Scope: ScopeSystem,
		Summary: "List directories for picking a workspace root.",
		Help:    "Without path: the picker roots (manager.workspace_roots, else $HOME). With path: its immediate subdirectories, symlinks not followed.",
		Result:  `{"path","parent","truncated","directories":[{"name","path"}]}`,
		Args: []Arg{
			{Name: "path", Kind: Path, Help: "Absolute existing directory."},
		},
	},
	{
		ID: "destroy_sandbox", Group: Management, Family: "management", Scope: ScopeSystem,
		Summary: "Destroy a sandbox and everything it owns on disk.",
		Help:    "Nothing is published; the host workspace is untouched.",
		Result:  `the removed record with state "stopped" and live_workspace_sessions []`,
		Args:    []Arg{sandboxIDArg},
	},
	{
		ID: "list_sandboxes", Group: Management, Family: "management", Scope: ScopeSystem,
		Summary: "List every sandbox.",
		Result:  `{"sandboxes":[record,…]} sorted by id (creation time)`,
	},
	{
		ID: "inspect_sandbox", Group: Management, Family: "management", Scope: ScopeSystem,
		Summary: "Show one sandbox record.",
		Result:  "the sandbox record",
		Args:    []Arg{sandboxIDArg},
	},
	{
		ID: "file_read", Group: Runtime, Family: "file", Scope: ScopeSandbox,
		Summary: "Read a window of lines of a UTF-8 file.",
		Help:    "CRLF and CR become LF, a BOM is dropped; lines [offset, offset+limit) joined with \\n.",
		Result:  "{path, content, start_line, num_lines, total_lines, bytes_read, total_bytes, next_offset|null, truncated}",
		Args: []Arg{
			{Name: "path", Kind: Path, Required: true, Help: "Workspace-relative path or /workspace/…"},
			{Name: "offset", Kind: Integer, Default: uint64(1), Help: "1-based first line; 0 means 1."},
			{Name: "limit", Kind: Integer, Default: uint64(2000), Min: u64(1), Max: u64(2000), Help: "Number of lines."},
			sessionIDArg,
		},
	},
	{
		ID: "file_write", Group: Runtime, Family: "file", Scope: ScopeSandbox,
		Summary: "Create or replace a file.",
		Help:    "Missing parents are created (0755); new files get 0644, existing files keep their mode.",
		Result:  `{"type":"create"|"update", path, bytes_written} (+ revision, layer_id when sessionless)`,
		Args: []Arg{
			{Name: "path", Kind: Path, Required: true, Help: "Workspace-relative path or /workspace/…"},
			{Name: "content", Kind: String, Required: true, Help: "The new content."},
			sessionIDArg,
		},
	},
	{
		ID: "file_edit", Group: Runtime, Family: "file", Scope: ScopeSandbox,
		Summary: "Apply exact string replacements to a file.",
		Help: "Edits apply in order on LF-normalized text; the file's line ending, BOM and mode are kept. " +
			"Each edit is {old_string, new_string, replace_all?}.",
		Result: `{"type":"edit", path, edits_applied, replacements, bytes_written} (+ revision, layer_id when sessionless)`,
		Args: []Arg{
			{Name: "path", Kind: Path, Required: true, Help: "Workspace-relative path or /workspace/…"},
			{Name: "edits", Kind: JSONArray, Required: true, MaxItems: 1000, AcceptJSONString: true,
				Help: "1..1000 objects {old_string, new_string, replace_all?}."},
			sessionIDArg,
		},
	},
	{
		ID: "file_list", Group: Runtime, Family: "file", Scope: ScopeSandbox,
		Summary: "List one directory level.",
		Help:    "Sorted by name bytes; kind is file, directory, symlink or other.",
		Result:  "{path, entries:[{name, kind, size}], truncated}",
		Args: []Arg{
			{Name: "path", Kind: Path, DefaultDoc: "workspace root", Help: "Directory; omitted, ., / and /workspace mean the root."},
			sessionIDArg,
			{Name: "limit", Kind: Integer, Default: uint64(2000), Min: u64(1), Max: u64(2000), ClampMax: true, Help: "Maximum entries."},
		},
	},
	{
		ID: "health", Group: Observability, Family: "health", Scope: ScopeSystem,
		Summary: "The supervisor's health and the host capabilities it probed at start.",
		Result:  "{status, version, uptime_s, uid, kernel, overlay_drivers, fuse, user_namespaces, cgroup, docker, store, counts, event_store}",
	},
}

// Ops returns every operation in catalog order.
func Ops() []Op { return ops }

// Families returns every help heading in catalog order.
func Families() []Family { return families }

// Lookup returns the operation with the given ID.
func Lookup(id string) (*Op, bool) {
	for i := range ops {
		if ops[i].ID == id {
			return &ops[i], true
		}
	}
	return nil, false
}

// GroupOps returns the operations of one group in catalog order.
func GroupOps(g Group) []Op {
	var out []Op
	for _, op := range ops {
		if op.Group == g {
			out = append(out, op)
		}
	}
	return out
}
