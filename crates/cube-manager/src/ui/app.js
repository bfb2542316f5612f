// Cube's web UI: one page over the manager's API. What it shows is loaded once, then kept
// up to date from `GET /events` (never a poll on a timer); a broken stream is shown and
// resumed. The token (with --acl) lives in this tab's session storage and travels only in
// the Authorization header. Every value from the API reaches the page as text, never as
// markup.
'use strict';

const ROLES = ['read', 'submit', 'operator', 'management'];
const STATES = ['Pending', 'Scheduled', 'Running', 'Completed', 'Failed', 'Lost'];
const PAGE_SIZE = 100;
const EVENTS_KEPT = 1000;

const ui = {
  token: sessionStorage.getItem('cube-token') || '',
  // The project the page shows: `*` is every project the token reaches.
  project: sessionStorage.getItem('cube-project') || '*',
  projects: [],
  self: null,
  index: 0,
  nodes: new Map(),
  tasks: new Map(),
  jobs: new Map(),
  queue: [],
  services: [],
  shards: null,
  leader: null,
  events: [],
  removed: new Set(),
  loadingTasks: false,
  generation: 0,
  stream: null,
  started: false,
  retry: 1000,
  page: null,
  drawing: false,
  refreshing: new Set(),
};

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(extra) {
  const all = Object.assign({}, extra || {});
  if (ui.token) all.Authorization = 'Bearer ' + ui.token;
  return all;
}

// `path` in `project` (the page's by default): every route takes `?project=`.
function scoped(path, project) {
  const scope = project || ui.project;
  if (!scope || scope === 'default') return path;
  return path + (path.includes('?') ? '&' : '?') + 'project=' + encodeURIComponent(scope);
}

// One request to the API, in the page's project (or `project`): its JSON, its X-Cube-Index
// and its next page's token. A 401 asks for a token.
async function api(method, path, body, project) {
  const init = { method, headers: headers(body === undefined ? {} : { 'Content-Type': 'application/json' }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(scoped(path, project), init);
  const text = await response.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = null; }
  if (!response.ok) {
    const message = (json && json.Message) || text || response.statusText;
    if (response.status === 401) askForToken(message);
    throw new ApiError(response.status, message);
  }
  return { json, index: indexOf(response.headers.get('X-Cube-Index')), next: response.headers.get('X-Cube-Next-Token') };
}

// An X-Cube-Index: a number, or (every project on managers that act for their own shards)
// a gathered cursor, one index per manager, kept as it came.
function indexOf(text) {
  if (!text) return 0;
  return /^[0-9]+$/.test(text) ? Number(text) : text;
}

// ---- the token ------------------------------------------------------------------------

let tokenWaiters = [];

function askForToken(why) {
  const dialog = document.getElementById('token-dialog');
  document.getElementById('token-error').textContent = ui.token ? why : '';
  if (!dialog.open) dialog.showModal();
  document.getElementById('token-input').focus();
  return new Promise((resolve) => tokenWaiters.push(resolve));
}

function setUpTokenDialog() {
  const form = document.getElementById('token-form');
  form.addEventListener('submit', () => {
    ui.token = document.getElementById('token-input').value.trim();
    sessionStorage.setItem('cube-token', ui.token);
    document.getElementById('token-input').value = '';
    const waiters = tokenWaiters;
    tokenWaiters = [];
    waiters.forEach((resolve) => resolve());
    start();
  });
}

function can(role) {
  if (!ui.self || !ui.self.Acl) return true;
  return ROLES.indexOf(ui.self.Role) >= ROLES.indexOf(role);
}

// ---- building the page ----------------------------------------------------------------

// An element with attributes and children; strings become text nodes.
function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else if (name === 'text') node.textContent = value;
    // Through the CSSOM: the page's policy allows no style attribute.
    else if (name === 'width') node.style.width = value;
    else node.setAttribute(name, value === true ? '' : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function stateBadge(state) {
  return el('span', { class: 'state ' + state }, state || '—');
}

// "3 min ago", with the absolute time on hover.
function ago(time) {
  if (!time || time.startsWith('0001-')) return el('span', { class: 'muted' }, '—');
  const then = new Date(time);
  const seconds = Math.max(0, Math.round((Date.now() - then.getTime()) / 1000));
  let text;
  if (seconds < 60) text = seconds + ' s ago';
  else if (seconds < 3600) text = Math.round(seconds / 60) + ' min ago';
  else if (seconds < 86400) text = Math.round(seconds / 3600) + ' h ago';
  else text = Math.round(seconds / 86400) + ' d ago';
  return el('time', { datetime: time, title: then.toLocaleString() }, text);
}

function bytes(value) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let amount = Number(value || 0);
  let unit = 0;
  while (amount >= 1024 && unit < units.length - 1) { amount /= 1024; unit += 1; }
  return (unit === 0 ? amount : amount.toFixed(1)) + ' ' + units[unit];
}

function bar(label, used, total, format) {
  const share = total > 0 ? Math.min(1, used / total) : 0;
  const text = format(used) + ' / ' + format(total);
  return el('div', {},
    el('div', { class: 'bar' + (share >= 0.999 ? ' full' : ''), role: 'meter', 'aria-label': label,
      'aria-valuemin': '0', 'aria-valuemax': String(total), 'aria-valuenow': String(used), 'aria-valuetext': text },
    el('span', { width: (share * 100).toFixed(1) + '%' })),
    el('span', { class: 'bar-label' }, text));
}

function table(columns, rows, empty) {
  if (rows.length === 0) return el('p', { class: 'muted' }, empty);
  return el('div', { class: 'table-wrap' }, el('table', {},
    el('thead', {}, el('tr', {}, columns.map((column) =>
      el('th', { scope: 'col', class: column.class }, column.title)))),
    el('tbody', {}, rows.map((row) => el('tr', row.attributes || {}, row.cells.map((cell, at) =>
      el('td', { class: columns[at].class }, cell)))))));
}

function taskLink(task) {
  return el('a', { href: '#/tasks/' + task.ID }, task.Name || task.ID.slice(0, 8));
}

function confirmThen(text, action) {
  const dialog = document.getElementById('confirm-dialog');
  document.getElementById('confirm-text').textContent = text;
  dialog.returnValue = '';
  dialog.onclose = () => { if (dialog.returnValue === 'yes') action(); };
  dialog.showModal();
  document.getElementById('confirm-no').focus();
}

function actionButton(label, role, confirmText, action, extra) {
  const allowed = can(role);
  return el('button', Object.assign({
    type: 'button',
    disabled: !allowed,
    title: allowed ? undefined : 'needs a ' + role + ' token',
    onclick: async () => {
      let text = confirmText;
      if (typeof confirmText === 'function') {
        try { text = await confirmText(); } catch (err) { showNotice(label + ' failed: ' + err.message, true); return; }
      }
      confirmThen(text, async () => {
        try { await action(); showNotice(label + ': done'); }
        catch (err) { showNotice(label + ' failed: ' + err.message, true); }
      });
    },
  }, extra || {}), label);
}

function showNotice(text, bad) {
  const notice = document.getElementById('notice');
  if (notice) {
    notice.textContent = text;
    notice.className = bad ? 'error' : 'muted';
  }
}

// ---- the state, and the stream that keeps it ------------------------------------------

// The first page of tasks is drawn at once; the others are read after it, a page at a
// time, while the page already follows the events (a big cluster's first render waits for
// one page, not for every task).
const FIRST_TASKS = 500;
const MORE_TASKS = 5000;

// Everything again (a reconnection, a tab shown again): the first reads, then the rest.
async function loadAll() {
  await loadFirst();
  loadRest();
}

// What the first render waits for: the nodes and the first page of tasks. The jobs, the
// waiting list (which holds every request ever let in) and the other tasks come after it
// (`loadRest`).
async function loadFirst() {
  let [nodes, tasks] = await Promise.all([
    api('GET', '/nodes'),
    api('GET', '/tasks?summary=true&limit=' + FIRST_TASKS),
  ]);
  // A gathered cursor stands for every manager's index but not for this one's nodes list:
  // the nodes are read again after it, so that the stream from the cursor misses none.
  if (typeof tasks.index === 'string') nodes = await api('GET', '/nodes');
  ui.generation = (ui.generation || 0) + 1;
  ui.nodes = new Map((nodes.json || []).map((node) => [node.Name, node]));
  ui.tasks = new Map((tasks.json || []).map((task) => [task.ID, task]));
  ui.removed = new Set();
  // The lists were read at different indexes: the stream starts after the oldest, so that
  // no change is missed (one seen twice is applied twice, to the same end). What is read
  // after this is newer still, and what changes after it comes as events.
  ui.index = typeof tasks.index === 'string' ? tasks.index : Math.min(nodes.index, tasks.index);
  ui.nextTasks = tasks.next;
  ui.loadingTasks = Boolean(tasks.next);
}

function loadRest() {
  if (ui.nextTasks) loadMoreTasks(ui.nextTasks, ui.generation);
  else performance.mark('cube-all-tasks');
  loadTheRest(ui.generation);
}

async function loadTheRest(generation) {
  const optional = (path) => api('GET', path).catch((err) => { console.warn('could not read ' + path, err); return null; });
  const [jobs, queue, shards, leader, services, projects] = await Promise.all([
    optional('/jobs'),
    optional('/queue'),
    optional('/shards'),
    // Several managers on etcd answer who leads; a manager on its own store has no such route.
    optional('/leader'),
    optional('/services'),
    optional('/projects'),
  ]);
  if (generation !== ui.generation) return;
  if (projects) {
    ui.projects = (projects.json || []).map((project) => project.Name).filter(Boolean);
    drawProjects();
  }
  if (jobs) ui.jobs = new Map((jobs.json || []).map((job) => [jobName(job), job]));
  if (queue) ui.queue = queue.json || [];
  ui.shards = shards ? shards.json : null;
  ui.leader = leader && leader.json ? leader.json.Leader : null;
  ui.services = services ? services.json || [] : [];
  draw();
}

// The rest of the tasks, a page at a time. A task the events already brought is newer than
// its page (or the events still to come make it so); a removed one stays removed.
async function loadMoreTasks(next, generation) {
  try {
    while (next && generation === ui.generation) {
      const page = await api('GET', '/tasks?summary=true&limit=' + MORE_TASKS + '&next=' + encodeURIComponent(next));
      if (generation !== ui.generation) return;
      for (const task of page.json || []) {
        if (!ui.tasks.has(task.ID) && !ui.removed.has(task.ID)) ui.tasks.set(task.ID, task);
      }
      next = page.next;
      draw();
    }
  } catch (err) {
    console.warn('could not read every task', err);
  }
  if (generation === ui.generation) {
    ui.loadingTasks = false;
    performance.mark('cube-all-tasks');
    draw();
  }
}

// A job's key, as its copies' `Job` says it: its name in `default`, `PROJECT/NAME` elsewhere.
function jobName(view) {
  const job = view.Job || view;
  return job.Project && job.Project !== 'default' ? job.Project + '/' + job.Name : job.Name;
}

// The job routes' path and project of a job's key.
function jobRoute(key) {
  const at = key.indexOf('/');
  const [project, name] = at < 0 ? ['default', key] : [key.slice(0, at), key.slice(at + 1)];
  return { project, name, path: '/jobs/' + encodeURIComponent(name) };
}

// The header's project selector: every project the token reaches, or one.
function drawProjects() {
  const select = document.getElementById('project');
  const names = ['*', ...ui.projects];
  if (!names.includes(ui.project)) names.push(ui.project);
  select.replaceChildren(...names.map((name) => el('option', { value: name, selected: name === ui.project },
    name === '*' ? 'every project' : name)));
}

function setUpProjects() {
  const select = document.getElementById('project');
  drawProjects();
  select.addEventListener('change', () => {
    ui.project = select.value;
    sessionStorage.setItem('cube-project', ui.project);
    if (!ui.started) return;
    ui.retry = 1000;
    reconnect();
  });
}

function setConnection(state, text) {
  const badge = document.getElementById('connection');
  badge.className = 'connection ' + state;
  badge.textContent = text;
}

// A hidden tab follows nothing: a browser opens at most six connections to one manager,
// and twenty tabs each holding a stream would leave none for the tab in front. A tab that
// is shown again reads everything anew and follows from there.
function pauseWhileHidden() {
  document.addEventListener('visibilitychange', () => {
    if (!ui.started) return;
    if (document.hidden) {
      if (ui.stream) ui.stream.abort();
      ui.stream = null;
      setConnection('', 'paused while the tab is hidden');
    } else {
      ui.retry = 1000;
      reconnect();
    }
  });
}

async function follow() {
  if (document.hidden) {
    setConnection('', 'paused while the tab is hidden');
    return;
  }
  if (ui.stream) ui.stream.abort();
  const controller = new AbortController();
  ui.stream = controller;
  try {
    await readLines('/events?index=' + encodeURIComponent(ui.index), { headers: headers(), signal: controller.signal }, take, () => {
      setConnection('live', 'live');
      ui.retry = 1000;
    });
  } catch (err) {
    if (controller.signal.aborted) return;
    if (err.status === 410 || err.status === 400) {
      // The events after our index are no longer kept: read everything again.
      await loadAll().catch(() => {});
      draw();
      // Refused again right after reading everything: asked again after a pause, never in
      // a tight loop.
      const now = Date.now();
      const again = ui.refusedAt && now - ui.refusedAt < 2000;
      ui.refusedAt = now;
      if (!again) return follow();
      setConnection('lost', 'the event stream is refused (' + err.message + ') — trying again');
      const wait = ui.retry;
      ui.retry = Math.min(ui.retry * 2, 10000);
      setTimeout(follow, wait);
      return;
    }
    console.warn('the event stream broke', err);
  }
  if (controller.signal.aborted) return;
  // The stream ended (the manager stopped, or dropped us): say so, and come back.
  setConnection('lost', 'connection lost — reconnecting');
  const wait = ui.retry;
  ui.retry = Math.min(ui.retry * 2, 10000);
  setTimeout(reconnect, wait);
}

async function reconnect() {
  try {
    await loadAll();
    draw();
  } catch (err) {
    setConnection('lost', 'connection lost — ' + err.message);
    setTimeout(reconnect, ui.retry);
    ui.retry = Math.min(ui.retry * 2, 10000);
    return;
  }
  follow();
}

// One event from the stream.
function take(event) {
  if (event.Topic === 'Stream') {
    // `Dropped` or `Closed`: the stream ends after it; `follow` resumes.
    return;
  }
  // Every project on managers acting for their own shards: the gathered cursor after it.
  if (event.Cursor) ui.index = event.Cursor;
  else if (event.Index && typeof ui.index === 'number') ui.index = Math.max(ui.index, event.Index);
  ui.events.push(event);
  if (ui.events.length > EVENTS_KEPT) ui.events.splice(0, ui.events.length - EVENTS_KEPT);
  const object = event.Object;
  switch (event.Topic) {
    case 'Task':
      if (event.Type === 'Removed') { ui.tasks.delete(event.Key); ui.removed.add(event.Key); }
      else if (object && object.ID) ui.tasks.set(object.ID, object);
      break;
    case 'Node':
      if (event.Type === 'NodeRemoved') ui.nodes.delete(event.Key);
      else if (object && object.Name) ui.nodes.set(object.Name, object);
      break;
    case 'Job':
    case 'Deployment':
      refresh('jobs');
      break;
    case 'Queue':
    case 'Quota':
      refresh('queue');
      break;
    case 'Project':
      refresh('projects');
      break;
    default:
      break;
  }
  draw();
}

// Reads a list again after an event that names it, once however many events arrive.
function refresh(what) {
  if (ui.refreshing.has(what)) return;
  ui.refreshing.add(what);
  queueMicrotask(async () => {
    try {
      if (what === 'jobs') {
        const jobs = (await api('GET', '/jobs')).json || [];
        ui.jobs = new Map(jobs.map((job) => [jobName(job), job]));
      } else if (what === 'projects') {
        ui.projects = ((await api('GET', '/projects')).json || []).map((project) => project.Name).filter(Boolean);
        drawProjects();
      } else if (what === 'queue') {
        ui.queue = (await api('GET', '/queue')).json || [];
        ui.services = (await api('GET', '/services')).json || [];
      }
    } catch (err) {
      console.warn('could not read ' + what, err);
    } finally {
      ui.refreshing.delete(what);
      draw();
    }
  });
}

// Draws the page again at the next frame, once however many changes came.
function draw() {
  if (ui.drawing) return;
  ui.drawing = true;
  requestAnimationFrame(() => {
    ui.drawing = false;
    if (ui.page && ui.page.update) ui.page.update();
  });
}

// ---- pages ----------------------------------------------------------------------------

function clusterPage() {
  const summary = el('div', { class: 'summary', 'aria-label': 'Tasks by state' });
  const managers = el('div');
  const nodes = el('div');
  return {
    title: 'Cluster',
    body: [el('h1', {}, 'Cluster'), el('h2', {}, 'Tasks by state'), summary,
      el('h2', {}, 'Nodes'), nodes, el('h2', {}, 'Managers'), managers],
    update() {
      // One pass over the tasks: the counts by state and what each node holds.
      const counts = {};
      const onNode = new Map();
      for (const task of ui.tasks.values()) {
        counts[task.State] = (counts[task.State] || 0) + 1;
        if (task.NodeName && (task.State === 'Running' || task.State === 'Scheduled')) {
          if (!onNode.has(task.NodeName)) onNode.set(task.NodeName, []);
          onNode.get(task.NodeName).push(task);
        }
      }
      summary.replaceChildren(...STATES.map((state) => el('a', { class: 'count', href: '#/tasks?state=' + state },
        el('b', {}, String(counts[state] || 0)), stateBadge(state))),
      ui.loadingTasks ? el('span', { class: 'muted', role: 'status' }, 'counting the rest…') : '');
      const rows = [...ui.nodes.values()].sort((a, b) => a.Name.localeCompare(b.Name)).map((node) => {
        const capacity = node.Capacity || {};
        const allocated = node.Allocated || {};
        const held = onNode.get(node.Name) || [];
        return {
          attributes: { 'data-node': node.Name },
          cells: [
            el('strong', {}, node.Name),
            stateBadge(node.Status),
            node.Eligible === false ? 'ineligible' : (node.Drain ? 'draining' : 'eligible'),
            bar('CPU of ' + node.Name, allocated.Cpu || 0, capacity.Cpu || 0, (v) => Number(v).toFixed(2) + ' cores'),
            bar('Memory of ' + node.Name, allocated.Memory || 0, capacity.Memory || 0, bytes),
            bar('Disk of ' + node.Name, allocated.Disk || 0, capacity.Disk || 0, bytes),
            el('span', {}, held.slice(0, 5).map((task, at) => [at ? ', ' : '', taskLink(task)]),
              held.length > 5 ? ' and ' + (held.length - 5) + ' more' : ''),
          ],
        };
      });
      nodes.replaceChildren(table([
        { title: 'Node' }, { title: 'State' }, { title: 'Eligibility', class: 'optional' },
        { title: 'CPU' }, { title: 'Memory' }, { title: 'Disk', class: 'optional' }, { title: 'Tasks' },
      ], rows, 'No node has joined yet: start one with `cube worker`.'));
      const shards = ui.shards;
      if (!shards || !shards.Managers) {
        managers.replaceChildren(el('p', { class: 'muted' }, 'One manager.'));
      } else {
        managers.replaceChildren(table([{ title: 'Manager' }, { title: 'Shards' }],
          shards.Managers.map((manager) => ({ cells: [
            el('span', {}, manager.Manager, manager.Manager === ui.leader ? el('span', { class: 'state Ready' }, 'leader') : ''),
            (manager.Shards || []).join(', ')] })),
          'No manager holds shards.'));
      }
    },
  };
}

function tasksPage(query) {
  let state = query.get('state') || '';
  let text = '';
  let page = 0;
  const list = el('div');
  const counter = el('p', { class: 'muted', role: 'status' });
  const pager = el('div', { class: 'actions' });
  const select = el('select', { id: 'task-state', onchange: () => { state = select.value; page = 0; draw(); } },
    el('option', { value: '' }, 'every state'), STATES.map((name) => el('option', { value: name, selected: name === state }, name)));
  const search = el('input', { id: 'task-search', type: 'text', placeholder: 'name, ID, node or job',
    oninput: () => { text = search.value.toLowerCase(); page = 0; draw(); } });
  return {
    title: 'Tasks',
    body: [el('h1', {}, 'Tasks'), el('div', { class: 'filter' },
      el('label', { for: 'task-state' }, 'State'), select,
      el('label', { for: 'task-search' }, 'Search'), search), counter, list, pager],
    update() {
      const matching = [...ui.tasks.values()].filter((task) => (!state || task.State === state)
        && (!text || [task.Name, task.ID, task.NodeName, task.Job].some((v) => v && v.toLowerCase().includes(text))))
        .sort((a, b) => (b.CreatedTime || '').localeCompare(a.CreatedTime || ''));
      const pages = Math.max(1, Math.ceil(matching.length / PAGE_SIZE));
      page = Math.min(page, pages - 1);
      const shown = matching.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
      counter.textContent = matching.length + (matching.length === 1 ? ' task' : ' tasks') + (ui.loadingTasks ? ' so far (reading the rest)' : '')
        + (pages > 1 ? ', page ' + (page + 1) + ' of ' + pages : '');
      list.replaceChildren(table([
        { title: 'Name' }, { title: 'State' }, { title: 'Node' }, { title: 'Job', class: 'optional' },
        { title: 'Image', class: 'optional' }, { title: 'Created' },
      ], shown.map((task) => ({ attributes: { 'data-task': task.ID }, cells: [taskLink(task), stateBadge(task.State),
        task.NodeName || el('span', { class: 'muted' }, task.PendingReason || '—'),
        task.Job ? el('a', { href: '#/jobs/' + encodeURIComponent(task.Job) }, task.Job) : '',
        task.Image, ago(task.CreatedTime)] })), 'No task matches.'));
      pager.replaceChildren(
        el('button', { type: 'button', disabled: page === 0, onclick: () => { page -= 1; draw(); } }, 'Previous'),
        el('button', { type: 'button', disabled: page >= pages - 1, onclick: () => { page += 1; draw(); } }, 'Next'));
    },
  };
}

// Reads a stream of JSON lines into `onLine` until it ends or `init.signal` aborts;
// `onOpen` is called once the answer said yes. A refusal throws its status and message.
async function readLines(path, init, onLine, onOpen) {
  const response = await fetch(scoped(path), init);
  if (!response.ok) {
    const text = await response.text();
    let message = text;
    try { message = JSON.parse(text).Message || text; } catch (_) { /* plain text */ }
    throw new ApiError(response.status, message);
  }
  if (onOpen) onOpen();
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, end).trim();
      buffer = buffer.slice(end + 1);
      if (line) onLine(JSON.parse(line));
    }
  }
}

function outputLine(target, line) {
  if (line.Text !== undefined) {
    target.append(el('span', { class: line.Stream === 'stderr' ? 'stderr' : '' }, line.Text));
  } else if (line.ExitCode !== undefined) {
    target.append(el('span', { class: 'muted' }, '[exit code ' + line.ExitCode + ']\n'));
  }
  target.scrollTop = target.scrollHeight;
}

function taskPage(id) {
  const details = el('div');
  const history = el('div');
  const placement = el('div', { id: 'placement' });
  const logs = el('pre', { class: 'logs', id: 'logs', 'aria-label': 'Logs', tabindex: '0' });
  const output = el('pre', { class: 'logs', id: 'exec-output', 'aria-label': 'Command output', tabindex: '0' });
  const command = el('input', { id: 'exec-command', type: 'text', placeholder: 'ls -l /' });
  let following = null;
  let lastState = null;
  const followButton = el('button', { type: 'button', id: 'follow-logs', disabled: !can('submit'),
    title: can('submit') ? undefined : 'needs a submit token', onclick: () => toggleLogs() }, 'Follow logs');
  function toggleLogs() {
    if (following) { following.abort(); following = null; followButton.textContent = 'Follow logs'; return; }
    following = new AbortController();
    followButton.textContent = 'Stop following';
    logs.replaceChildren();
    const mine = following;
    readLines('/tasks/' + id + '/logs?follow=true&tail=200', { headers: headers(), signal: mine.signal },
      (line) => outputLine(logs, line))
      .catch((err) => { if (!mine.signal.aborted) logs.append(el('span', { class: 'stderr' }, '[' + err.message + ']\n')); })
      .finally(() => { if (following === mine) { following = null; followButton.textContent = 'Follow logs'; } });
  }
  const stop = actionButton('Stop', 'submit', 'Stop task ' + id + '? Its container is stopped; a task of a job is replaced by its job.',
    () => api('DELETE', '/tasks/' + id), { id: 'stop-task', class: 'danger' });
  const run = el('button', { type: 'button', id: 'exec-run', disabled: !can('submit'), onclick: async () => {
    const words = command.value.trim().split(/\s+/).filter(Boolean);
    if (words.length === 0) return;
    output.replaceChildren();
    try {
      await readLines('/tasks/' + id + '/exec', { method: 'POST', headers: headers({ 'Content-Type': 'application/json' }),
        body: JSON.stringify({ Cmd: words }) }, (line) => outputLine(output, line));
    } catch (err) { output.append(el('span', { class: 'stderr' }, '[' + err.message + ']\n')); }
  } }, 'Run');
  return {
    title: 'Task',
    body: [el('h1', {}, 'Task ', el('code', {}, id)), el('div', { class: 'actions' }, stop, el('span', { id: 'notice', role: 'status' })),
      details, placement, el('h2', {}, 'History'), history,
      el('h2', {}, 'Logs'), el('div', { class: 'actions' }, followButton), logs,
      el('h2', {}, 'Run a command'), el('div', { class: 'filter' }, el('label', { for: 'exec-command' }, 'Command'), command, run), output],
    leave() { if (following) following.abort(); },
    update() {
      const task = ui.tasks.get(id);
      if (!task) {
        details.replaceChildren(el('p', { class: 'muted' }, 'No task ' + id + ' (it may have been removed).'));
        return;
      }
      stop.disabled = !can('submit') || task.DesiredState === 'Completed' || ['Completed', 'Failed', 'Lost'].includes(task.State);
      const fields = [
        ['Name', task.Name], ['State', stateBadge(task.State)], ['Desired', task.DesiredState],
        ['Node', task.NodeName || '—'], ['Image', task.Image], ['Job', task.Job || '—'],
        ['Project', task.Project || 'default'], ['Owner', task.Owner || '—'],
        ['CPU', task.Cpu ? task.Cpu + ' cores' : '—'], ['Memory', task.Memory ? bytes(task.Memory) : '—'],
        ['Command', (task.Cmd || []).join(' ') || '—'], ['Ports', Object.entries(task.PortBindings || {}).map(([c, h]) => h + '→' + c).join(', ') || '—'],
        ['Created', ago(task.CreatedTime)], ['Started', ago(task.StartTime)], ['Restarts', String(task.RestartCount || 0)],
        ['Error', task.Error || '—'],
      ];
      details.replaceChildren(el('section', { class: 'card' }, el('dl', { class: 'fields' },
        fields.map(([name, value]) => [el('dt', {}, name), el('dd', {}, value)]))));
      if (task.History) {
        history.replaceChildren(table([{ title: 'When' }, { title: 'What' }, { title: 'Detail', class: 'optional' }],
          [...task.History].reverse().map((entry) => ({ cells: [ago(entry.Time), String(entry.Event || ''), entry.Message || ''] })),
          'No history yet.'));
      } else if (lastState === null) {
        api('GET', '/tasks/' + id).then((full) => { ui.tasks.set(id, full.json); draw(); }).catch(() => {});
      }
      if (task.State !== lastState) {
        lastState = task.State;
        if (task.State === 'Pending') {
          api('GET', '/tasks/' + id + '/placement')
            .then((answer) => drawPlacement(placement, answer.json))
            .catch((err) => placement.replaceChildren(el('p', { class: 'error' }, err.message)));
        } else {
          placement.replaceChildren();
        }
      }
    },
  };
}

// Why a task waits, node by node (`cube why`).
function drawPlacement(target, answer) {
  target.replaceChildren(el('h2', {}, 'Why it waits'),
    el('p', {}, answer.Summary || 'It fits a node now: it is placed at the next pass.'),
    table([{ title: 'Node' }, { title: 'Fits' }, { title: 'Why not' }], (answer.Nodes || []).map((node) =>
      ({ cells: [node.Name, node.Fits ? 'yes' : 'no', node.Reason || ''] })), 'No node has joined.'));
}

function groupSummary(view) {
  return Object.entries(view.Summary || {}).map(([group, counts]) =>
    group + ': ' + Object.entries(counts).filter(([, n]) => typeof n === 'number' && n > 0).map(([k, n]) => n + ' ' + k.toLowerCase()).join(', '))
    .join('; ');
}

function jobsPage() {
  const list = el('div');
  return {
    title: 'Jobs',
    body: [el('h1', {}, 'Jobs'), list],
    update() {
      const jobs = [...ui.jobs.values()].sort((a, b) => jobName(a).localeCompare(jobName(b)));
      list.replaceChildren(table([{ title: 'Job' }, { title: 'Type', class: 'optional' }, { title: 'Status' },
        { title: 'Version', class: 'num' }, { title: 'Groups' }, { title: 'Submitted', class: 'optional' }],
      jobs.map((view) => ({ attributes: { 'data-job': jobName(view) }, cells: [
        el('a', { href: '#/jobs/' + encodeURIComponent(jobName(view)) }, jobName(view)),
        view.Job ? view.Job.Type : '', stateBadge(view.Status), String(view.Version), groupSummary(view), ago(view.SubmitTime)] })),
      'No job yet: `cube job run FILE`.'));
    },
  };
}

function jobPage(name) {
  const body = el('div');
  const copies = el('div');
  const deployment = el('div');
  const versions = el('div');
  const { project, path } = jobRoute(name);
  const scale = el('input', { id: 'scale-count', type: 'number', min: '0', value: '1', width: '6rem' });
  // The confirmation says what the manager's plan would do (`cube job plan`).
  const scaleText = async () => {
    const view = ui.jobs.get(name);
    const job = JSON.parse(JSON.stringify(view.Job));
    job.Groups[0].Count = Number(scale.value);
    const plan = (await api('POST', '/jobs/plan', job, project)).json;
    return 'Scale ' + name + ' to ' + scale.value + ' copies? The plan: ' + (plan.Create || []).length + ' to create, '
      + (plan.Stop || []).length + ' to stop, ' + (plan.Keep || []).length + ' kept.';
  };
  const scaleButton = actionButton('Scale', 'submit', scaleText, async () => {
    const view = ui.jobs.get(name);
    const group = view && view.Job && view.Job.Groups && view.Job.Groups[0] ? view.Job.Groups[0].Name : '';
    await api('POST', path + '/scale', { Group: group, Count: Number(scale.value) }, project);
  }, { id: 'scale-job' });
  const stop = actionButton('Stop job', 'submit', 'Stop job ' + name + '? Every copy is stopped.', () => api('DELETE', path, undefined, project), { id: 'stop-job', class: 'danger' });
  const promote = actionButton('Promote', 'submit', 'Promote the canaries of ' + name + '? The rollout goes on to every copy.', () => api('POST', path + '/promote', {}, project), { id: 'promote-job' });
  let loaded = null;
  let drawn = null;
  return {
    title: 'Job',
    body: [el('h1', {}, 'Job ', el('code', {}, name)),
      el('div', { class: 'actions' }, el('label', { for: 'scale-count' }, 'Copies'), scale, scaleButton, promote, stop, el('span', { id: 'notice', role: 'status' })),
      body, el('h2', {}, 'Deployment'), deployment, el('h2', {}, 'Copies'), copies, el('h2', {}, 'Versions'), versions],
    update() {
      const view = ui.jobs.get(name);
      if (!view) { body.replaceChildren(el('p', { class: 'muted' }, 'No job ' + name + '.')); return; }
      if (loaded !== view.Version) {
        loaded = view.Version;
        const group = view.Job && view.Job.Groups && view.Job.Groups[0];
        if (group) scale.value = String(group.Count);
      }
      body.replaceChildren(el('section', { class: 'card' }, el('dl', { class: 'fields' },
        el('dt', {}, 'Status'), el('dd', {}, stateBadge(view.Status)),
        el('dt', {}, 'Version'), el('dd', {}, String(view.Version)),
        el('dt', {}, 'Groups'), el('dd', {}, groupSummary(view)),
        el('dt', {}, 'Submitted'), el('dd', {}, ago(view.SubmitTime)))));
      const mine = [...ui.tasks.values()].filter((task) => task.Job === name)
        .sort((a, b) => (a.Index || 0) - (b.Index || 0));
      copies.replaceChildren(table([{ title: 'Copy' }, { title: 'State' }, { title: 'Node' }, { title: 'Created', class: 'optional' }],
        mine.map((task) => ({ cells: [taskLink(task), stateBadge(task.State), task.NodeName || '—', ago(task.CreatedTime)] })), 'No copies.'));
      // The deployment is read again when the job changed (a Job or Deployment event reads
      // the jobs again, which gives a new view), not at every event.
      if (drawn !== view) {
        drawn = view;
        api('GET', path + '/deployment', undefined, project).then((answer) => drawDeployment(deployment, answer.json))
          .catch(() => deployment.replaceChildren(el('p', { class: 'muted' }, 'No deployment.')));
        api('GET', path + '/versions', undefined, project).then((answer) => drawVersions(versions, name, answer.json || []))
          .catch((err) => versions.replaceChildren(el('p', { class: 'error' }, err.message)));
      }
    },
  };
}

// The kept versions, newest first, each with what it changed and a revert to it.
function drawVersions(target, name, kept) {
  const { project, path } = jobRoute(name);
  target.replaceChildren(table([{ title: 'Version', class: 'num' }, { title: 'Submitted' }, { title: 'Stable' },
    { title: 'Changes' }, { title: '' }], kept.map((version) => ({ cells: [
    String(version.Version) + (version.Current ? ' (current)' : ''), ago(version.SubmitTime), version.Stable ? 'yes' : 'no',
    el('div', {}, (version.Diff || []).map((line) => el('div', {}, el('code', {}, line)))),
    version.Current ? '' : actionButton('Revert to ' + version.Version, 'submit',
      'Revert ' + name + ' to version ' + version.Version + '? Its spec becomes a new version, rolled out as any other.',
      () => api('POST', path + '/revert', { Version: version.Version }, project)),
  ] })), 'No versions kept.'));
}

function drawDeployment(target, deployment) {
  if (!deployment || !deployment.Groups) { target.replaceChildren(el('p', { class: 'muted' }, 'No deployment.')); return; }
  const rows = Object.entries(deployment.Groups).map(([group, counts]) => {
    const desired = counts.Desired || 0;
    const healthy = counts.Healthy || 0;
    const placed = Math.max(0, (counts.Placed || 0) - healthy);
    const share = (n) => (desired > 0 ? (100 * Math.min(n, desired)) / desired : 0).toFixed(1) + '%';
    return { cells: [group, el('div', { class: 'progress', role: 'progressbar', 'aria-label': 'Rollout of ' + group,
      'aria-valuemin': '0', 'aria-valuemax': String(desired), 'aria-valuenow': String(healthy) },
    el('span', { class: 'healthy', width: share(healthy) }), el('span', { class: 'placed', width: share(placed) })),
    healthy + ' of ' + desired + ' healthy'] };
  });
  target.replaceChildren(el('p', {}, 'Version ', String(deployment.Version), ' — ', stateBadge(deployment.State),
    deployment.Reason ? ' ' + deployment.Reason : ''),
    table([{ title: 'Group' }, { title: 'Progress' }, { title: 'Healthy' }], rows, 'No groups.'));
}

function queuePage() {
  const list = el('div');
  const services = el('div');
  return {
    title: 'Waiting list',
    body: [el('h1', {}, 'Waiting list'), list, el('h2', {}, 'Services'), services],
    update() {
      services.replaceChildren(table([{ title: 'Service' }, { title: 'Node' }, { title: 'Address' }],
        (ui.services || []).map((service) => ({ cells: [
          el('a', { href: '#/tasks/' + service.ID }, service.Name || service.ID),
          service.Node || '—',
          Object.entries(service.Ports || {}).map(([port, host]) => (service.Address || '') + ':' + host + ' → ' + port).join(', ') || (service.Address || '—')] })),
        'No claimed request answers anywhere yet.'));
      // The waiting list's order, as `cube queue` shows it: higher priority first, then the
      // lower queue number. Managers acting for their shards each number their own positions.
      const entries = [...ui.queue].sort((a, b) => (b.Priority || 0) - (a.Priority || 0) || (a.Queue || 0) - (b.Queue || 0));
      list.replaceChildren(table([{ title: 'Position', class: 'num' }, { title: 'Request' }, { title: 'State' },
        { title: 'Waiting for' }, { title: 'Owner', class: 'optional' }, { title: 'Priority', class: 'num' }, { title: 'Since' }],
      entries.map((entry) => ({ attributes: { 'data-queue': entry.ID }, cells: [entry.Position ? String(entry.Position) : '—',
        entry.Kind === 'task' ? el('a', { href: '#/tasks/' + entry.ID }, (entry.Request && entry.Request.Name) || entry.ID) :
          el('a', { href: '#/jobs/' + encodeURIComponent(entry.ID) }, entry.ID),
        stateBadge(entry.State), entry.WaitingFor || '—', entry.Owner || '', String(entry.Priority || 0), ago(entry.Since)] })),
      'Nothing waits.'));
    },
  };
}

function eventsPage() {
  let text = '';
  const list = el('div');
  const search = el('input', { id: 'event-filter', type: 'text', placeholder: 'topic, type, key or job',
    oninput: () => { text = search.value.toLowerCase(); draw(); } });
  return {
    title: 'Events',
    body: [el('h1', {}, 'Events'), el('div', { class: 'filter' }, el('label', { for: 'event-filter' }, 'Filter'), search), list],
    update() {
      const shown = ui.events.filter((event) => !text || [event.Topic, event.Type, event.Key, event.Job]
        .some((v) => v && String(v).toLowerCase().includes(text))).slice(-200).reverse();
      list.replaceChildren(table([{ title: 'When' }, { title: 'Topic' }, { title: 'Type' }, { title: 'Key' }, { title: 'Job', class: 'optional' }],
        shown.map((event) => ({ cells: [ago(event.Time), event.Topic, event.Type,
          event.Topic === 'Task' ? el('a', { href: '#/tasks/' + event.Key }, event.Key.slice(0, 8)) : event.Key, event.Job || ''] })),
        'No events since this page opened.'));
    },
  };
}

function route() {
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, search] = hash.split('?');
  const query = new URLSearchParams(search || '');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  if (ui.page && ui.page.leave) ui.page.leave();
  let page;
  let current = 'cluster';
  if (parts[0] === 'tasks' && parts[1]) { page = taskPage(parts[1]); current = 'tasks'; }
  else if (parts[0] === 'tasks') { page = tasksPage(query); current = 'tasks'; }
  else if (parts[0] === 'jobs' && parts[1]) { page = jobPage(parts.slice(1).join('/')); current = 'jobs'; }
  else if (parts[0] === 'jobs') { page = jobsPage(); current = 'jobs'; }
  else if (parts[0] === 'queue') { page = queuePage(); current = 'queue'; }
  else if (parts[0] === 'events') { page = eventsPage(); current = 'events'; }
  else page = clusterPage();
  ui.page = page;
  document.title = page.title + ' — Cube';
  for (const link of document.querySelectorAll('nav a')) {
    if (link.dataset.page === current) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  const main = document.getElementById('main');
  main.replaceChildren(...page.body);
  page.update();
}

async function start() {
  try {
    setConnection('', 'loading…');
    const [self] = await Promise.all([api('GET', '/acl/self'), loadFirst()]);
    ui.self = self.json;
    const who = document.getElementById('who');
    who.textContent = ui.self.Acl ? ui.self.Name + ' (' + ui.self.Role + ')' : '';
  } catch (err) {
    if (err.status === 401) return; // the token dialog is open; its submit starts again
    setConnection('lost', 'cannot reach the manager: ' + err.message);
    setTimeout(start, ui.retry);
    ui.retry = Math.min(ui.retry * 2, 10000);
    return;
  }
  ui.started = true;
  route();
  // Once the first page is on screen (the frame after it was drawn: `cube-bench ui` reads
  // the mark), the rest is read and the events followed: parsing a big waiting list before
  // that frame would hold it back.
  requestAnimationFrame(() => {
    performance.mark('cube-first-render');
    setTimeout(() => {
      loadRest();
      follow();
    }, 0);
  });
}

window.addEventListener('hashchange', route);
// "3 min ago" grows older with the clock, not only with events: the page is drawn again
// from what it holds (no request) every half minute.
setInterval(draw, 30000);
document.addEventListener('DOMContentLoaded', () => {
  setUpTokenDialog();
  setUpProjects();
  pauseWhileHidden();
  start();
});
