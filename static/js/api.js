// HTTP client for the /v1 API: the TypeScript client's core (core.js), whose routes are
// generated from the command table; bearer token, JSON bodies, errors as ApiError.
import { ApiError, HttpClient } from './core.js';

export { ApiError };

export function createApi(token, { fetchImpl = globalThis.fetch.bind(globalThis), base = '' } = {}) {
  const http = new HttpClient({ token, baseUrl: base, fetch: fetchImpl });
  return {
    me: () => http.me(),
    listThreads: () => http.listThreads(),
    createThread: (title) => http.createThread(title ? { title } : {}),
    snapshot: (threadId, before = null) =>
      http.snapshot(threadId, before === null ? { include_hidden: true } : { include_hidden: true, before: Number(before) }),
    sendMessage: (threadId, text, clientRequestId) => http.send(threadId, text, { client_request_id: clientRequestId }),
    resume: (threadId, actionId, payload) => http.resume(threadId, actionId, payload),
    stopRun: (threadId, runId) => http.stop(threadId, runId),
    regenerate: (threadId) => http.regenerate(threadId),
    retry: (threadId, runId) => http.retry(threadId, runId),
    setVisibility: (threadId, messageId, visibility) =>
      http.call('message.visibility', { thread_id: threadId, message_id: messageId, visibility }),
    cancelQueued: (threadId, itemId) => http.call('queue.cancel', { thread_id: threadId, item_id: itemId }),
  };
}

/** Who won a conflicting resolution, from a 409 body (`resolved_by` or the message text). */
export function resolvedBy(err) {
  const by = err?.details?.resolved_by;
  if (typeof by === 'string' && by) return by;
  if (by && typeof by === 'object') return by.subject || by.name || JSON.stringify(by);
  const match = /resolved by ([^\s,.;]+)/i.exec(err?.message || '');
  return match ? match[1] : 'someone else';
}

/** A sentence for the error banner. */
export function describeError(err, what = '') {
  const prefix = what ? `${what}: ` : '';
  if (!(err instanceof ApiError)) return `${prefix}${err?.message || String(err)}`;
  if (err.status === 401) return 'Session expired or invalid token. Open the URL printed by the server again.';
  if (err.status === 0) return `${prefix}${err.message}`;
  if (err.code === 'conflict' && (err.details?.resolved_by || /resolved by/i.test(err.message))) {
    return `Already resolved by ${resolvedBy(err)}`;
  }
  const fieldErrors = Array.isArray(err.details?.errors)
    ? err.details.errors.map((e) => `${(e.loc || []).join('.') || 'payload'}: ${e.msg}`).join('; ')
    : '';
  return `${prefix}${err.message}${fieldErrors ? ` (${fieldErrors})` : ''} [${err.code}]`;
}
