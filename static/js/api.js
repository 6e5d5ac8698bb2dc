// HTTP client for the /v1 API: bearer token, JSON bodies, errors as ApiError.

export class ApiError extends Error {
  /**
   * @param {number} status HTTP status, 0 for a network failure
   * @param {string} code the server's snake_case error code (or network_error / http_<status>)
   * @param {string} message human sentence
   * @param {object} details the whole `error` object of the body (resolved_by, errors, ...)
   */
  constructor(status, code, message, details = {}) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

const seg = encodeURIComponent;

// `token`: the bearer, or a function giving the current one (a renewed OIDC access token).
export function createApi(token, { fetchImpl = globalThis.fetch.bind(globalThis), base = '' } = {}) {
  const bearer = typeof token === 'function' ? token : () => token;
  async function request(method, path, body) {
    const headers = { Accept: 'application/json', Authorization: `Bearer ${bearer()}` };
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetchImpl(base + path, init);
    } catch {
      throw new ApiError(0, 'network_error', 'Network error: the server could not be reached.');
    }
    const text = await res.text().catch(() => '');
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = null;
      }
    }
    if (!res.ok) {
      const err = data && typeof data.error === 'object' && data.error ? data.error : {};
      throw new ApiError(
        res.status,
        err.code || `http_${res.status}`,
        err.message || `${res.status} ${res.statusText || 'error'}`.trim(),
        err,
      );
    }
    return data;
  }

  return {
    me: () => request('GET', '/v1/me'),
    listThreads: () => request('GET', '/v1/threads'),
    createThread: (title) => request('POST', '/v1/threads', title ? { title } : {}),
    snapshot: (threadId, before = null) =>
      request('GET', `/v1/threads/${seg(threadId)}?include_hidden=true${before === null ? '' : `&before=${Number(before)}`}`),
    sendMessage: (threadId, text, clientRequestId) =>
      request('POST', `/v1/threads/${seg(threadId)}/messages`, {
        text,
        client_request_id: clientRequestId,
      }),
    resume: (threadId, actionId, payload) =>
      request('POST', `/v1/threads/${seg(threadId)}/actions/${seg(actionId)}/resume`, { payload }),
    stopRun: (threadId, runId) =>
      request('POST', `/v1/threads/${seg(threadId)}/runs/${seg(runId)}/stop`),
    regenerate: (threadId) => request('POST', `/v1/threads/${seg(threadId)}/regenerate`, {}),
    retry: (threadId, runId) => request('POST', `/v1/threads/${seg(threadId)}/runs/${seg(runId)}/retry`, {}),
    setVisibility: (threadId, messageId, visibility) =>
      request('POST', `/v1/threads/${seg(threadId)}/messages/${seg(messageId)}/visibility`, {
        visibility,
      }),
    cancelQueued: (threadId, itemId) =>
      request('DELETE', `/v1/threads/${seg(threadId)}/queue/${seg(itemId)}`),
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
