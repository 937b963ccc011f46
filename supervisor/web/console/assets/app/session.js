// Session: a terminal on the session (exec_command, the transcript stream,
// stdin), the command history, a file tree with content and blame gutter,
// and the session's file activity. Sync (the review planner in sync mode:
// plan, strategies, then sync onto the current head) and Fork (a new
// session with this one's view, opened at once).
import { Terminal } from '/vendor/xterm-xterm/xterm.mjs';
import { FitAddon } from '/vendor/xterm-addon-fit/addon-fit.mjs';
import { rpc, events, debounce, followCommand, newest } from './api.js';
import { h, clear, toast, age, time, badge, agentColour, errText, confirmDialog } from './ui.js';
import { charts } from './obs.js';
import { planner } from './review.js';

export function sessionPage(view, [sandboxId, wsId]) {
  const cleanups = [];
  const info = h('div', { class: 'row', id: 'session-info' });
  const termEl = h('div', { id: 'terminal' });
  const cmdInput = h('input', { id: 'cmd', placeholder: 'command (runs in /workspace with bash -c)', autocomplete: 'off' });
  const runBtn = h('button', { type: 'submit', class: 'primary', id: 'run' }, 'Run');
  const status = h('span', { id: 'cmd-status', class: 'muted' });
  const history = h('tbody', { id: 'history' });
  const tree = h('ul', { id: 'tree', class: 'tree' });
  const fileView = h('div', { id: 'file-view', class: 'file' }, h('p', { class: 'muted' }, 'Pick a file.'));
  const activity = h('tbody', { id: 'activity' });
  const resources = h('div', { class: 'charts', id: 'session-resources' });
  const syncPanel = h('div', { id: 'sync-panel', hidden: true });
  const syncResult = h('div', { id: 'sync-result' });
  const forkDialog = forkForm(sandboxId, wsId);

  clear(view,
    h('section', { class: 'card' }, info),
    h('div', {}, syncResult, syncPanel),
    forkDialog.el,
    h('div', { class: 'cols' },
      h('section', { class: 'card wide' },
        h('h3', {}, 'Terminal'),
        h('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); run(); } }, cmdInput, runBtn,
          h('button', { type: 'button', id: 'ctrl-c', title: 'cancel the running command (Ctrl-C)', onclick: () => stdin('\u0003') }, '^C'),
          h('button', { type: 'button', id: 'ctrl-d', title: 'end of input (Ctrl-D)', onclick: () => stdin('\u0004') }, '^D'),
          status),
        termEl,
        h('p', { class: 'muted small' }, 'While a command runs, what you type in the terminal goes to its stdin.')),
      h('section', { class: 'card' }, h('h3', {}, 'Commands'),
        h('table', { class: 'grid small' }, h('thead', {}, h('tr', {}, ['', 'Command', 'Status', 'Exit', 'Started'].map((c) => h('th', {}, c)))), history))),
    h('div', { class: 'cols' },
      h('section', { class: 'card narrow' }, h('h3', {}, 'Files'), tree),
      h('section', { class: 'card wide' }, fileView)),
    h('section', { class: 'card' }, h('h3', {}, 'File activity'),
      h('table', { class: 'grid small' }, h('thead', {}, h('tr', {}, ['Time', 'Op', 'Path', 'Command', 'Source'].map((c) => h('th', {}, c)))), activity)),
    h('section', { class: 'card' }, h('div', { class: 'row' }, h('h3', {}, 'Resources (last 10 minutes)'),
      h('button', { class: 'link small', onclick: () => refreshResources() }, 'refresh')), resources));

  // The terminal shows the streamed PTY rows; keys go to the running
  // command's stdin.
  const term = new Terminal({ convertEol: false, fontSize: 13, rows: 20, cols: 120, scrollback: 5000, theme: { background: '#1e1e1e' } });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(termEl);
  try { fit.fit(); } catch { /* hidden element: keep the default size */ }
  const onResize = () => { try { fit.fit(); } catch { /* ignore */ } };
  window.addEventListener('resize', onResize);
  cleanups.push(() => window.removeEventListener('resize', onResize), () => term.dispose());

  let running = null; // {id, stop}
  const recent = [];
  let recentAt = -1;

  async function run() {
    const cmd = cmdInput.value.trim();
    if (!cmd) return;
    if (running) { toast('a command is still running: send input, or ^C', 'error'); return; }
    recent.unshift(cmd); recentAt = -1;
    cmdInput.value = '';
    term.write(`\x1b[1;32m$ \x1b[0m${cmd.replace(/\n/g, '\r\n')}\r\n`);
    let out;
    try {
      // yield_time_ms 0: return at once; the stream carries the output.
      out = await rpc('exec_command', { cmd, workspace_session_id: wsId, yield_time_ms: 0 }, sandboxId);
    } catch (e) {
      term.write(`\x1b[31m${errText(e)}\x1b[0m\r\n`);
      return;
    }
    attach(out.command_session_id);
  }

  // attach streams a command's transcript into the terminal from its first
  // row and sends what is typed to its stdin until it ends: for a command
  // run here, or one an agent started (from the history).
  function attach(id) {
    status.textContent = `${id} running`;
    status.dataset.state = 'running';
    const stop = followCommand(sandboxId, id, (row) => term.write(row + '\r\n'), (res) => {
      running = null;
      const code = res?.exit_code;
      status.textContent = res ? `${id} ${res.status} (exit ${code})` : `${id}: stream ended`;
      status.dataset.state = res ? res.status : 'unknown';
      term.write(`\x1b[2m[${res ? res.status : 'stream ended'}${code !== null && code !== undefined ? ', exit ' + code : ''}]\x1b[0m\r\n`);
      refreshHistory();
    });
    running = { id, stop };
    cleanups.push(stop);
    refreshHistory();
  }

  async function stdin(text) {
    if (!running) return;
    try {
      await rpc('write_command_stdin', { command_session_id: running.id, stdin: text, yield_time_ms: 0 }, sandboxId);
    } catch (e) { toast(errText(e), 'error'); }
  }
  // Keystrokes are batched briefly: one request per burst, not per key.
  let pendingIn = '';
  const sendIn = debounce(() => { const t = pendingIn; pendingIn = ''; if (t) stdin(t); }, 30);
  term.onData((d) => {
    if (!running) return;
    if (d.includes('\u0003')) { pendingIn = ''; stdin('\u0003'); return; }
    pendingIn += d;
    sendIn();
  });
  cmdInput.addEventListener('keydown', (e) => {
    if (e.key === 'ArrowUp' && recent.length) { recentAt = Math.min(recentAt + 1, recent.length - 1); cmdInput.value = recent[recentAt]; e.preventDefault(); }
    if (e.key === 'ArrowDown') { recentAt = Math.max(recentAt - 1, -1); cmdInput.value = recentAt < 0 ? '' : recent[recentAt]; e.preventDefault(); }
  });

  const infoTurn = newest();
  async function refreshInfo() {
    const isNewest = infoTurn();
    try {
      const r = await rpc('list_workspace_sessions', {}, sandboxId);
      if (!isNewest()) return;
      const s = r.workspace_sessions.find((x) => x.workspace_session_id === wsId);
      if (!s) { clear(info, h('h2', {}, 'Session ' + wsId), badge('gone')); return; }
      clear(info,
        h('h2', {}, 'Session ', h('span', { class: 'mono' }, wsId)),
        s.agent ? h('span', { class: 'agent', style: `background:${agentColour(s.agent)}` }, s.agent) : null,
        badge(s.state), h('span', { class: 'muted' }, `${s.overlay_driver} · ${s.network_profile} · `,
          h('span', { id: 'base-revision', title: 'the published revision the session works over',
            dataset: { manifestVersion: s.base_revision?.manifest_version ?? '', layerCount: s.base_revision?.layer_count ?? '' } },
          `base revision ${s.base_revision?.manifest_version ?? '?'} (${s.base_revision?.layer_count} layers)`),
          ` · age ${age(s.created_at)}`),
        h('span', { class: 'spacer' }),
        s.finalize_policy !== 'publish_then_destroy' ? [ // implicit sessions publish themselves
          h('button', { id: 'sync', title: 'bring the session onto the current head: plan first', onclick: toggleSync }, syncOpen ? 'Close sync' : 'Sync…'),
          h('button', { id: 'fork', title: 'a new session with this view, independent afterwards', onclick: () => forkDialog.show(s) }, 'Fork…'),
        ] : null,
        h('a', { href: `#/review/${sandboxId}/${wsId}`, class: 'button primary', id: 'review' }, 'Review & publish'),
        h('button', { class: 'danger', id: 'discard', onclick: discard }, 'Discard'));
    } catch (e) { clear(info, h('span', { class: 'bad' }, errText(e))); }
  }

  // The sync panel: open, it shows the dry-run plan of a sync onto the
  // current head; "Sync" applies it with exactly the chosen strategies.
  let syncOpen = false;
  let sync = null;
  function toggleSync() {
    syncOpen = !syncOpen;
    if (syncOpen) {
      clear(syncResult);
      sync = planner({ sandboxId, wsId, mode: 'sync', onDone: synced });
      clear(syncPanel, h('h3', {}, 'Sync onto the current head'), sync.el);
    } else {
      sync?.stop(); sync = null;
      clear(syncPanel);
    }
    syncPanel.hidden = !syncOpen;
    refreshInfo();
  }
  cleanups.push(() => sync?.stop());

  // After a sync the session's view changed under the page: show the new
  // base, and read the tree and the open file (and its blame) again.
  async function synced(r) {
    const out = r.sync || {};
    const from = out.previous_base_revision?.manifest_version;
    const to = out.base_revision?.manifest_version;
    toggleSync();
    clear(syncResult, h('section', { class: 'card', id: 'synced', dataset: { revision: to ?? '' } },
      h('span', {}, out.no_op ? 'Already on the head' : 'Synced', from !== undefined ? ` from revision ${from}` : '', ` onto revision ${to ?? '?'}`),
      ' ', Object.entries(out).filter(([k, n]) => typeof n === 'number' && k.endsWith('_paths') && n).map(([k, n]) => badge(`${n} ${k.replace(/_paths$/, '').replace(/_/g, ' ')}`))));
    await Promise.all([refreshInfo(), listDir('.', tree), openPath ? openFile(openPath) : null, refreshActivity()]);
    view.dataset.synced = String(to ?? Date.now());
  }

  async function discard() {
    if (!await confirmDialog(`Discard session ${wsId}? Its unpublished changes are thrown away.`, 'Discard')) return;
    try {
      await rpc('destroy_workspace_session', { workspace_session_id: wsId }, sandboxId);
      toast(`discarded ${wsId}`);
      location.hash = '#/fleet';
    } catch (e) { toast(errText(e), 'error'); }
  }

  const historyTurn = newest();
  async function refreshHistory() {
    const isNewest = historyTurn();
    try {
      const r = await rpc('list_commands', { workspace_session_id: wsId, limit: 50 }, sandboxId);
      if (!isNewest()) return;
      clear(history, r.commands.map((c) => {
        const tr = h('tr', { class: 'cmd', dataset: { commandId: c.command_session_id } },
          h('td', {}, h('button', { class: 'link small attach', title: c.status === 'running' ? 'attach the terminal to it' : 'show its transcript', onclick: () => transcript(c) }, '▸')),
          h('td', { class: 'mono', title: c.cmd }, c.cmd.length > 60 ? c.cmd.slice(0, 60) + '…' : c.cmd),
          h('td', {}, badge(c.status)), h('td', {}, c.exit_code ?? ''), h('td', { title: c.started_at }, age(c.started_at)));
        return tr;
      }));
    } catch (e) { clear(history, h('tr', {}, h('td', { colspan: 5, class: 'bad' }, errText(e)))); }
  }

  async function transcript(c) {
    if (c.status === 'running' && !running) {
      term.write(`\x1b[2m--- attached to ${c.command_session_id}: ${c.cmd.replace(/\n/g, ' ')} ---\x1b[0m\r\n`);
      attach(c.command_session_id);
      return;
    }
    try {
      const r = await rpc('read_command_lines', { command_session_id: c.command_session_id, limit: 1000 }, sandboxId);
      term.write(`\x1b[2m--- transcript of ${c.command_session_id} (${r.status}, exit ${r.exit_code}) ---\x1b[0m\r\n`);
      term.write(r.output.replace(/\n/g, '\r\n') + '\r\n');
    } catch (e) { toast(errText(e), 'error'); }
  }

  // File tree: one directory level per click (file_list).
  async function listDir(path, ul) {
    try {
      const r = await rpc('file_list', { path, workspace_session_id: wsId }, sandboxId);
      clear(ul, r.entries.map((e) => {
        const full = path === '.' ? e.name : `${path}/${e.name}`;
        if (e.kind === 'directory') {
          const sub = h('ul', { class: 'tree' });
          let open = false;
          return h('li', { class: 'dir' }, h('a', { href: '#', onclick: (ev) => { ev.preventDefault(); open = !open; if (open) listDir(full, sub); else clear(sub); } }, e.name + '/'), sub);
        }
        return h('li', { class: 'file' }, h('a', { href: '#', dataset: { path: full }, onclick: (ev) => { ev.preventDefault(); openFile(full); } }, e.name));
      }), r.truncated ? h('li', { class: 'muted' }, '… truncated') : null);
    } catch (e) { clear(ul, h('li', { class: 'bad' }, errText(e))); }
  }

  const fileTurn = newest();
  let openPath = null;
  async function openFile(path) {
    const isNewest = fileTurn();
    openPath = path;
    clear(fileView, h('p', { class: 'muted' }, 'Loading ' + path + '…'));
    try {
      const [f, b] = await Promise.all([
        rpc('file_read', { path, workspace_session_id: wsId }, sandboxId),
        rpc('file_blame', { path, workspace_session_id: wsId }, sandboxId).catch((e) => ({ error: e })),
      ]);
      if (!isNewest()) return;
      clear(fileView, h('h3', { class: 'mono' }, path, f.truncated ? h('span', { class: 'muted small' }, ` (first ${f.num_lines} of ${f.total_lines} lines)`) : null),
        blameView(f.content, b.error ? null : b, b.error));
    } catch (e) { clear(fileView, h('p', { class: 'bad' }, errText(e))); }
  }

  const activityTurn = newest();
  async function refreshActivity() {
    const isNewest = activityTurn();
    try {
      const r = await rpc('file_activity', { sandbox_id: sandboxId, workspace_session_id: wsId, limit: 200 }, sandboxId);
      if (!isNewest()) return;
      clear(activity, r.records.slice().reverse().map((a) => h('tr', {},
        h('td', {}, time(a.ts)), h('td', {}, badge(a.op)), h('td', { class: 'mono' }, a.path, a.new_path ? ' → ' + a.new_path : ''),
        h('td', { class: 'mono small' }, a.command_session_id || ''), h('td', { class: 'muted' }, a.source))));
    } catch (e) { clear(activity, h('tr', {}, h('td', { colspan: 5, class: 'bad' }, errText(e)))); }
  }

  // The session's own cgroup samples; fetched on open and on request (the
  // samples come on the sampler's schedule, not with events).
  let plots = [];
  async function refreshResources() {
    try {
      const r = await rpc('cgroup', { sandbox_id: sandboxId, scope: wsId, window_ms: 600000 }, sandboxId);
      plots.forEach((p) => p.destroy());
      plots = charts(resources, r);
    } catch (e) { clear(resources, h('p', { class: 'muted' }, errText(e))); }
  }
  cleanups.push(() => plots.forEach((p) => p.destroy()));

  const refresh = debounce(() => { refreshInfo(); refreshHistory(); refreshActivity(); }, 300);
  cleanups.push(events.on(({ sandboxId: sb, kind }) => { if (sb === sandboxId || kind === 'truncated') refresh(); }));
  refreshInfo(); refreshHistory(); refreshActivity(); listDir('.', tree); refreshResources();
  return () => cleanups.forEach((f) => f());
}

// forkForm is the Fork dialog: an agent label and a network profile for the
// new session; on success the page moves to the fork's session page.
function forkForm(sandboxId, wsId) {
  const agent = h('input', { id: 'fork-agent', maxlength: 128, autocomplete: 'off', placeholder: 'agent label' });
  const profile = h('select', { id: 'fork-network' }, ['shared', 'isolated', 'offline'].map((p) => h('option', { value: p }, p)));
  const err = h('p', { class: 'bad small', id: 'fork-error' });
  const ok = h('button', { type: 'submit', class: 'primary', id: 'fork-ok' }, 'Fork');
  const d = h('dialog', { id: 'fork-dialog' },
    h('form', { onsubmit: submit },
      h('h3', {}, 'Fork ', h('span', { class: 'mono' }, wsId)),
      h('p', { class: 'muted small' }, 'A new session whose files equal this one\'s now; the two are independent afterwards.'),
      h('div', { class: 'row' }, h('label', {}, 'Agent ', agent), h('label', {}, 'Network ', profile)),
      err,
      h('menu', {}, h('button', { type: 'button', id: 'fork-cancel', onclick: () => d.close() }, 'Cancel'), ok)));
  async function submit(ev) {
    ev.preventDefault();
    ok.disabled = true;
    err.textContent = '';
    const args = { workspace_session_id: wsId, network_profile: profile.value };
    if (agent.value.trim()) args.agent = agent.value.trim();
    try {
      const r = await rpc('fork_workspace_session', args, sandboxId);
      d.close();
      toast(`forked ${wsId} → ${r.workspace_session_id}`);
      location.hash = `#/session/${sandboxId}/${r.workspace_session_id}`;
    } catch (e) {
      err.textContent = errText(e);
    } finally { ok.disabled = false; }
  }
  // show fills in the source's agent (suffixed) and network profile. (Not
  // d.open: that is the dialog's own open attribute.)
  const show = (s) => {
    agent.value = s.agent ? `${s.agent}-fork` : '';
    profile.value = s.network_profile || 'shared';
    err.textContent = '';
    d.showModal();
  };
  return { el: d, show };
}

// blameView renders content with a gutter: one colour per agent (or owner),
// the owner in each range's first line, command and time on hover.
export function blameView(content, blame, err) {
  const lines = content.split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  const owners = [];
  for (const r of blame?.ranges || []) {
    for (let i = 0; i < r.line_count; i++) owners[r.start_line - 1 + i] = { r, first: i === 0 };
  }
  const rows = lines.map((text, i) => {
    const o = owners[i];
    const who = o ? (o.r.agent || o.r.owner) : '';
    const title = o ? [o.r.owner, o.r.agent && 'agent ' + o.r.agent, o.r.command_session_id && 'command ' + o.r.command_session_id,
      o.r.layer_id && 'layer ' + o.r.layer_id, o.r.ts && new Date(o.r.ts).toLocaleString(), o.r.approximate && 'approximate', o.r.wholesale && 'wholesale'].filter(Boolean).join('\n') : '';
    return h('tr', {},
      h('td', { class: 'gutter' + (o?.first ? ' first' : ''), style: o ? `background:${agentColour(who)}` : null, title,
        dataset: o ? { owner: o.r.owner, agent: o.r.agent || '', command: o.r.command_session_id || '', layer: o.r.layer_id || '' } : {} }, o?.first ? who : ''),
      h('td', { class: 'ln' }, i + 1),
      h('td', { class: 'code' }, text));
  });
  return h('div', {},
    err ? h('p', { class: 'muted small' }, 'no blame: ' + errText(err)) : null,
    h('table', { class: 'blame' }, h('tbody', {}, rows)));
}
