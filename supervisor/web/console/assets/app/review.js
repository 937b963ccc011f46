// Review & publish, and the session page's Sync: both are the publish
// planner's dry-run plan shown for review. Every changed path with its
// route, planned outcome, diff against base and head, and conflict hunks;
// a strategy per path and a default. The action sends exactly the chosen
// resolutions; a rejection lists every conflicting path. One component,
// planner(), does this for either operation; a mode says which operation,
// which actions and what a success shows.
//
// Review page: Publish (the session ends), "Publish and keep working"
// (keep:true: the session goes on over the new head), Discard. After a
// publish: the new layer and head's blame of the touched files.
// Sync (session page): the session moves onto the current head; after it,
// the caller refreshes what the session shows.
import { rpc, events, debounce } from './api.js';
import { h, clear, toast, badge, confirmDialog, errText } from './ui.js';
import { blameView } from './session.js';

const strategies = ['merge', 'ours', 'theirs', 'reject'];

// Element ids per mode: the review page keeps the ids it always had; the
// sync panel lives on the session page, so its ids are prefixed.
const reviewIds = {
  head: 'review-head', summary: 'review-summary', paths: 'review-paths', result: 'publish-result',
  def: 'default-strategy', rejected: 'rejected', rejectedPaths: 'rejected-paths',
  conflictCount: 'conflict-count', planError: 'plan-error', base: 'review-base',
};
const syncIds = Object.fromEntries(Object.entries(reviewIds).map(([k, v]) => [k, 'sync-' + v.replace(/^(review|publish)-/, '')]));

const modes = {
  publish: {
    op: 'publish_workspace_session', key: 'publish', ids: reviewIds, verb: 'Publish',
    actions: [
      { id: 'publish', label: 'Publish', args: {}, cls: 'primary' },
      { id: 'publish-keep', label: 'Publish and keep working', args: { keep: true },
        title: 'publish, then go on in this session over the new head (same id, processes and holder)' },
    ],
  },
  sync: {
    op: 'sync_workspace_session', key: 'sync', ids: syncIds, verb: 'Sync',
    actions: [{ id: 'sync-apply', label: 'Sync', args: {}, cls: 'primary',
      title: 'move the session onto the current head with these strategies' }],
  },
};

// planner builds the plan/strategy/resolution UI for one session.
// mode: 'publish' or 'sync'. onDone(result, action) runs after a successful
// action. extra: more controls for the toolbar (the review page's
// Discard). Returns {el, refresh, stop}.
export function planner({ sandboxId, wsId, mode: modeName, onDone = () => {}, extra = [] }) {
  const mode = modes[modeName];
  const ids = mode.ids;
  const picks = new Map(); // path → strategy chosen here
  let defaultStrategy = 'merge';
  let plan = null;
  let diffs = { base: new Map(), head: new Map(), headChanged: new Set() };
  let stopped = false;
  let closed = false; // the session ended (published without keep)

  const head = h('div', { class: 'row', id: ids.head });
  const base = h('span', { class: 'muted', id: ids.base });
  const summary = h('div', { id: ids.summary, class: 'row' });
  const list = h('div', { id: ids.paths });
  const result = h('div', { id: ids.result });
  const defSel = h('select', { id: ids.def, onchange: () => { defaultStrategy = defSel.value; replan(); } },
    strategies.map((s) => h('option', { value: s }, s)));
  const buttons = mode.actions.map((a) => h('button', { class: a.cls || '', id: a.id, title: a.title, onclick: () => act(a) }, a.label));
  const el = h('div', { class: 'planner', dataset: { mode: modeName } },
    h('section', { class: 'card' },
      h('div', { class: 'row' }, head, base, h('span', { class: 'spacer' }),
        h('label', {}, 'Default strategy ', defSel), buttons, extra),
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
    const rev = b.base_revision;
    clear(base, rev ? h('span', { dataset: { manifestVersion: rev.manifest_version, layerCount: rev.layer_count } },
      `base revision ${rev.manifest_version}`) : null,
    ' · ', h('span', { class: 'changed-count', dataset: { count: b.error ? '' : b.files.length } },
      b.error ? '–' : `${b.files.length}${b.truncated ? '+' : ''} changed`));
  }

  async function replanNow() {
    if (closed || stopped) return;
    const args = { workspace_session_id: wsId, dry_run: true, default_strategy: defaultStrategy, resolutions: resolutions() };
    let r;
    try {
      r = await rpc(mode.op, args, sandboxId);
    } catch (e) {
      if (!stopped) clear(summary, h('span', { class: 'bad', id: ids.planError }, errText(e)));
      return;
    }
    if (stopped || closed) return;
    plan = r;
    render();
  }
  const replan = debounce(replanNow, 150);

  // refresh re-reads the diffs and plans again (after an action, or when
  // an event says the session or head changed).
  async function refreshNow() {
    if (closed || stopped) return;
    await loadDiffs();
    await replanNow();
  }

  function render() {
    const p = plan.plan;
    const out = plan[mode.key] || {};
    const os = out.outcome_summary || {};
    const wouldCommit = plan.would_commit ?? (p.paths.length > 0 && !p.conflicts.length);
    // A path can be dropped from the plan (published, or synced away):
    // its pick would be an unknown resolution path.
    const planned = new Set(p.paths.map((x) => x.path));
    for (const k of picks.keys()) if (!planned.has(k)) picks.delete(k);
    clear(head, verdict(p, wouldCommit),
    (plan.active_command_session_ids || []).length ? badge(`${plan.active_command_session_ids.length} commands running`, 'warn') : null);
    const headRev = p.head_revision?.manifest_version ?? out.revision?.manifest_version ?? out.base_revision?.manifest_version ?? '';
    clear(summary,
      h('span', { class: 'muted' }, `head revision ${headRev} · ${p.paths.length} paths${p.truncated ? ' (truncated)' : ''}:`),
      Object.entries(os).filter(([, n]) => n).map(([k, n]) => badge(`${n} ${k}`)),
      p.conflicts.length ? h('span', { class: 'bad', id: ids.conflictCount }, `${p.conflicts.length} conflicting`) : null,
      gitRefs(p.git_refs || []));
    clear(list, p.paths.map(pathCard));
    el.dataset.planned = String(Date.now());
  }

  // gitRefs shows what happens to the session's git refs (contract A8)
  // and the session's own commits they carry.
  function gitRefs(refs) {
    if (!refs.length) return null;
    return h('ul', { class: 'git-refs' }, refs.map((r) => h('li', {},
      h('span', {}, `git ${r.ref}: ${r.action}${r.note ? ` (${r.note})` : ''}`),
      (r.session_commits || []).length ? h('ul', { class: 'git-commits' }, r.session_commits.map((c) =>
        h('li', { class: 'muted' }, `${c.commit.slice(0, 12)} ${c.subject} (${c.author})`))) : null)));
  }

  // verdict says what the action would do. A sync moves the base even
  // when the session changed nothing, so it is judged by its conflicts.
  function verdict(p, wouldCommit) {
    const verb = mode.verb.toLowerCase();
    if (p.conflicts.length) return badge(`would not ${verb}`, 'warn');
    if (modeName === 'sync') {
      const from = p.base_revision?.manifest_version;
      const to = p.head_revision?.manifest_version;
      return from === to ? badge('already on the head', 'warn') : badge(`would sync onto revision ${to}`, 'ok');
    }
    if (wouldCommit) return badge('would commit', 'ok');
    return badge(p.paths.length ? `would not ${verb}` : `nothing to ${verb}`, 'warn');
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

  // touchedBy lists the paths a plan writes (for the head blame after a
  // publish).
  function touchedBy(pl) {
    return (pl?.plan.paths || []).filter((p) => p.change === 'write' && p.route === 'source' && p.outcome !== 'theirs').map((p) => p.path);
  }

  function setBusy(busy) { for (const b of buttons) b.disabled = busy || closed; }

  async function act(action) {
    const args = { workspace_session_id: wsId, default_strategy: defaultStrategy, resolutions: resolutions(), ...action.args };
    const reviewed = plan; // what the person saw when they chose
    setBusy(true);
    let r;
    try {
      r = await rpc(mode.op, args, sandboxId);
    } catch (e) {
      setBusy(false);
      showRejected(e);
      return;
    }
    // Without keep a publish closes the session: nothing left to plan.
    closed = modeName === 'publish' && r.destroyed !== false;
    picks.clear();
    try {
      await onDone(r, action, { result, list, summary, head, touched: touchedBy(reviewed) });
    } finally {
      setBusy(false);
      if (!closed) await refreshNow();
    }
  }

  function showRejected(e) {
    const d = e.details || {};
    // A sync (and publish's) rejection is publish_rejection (contract A4).
    const rej = d.publish_rejection;
    // keep:true whose publish went through but whose move onto the new head
    // did not: the layer exists; the session is still on its old base.
    const published = d.publish_completed === true;
    clear(result, h('section', { class: 'card conflict', id: ids.rejected, dataset: { publishCompleted: String(published) } },
      h('h3', {}, published ? 'Published, but the session could not go on over the new head' : `${mode.verb} ${rej ? 'rejected' : 'failed'}`),
      h('p', {}, errText(e)),
      (d.pinned_command_session_ids || []).length ? h('p', {}, 'Commands using /workspace: ', d.pinned_command_session_ids.map((c) => h('span', { class: 'mono' }, c + ' '))) : null,
      rej ? h('ul', { id: ids.rejectedPaths }, (rej.conflicts || []).map((c) => h('li', { dataset: { path: c.path } },
        h('span', { class: 'mono' }, c.path), ' ', badge(c.reason), c.conflict_reason ? ` ${c.conflict_reason}` : '', c.strategy ? ` (strategy ${c.strategy})` : ''))) : null,
      h('p', { class: 'muted' }, published ? `Layer ${d.publish?.layer_id ?? ''} was published. ${d.recovery_operation ? `Recover with ${d.recovery_operation}.` : ''}`
        : modeName === 'sync' ? 'Nothing changed in the session: choose strategies and sync again.'
          : 'The session is kept: choose strategies and publish again, or discard it.')));
    replan();
  }

  // An event about this sandbox (an agent's command, another publish) may
  // change the plan: plan again, coalesced.
  const onEvent = debounce(() => refreshNow(), 400);
  const off = events.on(({ sandboxId: sb, kind }) => { if (sb === sandboxId || kind === 'truncated') onEvent(); });

  refreshNow();
  return {
    el,
    refresh: refreshNow,
    stop: () => { stopped = true; off(); },
  };
}

export function reviewPage(view, [sandboxId, wsId]) {
  const discardBtn = h('button', { class: 'danger', id: 'discard', onclick: discard }, 'Discard');
  const p = planner({ sandboxId, wsId, mode: 'publish', extra: [discardBtn], onDone: showPublished });
  clear(view, h('h2', {}, 'Review ', h('span', { class: 'mono' }, wsId)), p.el);
  let count = 0;

  async function showPublished(r, action, { result, list, summary, head, touched }) {
    const pub = r.publish;
    const kept = !!action.args.keep && r.destroyed === false;
    count++;
    if (!kept) {
      discardBtn.disabled = true;
      clear(head, badge(pub.no_op ? 'published (no-op)' : 'published', 'ok'));
      clear(summary, h('span', {}, `revision ${pub.revision?.manifest_version}`), Object.entries(pub.outcome_summary || {}).filter(([, n]) => n).map(([k, n]) => badge(`${n} ${k}`)));
      clear(list);
    }
    const layerBox = h('div', { id: 'new-layer' });
    const blameBox = h('div', { id: 'head-blame' });
    clear(result, h('section', { class: 'card', id: 'published', dataset: { kept: String(kept), count: String(count) } },
      h('h3', {}, kept ? 'Published, and the session goes on: new layer ' : 'New layer ', h('span', { class: 'mono', id: 'layer-id' }, pub.layer_id || '(none: no-op)')),
      kept ? h('p', { class: 'muted', id: 'kept' }, `The session ${wsId} continues over revision ${pub.revision?.manifest_version ?? ''} with no changes of its own; work on and publish again.`) : null,
      (pub.resolved_paths || []).length ? h('ul', { id: 'resolved' }, pub.resolved_paths.map((x) => h('li', {}, h('span', { class: 'mono' }, x.path), ' ', badge(x.outcome), ` via ${x.strategy}`))) : null,
      layerBox),
    h('section', { class: 'card' }, h('h3', {}, 'Head blame of the touched files'), blameBox));
    if (pub.layer_id) {
      try {
        const l = await rpc('layerstack', { sandbox_id: sandboxId, layer_id: pub.layer_id }, sandboxId);
        clear(layerBox, h('ul', { class: 'small' }, l.entries.map((x) => h('li', {}, badge(x.kind), ' ', h('span', { class: 'mono' }, x.path)))));
      } catch (e) { clear(layerBox, h('p', { class: 'muted' }, errText(e))); }
    }
    for (const path of touched.slice(0, 20)) {
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

  return () => p.stop();
}

// renderDiff draws a unified diff with diff2html when it loaded, else as
// plain text. diff2html escapes the diff's text into its markup.
export function renderDiff(box, diff) {
  if (window.Diff2Html) {
    box.innerHTML = window.Diff2Html.html(diff, { drawFileList: false, outputFormat: 'line-by-line', matching: 'none' });
    // diff2html unquotes a git-quoted name and turns its backslashes into
    // slashes, so "a\nb" would read as the path a/nb: show the name as the
    // header has it (quoted as git quotes it), as text.
    const m = /^\+\+\+ (.*)$/m.exec(diff);
    if (m) {
      const shown = m[1].startsWith('"b/') ? '"' + m[1].slice(3) : m[1].replace(/^b\//, '');
      box.querySelectorAll('.d2h-file-name').forEach((e) => { e.textContent = shown; });
    }
  } else {
    clear(box, h('pre', {}, diff));
  }
}
