// Small DOM helpers shared by the pages. Everything is built with
// createElement/textContent: data from the supervisor is never parsed as HTML.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'value') el.value = v;
    // Through the CSSOM: a style attribute would be inline style, which
    // the console's CSP does not allow.
    else if (k === 'style') el.style.cssText = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}

export function toast(msg, kind = 'info') {
  const t = h('div', { class: 'toast ' + kind, role: 'status' }, msg);
  document.getElementById('toasts').append(t);
  setTimeout(() => t.remove(), kind === 'error' ? 10000 : 4000);
}

// confirmDialog resolves true when the person confirms. A <dialog> rather
// than window.confirm: it is styled, testable and does not block the page.
export function confirmDialog(text, okLabel = 'Confirm') {
  const d = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = okLabel;
  d.returnValue = '';
  d.showModal();
  return new Promise((resolve) => {
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
  });
}

export function age(ts) {
  const t = typeof ts === 'number' ? ts : Date.parse(ts);
  if (!t) return '';
  let s = Math.max(0, Math.round((Date.now() - t) / 1000));
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm';
  if (s < 86400) return Math.floor(s / 3600) + 'h' + String(Math.floor((s % 3600) / 60)).padStart(2, '0');
  return Math.floor(s / 86400) + 'd';
}

export function bytes(n) {
  if (n === null || n === undefined) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + ' ' + u[i];
}

export function time(ts) {
  const t = typeof ts === 'number' ? new Date(ts) : new Date(ts);
  return isNaN(t) ? String(ts ?? '') : t.toLocaleTimeString();
}

// agentColour gives each agent (or owner) a stable hue, so one agent's
// lines read as one colour across files and pages.
export function agentColour(name) {
  let x = 2166136261;
  for (const ch of String(name)) { x ^= ch.codePointAt(0); x = Math.imul(x, 16777619); }
  return `hsl(${(x >>> 0) % 360} 65% 85%)`;
}

export function badge(text, cls = '') {
  return h('span', { class: 'badge ' + cls + ' b-' + String(text).replace(/[^a-z_]/gi, '') }, text);
}

export function short(id) {
  return String(id ?? '').replace(/^(sbx|ws|cmd|req)-/, '').slice(-8);
}

export function errText(e) {
  return e && e.kind ? `${e.kind}: ${e.message}` : String(e?.message || e);
}
