// Observability of one sandbox: its sessions, live events with filters, the
// trace waterfall of a request, resource charts, process topology, the
// layer stack with Squash, and the supervisor's health probes.
import { rpc, events, debounce, newest } from './api.js';
import { h, clear, toast, badge, bytes, time, age, errText, confirmDialog, short } from './ui.js';

export function obsPage(view, [sandboxId]) {
  const cleanups = [];
  const head = h('div', { class: 'row', id: 'obs-head' });
  const sessions = h('tbody', { id: 'obs-sessions' });
  const tabsBar = h('nav', { class: 'tabs', id: 'obs-tabs' });
  const pane = h('div', { id: 'obs-pane' });
  clear(view, h('section', { class: 'card' }, head,
    h('table', { class: 'grid small' }, h('thead', {}, h('tr', {}, ['Session', 'Agent', 'State', 'Age', 'Running', ''].map((c) => h('th', {}, c)))), sessions)),
  h('section', { class: 'card' }, tabsBar, pane));

  const headTurn = newest();
  async function refreshHead() {
    const isNewest = headTurn();
    try {
      const [sb, r] = await Promise.all([rpc('inspect_sandbox', { sandbox_id: sandboxId }), rpc('list_workspace_sessions', {}, sandboxId)]);
      if (!isNewest()) return;
      clear(head, h('h2', { class: 'mono' }, sb.id), sb.name ? h('span', {}, sb.name) : null, badge(sb.state),
        h('span', { class: 'muted' }, `${sb.image} · ${sb.overlay_driver} · ${sb.layer_count} layers · ${sb.workspace_root}`));
      clear(sessions, r.workspace_sessions.filter((s) => s.state !== 'destroyed').map((s) => h('tr', {},
        h('td', {}, h('a', { class: 'mono', href: `#/session/${sandboxId}/${s.workspace_session_id}` }, s.workspace_session_id)),
        h('td', {}, s.agent || ''), h('td', {}, badge(s.state)), h('td', {}, age(s.created_at)),
        h('td', {}, (s.active_command_session_ids || []).length),
        h('td', {}, h('a', { href: `#/review/${sandboxId}/${s.workspace_session_id}` }, 'Review')))));
    } catch (e) { clear(head, h('span', { class: 'bad' }, errText(e))); }
  }

  const tabs = { Events: eventsTab, Trace: traceTab, Resources: resourcesTab, Topology: topologyTab, Layers: layersTab, Doctor: doctorTab };
  let tabCleanup = null;
  function show(name) {
    if (tabCleanup) { tabCleanup(); tabCleanup = null; }
    tabsBar.querySelectorAll('button').forEach((b) => b.classList.toggle('active', b.textContent === name));
    clear(pane);
    tabCleanup = tabs[name](pane, sandboxId) || null;
  }
  clear(tabsBar, Object.keys(tabs).map((n) => h('button', { class: 'link', id: 'tab-' + n.toLowerCase(), onclick: () => show(n) }, n)));
  show('Events');
  const refresh = debounce(refreshHead, 300);
  cleanups.push(events.on(({ sandboxId: sb, kind }) => { if (sb === sandboxId || kind === 'truncated') refresh(); }));
  refreshHead();
  return () => { cleanups.forEach((f) => f()); if (tabCleanup) tabCleanup(); };
}

// Events: the newest 200 from the events operation, then live from the
// stream; filter by kind and name substring.
function eventsTab(pane, sandboxId) {
  const rows = h('tbody', { id: 'event-rows' });
  const nameF = h('input', { placeholder: 'name contains', id: 'event-filter' });
  const kindF = h('select', {}, ['', 'event', 'span'].map((k) => h('option', { value: k }, k || 'all kinds')));
  const items = [];
  const paint = () => {
    const n = nameF.value, k = kindF.value;
    clear(rows, items.filter((it) => (!k || it.kind === k) && (!n || String(it.record.name).includes(n))).slice(-300).reverse().map((it) => h('tr', {},
      h('td', {}, time(it.record.ts)), h('td', {}, badge(it.kind)), h('td', { class: 'mono' }, it.record.name),
      h('td', {}, it.record.dur_ms !== undefined ? it.record.dur_ms + ' ms' : ''), h('td', {}, it.record.status || ''),
      h('td', { class: 'mono small' }, h('a', { href: '#', onclick: (e) => { e.preventDefault(); traceTab(clear(pane), sandboxId, it.record.trace); } }, short(it.record.trace))),
      h('td', { class: 'mono small attrs' }, JSON.stringify(it.record.attrs || {}).slice(0, 200)))));
  };
  const repaint = debounce(paint, 100);
  nameF.addEventListener('input', repaint); kindF.addEventListener('change', paint);
  clear(pane, h('div', { class: 'row' }, nameF, kindF),
    h('table', { class: 'grid small' }, h('thead', {}, h('tr', {}, ['Time', 'Kind', 'Name', 'Duration', 'Status', 'Trace', 'Attributes'].map((c) => h('th', {}, c)))), rows));
  rpc('events', { sandbox_id: sandboxId, last_n: 200 }, sandboxId).then((r) => {
    for (const rec of r.events) items.push({ kind: rec.kind || 'event', record: rec });
    paint();
  }).catch((e) => toast(errText(e), 'error'));
  return events.onAny((it) => {
    if (it.sandboxId !== sandboxId) return;
    items.push(it);
    if (items.length > 2000) items.splice(0, items.length - 2000);
    repaint();
  });
}

// Trace: a waterfall of one request's spans (the last one by default).
function traceTab(pane, sandboxId, traceId = 'last') {
  const input = h('input', { value: traceId, id: 'trace-id', size: 40 });
  const box = h('div', { class: 'waterfall' });
  async function load() {
    try {
      const r = await rpc('trace', { sandbox_id: sandboxId, trace_id: input.value || 'last' }, sandboxId);
      const flat = [];
      const walk = (n, depth) => { flat.push({ n, depth }); for (const c of n.children || []) walk(c, depth + 1); };
      for (const s of r.spans) walk(s, 0);
      const total = Math.max(1, ...flat.map(({ n }) => n.offset_ms + (n.span.dur_ms || 0)));
      clear(box, h('p', { class: 'muted' }, r.trace ? `trace ${r.trace} · ${total} ms` : 'no traces yet'),
        flat.map(({ n, depth }) => {
          const bar = h('div', { class: 'bar ' + (n.span.status || '') });
          bar.style.marginLeft = (100 * n.offset_ms / total) + '%';
          bar.style.width = Math.max(0.5, 100 * (n.span.dur_ms || 0) / total) + '%';
          return h('div', { class: 'span-row', title: JSON.stringify(n.span.attrs || {}) },
            h('span', { class: 'span-name', style: `padding-left:${depth}em` }, n.span.name, ` ${n.span.dur_ms} ms`),
            h('div', { class: 'track' }, bar));
        }));
    } catch (e) { clear(box, h('p', { class: 'bad' }, errText(e))); }
  }
  clear(pane, h('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); load(); } }, 'Trace id ', input, h('button', {}, 'Show')), box);
  load();
}

// Resources: CPU, memory, I/O and pids of the sandbox over the window, as
// uPlot charts.
function resourcesTab(pane, sandboxId) {
  const box = h('div', { class: 'charts' });
  clear(pane, box);
  let plots = [];
  rpc('resources', { sandbox_id: sandboxId, window_ms: 600000 }, sandboxId)
    .then((r) => { plots = charts(box, r); })
    .catch((e) => clear(box, h('p', { class: 'bad' }, errText(e))));
  return () => plots.forEach((p) => p.destroy());
}

// charts draws one small uPlot chart per numeric CPU, memory, I/O and pids
// metric of a resources/cgroup series; it returns the plots to destroy.
export function charts(box, r) {
  if (!r.series?.length) {
    clear(box, h('p', { class: 'muted' }, `no samples yet (${r.availability}) ${(r.errors || []).join('; ')}`));
    return [];
  }
  const ts = r.series.map((s) => s.ts / 1000);
  const keys = new Set();
  for (const s of r.series) for (const [k, v] of Object.entries({ ...s.metrics, ...s.deltas })) if (typeof v === 'number') keys.add(k);
  const pick = [...keys].filter((k) => /cpu|mem|io|pids|bytes/.test(k)).slice(0, 8);
  const plots = [];
  clear(box);
  for (const k of pick) {
    const ys = r.series.map((s) => (s.deltas?.[k] ?? s.metrics?.[k] ?? null));
    const el = h('div', { class: 'chart', dataset: { metric: k } });
    box.append(el);
    if (window.uPlot) {
      plots.push(new window.uPlot({ title: k, width: 380, height: 160, series: [{}, { label: k, stroke: '#2a6fdb' }] }, [ts, ys], el));
    } else {
      el.textContent = `${k}: ${ys[ys.length - 1]}`;
    }
  }
  return plots;
}

function topologyTab(pane, sandboxId) {
  rpc('topology', { sandbox_id: sandboxId }, sandboxId).then((r) => {
    const t = r.topology;
    clear(pane, !t.available ? h('p', { class: 'muted' }, t.error || 'unavailable') : null,
      t.workspaces.length ? null : h('p', { class: 'muted', id: 'topology-empty' }, 'No session holds processes now.'),
      (t.warnings || []).map((w) => h('p', { class: 'warn small' }, w)),
      t.workspaces.map((w) => h('div', {}, h('h4', { class: 'mono' }, w.workspace_id, ' ', badge(w.state), ` holder ${w.holder_pid ?? '–'}`),
        h('table', { class: 'grid small' }, h('thead', {}, h('tr', {}, ['PID', 'ns PID', 'Parent', 'Name', 'State', 'RSS', 'CPU'].map((c) => h('th', {}, c)))),
          h('tbody', {}, w.processes.map((p) => h('tr', { class: p.kind }, h('td', {}, p.pid), h('td', {}, p.namespace_pid), h('td', {}, p.parent_pid),
            h('td', { class: 'mono' }, p.name), h('td', {}, p.state), h('td', {}, bytes(p.resident_memory_bytes)), h('td', {}, p.cpu_time_us !== undefined ? (p.cpu_time_us / 1e6).toFixed(2) + ' s' : ''))))))));
  }).catch((e) => clear(pane, h('p', { class: 'bad' }, errText(e))));
}

function layersTab(pane, sandboxId) {
  async function load() {
    try {
      const r = await rpc('layerstack', { sandbox_id: sandboxId }, sandboxId);
      clear(pane, h('div', { class: 'row' }, h('span', {}, `manifest v${r.manifest_version} · ${r.layers.length} layers · ${bytes(r.total_bytes)} · ${r.active_lease_count} leases`),
        h('span', { class: 'spacer' }), h('button', { id: 'squash', onclick: squash }, 'Squash')),
      h('table', { class: 'grid small', id: 'layers' }, h('thead', {}, h('tr', {}, ['Layer (newest first)', 'Size', 'Allocated', 'Leased by', 'Booked by'].map((c) => h('th', {}, c)))),
        h('tbody', {}, r.layers.map((l) => h('tr', {}, h('td', { class: 'mono' }, l.layer_id), h('td', {}, bytes(l.bytes)), h('td', {}, bytes(l.allocated_bytes)),
          h('td', {}, (l.leased_by_workspaces || []).length), h('td', { class: 'small' }, (l.booked_by || []).join(', ')))))));
    } catch (e) { clear(pane, h('p', { class: 'bad' }, errText(e))); }
  }
  async function squash() {
    if (!await confirmDialog('Squash the layer stack of ' + sandboxId + '? Live sessions keep their view.', 'Squash')) return;
    try {
      const r = await rpc('squash_layerstacks', { sandbox_id: sandboxId });
      toast(`squashed ${r.squashed_blocks.length} blocks; manifest v${r.manifest_version}`);
    } catch (e) { toast(errText(e), 'error'); }
    load();
  }
  load();
}

// Doctor: the host diagnosis of `sandbox-supervisor doctor` (GET
// /api/doctor: every check, required or not, with the exact fix), under the
// supervisor's health line.
function doctorTab(pane) {
  const report = fetch('/api/doctor', { credentials: 'same-origin', cache: 'no-store' }).then((resp) => {
    if (!resp.ok) throw new Error(`doctor: HTTP ${resp.status}`);
    return resp.json();
  });
  Promise.all([rpc('health'), report]).then(([r, d]) => {
    clear(pane, h('p', {}, 'Supervisor ', badge(r.status), ` ${r.version} · up ${Math.round(r.uptime_s)} s · kernel ${r.kernel} · ${r.counts?.sandboxes} sandboxes, ${r.counts?.workspace_sessions} sessions, ${r.counts?.running_commands} commands`),
      h('p', {}, 'Host ', d.ok ? h('span', { class: 'ok' }, 'ready') : h('span', { class: 'bad' }, 'a required check fails')),
      h('table', { class: 'grid small', id: 'doctor' },
        h('thead', {}, h('tr', {}, h('th', {}, 'check'), h('th', {}, ''), h('th', {}, 'detail'), h('th', {}, 'fix'))),
        h('tbody', {}, (d.checks || []).map((c) => h('tr', { 'data-check': c.id },
          h('td', {}, c.id + (c.required ? '' : ' (optional)')),
          h('td', {}, c.ok ? h('span', { class: 'ok' }, 'pass') : h('span', { class: c.required ? 'bad' : 'muted' }, 'fail')),
          h('td', { class: 'small' }, c.detail || ''),
          h('td', { class: 'small' }, c.ok ? '' : h('code', {}, c.fix || '')))))));
  }).catch((e) => clear(pane, h('p', { class: 'bad' }, errText(e))));
}

