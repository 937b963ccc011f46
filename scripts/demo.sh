#!/usr/bin/env bash
# make demo: a supervisor on a temporary home, a sandbox from a sample
# project, sessionless writes, an edit and reads, the layer stack, cleanup.
set -euo pipefail
cd "$(dirname "$0")/.."
# DEMO_BIN: where the binaries are (CI: the installed /usr/bin).
BIN=${DEMO_BIN:-$PWD/bin}
demo=$(mktemp -d /tmp/esbx-demo.XXXXXX)
export EPHEMERAL_SANDBOX_HOME=$demo/home
trap 'kill $(cat "$EPHEMERAL_SANDBOX_HOME/run/supervisor.pid" 2>/dev/null) 2>/dev/null || true; sleep 0.3; rm -rf "$demo"' EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*" >&2; "$@"; }

# A dir export writes only below the workspace root or a directory listed
# in manager.export.allowed_roots: the demo allows $demo/export.
mkdir -p "$EPHEMERAL_SANDBOX_HOME/config" "$demo/export" && chmod 700 "$EPHEMERAL_SANDBOX_HOME" "$EPHEMERAL_SANDBOX_HOME/config"
printf 'manager:\n  export:\n    allowed_roots: [%s]\n' "$demo/export" > "$EPHEMERAL_SANDBOX_HOME/config/config.yml"
if [ -n "${DEMO_HTTP:-}" ]; then
  # The browser console: the autostarted supervisor reads http.listen.
  printf 'http:\n  listen: %s\n' "$DEMO_HTTP" >> "$EPHEMERAL_SANDBOX_HOME/config/config.yml"
fi

step "a sample project"
mkdir -p "$demo/project/src"
printf 'package main\n\nfunc main() {\n\tprintln("hello")\n}\n' > "$demo/project/src/main.go"
printf '# sample\n' > "$demo/project/README.md"
ln -s src/main.go "$demo/project/main-link"
find "$demo/project" | sed "s|$demo/||"

step "create a sandbox (the CLI starts the supervisor on first use)"
rec=$(show "$BIN/sandbox-manager-cli" --progress create_sandbox --workspace-bind-root "$demo/project" --name demo)
echo "$rec"
id=$(printf '%s' "$rec" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
if [ -n "${DEMO_HTTP:-}" ]; then
  step "the browser console (open this URL while the demo runs)"
  "$BIN/sandbox-supervisor" ui --no-browser
fi
rt() { show "$BIN/sandbox-runtime-cli" --sandbox-id "$id" "$@"; }

step "write, edit and read files on the published head"
rt file_write --path notes/todo.txt --content $'ship the demo\nwrite tests\n'
rt file_write --path notes/todo.txt --content $'ship the demo\nwrite tests\n'
echo "(the identical rewrite is a no-op: layer_id null, no new layer)"
rt file_edit --path src/main.go --edits '[{"old_string":"hello","new_string":"hello, sandbox"}]'
rt file_read --path src/main.go
rt file_list --path /workspace

step "an agent's private copy-on-write session"
ws=$(rt create_workspace_session --agent demo-agent | sed -n 's/.*"workspace_session_id":"\([^"]*\)".*/\1/p')
echo "session $ws"
rt exec_command --workspace-session-id "$ws" 'echo "from the session" >> notes/todo.txt; cat notes/todo.txt; id -u; hostname'
echo "(the published head does not see it:)"
rt file_read --path notes/todo.txt
rt exec_command --workspace-session-id "$ws" 'grep -E "NoNewPrivs|Seccomp:" /proc/self/status; mount -t tmpfs x /tmp 2>&1 || true'
rt destroy_workspace_session --workspace-session-id "$ws"

step "a bare command runs in an implicit session that publishes itself"
rt exec_command 'mkdir -p build && echo ok > build/status && ls build'
rt file_read --path build/status

step "two agents edit the same file in parallel; publication merges them per line"
a=$(rt create_workspace_session --agent alice | sed -n 's/.*"workspace_session_id":"\([^"]*\)".*/\1/p')
b=$(rt create_workspace_session --agent bob | sed -n 's/.*"workspace_session_id":"\([^"]*\)".*/\1/p')
rt exec_command --workspace-session-id "$a" "sed -i 's/ship the demo/ship the demo (alice)/' notes/todo.txt" >/dev/null
rt exec_command --workspace-session-id "$b" "sed -i 's/write tests/write tests (bob)/' notes/todo.txt" >/dev/null
rt diff_workspace_session --workspace-session-id "$b"
rt publish_workspace_session --workspace-session-id "$a"
rt publish_workspace_session --workspace-session-id "$b" --dry-run | head -c 600; echo " …"
rt publish_workspace_session --workspace-session-id "$b"
rt file_read --path notes/todo.txt
rt file_blame --path notes/todo.txt

step "an overlapping edit is rejected with exactly what conflicted; the session stays"
c=$(rt create_workspace_session --agent carol | sed -n 's/.*"workspace_session_id":"\([^"]*\)".*/\1/p')
rt exec_command --workspace-session-id "$c" "echo 'carol was here' > README.md" >/dev/null
rt file_write --path README.md --content $'# sample, edited on the head\n' >/dev/null
rt publish_workspace_session --workspace-session-id "$c" || echo "(exit $?: rejected, nothing committed)"
rt publish_workspace_session --workspace-session-id "$c" --resolutions '[{"path":"README.md","strategy":"ours"}]'

step "export the published changes to a host directory (an allowed root in the configuration)"
show "$BIN/sandbox-manager-cli" export_changes --sandbox-id "$id" --dest "$demo/export"
find "$demo/export" -type f | sed "s|$demo/||" | sort

step "a bad request gets a clear error and changes nothing"
rt file_read --path ../etc/passwd || echo "(exit $?)"

step "the layer stack: newest first"
cat "$EPHEMERAL_SANDBOX_HOME/data/sandboxes/$id/layerstack/manifest.json"; echo
ls "$EPHEMERAL_SANDBOX_HOME/data/sandboxes/$id/layerstack/layers"

step "squash folds the published layers into one; content and blame are unchanged"
show "$BIN/sandbox-manager-cli" squash_layerstacks --sandbox-id "$id"
ls "$EPHEMERAL_SANDBOX_HOME/data/sandboxes/$id/layerstack/layers"
rt file_blame --path notes/todo.txt

step "the host project is untouched"
cat "$demo/project/src/main.go"

step "health"
show "$BIN/sandbox-observability-cli" health

if [ -n "${DEMO_HTTP:-}" ] && [ -t 0 ]; then
  step "the console is still up: press Enter to destroy the sandbox and end the demo"
  "$BIN/sandbox-supervisor" ui --no-browser
  read -r _
fi

step "destroy and clean up"
show "$BIN/sandbox-manager-cli" destroy_sandbox --sandbox-id "$id" >/dev/null && echo destroyed
show "$BIN/sandbox-manager-cli" list_sandboxes
