// Bootstrap: session, socket, per-thread sync, commands, and render scheduling.

import { ApiError, createApi, describeError, resolvedBy } from './api.js';
import { h, randomId } from './dom.js';
import { OlderMessages } from './history.js';
import { renderConnection, renderRunBar, renderThread, renderThreadList } from './render.js';
import { mapServerErrors } from './schema-form.js';
import { signIn, signInConfig } from './oidc.js';
import { readSession, threadUrl } from './session.js';
import { ThreadSocket, socketProtocols, socketUrl } from './socket.js';
import { ThreadSync, activeRun } from './sync.js';
import { TypingSignal, applyPresence, presenceView, reviewingText, typingText } from './presence.js';

const $ = (id) => document.getElementById(id);
const els = {
  sidebar: $('sidebar'), sidebarToggle: $('sidebar-toggle'), whoami: $('whoami'),
  connection: $('connection-state'), banner: $('error-banner'), bannerText: $('error-text'),
  bannerDismiss: $('error-dismiss'), newThreadForm: $('new-thread-form'),
  newThreadTitle: $('new-thread-title'), newThreadSubmit: $('new-thread-submit'),
  refreshThreads: $('refresh-threads'), threadList: $('thread-list'),
  threadListEmpty: $('thread-list-empty'), emptyState: $('empty-state'), threadView: $('thread-view'),
  threadTitle: $('thread-title'), runStatus: $('run-status'), stopButton: $('stop-button'), retryButton: $('retry-button'),
  conversation: $('conversation'), messages: $('messages'), pendingActions: $('pending-actions'),
  live: $('live'), streamingText: $('streaming-text'), liveTools: $('live-tools'),
  takeover: $('takeover-note'), queueSection: $('queue-section'), queue: $('queue'),
  composer: $('composer'), composerInput: $('composer-input'), sendButton: $('send-button'),
  presence: $('presence'), typing: $('typing'),
};

const state = {
  // `urlToken`: a tl_ token, which the page's URL fragment carries; an OIDC access token never.
  token: '', urlToken: '', oidc: null, api: null, socket: null, me: null, threads: [], threadId: null, sync: null,
  socketState: 'idle', subscribed: false, busy: new Set(), lastSend: null, bannerItems: [],
  lastListRefresh: 0, focusComposer: false, presence: {}, reviewing: null,
  history: new OlderMessages(),
};

// --- presence ------------------------------------------------------------------------------

function sendPresence(changes) {
  if (!state.threadId || !state.subscribed || !state.socket) return;
  state.socket.send({ type: 'presence.update', thread_id: state.threadId, ...changes });
}

const typingSignal = new TypingSignal({ send: (typing) => sendPresence({ typing }) });

/** The action card holding keyboard focus is the one this person is reviewing. */
function onActionFocus(event) {
  const card = event.target.closest && event.target.closest('[data-action-id]');
  const actionId = card ? card.dataset.actionId : null;
  if (event.type === 'focusout') {
    const next = event.relatedTarget && event.relatedTarget.closest && event.relatedTarget.closest('[data-action-id]');
    if (next && next.dataset.actionId === state.reviewing) return;
    if (!next && state.reviewing) {
      state.reviewing = null;
      sendPresence({ reviewing: null });
    }
    return;
  }
  if (actionId && actionId !== state.reviewing) {
    state.reviewing = actionId;
    sendPresence({ reviewing: actionId });
  }
}

function renderPresence() {
  const view = presenceView(state.presence, state.me && state.me.subject);
  const list = els.presence;
  const items = view.here.map((p) => {
    const typing = view.typing.includes(p.name) ? ' is-typing' : '';
    const tabs = p.connections > 1 ? ` (${p.connections} tabs)` : '';
    const label = `${p.name}${p.me ? ' (you)' : ''}${tabs}${p.role && p.role !== 'user' ? `, ${p.role}` : ''}`;
    return h('li', { class: `presence__member${p.me ? ' is-me' : ''}${typing}`, dataset: { subject: p.subject } }, label);
  });
  const signature = JSON.stringify(view.here.map((p) => [p.subject, p.connections, view.typing.includes(p.name)]));
  if (list.dataset.signature !== signature) {
    list.replaceChildren(...items);
    list.dataset.signature = signature;
  }
  const typingLine = typingText(view.typing);
  if (els.typing.textContent !== typingLine) els.typing.textContent = typingLine;
  for (const card of els.pendingActions.querySelectorAll('[data-action-id]')) {
    const text = reviewingText(view.reviewing[card.dataset.actionId]);
    let note = card.querySelector('.card__reviewers');
    if (!note) {
      note = h('p', { class: 'card__reviewers', testid: 'action-reviewers', role: 'status' });
      card.insertBefore(note, card.children[1] || null);
    }
    if (note.textContent !== text) note.textContent = text;
  }
}

// --- banner --------------------------------------------------------------------------------

const BANNER_MAX = 3;

/** The banner lists the latest few distinct messages; a repeated one gets a count. */
function showBanner(message, kind = 'error') {
  const items = els.banner.hidden ? [] : state.bannerItems;
  const existing = items.find((item) => item.message === message);
  if (existing) {
    existing.count += 1;
    items.splice(items.indexOf(existing), 1);
    items.push(existing);
  } else {
    items.push({ message, kind, count: 1 });
  }
  state.bannerItems = items.slice(-BANNER_MAX);
  els.bannerText.replaceChildren(
    ...state.bannerItems.map((item) =>
      h('span', { class: 'banner__item', dataset: { kind: item.kind } }, item.count > 1 ? `${item.message} (×${item.count})` : item.message),
    ),
  );
  els.banner.dataset.kind = state.bannerItems.some((item) => item.kind === 'error') ? 'error' : 'info';
  els.banner.hidden = false;
}

function showError(err, what) {
  if (err instanceof ApiError && err.status === 401) return sessionExpired();
  showBanner(describeError(err, what));
}

function sessionExpired() {
  if (state.socket) state.socket.close();
  state.socketState = 'unauthorized';
  if (state.oidc) {
    state.oidc.forget();
    showBanner('Session expired. Reload the page to sign in again.');
  } else {
    showBanner('Session expired or invalid token. Open the URL printed by the server again.');
  }
  scheduleRender();
}

// --- rendering -------------------------------------------------------------------------------

let renderPending = false;
function scheduleRender() {
  if (renderPending) return;
  renderPending = true;
  const run = () => {
    if (!renderPending) return;
    renderPending = false;
    render();
  };
  requestAnimationFrame(run);
  setTimeout(run, 100); // rAF does not fire in background tabs; they must converge too
}

function connectionText() {
  if (state.socketState === 'unauthorized') return 'session expired';
  if (state.socketState !== 'open') return 'reconnecting';
  if (state.sync && (!state.subscribed || state.sync.resyncing)) return 'resyncing';
  return 'connected';
}

function render() {
  renderConnection(els.connection, connectionText());
  renderThreadList(els.threadList, state.threads, state.threadId, (id) => openThread(id, { push: true, focus: true }));
  els.threadListEmpty.hidden = state.threads.length > 0;
  const sync = state.sync;
  els.emptyState.hidden = Boolean(sync);
  els.threadView.hidden = !sync;
  els.composerInput.disabled = !sync || !state.token;
  els.sendButton.disabled = !sync || state.busy.has('send');
  if (!sync) return;
  if (state.focusComposer) {
    // Only now is the thread view shown: focus() on a hidden element does nothing.
    state.focusComposer = false;
    els.composerInput.focus();
  }
  const snapshot = sync.snapshot;
  const live = sync.liveView();
  const run = activeRun(snapshot, live);
  const conv = els.conversation;
  const nearBottom = conv.scrollHeight - conv.scrollTop - conv.clientHeight < 80;
  const title = snapshot ? snapshot.thread.title || 'Untitled thread' : 'Loading…';
  if (els.threadTitle.textContent !== title) els.threadTitle.textContent = title;
  renderRunBar(els, snapshot, run, state.busy.has('stop'), state.busy.has('retry'));
  // A snapshot holds the last messages only; older pages loaded on scroll-up go in front.
  const shown = snapshot ? { ...snapshot, messages: state.history.absorb(snapshot) } : snapshot;
  renderThread(els, { snapshot: shown, live, activeRun: run, me: state.me, busy: state.busy }, handlers);
  if (nearBottom || state.scrollOnNextRender) {
    conv.scrollTop = conv.scrollHeight;
    if (snapshot) state.scrollOnNextRender = false;
  }
  syncListTitle(snapshot);
  renderPresence();
}

function syncListTitle(snapshot) {
  if (!snapshot) return;
  const item = state.threads.find((t) => t.id === snapshot.thread.id);
  if (item && item.title !== snapshot.thread.title) {
    item.title = snapshot.thread.title;
    scheduleRender();
  }
}

/** Scrolled to the top of a long thread: fetch the page before the oldest loaded message. */
async function loadOlder() {
  const history = state.history;
  const threadId = state.threadId;
  if (!threadId || !history.hasMore || history.loading || els.conversation.scrollTop > 40) return;
  history.loading = true;
  try {
    const page = await state.api.snapshot(threadId, history.cursor);
    if (state.history !== history) return; // another thread was opened meanwhile
    const conv = els.conversation;
    const fromBottom = conv.scrollHeight - conv.scrollTop;
    history.prepend(page);
    render();
    conv.scrollTop = conv.scrollHeight - fromBottom; // keep the reader's place
  } catch (err) {
    showError(err, 'Could not load older messages');
  } finally {
    history.loading = false;
  }
}

// --- threads ---------------------------------------------------------------------------------

async function loadThreads() {
  state.lastListRefresh = Date.now();
  try {
    const data = await state.api.listThreads();
    state.threads = Array.isArray(data && data.threads) ? data.threads : [];
  } catch (err) {
    showError(err, 'Could not load the threads');
  }
  scheduleRender();
}

function openThread(threadId, { push = false, focus = false } = {}) {
  if (threadId === state.threadId) return;
  if (state.sync) {
    state.sync.dispose();
    state.socket.unsubscribe(state.threadId);
  }
  state.threadId = threadId;
  state.history = new OlderMessages();
  state.sync = null;
  state.subscribed = false;
  state.presence = {};
  state.reviewing = null;
  typingSignal.reset();
  state.lastSend = null;
  if (threadId) {
    const sync = new ThreadSync({
      threadId,
      fetchSnapshot: () => state.api.snapshot(threadId),
      onChange: scheduleRender,
      onError: (err) => onSyncError(sync, err),
      isRetryable: (err) => !(err instanceof ApiError) || err.status === 0 || err.status >= 500 || err.status === 429,
    });
    state.sync = sync;
    state.scrollOnNextRender = true;
    state.socket.subscribe(threadId);
    sync.requestRefetch({ force: true }); // do not wait for the socket to show the thread
  }
  const url = threadUrl(location.href, threadId, state.urlToken);
  if (push && url !== location.href) history.pushState(null, '', url);
  else if (url !== location.href) history.replaceState(null, '', url);
  if (window.matchMedia('(max-width: 720px)').matches) setSidebar(false);
  scheduleRender();
  state.focusComposer = Boolean(focus && threadId);
}

function onSyncError(sync, err) {
  if (sync !== state.sync) return;
  if (err instanceof ApiError && err.status === 404) {
    showBanner('This thread does not exist or you have no access to it.');
    openThread(null);
    return;
  }
  // One report per series of failures: the retries that follow would only repeat it.
  if (sync.failures <= 1) showError(err, 'Could not load the thread');
}

async function createThread(event) {
  event.preventDefault();
  if (state.busy.has('create')) return;
  state.busy.add('create');
  els.newThreadSubmit.disabled = true;
  try {
    const snap = await state.api.createThread(els.newThreadTitle.value.trim());
    els.newThreadTitle.value = '';
    const t = snap.thread;
    state.threads = [{ id: t.id, title: t.title, version: t.version }, ...state.threads.filter((x) => x.id !== t.id)];
    openThread(t.id, { push: true, focus: true });
    if (state.sync) state.sync.applySnapshot(snap);
  } catch (err) {
    showError(err, 'Could not create the thread');
  } finally {
    state.busy.delete('create');
    els.newThreadSubmit.disabled = false;
    scheduleRender();
  }
}

// --- commands --------------------------------------------------------------------------------

/** Run one command: mark `key` busy, report failures, refetch when the answer names a version. */
async function command(key, what, fn) {
  if (state.busy.has(key)) return undefined;
  const sync = state.sync;
  state.busy.add(key);
  scheduleRender();
  try {
    const res = await fn();
    if (sync && sync === state.sync) sync.invalidate(res && typeof res.version === 'number' ? res.version : undefined);
    return res;
  } catch (err) {
    showError(err, what);
    return undefined;
  } finally {
    state.busy.delete(key);
    scheduleRender();
  }
}

async function send(event) {
  if (event) event.preventDefault();
  const text = els.composerInput.value;
  const threadId = state.threadId;
  if (!text.trim() || !threadId || state.busy.has('send')) return;
  typingSignal.stop();
  // A retry of the same text reuses the request id, so a send that did arrive is not doubled.
  const last = state.lastSend;
  const requestId = last && last.text === text && last.threadId === threadId ? last.id : randomId();
  state.lastSend = { text, threadId, id: requestId };
  const res = await command('send', 'Could not send the message', () => state.api.sendMessage(threadId, text, requestId));
  if (res) {
    state.lastSend = null;
    if (els.composerInput.value === text) els.composerInput.value = '';
    state.scrollOnNextRender = true;
  }
  els.composerInput.focus();
}

function onComposerKey(event) {
  if (event.key === 'Enter' && !event.shiftKey && !event.altKey && !event.ctrlKey && !event.metaKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
}

const handlers = {
  hide: (m) => command(`msg:${m.id}`, 'Could not hide the message', () => state.api.setVisibility(state.threadId, m.id, 'hidden')),
  unhide: (m) => command(`msg:${m.id}`, 'Could not unhide the message', () => state.api.setVisibility(state.threadId, m.id, 'visible')),
  regenerate: () => command('regenerate', 'Could not regenerate', () => state.api.regenerate(state.threadId)),
  cancelQueued: (q) => command(`queue:${q.id}`, 'Could not cancel the queued message', () => state.api.cancelQueued(state.threadId, q.id)),
  resume: resumeAction,
};

async function resumeAction(action, payload, { form, status }) {
  const sync = state.sync;
  form.setBusy(true);
  status.textContent = 'Submitting…';
  try {
    const res = await state.api.resume(state.threadId, action.id, payload);
    status.textContent = 'Submitted.';
    if (sync === state.sync) sync.invalidate(res && res.version);
  } catch (err) {
    if (err instanceof ApiError && err.status === 409 && err.code === 'conflict') {
      const message = `Already resolved by ${resolvedBy(err)}`;
      status.textContent = message;
      showBanner(message, 'info');
      if (sync === state.sync) sync.resync();
      return;
    }
    form.setBusy(false);
    if (err instanceof ApiError && err.status === 422) {
      const mapped = mapServerErrors(err.details.errors, form.fieldNames);
      if (!Object.keys(mapped.fields).length && !mapped.general.length) mapped.general.push(err.message);
      form.setErrors(mapped);
      status.textContent = 'The server refused the payload; see the fields above.';
      return;
    }
    status.textContent = describeError(err);
    showError(err, 'Could not resolve the action');
  }
}

function retryRun() {
  const sync = state.sync;
  const run = sync && sync.snapshot && sync.snapshot.run;
  if (!run) return;
  command('retry', 'Could not retry the run', () => state.api.retry(state.threadId, run.id));
}

function stopRun() {
  const sync = state.sync;
  const run = sync && activeRun(sync.snapshot, sync.liveView());
  if (!run) return;
  command('stop', 'Could not stop the run', () => state.api.stopRun(state.threadId, run.id));
}

// --- socket ----------------------------------------------------------------------------------

function onFrame(frame) {
  const sync = state.sync;
  const mine = sync && frame.thread_id === state.threadId;
  switch (frame.type) {
    case 'subscribed':
      if (mine) {
        state.subscribed = true;
        sync.subscribed(frame.version);
      }
      break;
    case 'chunk':
      if (mine) sync.chunk(frame);
      break;
    case 'invalidate':
      if (mine) sync.invalidate(frame.version);
      break;
    case 'resync':
      if (sync && (mine || !frame.thread_id)) sync.resync();
      break;
    case 'presence':
    case 'presence.join':
    case 'presence.update':
    case 'presence.leave':
      if (mine) state.presence = applyPresence(state.presence, frame);
      break;
    case 'error':
      if (frame.code === 'not_found' && sync) {
        showBanner('This thread does not exist or you have no access to it.');
      } else {
        showBanner(`Server: ${frame.message || frame.code}`);
      }
      break;
    default:
      break; // pong and frame types added later
  }
  scheduleRender();
}

function onSocketState(next, attempt) {
  state.socketState = next;
  if (next !== 'open') {
    state.subscribed = false;
    // Presence belongs to a connection: the next one starts afresh (a new `presence` set).
    state.presence = {};
    state.reviewing = null;
    typingSignal.reset();
  }
  if (next === 'unauthorized') sessionExpired();
  // A server may refuse the upgrade with HTTP 401 instead of close 4401: browsers only see a
  // failed connection, so ask the HTTP API now and then whether the token still works.
  if (next === 'reconnecting' && (attempt === 2 || attempt % 5 === 0)) {
    state.api.me().catch((err) => {
      if (err instanceof ApiError && err.status === 401) sessionExpired();
    });
  }
  scheduleRender();
}

// --- boot ------------------------------------------------------------------------------------

function setSidebar(open) {
  els.sidebar.classList.toggle('is-open', open);
  els.sidebarToggle.setAttribute('aria-expanded', String(open));
}

function wireUi() {
  els.bannerDismiss.addEventListener('click', () => {
    els.banner.hidden = true;
    state.bannerItems = [];
  });
  els.newThreadForm.addEventListener('submit', createThread);
  els.refreshThreads.addEventListener('click', loadThreads);
  els.composer.addEventListener('submit', send);
  els.composerInput.addEventListener('keydown', onComposerKey);
  els.composerInput.addEventListener('input', () => (els.composerInput.value ? typingSignal.input() : typingSignal.stop()));
  els.composerInput.addEventListener('blur', () => typingSignal.stop());
  els.pendingActions.addEventListener('focusin', onActionFocus);
  els.pendingActions.addEventListener('focusout', onActionFocus);
  els.stopButton.addEventListener('click', stopRun);
  els.retryButton.addEventListener('click', retryRun);
  els.conversation.addEventListener('scroll', loadOlder, { passive: true });
  els.sidebarToggle.addEventListener('click', () => setSidebar(!els.sidebar.classList.contains('is-open')));
  document.addEventListener('keydown', (event) => {
    if (event.key === 'Escape' && els.sidebar.classList.contains('is-open')) {
      setSidebar(false);
      els.sidebarToggle.focus();
    }
  });
  window.addEventListener('popstate', () => openThread(readSession(location.href, sessionStorage).threadId));
  window.addEventListener('online', () => state.socket && state.socket.reconnectNow());
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState !== 'visible' || !state.socket) return;
    state.socket.reconnectNow();
    if (Date.now() - state.lastListRefresh > 5000) loadThreads();
  });
}

/** A renewed OIDC access token: HTTP uses it from now on, the open socket is told (auth.refresh). */
function tokenRenewed(token) {
  state.token = token;
  if (state.socket) state.socket.send({ type: 'auth.refresh', token, id: `refresh-${Date.now()}` });
}

async function boot() {
  wireUi();
  const session = readSession(location.href, sessionStorage, () =>
    window.confirm('This link carries a different access token than the one this tab uses. Switch to it? (Cancel keeps your current session.)'));
  const config = signInConfig(document);
  if (config && !session.token) {
    // No tl_ token offered or held: sign in at the deployment's identity provider.
    try {
      state.oidc = await signIn(config, { location, history, storage: sessionStorage, onToken: tokenRenewed });
    } catch (err) {
      state.socketState = 'unauthorized';
      showBanner(`Sign-in failed: ${err.message || err}`);
      render();
      return;
    }
    if (!state.oidc) return; // on the way to the login page
    state.token = state.oidc.accessToken;
  } else {
    state.token = state.urlToken = session.token;
    if (session.url !== location.href) history.replaceState(null, '', session.url);
  }
  if (!state.token) {
    state.socketState = 'unauthorized';
    showBanner('No access token. Open the URL printed by `threadline serve` (it ends with #token=…).');
    render();
    return;
  }
  state.api = createApi(() => state.token);
  state.socket = new ThreadSocket({
    url: socketUrl(location),
    protocols: () => socketProtocols(state.token),
    onFrame,
    onStateChange: onSocketState,
  });
  state.socket.connect();
  state.api.me().then(
    (me) => {
      state.me = me;
      els.whoami.textContent = `${me.subject} · ${me.role}${me.scopes && me.scopes.length ? ` · ${me.scopes.join(', ')}` : ''}`;
      scheduleRender();
    },
    (err) => showError(err, 'Could not load your identity'),
  );
  loadThreads();
  const threadId = state.oidc ? readSession(location.href, null).threadId : session.threadId;
  if (threadId) openThread(threadId);
  render();
}

boot();
