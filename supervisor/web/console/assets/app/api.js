// The console's only ways to the supervisor: POST /api/rpc (one request
// object, exactly as on the socket) and the SSE streams. The es_ui cookie
// (HttpOnly) authenticates; the page never sees the token.

export class RPCError extends Error {
  constructor(env) {
    super(env.message);
    this.kind = env.kind;
    this.details = env.details || {};
  }
}

let seq = 0;
const tab = Math.random().toString(36).slice(2, 8);

// rpc runs one operation. sandboxId selects sandbox scope; management
// operations take their sandbox as an argument and use system scope.
export async function rpc(op, args = {}, sandboxId = null) {
  const req = {
    op,
    request_id: `ui-${tab}-${++seq}`,
    scope: sandboxId ? { kind: 'sandbox', sandbox_id: sandboxId } : { kind: 'system' },
    args,
  };
  const resp = await fetch('/api/rpc', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(req),
    credentials: 'same-origin',
    cache: 'no-store',
  });
  let body;
  try {
    body = await resp.json();
  } catch {
    throw new RPCError({ kind: 'protocol_error', message: `HTTP ${resp.status} without a JSON body` });
  }
  if (resp.status === 401) {
    showLoggedOut();
  }
  if (body && body.error) throw new RPCError(body.error);
  return body;
}

function showLoggedOut() {
  const v = document.getElementById('view');
  if (v && !v.dataset.loggedOut) {
    v.dataset.loggedOut = '1';
    v.textContent = 'Not logged in: open the login URL that `sandbox-supervisor ui` prints.';
  }
}

// Operations whose span only says something was read: the events they
// produce (the console's own reads included) must not trigger re-fetches,
// or every refresh would cause the next.
const readOnly = new Set([
  'list_sandboxes', 'inspect_sandbox', 'list_docker_images', 'list_workspace_directories',
  'list_workspace_sessions', 'list_commands', 'read_command_lines', 'file_read', 'file_list',
  'file_blame', 'diff_workspace_session', 'export_changes',
]);

// Events is one shared /api/events stream for the page. Listeners get
// {sandboxId, kind, record}; records about reads are filtered out.
// EventSource resumes with Last-Event-ID by itself after a reconnect.
class Events {
  constructor() {
    this.listeners = new Set();
    this.raw = new Set();
    this.es = null;
    this.lastSeq = 0;
  }
  start() {
    if (this.es) return;
    // After a drop the new stream resumes after the last record seen.
    const es = new EventSource('/api/events' + (this.lastSeq ? `?last_event_id=${this.lastSeq}` : ''));
    this.es = es;
    const live = document.getElementById('live');
    es.addEventListener('ready', () => { live.textContent = '● live'; live.className = 'live on'; });
    es.onerror = () => { live.textContent = '○ reconnecting'; live.className = 'live off'; };
    es.addEventListener('dropped', () => { es.close(); this.es = null; setTimeout(() => this.start(), 500); });
    // Records were lost to the replay cap: what is shown may be stale, so
    // every page re-fetches everything (a record without a sandbox does).
    es.addEventListener('truncated', () => { for (const f of this.listeners) f({ seq: this.lastSeq, sandboxId: null, kind: 'truncated', record: {} }); });
    const handle = (ev) => {
      this.lastSeq = Number(ev.lastEventId) || this.lastSeq;
      let m;
      try { m = JSON.parse(ev.data); } catch { return; }
      const item = { seq: this.lastSeq, sandboxId: m.sandbox_id, kind: ev.type, record: m.record };
      for (const f of this.raw) f(item);
      const r = m.record || {};
      if (r.name === 'supervisor.dispatch' && readOnly.has(r.attrs?.op)) return;
      // This page's own requests refresh what they change themselves.
      if (String(r.trace || '').startsWith(`ui-${tab}-`)) return;
      for (const f of this.listeners) f(item);
    };
    es.addEventListener('event', handle);
    es.addEventListener('span', handle);
  }
  // on registers a listener for changes; the returned function removes it.
  on(f) { this.listeners.add(f); return () => this.listeners.delete(f); }
  // onAny also sees records of reads (the events page).
  onAny(f) { this.raw.add(f); return () => this.raw.delete(f); }
}

export const events = new Events();

// debounce coalesces a burst of events into one re-fetch.
export function debounce(f, ms = 200) {
  let t = null;
  return (...a) => { clearTimeout(t); t = setTimeout(() => f(...a), ms); };
}

// followCommand streams a command's transcript rows; onExit gets the final
// status. The server ends the stream after `exit`; closing here keeps
// EventSource from reconnecting.
export function followCommand(sandboxId, commandId, onRow, onExit) {
  const es = new EventSource(`/api/commands/${encodeURIComponent(commandId)}/stream?sandbox_id=${encodeURIComponent(sandboxId)}`);
  es.addEventListener('row', (ev) => onRow(JSON.parse(ev.data).row, Number(ev.lastEventId)));
  es.addEventListener('truncated', (ev) => onRow(`[${JSON.parse(ev.data).skipped} rows no longer retained]`, -1));
  es.addEventListener('exit', (ev) => { es.close(); onExit(JSON.parse(ev.data)); });
  es.onerror = () => { if (es.readyState === EventSource.CLOSED) onExit(null); };
  return () => es.close();
}

// newest makes turns for one kind of refresh: take() before a request,
// then isNewest() after its answer says whether a later refresh started
// meanwhile. Answers can arrive out of order; drawing only the newest keeps
// a slow, older answer from overwriting a newer one (and staying, since no
// further event may come).
export function newest() {
  let n = 0;
  return () => { const my = ++n; return () => my === n; };
}
