// The HTTP commands: one generic call over the command table's routes (src/generated/
// commands.ts, generated from server/protocol/commands.py), and typed helpers on top.
import { COMMANDS, type CommandInputs, type CommandName } from './generated/commands.js';
import type * as P from './generated/protocol.js';

export class ApiError extends Error {
  /** `status` is 0 for a network failure; `code` the server's snake_case code. */
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

type Fetch = (input: string, init: RequestInit) => Promise<Response>;

export interface HttpOptions {
  /** The server's origin, e.g. `http://127.0.0.1:8000` ('' in a page the server serves). */
  baseUrl?: string;
  /** The bearer, or a function giving the current one (a renewed OIDC access token). */
  token: string | (() => string);
  fetch?: Fetch;
}

const PATH_FIELD = /{(\w+)}/g;
type Routed = { [N in CommandName]: (typeof COMMANDS)[N]['path'] extends string ? N : never }[CommandName];

/** Method and URL (path fields filled in, a query for the reads that take one) and the body. */
export function route(name: Routed, input: Record<string, unknown>): { method: string; url: string; body?: unknown } {
  const spec = COMMANDS[name];
  const used = new Set<string>();
  const path = (spec.path as string).replace(PATH_FIELD, (_, field: string) => {
    used.add(field);
    const value = input[field];
    if (typeof value !== 'string' || !value) throw new TypeError(`${name}: ${field} is required`);
    return encodeURIComponent(value);
  });
  const rest = Object.entries(input).filter(([key, value]) => !used.has(key) && value !== undefined);
  if (spec.method === 'GET' || spec.method === 'DELETE') {
    const query = new URLSearchParams();
    for (const [key, value] of rest) {
      if (value === null) continue;
      if (key === 'metadata' && typeof value === 'object') {
        // `?metadata.<key>=<value>` filters (docs/protocol.md, "Threads").
        for (const [k, v] of Object.entries(value as Record<string, unknown>)) query.append(`metadata.${k}`, String(v));
      } else {
        query.append(key, String(value));
      }
    }
    const qs = query.toString();
    return { method: spec.method, url: qs ? `${path}?${qs}` : path };
  }
  return { method: spec.method as string, url: path, body: Object.fromEntries(rest) };
}

export class HttpClient {
  readonly baseUrl: string;
  private readonly bearer: () => string;
  private readonly fetchImpl: Fetch;

  constructor({ baseUrl = '', token, fetch: fetchImpl }: HttpOptions) {
    this.baseUrl = baseUrl.replace(/\/$/, '');
    this.bearer = typeof token === 'function' ? token : () => token;
    this.fetchImpl = fetchImpl || ((input, init) => globalThis.fetch(input, init));
  }

  /** Run a command of the table over HTTP; answers the JSON body, throws ApiError. */
  async call<N extends Routed, A = unknown>(name: N, input: Partial<CommandInputs[N]> & Record<string, unknown>): Promise<A> {
    const { method, url, body } = route(name, input);
    const headers: Record<string, string> = { Accept: 'application/json', Authorization: `Bearer ${this.bearer()}` };
    const init: RequestInit = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res: Response;
    try {
      res = await this.fetchImpl(this.baseUrl + url, init);
    } catch {
      throw new ApiError(0, 'network_error', 'Network error: the server could not be reached.');
    }
    const text = await res.text().catch(() => '');
    let data: unknown = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = null;
      }
    }
    if (!res.ok) {
      const err = (data as { error?: Record<string, unknown> } | null)?.error ?? {};
      const code = typeof err.code === 'string' ? err.code : `http_${res.status}`;
      const message = typeof err.message === 'string' ? err.message : `${res.status} ${res.statusText || 'error'}`.trim();
      throw new ApiError(res.status, code, message, err);
    }
    return data as A;
  }

  me(): Promise<P.Principal> {
    return this.call('me', {});
  }

  createThread(input: { title?: string; metadata?: Record<string, unknown>; scope?: string } = {}): Promise<P.Snapshot> {
    return this.call('thread.create', input);
  }

  listThreads(input: { limit?: number; metadata?: Record<string, string>; status?: P.ListThreads['status']; cursor?: string } = {}): Promise<P.ThreadPage> {
    return this.call('thread.list', input);
  }

  snapshot(threadId: string, input: { include_hidden?: boolean; before?: number; limit?: number } = {}): Promise<P.Snapshot> {
    return this.call('thread.snapshot', { thread_id: threadId, ...input });
  }

  send(threadId: string, text: string, options: { client_request_id?: string; policy?: P.InputPolicy } = {}): Promise<P.AdmissionAnswer> {
    return this.call('message.send', { thread_id: threadId, text, ...options });
  }

  resume(threadId: string, actionId: string, payload: Record<string, unknown>, expectedVersion?: number): Promise<P.VersionAnswer> {
    return this.call('action.resume', { thread_id: threadId, action_id: actionId, payload, expected_version: expectedVersion });
  }

  /** Hand an approval the caller may decide to one subject or one group (the policy must permit delegation). */
  reassign(threadId: string, actionId: string, to: { to_subject?: string; to_group?: string }): Promise<P.VersionAnswer> {
    return this.call('action.reassign', { thread_id: threadId, action_id: actionId, ...to });
  }

  stop(threadId: string, runId: string): Promise<P.StopAnswer> {
    return this.call('run.stop', { thread_id: threadId, run_id: runId });
  }

  regenerate(threadId: string, messageId?: string): Promise<P.RegenerateAnswer> {
    return this.call('regenerate', { thread_id: threadId, message_id: messageId });
  }

  retry(threadId: string, runId: string): Promise<P.RegenerateAnswer> {
    return this.call('run.retry', { thread_id: threadId, run_id: runId });
  }

  updateMetadata(threadId: string, metadata: Record<string, unknown>): Promise<P.MetadataAnswer> {
    return this.call('thread.update_metadata', { thread_id: threadId, metadata });
  }

  actions(input: { limit?: number; cursor?: string } = {}): Promise<{ actions: P.PendingAction[]; next_cursor?: string | null }> {
    return this.call('actions.list', { status: 'pending', ...input });
  }
}
