// Fleet: every sandbox with its state, image, overlay driver, layer count
// and live sessions, updated from the event stream; create and destroy.
import { rpc, events, debounce, newest } from './api.js';
import { h, clear, toast, confirmDialog, age, bytes, badge, errText } from './ui.js';

export function fleetPage(view) {
  const table = h('tbody', { id: 'fleet-rows' });
  const summary = h('span', { id: 'fleet-summary', class: 'muted' });
  const form = createForm(() => refreshAll());
  clear(view,
    h('section', { class: 'card' },
      h('div', { class: 'row' }, h('h2', {}, 'Sandboxes'), summary,
        h('button', { id: 'new-sandbox', onclick: () => form.toggleAttribute('hidden') }, 'New sandbox')),
      form,
      h('table', { class: 'grid', id: 'fleet' },
        h('thead', {}, h('tr', {}, ['Sandbox', 'State', 'Image', 'Overlay', 'Layers', 'Sessions', 'Health', ''].map((c) => h('th', {}, c)))),
        table)));

  const rows = new Map(); // sandbox id → {tr, sess}
  let gen = 0;

  async function refreshAll() {
    const g = ++gen;
    let list;
    try {
      list = (await rpc('list_sandboxes')).sandboxes;
    } catch (e) { toast(errText(e), 'error'); return; }
    if (g !== gen) return;
    const seen = new Set();
    for (const sb of list) {
      if (sb.state === 'stopped') continue;
      seen.add(sb.id);
      renderSandbox(sb);
    }
    for (const [id, r] of rows) if (!seen.has(id)) { r.tr.remove(); r.sess.remove(); rows.delete(id); }
    summary.textContent = `${seen.size} sandboxes · ${[...rows.values()].reduce((n, r) => n + r.count, 0)} live sessions`;
    view.dataset.rendered = String(Date.now());
  }

  function renderSandbox(sb) {
    let r = rows.get(sb.id);
    if (!r) {
      r = { tr: h('tr', { class: 'sandbox', dataset: { sandboxId: sb.id } }), sess: h('tr', { class: 'sessions' }), count: 0, sb, sessTurn: newest(), oneTurn: newest() };
      rows.set(sb.id, r);
      table.append(r.tr, r.sess);
      refreshSessions(sb.id);
    }
    r.sb = sb;
    clear(r.tr,
      h('td', {}, h('a', { href: '#/obs/' + sb.id, class: 'mono' }, sb.id), sb.name ? h('div', { class: 'muted' }, sb.name) : null,
        h('div', { class: 'muted small' }, sb.workspace_root)),
      h('td', {}, badge(sb.state)),
      h('td', { class: 'mono small' }, sb.image),
      h('td', {}, sb.overlay_driver),
      h('td', {}, sb.layer_count),
      h('td', { class: 'session-count' }, (sb.live_workspace_sessions || []).length),
      h('td', {}, sb.error ? h('span', { class: 'bad', title: sb.error }, 'failed') : health(sb)),
      h('td', {}, h('button', { class: 'danger destroy', onclick: () => destroy(sb) }, 'Destroy')));
  }

  function health(sb) {
    const rp = sb.resource_profile || {};
    const arts = (sb.recovery_artifacts || []).length;
    return h('span', {}, sb.state === 'ready' ? h('span', { class: 'ok' }, 'ok') : sb.state,
      rp.enforced === false ? h('span', { class: 'muted small', title: 'cgroups are not delegated: limits are not enforced' }, ' · no limits') : null,
      arts ? h('span', { class: 'warn small' }, ` · ${arts} recovery artifacts`) : null);
  }

  async function refreshSessions(id) {
    const r = rows.get(id);
    if (!r) return;
    const isNewest = r.sessTurn();
    let list;
    try {
      list = (await rpc('list_workspace_sessions', {}, id)).workspace_sessions;
    } catch (e) {
      if (isNewest()) clear(r.sess, h('td', { colspan: 8, class: 'muted' }, errText(e)));
      return;
    }
    if (!isNewest() || rows.get(id) !== r) return;
    const live = list.filter((s) => s.state !== 'destroyed' && s.state !== 'published');
    r.count = live.length;
    const agent = h('input', { placeholder: 'agent label', class: 'agent-input', size: 12 });
    clear(r.sess, h('td', { colspan: 8 },
      h('table', { class: 'inner' },
        h('tbody', {}, live.map((s) => h('tr', { class: 'session', dataset: { sessionId: s.workspace_session_id } },
          h('td', {}, h('a', { href: `#/session/${id}/${s.workspace_session_id}`, class: 'mono' }, s.workspace_session_id)),
          h('td', {}, s.agent ? h('span', { class: 'agent' }, s.agent) : h('span', { class: 'muted' }, s.finalize_policy === 'publish_then_destroy' ? 'implicit' : '—')),
          h('td', {}, badge(s.state)),
          h('td', { title: s.created_at }, age(s.created_at)),
          h('td', {}, `${(s.active_command_session_ids || []).length} running`),
          h('td', { class: 'changed', title: 'paths the session changed (diff against its base)' }, changedCount(id, s)),
          h('td', { title: 'upper dir size: what the session changed' }, bytes(s.upper_bytes)),
          h('td', {}, s.network_profile),
          h('td', {}, h('a', { href: `#/review/${id}/${s.workspace_session_id}`, class: 'review-link' }, 'Review')))))),
      h('div', { class: 'row small' }, agent,
        h('button', {
          onclick: async () => {
            try {
              await rpc('create_workspace_session', agent.value ? { agent: agent.value } : {}, id);
              refreshSessions(id);
            } catch (e) { toast(errText(e), 'error'); }
          },
        }, 'New session'))));
    summary.textContent = `${rows.size} sandboxes · ${[...rows.values()].reduce((n, x) => n + x.count, 0)} live sessions`;
  }

  async function destroy(sb) {
    const ok = await confirmDialog(`Destroy sandbox ${sb.id}${sb.name ? ' (' + sb.name + ')' : ''}? Its ${(sb.live_workspace_sessions || []).length} live sessions and unpublished work are discarded; the host workspace is untouched.`, 'Destroy');
    if (!ok) return;
    try {
      await rpc('destroy_sandbox', { sandbox_id: sb.id });
      toast(`destroyed ${sb.id}`);
    } catch (e) { toast(errText(e), 'error'); }
    refreshAll();
  }

  // Re-fetch only what an event names: a sandbox's sessions for its own
  // records, the list for management operations and system records.
  const pending = new Set();
  let all = false;
  const flush = debounce(() => {
    if (all) { all = false; refreshAll(); }
    for (const id of pending) { if (rows.has(id)) { refreshSessions(id); refreshOne(id); } }
    pending.clear();
  }, 150);
  async function refreshOne(id) {
    const isNewest = rows.get(id).oneTurn();
    try {
      const sb = await rpc('inspect_sandbox', { sandbox_id: id });
      if (isNewest() && rows.has(id)) renderSandbox(sb);
    } catch { all = true; flush(); }
  }
  const off = events.on(({ sandboxId, record }) => {
    const op = record?.attrs?.op;
    if (!sandboxId || op === 'create_sandbox' || op === 'destroy_sandbox' || !rows.has(sandboxId)) all = true;
    else pending.add(sandboxId);
    flush();
  });
  refreshAll();
  return () => { off(); gen++; };
}

// changedCount fills in a session's changed-path count after the row is
// drawn: one diff_workspace_session each (max_bytes 1: only the list is
// wanted), at most four at a time so a large fleet does not queue up the
// supervisor behind the page.
const diffQueue = [];
let diffRunning = 0;
function changedCount(sandboxId, s) {
  const cell = h('span', { class: 'muted' }, '…');
  diffQueue.push(async () => {
    if (!cell.isConnected) return;
    try {
      const r = await rpc('diff_workspace_session', { workspace_session_id: s.workspace_session_id, max_bytes: 1 }, sandboxId);
      cell.textContent = `${r.files.length}${r.truncated && r.files.length >= 10000 ? '+' : ''} changed`;
      cell.className = '';
    } catch { cell.textContent = '–'; }
  });
  setTimeout(pump, 0); // after the row is in the page
  return cell;
}
function pump() {
  while (diffRunning < 4 && diffQueue.length) {
    const job = diffQueue.shift();
    diffRunning++;
    job().finally(() => { diffRunning--; pump(); });
  }
}

// createForm: workspace picker (list_workspace_directories), image
// (list_docker_images + host), overlay, name.
function createForm(done) {
  const path = h('input', { id: 'ws-path', placeholder: '/abs/path/to/workspace', size: 50 });
  const dirs = h('ul', { class: 'dirs' });
  const image = h('select', { id: 'ws-image' }, h('option', { value: 'host' }, 'host'));
  const overlay = h('select', { id: 'ws-overlay' }, ['auto', 'kernel', 'fuse'].map((o) => h('option', { value: o }, o)));
  const name = h('input', { id: 'ws-name', placeholder: 'name (optional)' });
  async function browse(p) {
    try {
      const r = await rpc('list_workspace_directories', p ? { path: p } : {});
      if (p) path.value = p;
      clear(dirs,
        r.parent ? h('li', {}, h('a', { href: '#', onclick: (e) => { e.preventDefault(); browse(r.parent); } }, '⬑ ..')) : null,
        r.directories.map((d) => h('li', {}, h('a', { href: '#', onclick: (e) => { e.preventDefault(); browse(d.path); } }, d.name + '/'))),
        r.truncated ? h('li', { class: 'muted' }, '… more') : null);
    } catch (e) { toast(errText(e), 'error'); }
  }
  const form = h('form', {
    class: 'create', hidden: true, id: 'create-form',
    onsubmit: async (e) => {
      e.preventDefault();
      const args = { workspace_root: path.value, image: image.value, overlay: overlay.value };
      if (name.value) args.name = name.value;
      const btn = form.querySelector('button[type=submit]');
      btn.disabled = true;
      try {
        const rec = await rpc('create_sandbox', args);
        toast(`created ${rec.id}`);
        form.setAttribute('hidden', '');
        done();
      } catch (err) { toast(errText(err), 'error'); } finally { btn.disabled = false; }
    },
  },
  h('label', {}, 'Workspace ', path, h('button', { type: 'button', onclick: () => browse(path.value || null) }, 'Browse')),
  dirs,
  h('label', {}, 'Image ', image), h('label', {}, 'Overlay ', overlay), h('label', {}, 'Name ', name),
  h('button', { type: 'submit', class: 'primary' }, 'Create'));
  rpc('list_docker_images').then((r) => {
    for (const i of r.images || []) image.append(h('option', { value: i }, i));
    if (r.docker === 'unavailable') image.title = 'Docker: ' + (r.error || 'unavailable');
  }).catch(() => {});
  return form;
}
