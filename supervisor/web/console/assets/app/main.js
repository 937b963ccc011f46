// The console's router: #/fleet, #/session/<sbx>/<ws>, #/review/<sbx>/<ws>,
// #/obs/<sbx>. Each page is a function (view, params) that renders into
// view and returns a cleanup function (closing its streams and listeners).
import { events } from './api.js';
import { h, clear } from './ui.js';
import { fleetPage } from './fleet.js';
import { sessionPage } from './session.js';
import { reviewPage } from './review.js';
import { obsPage } from './obs.js';

const routes = [
  [/^#\/fleet$/, fleetPage, () => []],
  [/^#\/session\/([^/]+)\/([^/]+)$/, sessionPage, (m) => [['Fleet', '#/fleet'], [m[1], '#/obs/' + m[1]], ['session ' + m[2], null]]],
  [/^#\/review\/([^/]+)\/([^/]+)$/, reviewPage, (m) => [['Fleet', '#/fleet'], [m[1], '#/obs/' + m[1]], ['session ' + m[2], `#/session/${m[1]}/${m[2]}`], ['review', null]]],
  [/^#\/obs\/([^/]+)$/, obsPage, (m) => [['Fleet', '#/fleet'], [m[1], null]]],
];

let cleanup = null;

function route() {
  const hash = location.hash || '#/fleet';
  const view = document.getElementById('view');
  if (view.dataset.loggedOut) return;
  if (cleanup) { try { cleanup(); } catch { /* a page's cleanup must not block navigation */ } cleanup = null; }
  for (const [re, page, crumbs] of routes) {
    const m = hash.match(re);
    if (!m) continue;
    clear(document.getElementById('crumbs'), crumbs(m).map(([t, href]) => href ? h('a', { href }, t) : h('span', {}, t)));
    clear(view);
    view.dataset.page = page.name.replace(/Page$/, '');
    cleanup = page(view, m.slice(1).map(decodeURIComponent)) || null;
    return;
  }
  location.hash = '#/fleet';
}

window.addEventListener('hashchange', route);
events.start();
route();
