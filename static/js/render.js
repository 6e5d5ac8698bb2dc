// DOM rendering of the thread list and one thread. All server text goes through text nodes.

import { formatValue, h, reconcile } from './dom.js';
import { decidedText, decisionOf, refusalText, renderApproval } from './approval.js';
import { buildSchemaForm } from './schema-form.js';
import { ACTIVE_RUN_STATUSES } from './sync.js';

const ROLE_LABELS = { user: 'User', assistant: 'Assistant', system: 'System' };
const STATE_LABELS = {
  'input-available': 'input available',
  'awaiting-action': 'awaiting action',
  running: 'running',
  'output-available': 'done',
  'output-error': 'error',
  skipped: 'skipped',
  rejected: 'rejected',
  cancelled: 'cancelled',
};

// --- thread list -----------------------------------------------------------------------

export function renderThreadList(listEl, threads, currentId, onOpen) {
  reconcile(listEl, threads, {
    key: (t) => t.id,
    signature: (t) => `${t.title}|${t.id === currentId}`,
    create: (t) =>
      h(
        'li',
        { class: 'thread-list__row' },
        h(
          'button',
          {
            type: 'button',
            class: `thread-item${t.id === currentId ? ' is-current' : ''}`,
            testid: 'thread-item',
            dataset: { threadId: t.id },
            'aria-current': t.id === currentId ? 'page' : null,
            onclick: () => onOpen(t.id),
          },
          t.title || 'Untitled thread',
        ),
      ),
  });
}

// --- conversation ----------------------------------------------------------------------

/**
 * Render one thread.
 * @param {object} els elements from index.html (messages, pendingActions, liveTools, ...)
 * @param {object} model {snapshot, live, activeRun, me, busy: Set<string>}
 * @param {object} on handlers: hide, unhide, regenerate, resume, cancelQueued
 */
export function renderThread(els, model, on) {
  const { snapshot, live, activeRun } = model;
  const messages = snapshot ? snapshot.messages : [];
  const runActive = Boolean(activeRun);
  let lastAssistant = null;
  for (const m of messages) if (m.role === 'assistant' && m.visibility !== 'hidden') lastAssistant = m.id;
  const overlay = live.toolStates;
  const allowed = permissionsOf(snapshot);
  const context = (m) => messageContext(m, lastAssistant, runActive, overlay, model.busy, allowed);

  reconcile(els.messages, messages, {
    key: (m) => m.id,
    signature: (m) => JSON.stringify([m, context(m)]),
    create: (m) => renderMessage(m, context(m), on),
  });

  const actions = snapshot ? snapshot.pending_actions : [];
  const role = model.me && model.me.role;
  // Progress and who may decide change while an approval is pending: both rebuild its card.
  reconcile(els.pendingActions, actions, {
    key: (a) => a.id,
    signature: (a) => JSON.stringify([decisionOf(a, snapshot, role), a.approval || null]),
    create: (a) => renderPendingAction(a, role, decisionOf(a, snapshot, role), on),
  });

  renderLive(els, live);
  renderQueue(els, snapshot ? snapshot.queue : [], on, model.busy, allowed);
}

/**
 * What the snapshot says this reader may do (`permissions`, docs/protocol.md); a server that
 * sends none allows everything, as before permissions existed.
 */
export function permissionsOf(snapshot) {
  const p = snapshot && snapshot.permissions;
  if (!p) return { regenerate: true, retry: true, stop: true, visibility: () => true, cancelQueued: () => true };
  const visible = new Set(p.visibility || []);
  const cancellable = new Set(p.cancel_queued || []);
  return {
    regenerate: Boolean(p.regenerate),
    // Servers before `retry` was reported left it to the refusal.
    retry: p.retry === undefined ? true : Boolean(p.retry),
    stop: Boolean(p.stop),
    visibility: (id) => visible.has(id),
    cancelQueued: (id) => cancellable.has(id),
  };
}

function messageContext(m, lastAssistant, runActive, overlay, busy, allowed) {
  const tools = {};
  for (const p of m.parts) {
    if (p.type === 'tool-call' && overlay[p.tool_call_id]) tools[p.tool_call_id] = overlay[p.tool_call_id];
  }
  return {
    canRegenerate: m.id === lastAssistant && !runActive && allowed.regenerate,
    canHide: allowed.visibility(m.id),
    tools,
    busy: busy.has(`msg:${m.id}`) || busy.has('regenerate'),
  };
}

function renderMessage(m, ctx, on) {
  const hidden = m.visibility === 'hidden';
  const role = ROLE_LABELS[m.role] || m.role;
  const body = h('div', { class: 'msg__body' }, m.parts.map((p) => renderPart(p, ctx.tools)));
  const buttons = [];
  if (hidden && ctx.canHide) {
    buttons.push(
      h('button', { type: 'button', class: 'btn btn--small', testid: 'unhide-button', disabled: ctx.busy, onclick: () => on.unhide(m) }, 'Unhide'),
    );
  } else if (!hidden) {
    if (ctx.canHide) buttons.push(
      h('button', { type: 'button', class: 'btn btn--small', testid: 'hide-button', disabled: ctx.busy, 'aria-label': `Hide ${role.toLowerCase()} message`, onclick: () => on.hide(m) }, 'Hide'),
    );
    if (ctx.canRegenerate) {
      buttons.push(
        h('button', { type: 'button', class: 'btn btn--small', testid: 'regenerate-button', disabled: ctx.busy, onclick: () => on.regenerate(m) }, 'Regenerate'),
      );
    }
  }
  return h(
    'article',
    {
      class: `msg msg--${m.role}${hidden ? ' msg--hidden' : ''}`,
      testid: 'message',
      dataset: { role: m.role, messageId: m.id, visibility: m.visibility || 'visible' },
      'aria-label': `${role} message${hidden ? ' (hidden)' : ''}`,
    },
    h(
      'header',
      { class: 'msg__header' },
      h('span', { class: 'msg__role' }, role),
      hidden ? h('span', { class: 'badge badge--hidden', testid: 'hidden-badge' }, 'hidden') : null,
      h('span', { class: 'msg__actions' }, buttons),
    ),
    hidden ? h('details', { class: 'msg__collapsed' }, h('summary', {}, 'Show hidden message'), body) : body,
  );
}

function renderPart(p, overlayTools) {
  if (p.type === 'text') return h('div', { class: 'msg__text', testid: 'message-text' }, p.text);
  if (p.type === 'tool-call') return renderToolCall({ ...p, ...(overlayTools[p.tool_call_id] || {}) });
  return h('div', { class: 'msg__unknown' }, `[${p.type} part]`);
}

export function renderToolCall(p) {
  const state = p.state || 'input-available';
  const resolution = p.waiting && p.waiting.resolution;
  return h(
    'div',
    { class: `tool tool--${state}`, testid: 'tool-call', dataset: { state, toolCallId: p.tool_call_id || '' } },
    h(
      'div',
      { class: 'tool__head' },
      h('span', { class: 'tool__label' }, 'Tool '),
      h('code', { class: 'tool__name', testid: 'tool-name' }, p.name),
      h('span', { class: `badge badge--state badge--${state}`, testid: 'tool-state', title: `state: ${state}` }, STATE_LABELS[state] || state),
    ),
    h('div', { class: 'tool__section' }, h('span', { class: 'tool__caption' }, 'Input'), h('pre', { class: 'tool__json' }, formatValue(p.input || {}))),
    p.output !== undefined && p.output !== null
      ? h('div', { class: 'tool__section' }, h('span', { class: 'tool__caption' }, 'Output'), h('pre', { class: 'tool__json', testid: 'tool-output' }, formatValue(p.output)))
      : null,
    p.error ? h('p', { class: 'tool__error', testid: 'tool-error' }, `Error: ${p.error}`) : null,
    state === 'awaiting-action' && !resolution ? h('p', { class: 'tool__waiting' }, 'Waiting for a decision…') : null,
    resolution
      ? h('p', { class: 'tool__resolution', testid: 'tool-resolution' }, `Action resolved by ${resolution.subject}`, describePayload(resolution.payload))
      : null,
    decidedText(resolution) ? h('p', { class: 'tool__resolution', testid: 'tool-decisions' }, decidedText(resolution)) : null,
  );
}

function describePayload(payload) {
  if (!payload || typeof payload !== 'object') return '';
  const items = Object.entries(payload).map(([k, v]) => `${k}: ${typeof v === 'string' ? v : JSON.stringify(v)}`);
  return items.length ? ` (${items.join(', ')})` : '';
}

// --- pending actions -------------------------------------------------------------------

function renderPendingAction(a, role, decision, on) {
  const allowed = decision.allowed;
  const titleId = `action-title-${a.id}`.replace(/[^A-Za-z0-9_-]/g, '_');
  const status = h('p', { class: 'card__status', testid: 'action-status', role: 'status' });
  const form = buildSchemaForm({
    schema: a.schema || {},
    idPrefix: `act-${a.id}`,
    disabled: !allowed,
    onSubmit: (payload) => on.resume(a, payload, { form, status }),
  });
  return h(
    'section',
    { class: 'card', testid: 'pending-action', dataset: { actionId: a.id, toolCallId: a.tool_call_id || '' }, 'aria-labelledby': titleId },
    h('h3', { class: 'card__title', id: titleId }, `Action needed: ${a.tool_name}`),
    h('p', { class: 'card__meta' }, `${a.kind || 'approval'} · allowed roles: ${(a.allowed_roles || []).join(', ') || 'any'}`),
    h('pre', { class: 'tool__json' }, formatValue(a.input || {})),
    renderApproval(a.approval),
    allowed ? null : h('p', { class: 'card__note', testid: 'action-refusal', dataset: { reason: decision.reason || '' } }, refusalText(decision.reason, role)),
    form.element,
    status,
  );
}

// --- live stream -----------------------------------------------------------------------

function renderLive(els, live) {
  const text = live.text || '';
  if (els.streamingText.textContent !== text) els.streamingText.textContent = text;
  const tools = live.parts.filter((p) => p.type === 'tool-call');
  reconcile(els.liveTools, tools, {
    key: (p) => p.tool_call_id,
    signature: (p) => JSON.stringify(p),
    create: (p) => renderToolCall(p),
  });
  els.takeover.hidden = live.takeover === null || live.takeover === undefined;
  const empty = !text && tools.length === 0 && els.takeover.hidden;
  els.live.classList.toggle('is-empty', empty);
  els.live.dataset.runId = live.runId || '';
}

// --- queue, run bar ---------------------------------------------------------------------

function renderQueue(els, queue, on, busy, allowed) {
  els.queueSection.hidden = queue.length === 0;
  reconcile(els.queue, queue, {
    key: (q) => q.id,
    signature: (q) => `${q.text}|${q.submitted_by}|${busy.has(`queue:${q.id}`)}|${allowed.cancelQueued(q.id)}`,
    create: (q) =>
      h(
        'li',
        { class: 'queue-item', testid: 'queue-item', dataset: { itemId: q.id } },
        h('span', { class: 'queue-item__text', title: q.truncated ? `${q.size} characters; the preview is cut` : null }, String(q.text || '') + (q.truncated ? '…' : '')),
        q.submitted_by ? h('span', { class: 'queue-item__by' }, ` — ${q.submitted_by}`) : null,
        !allowed.cancelQueued(q.id) ? null : h('button', { type: 'button', class: 'btn btn--small', testid: 'queue-cancel', disabled: busy.has(`queue:${q.id}`), 'aria-label': `Cancel queued message: ${String(q.text || '').slice(0, 40)}`, onclick: () => on.cancelQueued(q) }, 'Cancel'),
      ),
  });
}

export function renderRunBar(els, snapshot, activeRun, stopBusy, retryBusy = false) {
  const run = activeRun || (snapshot && snapshot.run);
  const status = run ? run.status : 'idle';
  els.runStatus.textContent = run && run.status === 'failed' && run.error ? `failed: ${run.error}` : status;
  els.runStatus.dataset.status = status;
  const canStop = Boolean(activeRun && ACTIVE_RUN_STATUSES.has(activeRun.status)) && permissionsOf(snapshot).stop;
  els.stopButton.hidden = !canStop;
  els.stopButton.disabled = !canStop || stopBusy;
  // Retry answers the latest run's input again; the server accepts it only for a failed or
  // cancelled run with nothing queued after it, so the button is offered exactly then.
  const queued = snapshot ? snapshot.queue.length : 0;
  const canRetry = Boolean(!activeRun && run && RETRYABLE_RUN_STATUSES.has(run.status) && !queued)
    && permissionsOf(snapshot).retry;
  els.retryButton.hidden = !canRetry;
  els.retryButton.disabled = !canRetry || retryBusy;
}

const RETRYABLE_RUN_STATUSES = new Set(['failed', 'cancelled']);

export function renderConnection(el, state) {
  if (el.textContent !== state) el.textContent = state;
  el.dataset.state = state;
}
