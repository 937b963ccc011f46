package catalog

// families lists every help heading in catalog order (§3), capability
// headings included. Families get operations as later work declares them.
var families = []Family{
	{Group: Management, Name: "management", Help: "Sandboxes: create, inspect, destroy, squash and export."},
	{Group: Runtime, Name: "command", Help: "Shell commands inside workspace sessions."},
	{Group: Runtime, Name: "file", Help: "Files inside the sandbox's workspace (/workspace in its sessions), never on the host: the published state (sessionless) or a session's private view. Symlinks are never followed: a path with a symlink as any component but the last is refused by every file operation, with or without a session, with invalid_request `path \"P\": component \"C\" is a symlink` (details.path, details.component); a symlink as the last component is reported as its kind (not a regular file / not a directory (Symlink))."},
	{Group: Runtime, Name: "workspace_session", Help: "Private copy-on-write views and their publication."},
	{Group: Runtime, Name: "network", Help: "Port forwarding into sessions."},
	{Group: Runtime, Name: "supervisor_http", Capability: true, Help: "The optional loopback HTTP listener: /health, /api/rpc, the /api/events stream, the /forward/… preview routes and the browser console (fleet, session, review & publish, observability) at /."},
	{Group: Runtime, Name: "network_isolation", Capability: true, Help: "shared sessions use the user's network; isolated ones get their own network with outbound access through pasta or slirp4netns and no host loopback; offline ones see only their own loopback."},
	{Group: Runtime, Name: "reserved_paths", Capability: true, Help: "Path components starting with .wh. are reserved and refused at publish."},
	{Group: Runtime, Name: "shell_security", Capability: true, Help: "Every command runs with no_new_privs, a capability drop and a seccomp deny-list."},
	{Group: Observability, Name: "snapshot", Help: "A point-in-time view of sandboxes and sessions."},
	{Group: Observability, Name: "trace", Help: "Span trees of requests."},
	{Group: Observability, Name: "events", Help: "The bounded event log."},
	{Group: Observability, Name: "resources", Help: "Sampled CPU, memory, I/O and pids per sandbox and session."},
	{Group: Observability, Name: "daemon", Help: "The supervisor process itself."},
	{Group: Observability, Name: "topology", Help: "Processes per session."},
	{Group: Observability, Name: "cgroup", Help: "Resource samples of a sandbox or one session, with its processes."},
	{Group: Observability, Name: "layerstack", Help: "Layers, sizes and leases."},
	{Group: Observability, Name: "health", Help: "The supervisor's own health and host capabilities."},
	{Group: Observability, Name: "file_activity", Help: "What changed inside workspace sessions, by which command."},
	{Group: Observability, Name: "resource_isolation", Capability: true, Help: "Per-sandbox and per-session cgroups when the supervisor's cgroup is delegated."},
	{Group: Observability, Name: "resource_efficiency", Capability: true, Help: "Bounded disk-only stores; reads never write or sample."},
}

var sessionIDArg = Arg{Name: "workspace_session_id", Kind: String, ID: true,
	Help: "Work inside this workspace session (its private view); without it the operation is sessionless: reads see the published state and writes publish one new layer immediately."}

// maxOutputArg bounds the output text a command-output result returns; the
// clients apply it (sandbox-mcp defaults it), the supervisor never sees it.
var maxOutputArg = Arg{Name: "max_output_tokens", Kind: Integer, ClientSide: true, DefaultDoc: "unbounded (sandbox-mcp: --max-output-tokens, 10000)",
	Help: "Bound the returned output to about this many tokens (4 characters each): its head and tail are kept around a marker " +
		"that names the reads returning what was left out (read_command_lines start_offset and limit; a row shown only in part " +
		"comes back whole with max_output_tokens 0) and says when earlier rows fell out of the transcript window. " +
		"0 means unbounded. The transcript keeps every byte."}

// resolutionsArg is shared by the operations that resolve a session's
// changes against the published state.
var resolutionsArg = Arg{Name: "resolutions", Kind: JSONArray, Default: []any{}, DefaultDoc: "[]", MaxItems: 10000, AcceptJSONString: true,
	Items: &Items{Fields: []Field{
		{Name: "path", Kind: Path, Required: true, Help: "A path the session changed (workspace-relative)."},
		{Name: "strategy", Kind: String, Required: true, Enum: []string{"merge", "ours", "theirs", "reject"},
			Help: "merge: 3-way line merge; ours: the session's version; theirs: the published version; reject: fail on any change."},
	}},
	Help: "Per-path strategies for paths the session changed, overriding default_strategy."}

var yieldArg = Arg{Name: "yield_time_ms", Kind: Integer, Default: uint64(1000), Max: u64(300000), ClampMax: true,
	Help: "Wait this long for the command to finish before returning its output so far (clamped to runtime.command.max_yield_ms)."}

var graceArg = Arg{Name: "grace_s", Kind: Float, Default: 0.25, FMin: f64(0), FMax: f64(60),
	DefaultDoc: "runtime.workspace.exit_grace_s (0.25)", Help: "Seconds between SIGTERM and SIGKILL of the holder."}

// MaxEventsLastN bounds events' last_n: more than any event store holds
// (16 MiB at most, ~100 bytes a record), so it never hides an event; the
// response itself stays within §10.1's caps by paging.
const MaxEventsLastN = 1000000

var obsSandboxArg = Arg{Name: "sandbox_id", Kind: String, ID: true, Help: "Only this sandbox (the request becomes sandbox-scoped)."}

var windowArg = Arg{Name: "window_ms", Kind: Integer, Default: uint64(60000), Min: u64(1),
	Help: "Samples of the last window_ms milliseconds (≤ observability.views.resource_window_ms, 600000)."}

var obsSandboxRequired = Arg{Name: "sandbox_id", Kind: String, Required: true, ID: true, Help: "The sandbox."}

var sandboxIDArg = Arg{Name: "sandbox_id", Kind: String, Required: true, ID: true, Help: "The sandbox."}

var ops = []Op{
	{
		ID: "create_sandbox", Group: Management, Family: "management", Scope: ScopeSystem, Streams: true, Span: "sandbox.create",
		Title: "Create sandbox", Effect: Additive, OpenWorld: true,
		Summary: "Create sandboxes from a workspace directory.",
		Help: "Snapshots the workspace directory into the base layer B000001-base of a new LayerStack. " +
			"The host directory is read once and never written (except by export_changes).",
		Result: "one sandbox record when count is 1, else {\"sandboxes\":[record,…]} in creation order",
		Output: sandboxCreateOut,
		Args: []Arg{
			{Name: "image", Kind: String, Default: "host", NonEmpty: true,
				Help: "Root filesystem of the sessions: host (read-only host system directories); a Docker image reference or sha256:<64 hex> image ID " +
					"on the local Docker Engine (pulled when absent and images.pull is missing); docker-archive:/abs/path.tar or oci-archive:/abs/path.tar."},
			{Name: "workspace_root", Kind: Path, Required: true, Flag: "workspace-bind-root", FlagAliases: []string{"workspace-root"},
				Help: "Absolute existing directory to snapshot (not /, not inside or containing the supervisor's directories)."},
			{Name: "count", Kind: Integer, Default: uint64(1), Min: u64(1), DefaultDoc: "1",
				Help: "How many sandboxes to create from the same snapshot (≤ manager.max_create_count, 16)."},
			{Name: "overlay", Kind: String, Enum: []string{"auto", "kernel", "fuse"}, DefaultDoc: `sandbox.default_overlay ("auto")`,
				Help: "Overlay driver of the sandbox's sessions."},
			{Name: "name", Kind: String, MaxLen: 128, NoControl: true, Help: "Free-text label; not unique."},
			{Name: "git_ref", Kind: String, MaxLen: 256, NonEmpty: true, NoControl: true, DefaultDoc: "the working tree",
				Help: "Snapshot this commit (branch, tag or hash) of the workspace's git repository instead of its working tree."},
		},
	},
	{
		ID: "list_docker_images", Group: Management, Family: "management", Scope: ScopeSystem,
		Title: "List Docker images", Effect: ReadOnly,
		Summary: "List the images of the local Docker Engine.",
		Help:    "Every local repo tag and, for untagged images, the sha256 image ID, sorted. Never fails because Docker is absent: docker is then \"unavailable\" with the reason.",
		Result:  `{"docker":"available","images":[…]} or {"images":[],"docker":"unavailable","error":"<reason>"}`,
	},
	{
		ID: "list_workspace_directories", Group: Management, Family: "management", Scope: ScopeSystem, Cancellable: true,
		Title: "List workspace directories", Effect: ReadOnly,
		Summary: "List directories for picking a workspace root.",
		Help:    "Without path: the picker roots (manager.workspace_roots, else $HOME). With path: its immediate subdirectories, symlinks not followed.",
		Result:  `{"path","parent","truncated","directories":[{"name","path"}]}`,
		Args: []Arg{
			{Name: "path", Kind: Path, Help: "Absolute existing directory."},
		},
	},
	{
		ID: "destroy_sandbox", Group: Management, Family: "management", Scope: ScopeSystem, Streams: true, Span: "sandbox.destroy",
		Title: "Destroy sandbox", Effect: Destructive, Idempotent: true,
		Summary: "Destroy a sandbox and everything it owns on disk.",
		Help:    "Nothing is published; the host workspace is untouched.",
		Result:  `the removed record with state "stopped" and live_workspace_sessions []`,
		Args:    []Arg{sandboxIDArg},
	},
	{
		ID: "list_sandboxes", Group: Management, Family: "management", Scope: ScopeSystem,
		Title: "List sandboxes", Effect: ReadOnly,
		Summary: "List every sandbox.",
		Result:  `{"sandboxes":[record,…]} sorted by id (creation time)`,
		Output:  sandboxesOut,
	},
	{
		ID: "inspect_sandbox", Group: Management, Family: "management", Scope: ScopeSystem,
		Title: "Inspect sandbox", Effect: ReadOnly,
		Summary: "Show one sandbox record.",
		Result:  "the sandbox record",
		Output:  sandboxRecordOut,
		Args:    []Arg{sandboxIDArg},
	},
	{
		ID: "squash_layerstacks", Group: Management, Family: "management", Scope: ScopeSystem, Streams: true, Span: "layerstack.squash",
		Title: "Squash layer stack", Effect: Additive, Idempotent: true,
		Summary: "Fold runs of published layers into squashed layers.",
		Help: "Every run of two or more layers above the base that no live session's newest layer splits becomes one S layer; " +
			"the merged view is unchanged. Then the remount sweep (amendment A4) moves every live session whose layers were squashed onto the squashed layers " +
			"without stopping its work (disposition remounted; runtime.layerstack.remount_sweep_width at a time), and the replaced layers are deleted before the result returns. " +
			"A kernel-driver session with a process whose cwd, root, open file or mapping is inside /workspace stays on its layers " +
			"(leased, reason pinned:cwd_pinned_workspace, pinned:fd_pinned_workspace or pinned:mapped_file_pinned_workspace, class_detail naming the commands); " +
			"those layers are reclaimed when it ends. Other leased reasons: quiesce_failed:freeze_timeout, unsupported:<driver>_lower_swap. " +
			"A session the move leaves in an unknown state is faulty and destroyed.",
		Result: "{manifest_version, squashed_blocks[{squashed_layer_id, replaced_layer_ids, replaced_layers, blocked_reasons?}], " +
			"swept_sessions[{session_id, disposition: session_gone|identity|remounted|leased|faulty, reason?, class_detail?}], faulty_sessions?[{session_id, class_detail, lease_errors}]}",
		Args: []Arg{sandboxIDArg},
	},
	{
		ID: "export_changes", Group: Management, Family: "management", Scope: ScopeSystem, Streams: true, Span: "layerstack.export", Cancellable: true,
		Title: "Export changes to the host", Effect: Destructive, Idempotent: true, OpenWorld: true,
		Summary: "Export the sandbox's published changes to a host directory, an archive or git commits.",
		Help: "Folds every non-base layer of head (newest wins, whiteouts and opaque cuts applied) and writes it to dest. " +
			"Paths the sandbox did not change are never touched. " +
			"What it can reach: dir, tar and tar-zst write only below the sandbox's own workspace root or a directory the user listed in " +
			"manager.export.allowed_roots (empty by default), never through a symlink and never into a .git directory; " +
			"existing directories keep their mode. A git directory's private and protected files (config, hooks/, info/, index, logs…) " +
			"are never written, deleted or archived, even from older layers; kept_out names them. Format git writes one commit per published layer to branch " +
			"(parented on the workspace's recorded HEAD, plus one commit for a dirty snapshot), with Agent Trace notes under " +
			"refs/notes/agent-trace; it never touches the working tree, the index or the checked-out branch.",
		Result: "{manifest_version, format, layers_exported[], files_written, directories_written, symlinks_written, …, kept_out[]?, kept_out_count?}; " +
			"git: {manifest_version, format, branch, git_dir, previous_tip, tip, commits:[{commit, layer_id, author, note}], layers_exported[]}",
		Args: []Arg{
			sandboxIDArg,
			{Name: "dest", Kind: Path, DefaultDoc: "required for dir, tar and tar-zst",
				Help: "Absolute destination: a directory (dir) or an archive file (tar, tar-zst), below the sandbox's workspace root or a directory of manager.export.allowed_roots."},
			{Name: "format", Kind: String, Default: "dir", Enum: []string{"dir", "tar", "tar-zst", "git"}, Help: "Output format."},
			{Name: "branch", Kind: String, MaxLen: 255, NonEmpty: true, NoControl: true, DefaultDoc: "required for git",
				Help: "git: the branch to create or fast-forward (refs/heads/<branch>); never the checked-out branch."},
			{Name: "git_dir", Kind: Path, DefaultDoc: "the workspace's repository",
				Help: "git: a repository (work tree or .git directory) to write to: the workspace's own, or one below the workspace root or a directory of manager.export.allowed_roots."},
			{Name: "since", Kind: String, ID: true, DefaultDoc: "the branch tip's Layer trailer, else the base",
				Help: "git: export only the layers newer than this layer of head."},
			{Name: "force", Kind: Boolean, Default: false, Help: "git: move the branch even when its tip is not an ancestor of the new commits."},
		},
	},
	{
		ID: "exec_command", Group: Runtime, Family: "command", Scope: ScopeSandbox, Span: "command.exec",
		Title: "Run command in sandbox", Effect: Destructive, OpenWorld: true,
		Summary: "Run a shell command inside the sandbox (not on the host).",
		Help: "Runs /bin/bash --noprofile --norc -c COMMAND in a PTY with cwd /workspace, inside the sandbox's namespaces over a copy-on-write view of the workspace. " +
			"Without workspace_session_id a new implicit session is created; it publishes its changes and destroys itself when its last command ends. " +
			"While status is \"running\", poll with write_command_stdin and stdin \"\" (it waits up to yield_time_ms and returns the new output), " +
			"or read rows by offset with read_command_lines.",
		Result: "command output {status, exit_code, wall_time_seconds, command_total_time_seconds, start_offset, end_offset, total_lines, " +
			"original_token_count, output, command_session_id, workspace_session_id, transcript_lost?, transcript_error?, …}; " +
			"transcript_lost: the transcript could not be stored (e.g. a full disk): output holds what was kept in memory, transcript_error says why",
		Args: []Arg{
			{Name: "cmd", Kind: String, Required: true, NonEmpty: true, Positional: "COMMAND", Help: "The shell command."},
			{Name: "workspace_session_id", Kind: String, ID: true, DefaultDoc: "a new implicit session", Help: "An active session of this sandbox."},
			{Name: "timeout_ms", Kind: Integer, Min: u64(1), DefaultDoc: "none", Help: "Kill the command after this long (status timed_out, exit code 124)."},
			yieldArg,
			maxOutputArg,
		},
	},
	{
		ID: "write_command_stdin", Group: Runtime, Family: "command", Scope: ScopeSandbox,
		Title: "Write to command / poll", Effect: Destructive,
		Summary: "Write to a running command's terminal, or poll it with empty stdin.",
		Help: "stdin \"\" writes nothing: it waits up to yield_time_ms and returns the output since the previous call (how to poll a running command). " +
			"\\u0003 anywhere cancels the command (SIGINT, then SIGKILL; status cancelled, exit code 130); \\u0004 is end-of-file for a canonical-mode reader.",
		Result: "command output",
		Args: []Arg{
			{Name: "command_session_id", Kind: String, Required: true, ID: true, Help: "The command."},
			{Name: "stdin", Kind: String, Required: true, Positional: "TEXT", Help: "Text written to the PTY as UTF-8 (≤ runtime.command.max_stdin_bytes, 1 MiB); \"\" to poll."},
			yieldArg,
			maxOutputArg,
		},
	},
	{
		ID: "read_command_lines", Group: Runtime, Family: "command", Scope: ScopeSandbox,
		Title: "Read command output", Effect: ReadOnly,
		Summary: "Read a command's output rows by offset.",
		Help:    "Random access; does not move the yield cursor.",
		Result:  "command output for the requested rows",
		Args: []Arg{
			{Name: "command_session_id", Kind: String, Required: true, ID: true, Help: "The command."},
			{Name: "start_offset", Kind: Integer, Default: uint64(0), Help: "First row (0-based)."},
			{Name: "limit", Kind: Integer, Default: uint64(200), Min: u64(1), Max: u64(1000), ClampMin: true, ClampMax: true, Help: "Rows to return."},
			maxOutputArg,
		},
	},
	{
		ID: "list_commands", Group: Runtime, Family: "command", Scope: ScopeSandbox,
		Title: "List commands", Effect: ReadOnly,
		Summary: "List running and retained commands, newest first.",
		Result:  `{"commands":[{command_session_id, cmd, status, exit_code, started_at, ended_at, workspace_session_id, interrupted}],"truncated"}`,
		Args: []Arg{
			{Name: "workspace_session_id", Kind: String, ID: true, Help: "Only this session's commands (it may no longer exist)."},
			{Name: "status", Kind: String, Enum: []string{"running", "ok", "error", "timed_out", "cancelled"}, Help: "Only commands in this status."},
			{Name: "limit", Kind: Integer, Default: uint64(100), Min: u64(1), Max: u64(1000), Help: "Maximum commands."},
		},
	},
	{
		ID: "file_read", Group: Runtime, Family: "file", Scope: ScopeSandbox, Cancellable: true,
		Title: "Read file in sandbox", Effect: ReadOnly,
		Summary: "Read a window of lines of a UTF-8 file inside the sandbox (not on the host).",
		Help: "Without workspace_session_id: the sandbox's published state; with it: that session's private view. " +
			"CRLF and CR become LF, a BOM is dropped; lines [offset, offset+limit) joined with \\n.",
		Result: "{path, content, start_line, num_lines, total_lines, bytes_read, total_bytes, next_offset|null, truncated}",
		Output: fileReadOut,
		Args: []Arg{
			{Name: "path", Kind: Path, Required: true, Help: "Workspace-relative path or /workspace/…"},
			{Name: "offset", Kind: Integer, Default: uint64(1), Help: "1-based first line; 0 means 1."},
			{Name: "limit", Kind: Integer, Default: uint64(2000), Min: u64(1), Max: u64(2000), Help: "Number of lines."},
			sessionIDArg,
		},
	},
	{
		ID: "file_write", Group: Runtime, Family: "file", Scope: ScopeSandbox,
		Title: "Write file in sandbox", Effect: Destructive, Idempotent: true,
		Summary: "Create or replace a file inside the sandbox (not on the host).",
		Help: "Without workspace_session_id the write is published immediately as one new layer that every later session and read sees; " +
			"with it, the change stays private to that session until publish_workspace_session. " +
			"Missing parents are created (0755); new files get 0644, existing files keep their mode.",
		Result: `{"type":"create"|"update", path, bytes_written} (+ revision, layer_id when sessionless)`,
		Output: fileWriteOut,
		Args: []Arg{
			{Name: "path", Kind: Path, Required: true, Help: "Workspace-relative path or /workspace/…"},
			{Name: "content", Kind: String, Required: true, Help: "The new content."},
			sessionIDArg,
		},
	},
	{
		ID: "file_edit", Group: Runtime, Family: "file", Scope: ScopeSandbox,
		Title: "Edit file in sandbox", Effect: Destructive,
		Summary: "Apply exact string replacements to a file inside the sandbox (not on the host).",
		Help: "Without workspace_session_id the edit is published immediately as one new layer; with it, it stays in that session until published. " +
			"Edits apply in order on LF-normalized text; the file's line ending, BOM and mode are kept. " +
			"Each old_string must match exactly once unless replace_all is true.",
		Result: `{"type":"edit", path, edits_applied, replacements, bytes_written} (+ revision, layer_id when sessionless)`,
		Output: fileEditOut,
		Args: []Arg{
			{Name: "path", Kind: Path, Required: true, Help: "Workspace-relative path or /workspace/…"},
			{Name: "edits", Kind: JSONArray, Required: true, MaxItems: 1000, AcceptJSONString: true,
				Items: &Items{Fields: []Field{
					{Name: "old_string", Kind: String, Required: true, Help: "Exact text to replace (non-empty)."},
					{Name: "new_string", Kind: String, Required: true, Help: "Replacement text (different from old_string)."},
					{Name: "replace_all", Kind: Boolean, Default: false, Help: "Replace every occurrence instead of exactly one."},
				}},
				Help: "1..1000 edits, applied in order."},
			sessionIDArg,
		},
	},
	{
		ID: "file_blame", Group: Runtime, Family: "file", Scope: ScopeSandbox, Cancellable: true,
		Title: "Blame file lines", Effect: ReadOnly,
		Summary: "Which session, command or operation wrote each line of a file.",
		Help:    "Ranges tile every line exactly once. Without workspace_session_id: the sandbox's published state; with it: the session's own view.",
		Result:  "{path, view, workspace_session_id|null, revision, line_count, ranges:[{start_line, line_count, owner, …}]}",
		Output:  blameOut,
		Args: []Arg{
			{Name: "path", Kind: Path, Required: true, Help: "Workspace-relative path or /workspace/…"},
			{Name: "workspace_session_id", Kind: String, ID: true, Help: "Blame the session's own view."},
			{Name: "format", Kind: String, Default: "ranges", Enum: []string{"ranges", "agent-trace"},
				Help: "ranges: the blame result; agent-trace: one Agent Trace v0.1 record for the file."},
		},
	},
	{
		ID: "file_list", Group: Runtime, Family: "file", Scope: ScopeSandbox, Cancellable: true,
		Title: "List directory in sandbox", Effect: ReadOnly,
		Summary: "List one directory level inside the sandbox (not on the host).",
		Help:    "Sorted by name bytes; kind is file, directory, symlink or other.",
		Result:  "{path, entries:[{name, kind, size}], truncated}",
		Output:  fileListOut,
		Args: []Arg{
			{Name: "path", Kind: Path, DefaultDoc: "workspace root", Help: "Directory; omitted, ., / and /workspace mean the root."},
			sessionIDArg,
			{Name: "limit", Kind: Integer, Default: uint64(2000), Min: u64(1), Max: u64(2000), ClampMax: true, Help: "Maximum entries."},
		},
	},
	{
		ID: "create_workspace_session", Group: Runtime, Family: "workspace_session", Scope: ScopeSandbox,
		Title: "Create workspace session", Effect: Additive,
		Summary: "Create an explicit workspace session: a private copy-on-write view of the sandbox's current published state.",
		Help: "Pass its workspace_session_id to exec_command and the file tools to work in it; nothing is shared until publish_workspace_session. " +
			"The view is frozen at creation; later publishes by others are not visible inside it.",
		Result: "{workspace_session_id, network_profile, finalize_policy:\"no_op\", agent, created_at, base_revision, overlay_driver}",
		Output: sessionCreateOut,
		Args: []Arg{
			{Name: "network_profile", Kind: String, Default: "shared", Enum: []string{"shared", "isolated", "offline"},
				Help: "shared: the user's network; isolated: its own network namespace with outbound TCP/UDP and DNS through pasta or slirp4netns, " +
					"no host loopback, no other session, private ranges per network.isolated.allow_private; offline: only its own loopback."},
			{Name: "agent", Kind: String, MaxLen: 128, NoControl: true, Help: "Label of the agent or person owning the session."},
		},
	},
	{
		ID: "publish_workspace_session", Group: Runtime, Family: "workspace_session", Scope: ScopeSandbox, Span: "workspace_session.publish",
		Title: "Publish workspace session", Effect: Destructive,
		Summary: "Publish an explicit session's changes as one new layer, or nothing.",
		Help: "Every changed path is resolved against the current published state with its strategy (merge, ours, theirs, reject); " +
			"any conflict rejects the whole publish and keeps the session (fix it, or pass resolutions, and publish again). " +
			"dry_run returns the plan and commits nothing. On success the session is closed (with keep, it continues on the new head); publish.summary counts what was published.",
		Result: "{workspace_session_id, dry_run, publish:{no_op, revision, route_summary, outcome_summary, summary, layer_id, resolved_paths}, destroyed, …}; " +
			"publish.summary counts the session's changes by fate: {result: published|no_op (dry run: would_publish|would_reject|no_op), " +
			"changed_paths, published_paths, merged_paths, kept_head_paths, conflict_paths}; with keep: destroyed:false, kept:true and " +
			"base_revision, the session's new base (the head it published)",
		Output: publishOut,
		Args: []Arg{
			{Name: "workspace_session_id", Kind: String, Required: true, ID: true, Help: "An explicit session."},
			graceArg,
			{Name: "default_strategy", Kind: String, Default: "merge", Enum: []string{"merge", "ours", "theirs", "reject"},
				Help: "Strategy for paths without a resolution."},
			resolutionsArg,
			{Name: "dry_run", Kind: Boolean, Default: false, Help: "Compute the plan against the current head and commit nothing."},
			{Name: "keep", Kind: Boolean, Default: false,
				Help: "Keep working: after the commit the session continues on the new head with an empty upper (same id, holder and running commands) instead of closing."},
			{Name: "git_refs", Kind: String, Enum: []string{"merge", "rebase", "branch"}, DefaultDoc: "git.publish_refs (merge)",
				Help: "How the session's git branch is published when the head's tip moved: a merge commit, the session's commits replayed onto the head's tip, or only the branch sandbox/<agent>-<session>."},
		},
	},
	{
		ID: "sync_workspace_session", Group: Runtime, Family: "workspace_session", Scope: ScopeSandbox, Span: "workspace_session.sync",
		Title: "Sync workspace session", Effect: Destructive,
		Summary: "Bring an explicit session onto the current head, keeping its own changes.",
		Help: "Paths changed only on the head appear in the session; paths changed only in the session stay; paths changed on both " +
			"are resolved like a publish (merge, ours, theirs, reject, resolutions) and any conflict rejects the whole sync with every " +
			"path listed and changes nothing. The session's id, holder and running commands stay; on the kernel driver a command " +
			"whose working directory or open files are in /workspace makes the sync fail naming it. dry_run returns the plan only.",
		Result: "{workspace_session_id, dry_run, sync:{no_op, base_revision, previous_base_revision, summary:{result: synced|no_op " +
			"(dry run: would_sync|would_reject|no_op), changed_paths, merged_paths, kept_head_paths, conflict_paths}, …}, plan (dry run)}",
		Output: syncOut,
		Args: []Arg{
			{Name: "workspace_session_id", Kind: String, Required: true, ID: true, Help: "An explicit session."},
			{Name: "default_strategy", Kind: String, Default: "merge", Enum: []string{"merge", "ours", "theirs", "reject"},
				Help: "Strategy for paths changed on both sides without a resolution."},
			resolutionsArg,
			{Name: "dry_run", Kind: Boolean, Default: false, Help: "Compute the plan against the current head and change nothing."},
			{Name: "git_refs", Kind: String, Enum: []string{"merge", "rebase", "branch"}, DefaultDoc: "git.publish_refs (merge)",
				Help: "How the head's commits join the session's git branch when both moved: a merge commit (also for branch) or the session's commits replayed onto the head's tip."},
		},
	},
	{
		ID: "destroy_workspace_session", Group: Runtime, Family: "workspace_session", Scope: ScopeSandbox,
		Title: "Discard workspace session", Effect: Destructive, Idempotent: true,
		Summary: "Discard a session and its changes.",
		Help:    "Refused while commands run and the holder lives.",
		Result:  "{workspace_session_id, destroyed:true, evicted_upperdir_bytes, active_leases_after}",
		Args: []Arg{
			{Name: "workspace_session_id", Kind: String, Required: true, ID: true, Help: "Implicit or explicit session."},
			graceArg,
		},
	},
	{
		ID: "fork_workspace_session", Group: Runtime, Family: "workspace_session", Scope: ScopeSandbox, Span: "workspace_session.fork",
		Title: "Fork workspace session", Effect: Additive,
		Summary: "Create an explicit session whose view equals another session's current view; the two are independent afterwards.",
		Help: "The new session has its own ID and holder, the source's base revision and a copy of the source's changes " +
			"(reflinked or copy_file_range'd where the filesystem allows). Blame in the fork keeps crediting the source's commands for the " +
			"lines they wrote; file_activity of the fork starts empty. A source's running commands are stopped for the copy and go on " +
			"in the source only. Implicit sessions cannot be forked (not_found, as publish).",
		Result: "{workspace_session_id, network_profile, finalize_policy:\"no_op\", agent, created_at, base_revision, overlay_driver, forked_from}",
		Output: sessionForkOut,
		Args: []Arg{
			{Name: "workspace_session_id", Kind: String, Required: true, ID: true, Help: "The explicit source session."},
			{Name: "agent", Kind: String, MaxLen: 128, NoControl: true,
				Help: "Label of the agent or person owning the new session (as create_workspace_session: not inherited from the source)."},
			{Name: "network_profile", Kind: String, Enum: []string{"shared", "isolated", "offline"}, DefaultDoc: "the source's profile",
				Help: "As create_workspace_session; omitted, the fork gets the source's profile (a fork never widens network access unasked)."},
		},
	},
	{
		ID: "list_workspace_sessions", Group: Runtime, Family: "workspace_session", Scope: ScopeSandbox,
		Title: "List workspace sessions", Effect: ReadOnly,
		Summary: "List the sandbox's sessions, implicit and explicit.",
		Result:  `{"workspace_sessions":[session object…]} sorted by created_at`,
		Output:  sessionsOut,
	},
	{
		ID: "diff_workspace_session", Group: Runtime, Family: "workspace_session", Scope: ScopeSandbox, Cancellable: true,
		Title: "Diff workspace session", Effect: ReadOnly,
		Summary: "What a session changed: per-path status and unified diffs against its base or the current head.",
		Help:    "Also lists the session-changed paths that head has changed meanwhile (they will go through resolution).",
		Result:  "{workspace_session_id, against, base_revision, head_revision, files:[{path, status, kind, route, binary, mode, diff, diff_truncated}], head_changed_paths[], truncated}",
		Output:  diffOut,
		Args: []Arg{
			{Name: "workspace_session_id", Kind: String, Required: true, ID: true, Help: "Any state except finalizing."},
			{Name: "against", Kind: String, Default: "base", Enum: []string{"base", "head"}, Help: "Left side of the diffs."},
			{Name: "paths", Kind: JSONArray, MaxItems: 1000, AcceptJSONString: true, DefaultDoc: "all", Items: &Items{Kind: Path},
				Help: "Workspace-relative paths; each matches that path and everything below it."},
			{Name: "max_bytes", Kind: Integer, Default: uint64(1048576), Min: u64(1), Max: u64(8388608), Help: "Total unified-diff text."},
		},
	},
	{
		ID: "forward_port", Group: Runtime, Family: "network", Scope: ScopeSandbox,
		Summary: "Make a port inside a session reachable on the host's loopback.",
		Help: "For a shared session or none the port is returned as is. For an isolated or offline session the supervisor listens on an " +
			"ephemeral 127.0.0.1 port and relays each connection through the session's holder to 127.0.0.1:<port> inside; the same " +
			"call returns the same forward; at most 16 per session; forwards end with their session.",
		Result: "{workspace_session_id|null, network_profile, target_port, host:\"127.0.0.1\", port, url|null}",
		Args: []Arg{
			{Name: "port", Kind: Integer, Required: true, Min: u64(1), Max: u64(65535), Help: "The port inside the session."},
			{Name: "workspace_session_id", Kind: String, ID: true, Help: "An active session of this sandbox; without it the port is the user's own."},
		},
	},
	{
		ID: "snapshot", Group: Observability, Family: "snapshot", Scope: ScopeSystemOrSandbox, Cancellable: true,
		Title: "Activity snapshot", Effect: ReadOnly,
		Summary: "What every sandbox (or one) is doing now: sessions, running commands, layer stack.",
		Result:  "sandbox: {sandbox_id, lifecycle_state, availability, …, workspaces[], stack}; system: {sandboxes:[…]}",
		Args:    []Arg{obsSandboxArg},
	},
	{
		ID: "trace", Group: Observability, Family: "trace", Scope: ScopeSystemOrSandbox, Cancellable: true,
		Title: "Request trace", Effect: ReadOnly,
		Summary: "The span tree of one request (by its request_id), the last one by default.",
		Result:  "{view:\"trace\", trace, spans:[{span, offset_ms, children, events}]}",
		Args: []Arg{obsSandboxArg,
			{Name: "trace_id", Kind: String, Default: "last", NonEmpty: true, Help: "A request_id or a synthetic trace id; \"last\" is the newest."}},
	},
	{
		ID: "events", Group: Observability, Family: "events", Scope: ScopeSystemOrSandbox, Cancellable: true,
		Title: "Event log", Effect: ReadOnly,
		Summary: "Recorded events, oldest first.",
		Help:    "Every record carries seq, one supervisor-wide sequence number (it continues across restarts); the HTTP listener's event stream GET /api/events uses it as the SSE id, so a console resumes after the last record it has with Last-Event-ID or ?last_event_id=.",
		Result:  "{view:\"events\", events:[…]}; with last_n or after_seq also truncated and, when truncated, next_after_seq",
		Args: []Arg{obsSandboxArg,
			{Name: "name", Kind: String, Help: "Only events with exactly this name."},
			{Name: "since_ms", Kind: Integer, Help: "Only events at or after this Unix time in ms."},
			{Name: "last_n", Kind: Integer, Min: u64(1), Max: u64(MaxEventsLastN),
				Help: "Only the newest n (up to 1000000, more than any event store holds). One response carries at most 500 events and 256 KiB: " +
					"a bigger selection is paged, oldest first — the response says truncated:true and next_after_seq; repeat the query " +
					"with after_seq set to it for the next page."},
			{Name: "after_seq", Kind: Integer, Help: "Only events whose seq is above this (a page's next_after_seq); the result is paged as with last_n."}},
	},
	{
		ID: "resources", Group: Observability, Family: "resources", Scope: ScopeSystemOrSandbox, Cancellable: true,
		Title: "Resource use", Effect: ReadOnly,
		Summary: "Sampled resource use: a sandbox's series, or the fleet's latest per sandbox.",
		Help:    "Reads the samples the supervisor records every observability.resource_stats.sample_interval_ms; it never samples on demand.",
		Result:  "sandbox: {view:\"resources\", scope:\"sandbox\", sandbox_id, source, availability, errors[], series:[{ts, sample_delta_ms, metrics, deltas}]}; system: {view:\"resources\", scope:\"fleet\", availability, errors[], sandboxes:{<id>:{availability, errors, current}}}",
		Args:    []Arg{obsSandboxArg, windowArg},
	},
	{
		ID: "daemon", Group: Observability, Family: "daemon", Scope: ScopeSystemOrSandbox, Cancellable: true,
		Title: "Supervisor process", Effect: ReadOnly,
		Summary: "The supervisor process: pid, uptime, memory, goroutines, descriptors, holders.",
		Result:  "{view:\"daemon\", scope, daemon:{…, holders:[…]}}",
		Args:    []Arg{obsSandboxArg},
	},
	{
		ID: "topology", Group: Observability, Family: "topology", Scope: ScopeSandbox, Cancellable: true,
		Title: "Session processes", Effect: ReadOnly,
		Summary: "Holders and the processes of each session, by PID namespace.",
		Result:  "{view:\"topology\", scope:\"sandbox\", topology:{schema_version:2, workspaces:[…]}}",
		Args:    []Arg{obsSandboxRequired},
	},
	{
		ID: "cgroup", Group: Observability, Family: "cgroup", Scope: ScopeSandbox, Cancellable: true,
		Title: "Cgroup samples", Effect: ReadOnly,
		Summary: "The resource samples of a sandbox or one of its sessions, and its processes.",
		Result:  "{view:\"cgroup\", scope, availability, errors[], series:[…], topology}",
		Args: []Arg{obsSandboxRequired,
			{Name: "scope", Kind: String, Default: "sandbox", NonEmpty: true, Help: "\"sandbox\" or a workspace session ID."},
			windowArg},
	},
	{
		ID: "layerstack", Group: Observability, Family: "layerstack", Scope: ScopeSandbox, Cancellable: true,
		Title: "Layer stack", Effect: ReadOnly,
		Summary: "Layers, sizes and leases; or one session's mounts; or one layer's entries.",
		Result:  "{view:\"layerstack\", manifest_version, root_hash, layers:[…], squash:{running, autosquash_pending}, …}",
		Args: []Arg{obsSandboxRequired,
			{Name: "workspace_id", Kind: String, ID: true, Help: "A workspace session: its mounted layers and upper size."},
			{Name: "window_ms", Kind: Integer, DefaultDoc: "none", Help: "Include the stack samples of this window (≤ 600000)."},
			{Name: "layer_id", Kind: String, ID: true, Help: "One layer: its entries."},
			{Name: "limit", Kind: Integer, Default: uint64(500), Min: u64(1), Max: u64(5000), Help: "Entries of a layer."}},
	},
	{
		ID: "health", Group: Observability, Family: "health", Scope: ScopeSystem, Cancellable: true,
		Title: "Supervisor health", Effect: ReadOnly,
		Summary: "The supervisor's health and the host capabilities it probed at start.",
		Result:  "{status, version, uptime_s, uid, kernel, overlay_drivers, fuse, user_namespaces, cgroup, docker, store, counts, event_store}",
		Output:  healthOut,
	},
	{
		ID: "file_activity", Group: Observability, Family: "file_activity", Scope: ScopeSandbox, Cancellable: true,
		Title: "File activity", Effect: ReadOnly,
		Summary: "File changes made inside workspace sessions, oldest first.",
		Help: "One record per create, write, truncate, rename, unlink, mkdir, rmdir, symlink or chmod: " +
			"as it happens under the fuse driver (source fuse, writes coalesced per handle), " +
			"or from the upper-dir difference at each checkpoint under the kernel driver (source capture). " +
			"Session file operations carry their request_id.",
		Result: "{view:\"file_activity\", sandbox_id, records:[{ts, workspace_session_id, command_session_id, op, path, new_path?, offset?, length?, source, request_id?}], truncated}",
		Args: []Arg{obsSandboxRequired,
			{Name: "workspace_session_id", Kind: String, ID: true, Help: "Only records of this workspace session."},
			{Name: "path", Kind: Path, Help: "Only records of this path or below it (workspace-relative or /workspace/…)."},
			{Name: "since_ms", Kind: Integer, Help: "Only records at or after this Unix time in ms."},
			{Name: "limit", Kind: Integer, Default: uint64(200), Min: u64(1), Max: u64(1000), Help: "The newest records kept."}},
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
