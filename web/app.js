// rate_ctl admin page: plain JS against the REST API under /api/v1.
// No framework and nothing fetched from elsewhere; the service embeds this
// file and serves it at /app.js.
'use strict';

const API = '/api/v1';
const TOKEN_KEY = 'rate_ctl.token';
const STATS_EVERY_MS = 2000;
const REFRESH_EVERY_MS = 2000;
const STATS_SECONDS = 120;
const MAX_SPARKLINES = 20;

const ALGORITHMS = {
  fixed_window: 'At most “rate” requests in each clock-aligned window of one “per”.',
  sliding_window: 'At most “rate” requests in any window of one “per” (smoother than fixed).',
  token_bucket: '“rate” per “per” on average; up to “burst” extra requests at once.',
  leaky_bucket: 'Evenly spaced: one request every per/rate. Burst is always 1.',
  concurrency: 'At most “rate” requests in flight at the same time; “per” and “burst” are ignored.',
  warm_up: 'Starts at rate ÷ cold factor after a quiet period and climbs to “rate” over the warm-up period. Burst is always 1.',
};

const state = {
  token: null,
  version: null,
  tab: 'strategies',
  strategies: [],
  blacklist: [],
  hosts: [],
  audit: [],
  auditMore: false,
  editing: null, // strategy being edited (null = new)
  chartId: null,
  stats: new Map(), // strategy id -> points
  hostEdits: new Map(), // host_id -> unsaved weight text
};

const $ = (sel, root = document) => root.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (v === true) e.setAttribute(k, '');
    else e.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// ---------------------------------------------------------------- API

class ApiError extends Error {
  constructor(status, field, message) {
    super(message);
    this.status = status;
    this.field = field;
  }
}

async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (state.token) headers.Authorization = 'Bearer ' + state.token;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(API + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
    });
  } catch (e) {
    throw new ApiError(0, null, 'Cannot reach the rate-ctl service: ' + e.message);
  }
  let data = null;
  const text = await res.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch (_) {
      data = null;
    }
  }
  if (res.ok) return data;
  const err = (data && data.error) || {};
  const message = err.message || `${res.status} ${res.statusText}`;
  if (res.status === 401) {
    showTokenPanel('The service did not accept this token (401 Unauthorized). Enter the current token.');
  }
  throw new ApiError(res.status, err.field ?? null, message);
}

function toast(message, kind = 'info') {
  const t = $('#toast');
  t.textContent = message;
  t.className = 'toast ' + kind;
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, kind === 'error' ? 9000 : 4000);
}

// Reports an error that is not tied to a form field.
function reportError(e, what) {
  if (e.status === 401) return; // the token panel says it
  if (e.status === 403) {
    toast(`${what}: this token may not do that (403). Changes need the admin token.`, 'error');
    return;
  }
  toast(`${what}: ${e.message}`, 'error');
}

function setVersion(v) {
  if (typeof v !== 'number') return;
  state.version = v;
  $('#config-version').textContent = 'config version ' + v;
}

// ---------------------------------------------------------------- token

function showTokenPanel(message) {
  $('#token-panel').hidden = false;
  $('#app').hidden = true;
  $('#token-error').textContent = message || '';
  $('#token-input').value = '';
  $('#token-input').focus();
}

async function useToken(token) {
  state.token = token;
  try {
    setVersion((await api('GET', '/version')).version);
  } catch (e) {
    if (e.status !== 401) showTokenPanel(e.message);
    return false;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $('#token-panel').hidden = true;
  $('#app').hidden = false;
  await refreshTab();
  return true;
}

$('#token-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const token = $('#token-input').value.trim();
  if (!token) {
    $('#token-error').textContent = 'Enter the token first.';
    return;
  }
  $('#token-error').textContent = 'Checking…';
  if (await useToken(token)) $('#token-error').textContent = '';
});

$('#change-token').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  showTokenPanel('');
});

// ---------------------------------------------------------------- tabs

const TABS = ['strategies', 'blacklist', 'hosts', 'audit'];

function selectTab(name) {
  state.tab = name;
  for (const t of TABS) {
    const on = t === name;
    $('#tab-' + t).setAttribute('aria-selected', String(on));
    $('#tab-' + t).tabIndex = on ? 0 : -1;
    $('#panel-' + t).hidden = !on;
  }
  refreshTab();
}

for (const t of TABS) {
  $('#tab-' + t).addEventListener('click', () => selectTab(t));
  $('#tab-' + t).addEventListener('keydown', (ev) => {
    const i = TABS.indexOf(t);
    let j = null;
    if (ev.key === 'ArrowRight') j = (i + 1) % TABS.length;
    if (ev.key === 'ArrowLeft') j = (i + TABS.length - 1) % TABS.length;
    if (j !== null) {
      selectTab(TABS[j]);
      $('#tab-' + TABS[j]).focus();
    }
  });
}

async function refreshTab() {
  if (!state.token) return;
  try {
    if (state.tab === 'strategies') await loadStrategies();
    else if (state.tab === 'blacklist') await loadBlacklist();
    else if (state.tab === 'hosts') await loadHosts();
    else if (state.tab === 'audit') await loadAudit(false);
  } catch (e) {
    reportError(e, 'Loading failed');
  }
}

// ---------------------------------------------------------------- formatting

function fmtTime(ms) {
  if (!ms) return '–';
  return new Date(ms).toLocaleString();
}

function fmtDuration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return s + ' s';
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${s % 60} s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${m % 60} min`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

function fmtAgo(ms) {
  if (!ms) return 'never';
  return fmtDuration(Date.now() - ms) + ' ago';
}

function fmtRate(n) {
  if (n >= 100) return n.toFixed(0);
  if (n >= 10) return n.toFixed(1);
  return n.toFixed(2);
}

function fmtAxis(v) {
  return String(Number(v.toPrecision(3)));
}

function describeLimit(s) {
  if (s.action === 'allow') return 'unlimited';
  if (s.algorithm === 'concurrency') return `${s.rate} in flight`;
  let t = `${s.rate} / ${s.per}`;
  if (s.algorithm === 'token_bucket' && s.burst > 1) t += `, burst ${s.burst}`;
  if (s.algorithm === 'warm_up') t += `, warm-up ${s.warm_up_ms / 1000} s ×${s.cold_factor}`;
  if (s.each && s.each.length) t += ` per ${s.each.join(' + ')}`;
  if (s.tz) t += ` (${s.tz})`;
  return t;
}

function describeAction(s) {
  if (s.action === 'allow') return 'allow (never limited)';
  if (s.action === 'dry_run') return 'dry run (count only)';
  if (s.action === 'delay') return `delay${s.max_delay_ms ? ' ≤ ' + s.max_delay_ms + ' ms' : ''}`;
  return `reject ${s.status || 503}`;
}

// The action a strategy enforces, or for dry run the one it goes back to
// when dry run ends (the API keeps status / max_delay_ms while in dry run):
// "delay, max 500 ms", "reject, status 429".
function describeEnforcing(s) {
  if (s.action === 'delay' || (s.action === 'dry_run' && s.max_delay_ms)) {
    return `delay, max ${s.max_delay_ms} ms`;
  }
  return s.status ? `reject, status ${s.status}` : "reject, the location's status (503 by default)";
}

// ---------------------------------------------------------------- strategies

for (const a of Object.keys(ALGORITHMS)) {
  $('#f-algorithm').append(el('option', { value: a, text: a }));
  $('#s-algorithm').append(el('option', { value: a, text: a.replace('_', ' ') }));
}

let filterTimer = null;
for (const id of ['#f-name', '#f-dimension', '#f-value']) {
  $(id).addEventListener('input', () => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(() => loadStrategies().catch((e) => reportError(e, 'Loading failed')), 250);
  });
}
$('#f-algorithm').addEventListener('change', renderStrategies);
$('#f-enabled').addEventListener('change', renderStrategies);
$('#f-clear').addEventListener('click', () => {
  for (const id of ['#f-name', '#f-dimension', '#f-value', '#f-algorithm', '#f-enabled']) $(id).value = '';
  loadStrategies().catch((e) => reportError(e, 'Loading failed'));
});

function filtersActive() {
  return ['#f-name', '#f-dimension', '#f-value', '#f-algorithm', '#f-enabled'].some((id) => $(id).value.trim() !== '');
}

async function loadStrategies() {
  const q = new URLSearchParams();
  const name = $('#f-name').value.trim();
  const dim = $('#f-dimension').value.trim();
  const val = $('#f-value').value.trim();
  if (name) q.set('name', name);
  if (dim) q.set('dimension', dim);
  if (val) q.set('value', val);
  const qs = q.toString();
  const data = await api('GET', '/strategies' + (qs ? '?' + qs : ''));
  setVersion(data.version);
  state.strategies = data.strategies || [];
  renderStrategies();
}

function visibleStrategies() {
  const alg = $('#f-algorithm').value;
  const en = $('#f-enabled').value;
  return state.strategies.filter((s) =>
    (!alg || s.algorithm === alg) && (!en || (en === 'yes') === !!s.enabled));
}

function renderStrategies() {
  const list = visibleStrategies();
  const tbody = $('#strategies-table tbody');
  tbody.replaceChildren();
  for (const s of list) tbody.append(strategyRow(s));
  const empty = $('#strategies-empty');
  $('#strategies-table').hidden = list.length === 0;
  empty.hidden = list.length !== 0;
  if (list.length === 0) {
    empty.replaceChildren();
    if (filtersActive()) {
      empty.append('No strategy matches these filters. ',
        el('button', { type: 'button', class: 'link', onclick: () => $('#f-clear').click() }, 'Clear filters'));
    } else {
      empty.append(el('strong', {}, 'No strategies yet.'),
        ' A strategy limits matching requests, e.g. 100 requests per second to api=/pay. ',
        el('button', { type: 'button', class: 'primary small', onclick: () => openStrategyForm(null) }, 'Create the first one'));
    }
  }
  const total = state.strategies.length;
  $('#strategies-count').textContent = list.length === total
    ? `${total} ${total === 1 ? 'strategy' : 'strategies'}`
    : `${list.length} of ${total} strategies shown`;
  drawAllSparklines();
}

// A condition's key is its dimension and operator character: `api` exact,
// `api^` prefix, `api~` path template, `api!` negation (docs/API.md).
const OPS = [['', '=', 'is'], ['^', '^=', 'starts with'], ['~', '~=', 'matches the template'], ['!', '!=', 'is not']];
function splitKey(key) {
  const last = key.slice(-1);
  const op = OPS.find(([c]) => c !== '' && c === last);
  return op ? [key.slice(0, -1), op] : [key, OPS[0]];
}

function matchChips(s) {
  const entries = Object.entries(s.match || {});
  if (entries.length === 0) return el('span', { class: 'muted' }, 'every request');
  return entries.map(([k, v]) => {
    const [d, op] = splitKey(k);
    return el('span', { class: 'chip', title: `${d} ${op[2]} ${v}` },
      el('span', { class: 'chip-dim' }, d), op[1], v);
  });
}

function strategyRow(s) {
  const dry = s.action === 'dry_run';
  const spark = el('canvas', { class: 'spark', width: 140, height: 28, 'data-id': s.id, role: 'img',
    'aria-label': `Traffic of ${s.name}` });
  const tr = el('tr', { 'data-id': s.id, class: s.enabled ? '' : 'disabled-row' },
    // A long name is cut with an ellipsis (the whole name on hover), so the
    // other columns stay on screen.
    el('td', { class: 'name-cell' }, el('strong', { class: 'name', title: s.name }, s.name),
      el('div', { class: 'muted small' }, `#${s.id} · ${s.action === 'allow' ? 'allow' : s.algorithm}`
        + (s.priority ? ` · priority ${s.priority}` : ''))),
    el('td', {}, matchChips(s)),
    el('td', {}, describeLimit(s)),
    el('td', {}, describeAction(s),
      dry ? el('div', { class: 'muted small' }, `afterwards: ${describeEnforcing(s)}`) : null),
    el('td', {}, s.scope),
    el('td', {}, toggle(`Enabled: ${s.name}`, !!s.enabled, (on, input) => patchStrategy(s, { enabled: on }, input))),
    el('td', {}, s.action === 'allow' ? el('span', { class: 'muted' }, '—')
      : toggle(`Dry run: ${s.name}`, dry, (on, input) => patchStrategy(s, { dry_run: on }, input),
        'Dry run: count what would be limited but let every request pass. Turning it off restores the action it had before.')),
    el('td', {}, el('button', { type: 'button', class: 'spark-btn', title: 'Show live chart',
      'aria-label': `Show live chart of ${s.name}`, onclick: () => openChart(s.id) }, spark)),
    el('td', { class: 'actions' },
      el('button', { type: 'button', class: 'small', 'aria-label': `Edit ${s.name}`, onclick: () => openStrategyForm(s) }, 'Edit'),
      el('button', { type: 'button', class: 'small danger-outline', 'aria-label': `Delete ${s.name}`, onclick: () => deleteStrategy(s) }, 'Delete')));
  return tr;
}

function toggle(label, on, onChange, title) {
  const input = el('input', { type: 'checkbox', role: 'switch', 'aria-label': label, checked: on, title });
  input.addEventListener('change', () => onChange(input.checked, input));
  return el('label', { class: 'switch', title }, input, el('span', { class: 'slider', 'aria-hidden': 'true' }));
}

async function patchStrategy(s, change, input) {
  input.disabled = true;
  try {
    const updated = await api('PATCH', `/strategies/${s.id}`, { version: s.version, ...change });
    Object.assign(s, updated);
    setVersion(updated.version);
    const what = 'enabled' in change ? (change.enabled ? 'enabled' : 'disabled')
      : (change.dry_run ? 'switched to dry run' : `enforcing again (${describeEnforcing(updated)})`);
    toast(`“${s.name}” ${what}. Hosts apply it within a second.`);
    renderStrategies();
  } catch (e) {
    input.checked = !input.checked;
    if (e.status === 409) {
      toast(`Someone else changed “${s.name}” after this page loaded it. The list is reloaded — check it and try again.`, 'error');
      await loadStrategies().catch(() => {});
    } else {
      reportError(e, `Changing “${s.name}” failed`);
    }
  } finally {
    input.disabled = false;
  }
}

async function deleteStrategy(s) {
  const ok = await confirmDialog(`Delete strategy “${s.name}”? Requests it limits will pass again within a second. This cannot be undone.`, 'Delete strategy');
  if (!ok) return;
  try {
    // The version shown: 409 if someone changed it since the list was read.
    await api('DELETE', `/strategies/${s.id}?version=${s.version}`);
    toast(`Deleted “${s.name}”.`);
    if (state.chartId === s.id) closeChart();
  } catch (e) {
    if (e.status === 404) toast(`“${s.name}” was already deleted by someone else.`, 'error');
    else if (e.status === 409) toast(`“${s.name}” was changed by someone else and was not deleted. The list is reloaded.`, 'error');
    else reportError(e, 'Delete failed');
  }
  await loadStrategies().catch((e) => reportError(e, 'Loading failed'));
}

function confirmDialog(text, okLabel) {
  const d = $('#confirm-dialog');
  $('#confirm-text').textContent = text;
  $('#confirm-ok').textContent = okLabel;
  d.returnValue = '';
  d.showModal();
  $('#confirm-cancel').focus();
  return new Promise((resolve) => {
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
  });
}

// ---------------------------------------------------------------- strategy form

const FORM_FIELDS = ['name', 'algorithm', 'rate', 'per', 'burst', 'warm_up_ms', 'cold_factor', 'each', 'ipv4_prefix', 'ipv6_prefix', 'on_full', 'scope', 'split', 'action', 'status', 'max_delay_ms', 'priority', 'enabled', 'match', 'count_if', 'cost_from', 'cost_after', 'max_keys', 'ban_after', 'ban_within', 'ban_for', 'tz'];

function conditionRow(key = '', val = '') {
  const n = $('#s-conditions').children.length + 1;
  const errId = `s-cond-error-${n}-${Math.random().toString(36).slice(2, 7)}`;
  const [dim, op] = splitKey(key);
  const opSelect = el('select', { class: 'cond-op', 'aria-label': `Condition ${n} operator` },
    ...OPS.map(([c, sym, words]) => el('option', { value: c, title: words }, sym)));
  opSelect.value = op[0];
  const row = el('div', { class: 'cond-row' },
    el('input', { class: 'cond-dim', list: 'dimension-list', value: dim, placeholder: 'dimension, e.g. api',
      'aria-label': `Condition ${n} dimension`, 'aria-describedby': errId }),
    opSelect,
    el('input', { class: 'cond-val', value: val, placeholder: 'value, e.g. /pay',
      'aria-label': `Condition ${n} value`, 'aria-describedby': errId }),
    el('button', { type: 'button', class: 'small link', 'aria-label': `Remove condition ${n}`,
      onclick: () => { row.remove(); } }, 'Remove'),
    el('p', { class: 'field-error cond-error', id: errId }));
  return row;
}

$('#s-add-condition').addEventListener('click', () => {
  const row = conditionRow();
  $('#s-conditions').append(row);
  $('.cond-dim', row).focus();
});

// Only the buckets and warm_up can delay a request (the API refuses a delay cap on others).
const canDelay = (alg) => alg === 'token_bucket' || alg === 'leaky_bucket' || alg === 'warm_up';

// What a strategy saved in dry run keeps for when dry run ends: the edited
// strategy's status, and its delay cap only while `alg` can still delay
// (the cap's field is hidden in dry run, so it could not be cleared by hand).
function keptAfterDryRun(alg) {
  const kept = {};
  const s = state.editing;
  if (s && s.status) kept.status = s.status;
  if (s && s.max_delay_ms && canDelay(alg)) kept.max_delay_ms = s.max_delay_ms;
  return kept;
}

function updateFormHints() {
  const alg = $('#s-algorithm').value;
  $('#s-algorithm-hint').textContent = ALGORITHMS[alg] || '';
  const bucket = canDelay(alg);
  $('#s-burst').disabled = alg !== 'token_bucket';
  if (alg === 'leaky_bucket' || alg === 'warm_up') $('#s-burst').value = 1;
  $('#s-warm-up-fields').hidden = alg !== 'warm_up';
  $('#s-per').disabled = alg === 'concurrency';
  const action = $('#s-action').value;
  // An allow limits nothing: no rate fields.
  for (const id of ['#s-algorithm', '#s-rate', '#s-per', '#s-burst']) $(id).closest('.field').hidden = action === 'allow';
  if (action === 'allow') $('#s-warm-up-fields').hidden = true;
  $('#s-status-field').hidden = action !== 'reject';
  $('#s-delay-field').hidden = action !== 'delay';
  $('#s-action-hint').textContent = action === 'dry_run'
    ? `Turning dry run off enforces: ${describeEnforcing({ action: 'dry_run', ...keptAfterDryRun(alg) })}.` : '';
  $('#s-action-error').dataset.hint = action === 'delay' && !bucket ? 'Delay works with token bucket, leaky bucket or warm-up.' : '';
  $('#s-scope-hint').textContent = $('#s-scope').value === 'cluster'
    ? 'Split between hosts (below).' : 'Each host allows the full rate.';
  $('#s-split-field').hidden = $('#s-scope').value !== 'cluster' || action === 'allow';
}
for (const id of ['#s-algorithm', '#s-action', '#s-scope']) $(id).addEventListener('change', updateFormHints);

function clearFormErrors() {
  $('#sd-form-error').textContent = '';
  for (const p of document.querySelectorAll('#strategy-form .field-error')) p.textContent = '';
  for (const i of document.querySelectorAll('#strategy-form [aria-invalid]')) i.removeAttribute('aria-invalid');
}

function fillForm(s) {
  $('#s-name').value = s ? s.name : '';
  $('#s-conditions').replaceChildren();
  const match = s ? Object.entries(s.match || {}) : [['api', '']];
  for (const [d, v] of match) $('#s-conditions').append(conditionRow(d, v));
  $('#s-algorithm').value = s ? s.algorithm : 'token_bucket';
  $('#s-rate').value = s ? s.rate : '';
  $('#s-per').value = s ? s.per : 'second';
  $('#s-burst').value = s ? s.burst : 1;
  $('#s-warm-up').value = s && s.warm_up_ms ? s.warm_up_ms / 1000 : 30;
  $('#s-cold-factor').value = s && s.cold_factor ? s.cold_factor : 3;
  $('#s-each').value = s && s.each ? s.each.join(', ') : '';
  $('#s-ipv4-prefix').value = s && s.ipv4_prefix ? s.ipv4_prefix : 32;
  $('#s-ipv6-prefix').value = s && s.ipv6_prefix ? s.ipv6_prefix : 64;
  $('#s-on-full').value = s && s.on_full ? s.on_full : 'overflow';
  $('#s-per-key-fields').hidden = $('#s-each').value.trim() === '';
  $('#s-scope').value = s ? s.scope : 'cluster';
  $('#s-split').value = s && s.split ? s.split : 'demand';
  $('#s-action').value = s ? s.action : 'reject';
  $('#s-status').value = s && s.status ? s.status : '';
  $('#s-max-delay').value = s && s.max_delay_ms ? s.max_delay_ms : '';
  $('#s-priority').value = s ? s.priority || 0 : 0;
  $('#s-enabled').checked = s ? !!s.enabled : true;
  // Issue 31: the response and cost options.
  $('#s-count-if').value = s && s.count_if ? s.count_if : '';
  $('#s-cost-from').value = s && s.cost_from ? s.cost_from : '';
  $('#s-cost-after').value = s && s.cost_after ? s.cost_after : '';
  $('#s-max-keys').value = s && s.max_keys ? s.max_keys : '';
  // Issue 33: calendar windows' zone.
  $('#s-tz').value = s && s.tz ? s.tz : '';
  for (const [k, id] of [['ban_after', '#s-ban-after'], ['ban_within', '#s-ban-within'], ['ban_for', '#s-ban-for']]) {
    $(id).value = s && s[k] ? s[k] : '';
  }
  updateFormHints();
}

async function openStrategyForm(s) {
  clearFormErrors();
  if (s) {
    try {
      s = await api('GET', `/strategies/${s.id}`); // the latest version to edit
    } catch (e) {
      if (e.status === 404) {
        toast(`“${s.name}” no longer exists; someone deleted it.`, 'error');
        loadStrategies().catch(() => {});
      } else reportError(e, 'Opening the strategy failed');
      return;
    }
  }
  state.editing = s;
  $('#sd-title').textContent = s ? `Edit strategy “${s.name}”` : 'New strategy';
  $('#s-save').textContent = s ? 'Save changes' : 'Create strategy';
  fillForm(s);
  $('#strategy-dialog').showModal();
  $('#s-name').focus();
}

$('#new-strategy').addEventListener('click', () => openStrategyForm(null));
$('#s-each').addEventListener('input', () => {
  $('#s-per-key-fields').hidden = $('#s-each').value.trim() === '';
});
$('#s-cancel').addEventListener('click', () => $('#strategy-dialog').close());

function numberOrText(v) {
  const t = v.trim();
  if (t === '') return null;
  const n = Number(t);
  return Number.isFinite(n) ? n : t; // let the API name the field if it is not a number
}

function readForm() {
  const body = { name: $('#s-name').value.trim(), match: {} };
  for (const row of $('#s-conditions').children) {
    const d = $('.cond-dim', row).value.trim();
    const v = $('.cond-val', row).value;
    if (d === '' && v.trim() === '') continue;
    body.match[d + $('.cond-op', row).value] = v.trim();
  }
  body.algorithm = $('#s-algorithm').value;
  body.rate = numberOrText($('#s-rate').value);
  if (body.rate === null) delete body.rate;
  body.per = $('#s-per').value;
  const burst = numberOrText($('#s-burst').value);
  if (burst !== null) body.burst = burst;
  if (body.algorithm === 'warm_up') {
    // The form asks for seconds; the API takes milliseconds and names the
    // field warm_up_ms in its errors, shown under this input.
    const w = numberOrText($('#s-warm-up').value);
    if (w !== null) body.warm_up_ms = typeof w === 'number' ? Math.round(w * 1000) : w;
    const cf = numberOrText($('#s-cold-factor').value);
    if (cf !== null) body.cold_factor = cf;
  }
  body.each = $('#s-each').value.split(',').map((d) => d.trim()).filter((d) => d !== '');
  if (body.each.length) {
    const p4 = numberOrText($('#s-ipv4-prefix').value);
    if (p4 !== null) body.ipv4_prefix = p4;
    const p6 = numberOrText($('#s-ipv6-prefix').value);
    if (p6 !== null) body.ipv6_prefix = p6;
    body.on_full = $('#s-on-full').value;
  }
  body.scope = $('#s-scope').value;
  body.action = $('#s-action').value;
  if (body.scope === 'cluster' && body.action !== 'allow') body.split = $('#s-split').value;
  if (body.action === 'reject') {
    const st = numberOrText($('#s-status').value);
    if (st !== null) body.status = st;
  }
  if (body.action === 'delay') {
    const md = numberOrText($('#s-max-delay').value);
    if (md !== null) body.max_delay_ms = md;
  }
  // Saving is a full replace: keep what the strategy enforces again when
  // dry run ends, as the dry-run toggle does.
  if (body.action === 'dry_run') Object.assign(body, keptAfterDryRun(body.algorithm));
  if (body.action === 'allow') {
    for (const k of ['algorithm', 'rate', 'per', 'burst', 'warm_up_ms', 'cold_factor']) delete body[k];
  }
  const prio = numberOrText($('#s-priority').value);
  if (prio !== null) body.priority = prio;
  body.enabled = $('#s-enabled').checked;
  if (body.action !== 'allow') {
    for (const [k, id] of [['count_if', '#s-count-if'], ['cost_from', '#s-cost-from'], ['cost_after', '#s-cost-after']]) {
      const v = $(id).value.trim();
      if (v !== '') body[k] = v;
    }
  }
  if (body.each.length) {
    const mk = numberOrText($('#s-max-keys').value);
    if (mk !== null) body.max_keys = mk;
    // The penalty box (issue 32): sent as given, the server checks them.
    for (const [k, id] of [['ban_after', '#s-ban-after'], ['ban_within', '#s-ban-within'], ['ban_for', '#s-ban-for']]) {
      const v = numberOrText($(id).value);
      if (v !== null) body[k] = v;
    }
  }
  const tz = $('#s-tz').value.trim();
  if (tz !== '' && body.action !== 'allow') body.tz = tz;
  return body;
}

// Puts an API error next to the field it names ("rate", "match.ip",
// "action.status", ...); anything else goes to the top of the form.
function showFieldError(field, message) {
  let f = field || '';
  if (f.startsWith('action.')) f = f.slice(7);
  let target = null;
  let input = null;
  if (f === 'match' || f === 'conditions' || f.startsWith('match.') || f.startsWith('match[') || f.startsWith('conditions')) {
    const dim = f.startsWith('match.') ? f.slice(6) : null;
    const idx = /\[(\d+)\]/.exec(f);
    const rows = [...$('#s-conditions').children];
    const row = dim !== null ? rows.find((r) => $('.cond-dim', r).value.trim() + $('.cond-op', r).value === dim)
      : idx ? rows.filter((r) => $('.cond-dim', r).value.trim() !== '' || $('.cond-val', r).value.trim() !== '')[Number(idx[1])] : null;
    if (row) {
      target = $('.cond-error', row);
      input = $('.cond-val', row);
    } else target = $('#s-match-error');
  } else if (FORM_FIELDS.includes(f)) {
    target = $(`#s-${f}-error`);
    input = $(`#strategy-form [name="${f}"]`);
    if (input && input.closest('[hidden]')) { target = null; input = null; }
  }
  if (!target) {
    $('#sd-form-error').textContent = message;
    return;
  }
  target.textContent = message;
  if (input) {
    input.setAttribute('aria-invalid', 'true');
    input.focus();
  }
}

$('#strategy-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  clearFormErrors();
  const body = readForm();
  const editing = state.editing;
  const save = $('#s-save');
  save.disabled = true;
  try {
    let saved;
    if (editing) {
      body.version = editing.version;
      saved = await api('PUT', `/strategies/${editing.id}`, body);
    } else {
      saved = await api('POST', '/strategies', body);
    }
    setVersion(saved.version);
    $('#strategy-dialog').close();
    toast(`${editing ? 'Saved' : 'Created'} “${saved.name}”. Hosts apply it within a second.`);
    await loadStrategies();
  } catch (e) {
    if (e.status === 400 || e.status === 422) {
      showFieldError(e.field, e.message);
    } else if (e.status === 409 && editing) {
      try {
        const latest = await api('GET', `/strategies/${editing.id}`);
        state.editing = latest;
        fillForm(latest);
        $('#sd-form-error').textContent = 'Someone else changed this strategy while you were editing it. ' +
          'The form now shows their version; make your change again and save.';
      } catch (e2) {
        $('#strategy-dialog').close();
        toast('Someone else changed or deleted this strategy. The list is reloaded.', 'error');
      }
      loadStrategies().catch(() => {});
    } else if (e.status === 404 && editing) {
      $('#strategy-dialog').close();
      toast(`“${editing.name}” was deleted by someone else.`, 'error');
      loadStrategies().catch(() => {});
    } else if (e.status === 403) {
      $('#sd-form-error').textContent = 'This token may only read. Saving needs the admin token.';
    } else if (e.status !== 401) {
      $('#sd-form-error').textContent = e.message;
    }
  } finally {
    save.disabled = false;
  }
});

// ---------------------------------------------------------------- charts

function openChart(id) {
  state.chartId = id;
  const s = state.strategies.find((x) => x.id === id);
  $('#chart-title').textContent = `Live traffic — ${s ? s.name : '#' + id}`;
  $('#chart-card').hidden = false;
  drawChart();
  pollStats();
  loadTopKeys(s).catch((e) => reportError(e, 'Loading the top keys failed'));
  $('#chart-card').scrollIntoView({ block: 'nearest' });
}

// Issue 33: "limited now" of a per-key strategy, each key linked to its
// view across the fleet (GET /strategies/{id}/keys/{key}).
async function loadTopKeys(s) {
  $('#top-card').hidden = !(s && s.each && s.each.length);
  $('#top-key').textContent = '';
  if ($('#top-card').hidden) return;
  const data = await api('GET', `/strategies/${s.id}/top`);
  const body = $('#top-table tbody');
  body.replaceChildren();
  for (const e of data.entries || []) {
    const link = el('button', { type: 'button', class: 'link', onclick: () => showKey(s.id, e.key).catch((x) => reportError(x, 'Loading the key failed')) }, e.key);
    body.append(el('tr', {}, el('td', {}, link), el('td', {}, String(e.rejections)), el('td', {}, String(e.requests)), el('td', {}, (e.hosts || []).join(', '))));
  }
  $('#top-empty').hidden = (data.entries || []).length > 0;
}

async function showKey(id, key) {
  const v = await api('GET', `/strategies/${id}/keys/${encodeURIComponent(key)}`);
  const hosts = (v.hosts || []).map((h) => h.answered ? `${h.host}: used ${h.used} of ${h.limit}, ${h.remaining} left` : `${h.host}: no answer`);
  $('#top-key').textContent = `${v.key}: fleet used ${v.fleet.used}, remaining ${v.fleet.remaining}, reset in ${Math.ceil(v.fleet.reset_ms / 1000)} s. ${hosts.join('; ')}`;
}

function closeChart() {
  state.chartId = null;
  $('#chart-card').hidden = true;
  $('#top-card').hidden = true;
}
$('#chart-close').addEventListener('click', closeChart);

let statsBusy = false;
async function pollStats() {
  if (statsBusy || !state.token || state.tab !== 'strategies' || $('#app').hidden || document.hidden) return;
  statsBusy = true;
  try {
    const ids = visibleStrategies().slice(0, MAX_SPARKLINES).map((s) => s.id);
    if (state.chartId !== null && !ids.includes(state.chartId)) ids.push(state.chartId);
    await Promise.all(ids.map(async (id) => {
      try {
        const d = await api('GET', `/stats?strategy=${id}&seconds=${STATS_SECONDS}`);
        state.stats.set(id, (d && d.points) || []);
      } catch (e) {
        if (e.status === 404) state.stats.set(id, []);
        else throw e;
      }
    }));
    drawAllSparklines();
    drawChart();
  } catch (e) {
    if (e.status !== 401) $('#chart-now').textContent = 'Statistics unavailable: ' + e.message;
  } finally {
    statsBusy = false;
  }
}

function prepCanvas(c) {
  const ratio = window.devicePixelRatio || 1;
  const w = Number(c.getAttribute('width'));
  const h = Number(c.getAttribute('height'));
  if (!c.dataset.cssw) {
    c.dataset.cssw = w;
    c.dataset.cssh = h;
  }
  const cw = Number(c.dataset.cssw);
  const ch = Number(c.dataset.cssh);
  if (c.width !== Math.round(cw * ratio)) {
    c.style.width = cw + 'px';
    c.style.height = ch + 'px';
    c.width = Math.round(cw * ratio);
    c.height = Math.round(ch * ratio);
  }
  const g = c.getContext('2d');
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, cw, ch);
  return { g, w: cw, h: ch };
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

const COLORS = { passed: '#2f7d4f', limited: '#c2412d', grid: '#e3e6ea', axis: '#5b6570', rate: '#3553c8' };
const PER_SECONDS = { second: 1, minute: 60, hour: 3600, day: 86400, week: 604800, month: 2629746 };

// The chart's rate line: the strategy's rate in requests per second and what
// it limits (a cluster rate is for the whole fleet, as the chart's lines,
// which add up every host); null where admitted per second has no rate to
// compare with (allow, concurrency, a rate per key).
function chartRate(s) {
  if (!s || s.action === 'allow' || s.algorithm === 'concurrency' || (s.each && s.each.length)) return null;
  return { perS: s.rate / (PER_SECONDS[s.per] || 1), label: s.scope === 'host' ? 'rate per host' : 'rate, fleet-wide' };
}

function plotLines(g, points, x0, y0, w, h, max, now, seconds, lineWidth) {
  const xs = (at) => x0 + w - ((now - at) / (seconds * 1000)) * w;
  const ys = (v) => y0 + h - (v / max) * h;
  for (const [key, color] of [['passed_per_s', COLORS.passed], ['limited_per_s', COLORS.limited]]) {
    g.strokeStyle = color;
    g.lineWidth = lineWidth;
    g.beginPath();
    let started = false;
    for (const p of points) {
      const x = Math.max(x0, xs(p.at));
      const y = ys(p[key] || 0);
      if (!started) { g.moveTo(x, y); started = true; } else g.lineTo(x, y);
    }
    g.stroke();
  }
}

function drawAllSparklines() {
  const now = Date.now();
  for (const c of document.querySelectorAll('canvas.spark')) {
    const id = Number(c.dataset.id);
    const { g, w, h } = prepCanvas(c);
    const pts = state.stats.get(id) || [];
    g.fillStyle = '#f6f7f9';
    g.fillRect(0, 0, w, h);
    if (pts.length === 0) {
      g.fillStyle = COLORS.axis;
      g.font = '11px system-ui, sans-serif';
      g.fillText('no traffic yet', 6, h / 2 + 4);
      continue;
    }
    const max = niceMax(Math.max(...pts.map((p) => Math.max(p.passed_per_s || 0, p.limited_per_s || 0))));
    plotLines(g, pts, 1, 2, w - 2, h - 4, max, now, STATS_SECONDS, 1.5);
    const last = pts[pts.length - 1];
    c.title = `now: ${fmtRate(last.passed_per_s || 0)} passed/s, ${fmtRate(last.limited_per_s || 0)} limited/s`;
  }
}

function drawChart() {
  if (state.chartId === null) return;
  const c = $('#chart');
  const { g, w, h } = prepCanvas(c);
  const pts = state.stats.get(state.chartId) || [];
  const now = Date.now();
  const left = 48;
  const bottom = 22;
  const top = 8;
  const pw = w - left - 10;
  const ph = h - top - bottom;
  const rate = chartRate(state.strategies.find((x) => x.id === state.chartId));
  const max = niceMax(Math.max(rate ? rate.perS * 1.15 : 0, ...pts.map((p) => Math.max(p.passed_per_s || 0, p.limited_per_s || 0))));
  g.font = '12px system-ui, sans-serif';
  g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = top + ph - (i / 4) * ph;
    g.strokeStyle = COLORS.grid;
    g.beginPath();
    g.moveTo(left, Math.round(y) + 0.5);
    g.lineTo(left + pw, Math.round(y) + 0.5);
    g.stroke();
    g.fillStyle = COLORS.axis;
    g.textAlign = 'right';
    g.fillText(fmtAxis((max * i) / 4), left - 6, y + 4);
  }
  g.textAlign = 'center';
  for (const s of [120, 90, 60, 30, 0]) {
    const x = left + pw - (s / STATS_SECONDS) * pw;
    g.fillText(s === 0 ? 'now' : `−${s} s`, Math.min(Math.max(x, left + 14), left + pw - 14), h - 6);
  }
  g.save();
  g.translate(12, top + ph / 2);
  g.rotate(-Math.PI / 2);
  g.fillText('req/s', 0, 0);
  g.restore();
  delete c.dataset.rateY;
  if (rate) {
    const y = Math.round(top + ph - (rate.perS / max) * ph) + 0.5;
    g.strokeStyle = COLORS.rate;
    g.lineWidth = 2;
    g.setLineDash([8, 4]);
    g.beginPath();
    g.moveTo(left, y);
    g.lineTo(left + pw, y);
    g.stroke();
    g.setLineDash([]);
    g.fillStyle = COLORS.rate;
    g.textAlign = 'left';
    g.fillText(`${rate.label}: ${fmtRate(rate.perS)}/s`, left + 6, y - 5);
    c.dataset.rateY = Math.floor(y); // where the line is, for the page's test
  }
  if (pts.length) plotLines(g, pts, left, top, pw, ph, max, now, STATS_SECONDS, 2);
  const last = pts[pts.length - 1];
  const rateText = rate ? ` Dashed: the ${rate.label}, ${fmtRate(rate.perS)}/s.` : '';
  $('#chart-now').textContent = (last
    ? `Latest: ${fmtRate(last.passed_per_s || 0)} passed/s, ${fmtRate(last.limited_per_s || 0)} limited/s, all hosts together (${fmtAgo(last.at)}).`
    : 'No traffic reported for this strategy in the last 2 minutes. Agents report counters every second or so.') + rateText;
}

// ---------------------------------------------------------------- blacklist

async function loadBlacklist() {
  const data = await api('GET', '/blacklist');
  setVersion(data.version);
  state.blacklist = data.entries || [];
  renderBlacklist();
}

const expiresOf = (e) => e.expires_at ?? e.expires_ms ?? null;
const createdOf = (e) => e.created_at ?? e.created_ms ?? null;

function remainingText(e) {
  const exp = expiresOf(e);
  if (exp === null) return 'never';
  const left = exp - Date.now();
  return left <= 0 ? 'expired' : 'in ' + fmtDuration(left);
}

function renderBlacklist() {
  const tbody = $('#bl-table tbody');
  tbody.replaceChildren();
  for (const e of state.blacklist) {
    const exp = expiresOf(e);
    tbody.append(el('tr', { 'data-id': e.id },
      el('td', {}, e.dimension),
      el('td', {}, el('code', {}, e.value)),
      el('td', {}, e.reason || el('span', { class: 'muted' }, '–')),
      el('td', { class: 'source' }, e.source === 'ban' ? el('strong', { title: 'raised by a strategy\'s penalty box' }, 'ban') : 'manual'),
      el('td', { title: fmtTime(createdOf(e)) }, fmtAgo(createdOf(e))),
      el('td', { class: 'remaining', 'data-exp': exp ?? '', title: exp ? fmtTime(exp) : 'does not expire' }, remainingText(e)),
      el('td', { class: 'actions' }, el('button', { type: 'button', class: 'small danger-outline',
        'aria-label': `Remove ${e.dimension} ${e.value} from the blacklist`, onclick: () => removeBlacklist(e) }, 'Remove'))));
  }
  $('#bl-table').hidden = state.blacklist.length === 0;
  $('#bl-empty').hidden = state.blacklist.length !== 0;
}

function tickRemaining() {
  for (const td of document.querySelectorAll('#bl-table td.remaining')) {
    const exp = td.dataset.exp;
    if (!exp) continue;
    const left = Number(exp) - Date.now();
    td.textContent = left <= 0 ? 'expired' : 'in ' + fmtDuration(left);
  }
}

async function removeBlacklist(e) {
  const ok = await confirmDialog(`Unblock ${e.dimension} = ${e.value}? Its requests are let through again within a second.`, 'Remove');
  if (!ok) return;
  try {
    await api('DELETE', `/blacklist/${e.id}`);
    toast(`Removed ${e.dimension} = ${e.value} from the blacklist.`);
  } catch (err) {
    if (err.status !== 404) reportError(err, 'Remove failed');
  }
  await loadBlacklist().catch((err) => reportError(err, 'Loading failed'));
}

$('#bl-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  for (const p of document.querySelectorAll('#bl-form .field-error, #bl-form .form-error')) p.textContent = '';
  for (const i of document.querySelectorAll('#bl-form [aria-invalid]')) i.removeAttribute('aria-invalid');
  const body = { dimension: $('#bl-dimension').value.trim(), value: $('#bl-value').value.trim() };
  const exp = $('#bl-expires').value;
  if (exp) body.expires_in_s = Number(exp);
  const reason = $('#bl-reason').value.trim();
  if (reason) body.reason = reason;
  try {
    const e = await api('POST', '/blacklist', body);
    toast(`Blocked ${e.dimension} = ${e.value} (${remainingText(e) === 'never' ? 'no expiry' : 'expires ' + remainingText(e)}).`);
    $('#bl-value').value = '';
    $('#bl-reason').value = '';
    await loadBlacklist();
  } catch (e) {
    if (e.status === 400 || e.status === 422) {
      const f = { dimension: 'dimension', value: 'value', reason: 'reason', expires_in_s: 'expires', expires_at: 'expires' }[e.field];
      if (f) {
        $(`#bl-${f}-error`).textContent = e.message;
        $(`#bl-${f}`).setAttribute('aria-invalid', 'true');
        $(`#bl-${f}`).focus();
      } else $('#bl-form-error').textContent = e.message;
    } else if (e.status === 403) {
      $('#bl-form-error').textContent = 'This token may only read. Blocking needs the admin token.';
    } else if (e.status !== 401) {
      $('#bl-form-error').textContent = e.message;
    }
  }
});

// ---------------------------------------------------------------- hosts

async function loadHosts() {
  const data = await api('GET', '/hosts');
  setVersion(data.version);
  state.hosts = data.hosts || [];
  renderHosts();
}

function renderHosts() {
  const tbody = $('#hosts-table tbody');
  // Keep a weight the user is typing.
  const focused = document.activeElement && document.activeElement.closest('#hosts-table') ? document.activeElement.dataset.host : null;
  tbody.replaceChildren();
  for (const h of state.hosts) {
    const lag = typeof h.lag === 'number' ? h.lag : (state.version ?? 0) - (h.applied_version ?? 0);
    const status = !h.fresh
      ? el('span', { class: 'badge stale' }, 'stale — no heartbeat')
      : h.publish_error ? el('span', { class: 'badge stale' }, 'publish refused')
        : lag > 0 ? el('span', { class: 'badge behind' }, 'fresh, catching up')
          : el('span', { class: 'badge ok' }, 'fresh, in sync');
    // The agent's last publish refusal (cleared by its next publish): the
    // only place besides its log where an over-capacity change shows.
    const publishError = h.publish_error
      ? el('p', { class: 'field-error publish-error', title: fmtTime(h.publish_error_at) },
        `${fmtAgo(h.publish_error_at)}: ${h.publish_error}`)
      : null;
    // Leases of split: demand strategies: leased rate, demand, lease age.
    const leases = (h.leases || []).map((l) => el('p', { class: 'hint lease', title: `epoch ${l.epoch}, expires ${fmtTime(l.expires)}` },
      `strategy ${l.strategy}: lease ${l.rate}, demand ${l.demand.toFixed(1)}/s, ${(l.age_ms / 1000).toFixed(1)} s old`));
    const weightInput = el('input', { type: 'number', min: 1, step: 1, class: 'weight', 'data-host': h.host_id,
      value: state.hostEdits.get(h.host_id) ?? h.weight, 'aria-label': `Weight of ${h.host_id}`,
      'aria-describedby': `w-err-${h.host_id}` });
    weightInput.addEventListener('input', () => state.hostEdits.set(h.host_id, weightInput.value));
    const saveBtn = el('button', { type: 'button', class: 'small', 'aria-label': `Save weight of ${h.host_id}` }, 'Save');
    const err = el('p', { class: 'field-error', id: `w-err-${h.host_id}` });
    saveBtn.addEventListener('click', () => saveWeight(h, weightInput, err));
    weightInput.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') saveWeight(h, weightInput, err); });
    tbody.append(el('tr', {},
      el('td', {}, el('strong', {}, h.host_id)),
      el('td', {}, el('div', { class: 'weight-cell' }, weightInput, saveBtn), err),
      el('td', { title: h.applied_at ? 'applied ' + fmtTime(h.applied_at) : '' },
        `${h.applied_version ?? '–'} of ${state.version ?? '–'}`),
      el('td', {}, lag > 0 ? `${lag} version${lag === 1 ? '' : 's'}` : '0'),
      el('td', { title: fmtTime(h.last_heartbeat) }, fmtAgo(h.last_heartbeat)),
      el('td', {}, status, publishError, ...leases)));
    if (focused === h.host_id) weightInput.focus();
  }
  $('#hosts-table').hidden = state.hosts.length === 0;
  $('#hosts-empty').hidden = state.hosts.length !== 0;
}

async function saveWeight(h, input, err) {
  err.textContent = '';
  input.removeAttribute('aria-invalid');
  const v = numberOrText(input.value);
  try {
    const updated = await api('PUT', `/hosts/${encodeURIComponent(h.host_id)}`, { weight: v });
    state.hostEdits.delete(h.host_id);
    toast(`Weight of ${h.host_id} is now ${updated.weight}.`);
    await loadHosts();
  } catch (e) {
    if (e.status === 400 || e.status === 422) {
      err.textContent = e.message;
      input.setAttribute('aria-invalid', 'true');
    } else reportError(e, `Saving the weight of ${h.host_id} failed`);
  }
}

// ---------------------------------------------------------------- audit

async function loadAudit(more) {
  const q = new URLSearchParams({ limit: '50' });
  if (more && state.audit.length) q.set('before_id', String(state.audit[state.audit.length - 1].id));
  const data = await api('GET', '/audit?' + q);
  const entries = data.entries || [];
  state.audit = more ? state.audit.concat(entries) : entries;
  state.auditMore = entries.length === 50;
  renderAudit();
}
$('#audit-more').addEventListener('click', () => loadAudit(true).catch((e) => reportError(e, 'Loading failed')));

function diffText(before, after) {
  if (!before && after) return 'created';
  if (before && !after) return 'deleted';
  if (!before || !after || typeof before !== 'object') return '';
  const skip = new Set(['version', 'updated_at', 'updated_ms', 'created_at', 'created_ms']);
  const parts = [];
  for (const k of new Set([...Object.keys(before), ...Object.keys(after)])) {
    if (skip.has(k)) continue;
    const a = JSON.stringify(before[k]);
    const b = JSON.stringify(after[k]);
    if (a !== b) parts.push(`${k}: ${a ?? '–'} → ${b ?? '–'}`);
  }
  return parts.join('; ');
}

function renderAudit() {
  const tbody = $('#audit-table tbody');
  tbody.replaceChildren();
  for (const a of state.audit) {
    const summary = diffText(a.before, a.after);
    tbody.append(el('tr', {},
      el('td', { title: fmtAgo(a.at) }, fmtTime(a.at)),
      // Token name, its role when the name does not say it, and the
      // client's address of an API change.
      el('td', {}, a.token, a.role && a.role !== a.token ? ` (${a.role})` : null,
        a.client ? el('div', { class: 'muted' }, a.client) : null),
      el('td', {}, el('code', {}, a.action)),
      el('td', {}, a.target),
      el('td', {}, el('details', {},
        el('summary', {}, summary || 'details'),
        el('div', { class: 'audit-json' },
          el('div', {}, el('h4', {}, 'Before'), el('pre', {}, a.before ? JSON.stringify(a.before, null, 2) : '–')),
          el('div', {}, el('h4', {}, 'After'), el('pre', {}, a.after ? JSON.stringify(a.after, null, 2) : '–')))))));
  }
  $('#audit-table').hidden = state.audit.length === 0;
  $('#audit-empty').hidden = state.audit.length !== 0;
  $('#audit-more').hidden = !state.auditMore;
}

// ---------------------------------------------------------------- start

setInterval(pollStats, STATS_EVERY_MS);
setInterval(tickRemaining, 1000);
// Keep the open tab current: reload it when the config version moved (a
// change by another operator or CLI) and, for hosts, on every tick
// (heartbeats and applied versions change without a new config version).
let watchBusy = false;
setInterval(async () => {
  if (watchBusy || !state.token || $('#app').hidden || document.hidden) return;
  if ($('#strategy-dialog').open || $('#confirm-dialog').open) return;
  watchBusy = true;
  try {
    const before = state.version;
    const v = (await api('GET', '/version')).version;
    const moved = v !== before;
    setVersion(v);
    if (state.tab === 'strategies' && $('#strategies-table').contains(document.activeElement)) return;
    if (state.tab === 'audit' && state.audit.length > 50) return; // keep "load older" pages
    if (moved || state.tab === 'hosts') await refreshTab();
  } catch (e) {
    // The next tick retries; a 401 already shows the token prompt.
  } finally {
    watchBusy = false;
  }
}, REFRESH_EVERY_MS);

(function start() {
  // The token lives for this tab only (sessionStorage); one an older page
  // kept in localStorage across browser restarts is removed.
  localStorage.removeItem(TOKEN_KEY);
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) useToken(saved);
  else showTokenPanel('');
})();
