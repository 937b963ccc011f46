// Review & publish: the dry-run plan of publish_workspace_session as a
// review page. Every changed path with its route, planned outcome, diff
// against base and head, and conflict hunks; a strategy per path and a
// default. Publish sends exactly the chosen resolutions; Discard destroys
// the session. After a publish: the new layer and head's blame of the
// touched files. A rejection lists every conflicting path.
import { rpc, debounce } from './api.js';
import { h, clear, toast, badge, confirmDialog, errText } from './ui.js';
import { blameView } from './session.js';

const strategies = ['merge', 'ours', 'theirs', 'reject'];

export function reviewPage(view, [sandboxId, wsId]) {
  const picks = new Map(); // path → strategy chosen on this page
  let defaultStrategy = 'merge';
  let plan = null;
  let diffs = { base: new Map(), head: new Map() };
  let dead = false;

  const head = h('div', { class: 'row', id: 'review-head' });
  const summary = h('div', { id: 'review-summary', class: 'row' });
  const list = h('div', { id: 'review-paths' });
  const result = h('div', { id: 'publish-result' });
  const defSel = h('select', { id: 'default-strategy', onchange: () => { defaultStrategy = defSel.value; replan(); } },
    strategies.map((s) => h('option', { value: s }, s)));
  const publishBtn = h('button', { class: 'primary', id: 'publish', onclick: publish }, 'Publish');
  const discardBtn = h('button', { class: 'danger', id: 'discard', onclick: discard }, 'Discard');
  clear(view,
    h('section', { class: 'card' },
      h('div', { class: 'row' }, h('h2', {}, 'Review ', h('span', { class: 'mono' }, wsId)), head, h('span', { class: 'spacer' }),
        h('label', {}, 'Default strategy ', defSel), publishBtn, discardBtn),
      summary),
    result,
    list);

  function resolutions() {
    return [...picks].map(([path, strategy]) => ({ path, strategy }));
  }

  async function loadDiffs() {
    const [b, hd] = await Promise.all(['base', 'head'].map((against) =>
      rpc('diff_workspace_session', { workspace_session_id: wsId, against }, sandboxId).catch((e) => ({ error: e, files: [] }))));
    diffs = { base: new Map(b.files.map((f) => [f.path, f])), head: new Map(hd.files.map((f) => [f.path, f])), headChanged: new Set(b.head_changed_paths || []) };
  }

  async function replanNow() {
    const args = { workspace_session_id: wsId, dry_run: true, default_strategy: defaultStrategy, resolutions: resolutions() };
    let r;
    try {
      r = await rpc('publish_workspace_session', args, sandboxId);
    } catch (e) {
      clear(summary, h('span', { class: 'bad', id: 'plan-error' }, errText(e)));
      return;
    }
    if (dead) return;
    plan = r;
    render();
  }
  const replan = debounce(replanNow, 150);

  function render() {
    const p = plan.plan;
    const os = plan.publish.outcome_summary || {};
    clear(head, plan.would_commit ? badge('would commit', 'ok') : badge(p.paths.length ? 'would not commit' : 'nothing to publish', 'warn'),
      (plan.active_command_session_ids || []).length ? badge(`${plan.active_command_session_ids.length} commands running`, 'warn') : null);
    clear(summary,
      h('span', { class: 'muted' }, `head revision ${plan.publish.revision?.manifest_version ?? ''} · ${p.paths.length} paths${p.truncated ? ' (truncated)' : ''}:`),
      Object.entries(os).filter(([, n]) => n).map(([k, n]) => badge(`${n} ${k}`)),
      p.conflicts.length ? h('span', { class: 'bad', id: 'conflict-count' }, `${p.conflicts.length} conflicting`) : null);
    clear(list, p.paths.map(pathCard));
    view.dataset.planned = String(Date.now());
  }

  function pathCard(e) {
    const sel = h('select', {
      class: 'strategy', dataset: { path: e.path },
      onchange: () => { if (sel.value === '') picks.delete(e.path); else picks.set(e.path, sel.value); replan(); },
    }, h('option', { value: '' }, `default (${defaultStrategy})`), strategies.map((s) => h('option', { value: s }, s)));
    sel.value = picks.get(e.path) || '';
    const diffBox = h('div', { class: 'diff' });
    let against = 'base';
    const tabs = h('span', { class: 'tabs' }, ['base', 'head'].map((a) => h('button', {
      class: 'link small' + (a === against ? ' active' : ''), onclick: (ev) => {
        against = a;
        tabs.querySelectorAll('button').forEach((b) => b.classList.toggle('active', b === ev.target));
        showDiff();
      },
    }, 'vs ' + a)));
    function showDiff() {
      const f = diffs[against].get(e.path);
      if (!f) { clear(diffBox, h('p', { class: 'muted small' }, 'no diff for this path')); return; }
      if (!f.diff) { clear(diffBox, h('p', { class: 'muted small' }, f.binary ? 'binary or oversized file' : f.diff_truncated ? 'diff left out (size cap)' : `${f.status} ${f.kind}`)); return; }
      renderDiff(diffBox, f.diff);
    }
    showDiff();
    const conflict = e.outcome === 'conflict' || e.outcome === 'protected';
    return h('section', { class: 'card path' + (conflict ? ' conflict' : ''), dataset: { path: e.path, outcome: e.outcome } },
      h('div', { class: 'row' },
        h('span', { class: 'mono path-name' }, e.path), badge(e.change), badge(e.route, e.route === 'ignored' ? 'muted' : ''),
        h('span', { class: 'outcome' }, badge(e.outcome)), e.conflict_reason ? h('span', { class: 'muted small' }, e.conflict_reason) : null,
        diffs.headChanged?.has(e.path) ? h('span', { class: 'warn small', title: 'head changed this path since the session began' }, 'head changed') : null,
        h('span', { class: 'spacer' }), tabs, h('label', {}, 'strategy ', sel)),
      e.hunks?.length ? hunks(e.hunks) : null,
      diffBox);
  }

  function hunks(hs) {
    return h('table', { class: 'hunks' },
      h('thead', {}, h('tr', {}, h('th', {}, 'line'), h('th', {}, 'base'), h('th', {}, 'head (theirs)'), h('th', {}, 'session (ours)'))),
      h('tbody', {}, hs.map((k) => h('tr', { class: 'hunk' },
        h('td', {}, `${k.base_start_line}+${k.base_line_count}`),
        h('td', {}, h('pre', {}, k.base_text)), h('td', {}, h('pre', { class: 'theirs' }, k.head_text)),
        h('td', {}, h('pre', { class: 'ours' }, k.session_text, k.text_truncated ? '\n…' : ''))))));
  }

  async function publish() {
    const res = resolutions();
    publishBtn.disabled = true;
    let r;
    try {
      r = await rpc('publish_workspace_session', { workspace_session_id: wsId, default_strategy: defaultStrategy, resolutions: res }, sandboxId);
    } catch (e) {
      publishBtn.disabled = false;
      showRejected(e);
      return;
    }
    await showPublished(r);
  }

  function showRejected(e) {
    const rej = e.details?.publish_rejection;
    clear(result, h('section', { class: 'card conflict', id: 'rejected' },
      h('h3', {}, 'Publish rejected'), h('p', {}, errText(e)),
      rej ? h('ul', { id: 'rejected-paths' }, (rej.conflicts || []).map((c) => h('li', { dataset: { path: c.path } },
        h('span', { class: 'mono' }, c.path), ' ', badge(c.reason), c.conflict_reason ? ` ${c.conflict_reason}` : '', c.strategy ? ` (strategy ${c.strategy})` : ''))) : null,
      h('p', { class: 'muted' }, 'The session is kept: choose strategies and publish again, or discard it.')));
    replan();
  }

  async function showPublished(r) {
    const pub = r.publish;
    const touched = (plan?.plan.paths || []).filter((p) => p.change === 'write' && p.route === 'source' && p.outcome !== 'theirs').map((p) => p.path).slice(0, 20);
    clear(list);
    clear(head, badge(pub.no_op ? 'published (no-op)' : 'published', 'ok'));
    clear(summary, h('span', {}, `revision ${pub.revision?.manifest_version}`), Object.entries(pub.outcome_summary || {}).filter(([, n]) => n).map(([k, n]) => badge(`${n} ${k}`)));
    publishBtn.disabled = true; discardBtn.disabled = true;
    const layerBox = h('div', { id: 'new-layer' });
    const blameBox = h('div', { id: 'head-blame' });
    clear(result, h('section', { class: 'card', id: 'published' },
      h('h3', {}, 'New layer ', h('span', { class: 'mono', id: 'layer-id' }, pub.layer_id || '(none: no-op)')),
      (pub.resolved_paths || []).length ? h('ul', { id: 'resolved' }, pub.resolved_paths.map((x) => h('li', {}, h('span', { class: 'mono' }, x.path), ' ', badge(x.outcome), ` via ${x.strategy}`))) : null,
      layerBox),
    h('section', { class: 'card' }, h('h3', {}, 'Head blame of the touched files'), blameBox));
    if (pub.layer_id) {
      try {
        const l = await rpc('layerstack', { sandbox_id: sandboxId, layer_id: pub.layer_id }, sandboxId);
        clear(layerBox, h('ul', { class: 'small' }, l.entries.map((x) => h('li', {}, badge(x.kind), ' ', h('span', { class: 'mono' }, x.path)))));
      } catch (e) { clear(layerBox, h('p', { class: 'muted' }, errText(e))); }
    }
    for (const path of touched) {
      try {
        const [f, b] = await Promise.all([rpc('file_read', { path }, sandboxId), rpc('file_blame', { path }, sandboxId)]);
        blameBox.append(h('div', { class: 'head-file', dataset: { path } }, h('h4', { class: 'mono' }, path), blameView(f.content, b)));
      } catch (e) { blameBox.append(h('p', { class: 'muted' }, `${path}: ${errText(e)}`)); }
    }
    view.dataset.published = pub.layer_id || 'no_op';
  }

  async function discard() {
    if (!await confirmDialog(`Discard session ${wsId}? Its unpublished changes are thrown away.`, 'Discard')) return;
    try {
      await rpc('destroy_workspace_session', { workspace_session_id: wsId }, sandboxId);
      toast(`discarded ${wsId}`);
      location.hash = '#/fleet';
    } catch (e) { toast(errText(e), 'error'); }
  }

  loadDiffs().then(replanNow);
  return () => { dead = true; };
}

// renderDiff draws a unified diff with diff2html when it loaded, else as
// plain text. diff2html escapes the diff's text into its markup.
export function renderDiff(box, diff) {
  if (window.Diff2Html) {
    box.innerHTML = window.Diff2Html.html(diff, { drawFileList: false, outputFormat: 'line-by-line', matching: 'none' });
  } else {
    clear(box, h('pre', {}, diff));
  }
}
