// A client session: one websocket (reconnect, backoff, resubscribe), one HTTP client, and per
// watched thread a ThreadSync that refetches snapshots when it is behind; the action inbox.
import type { SnapshotDelta } from './delta.js';
import type * as P from './generated/protocol.js';
import { ApiError, HttpClient, type HttpOptions } from './http.js';
import { applyPresence, type PresenceMembers } from './presence.js';
import { type Clock, type Frame, type SocketState, ThreadSocket, type WebSocketFactory, socketProtocols, socketUrl } from './socket.js';
import { type ActiveRun, type ChunkFrame, type LiveView, ThreadSync, activeRun } from './sync.js';

type Listener = () => void;

/** What a watcher of one thread sees; a new object after every change (for React). */
export interface ThreadView {
  threadId: string;
  snapshot: P.Snapshot | null;
  live: LiveView;
  /** Streamed text not yet in the snapshot. */
  liveText: string;
  pendingActions: P.PendingAction[];
  queue: Record<string, unknown>[];
  run: ActiveRun | null;
  runStatus: string | null;
  resyncing: boolean;
  connection: SocketState;
  presence: PresenceMembers;
  error: unknown;
}

class Emitter {
  private listeners = new Set<Listener>();
  subscribe = (listener: Listener): (() => void) => {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  };
  emit(): void {
    for (const listener of [...this.listeners]) listener();
  }
}

const randomId = (): string => `c-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;

export class ThreadWatch extends Emitter {
  readonly sync: ThreadSync;
  presence: PresenceMembers = {};
  subscribedOnce = false;
  error: unknown = null;
  refs = 0;
  private view: ThreadView | null = null;

  constructor(
    readonly client: ThreadlineClient,
    readonly threadId: string,
  ) {
    super();
    this.sync = new ThreadSync({
      threadId,
      fetchSnapshot: () => client.http.snapshot(threadId),
      onChange: () => this.changed(),
      onError: (err) => {
        this.error = err;
        this.changed();
      },
      isRetryable: (err) => !(err instanceof ApiError && [401, 403, 404].includes(err.status)),
    });
  }

  changed(): void {
    this.view = null;
    this.emit();
  }

  /** The current view, the same object until something changes. */
  getView = (): ThreadView => {
    if (this.view) return this.view;
    const snapshot = this.sync.snapshot;
    const live = this.sync.liveView();
    const run = activeRun(snapshot, live);
    this.view = {
      threadId: this.threadId,
      snapshot,
      live,
      liveText: live.text,
      pendingActions: snapshot?.pending_actions ?? [],
      queue: snapshot?.queue ?? [],
      run,
      runStatus: run ? run.status : (snapshot?.run?.status ?? null),
      resyncing: this.sync.resyncing,
      connection: this.client.socket.state,
      presence: this.presence,
      error: this.error,
    };
    return this.view;
  };

  onFrame(frame: Frame): void {
    switch (frame.type) {
      case 'subscribed':
        this.subscribedOnce = true;
        this.sync.subscribed(frame.version as number);
        break;
      case 'chunk':
        this.sync.chunk(frame as unknown as ChunkFrame);
        break;
      case 'invalidate':
        if (!(frame.delta && this.sync.applyDelta(frame.version as number, frame.delta as SnapshotDelta))) {
          this.sync.invalidate(frame.version as number);
        }
        break;
      case 'resync':
        this.sync.resync();
        break;
      case 'presence':
      case 'presence.join':
      case 'presence.update':
      case 'presence.leave':
        this.presence = applyPresence(this.presence, frame);
        this.changed();
        break;
      default:
        break;
    }
  }

  /** A command's answer names the version it committed: refetch if that is newer. */
  private async settle<A extends { version?: number | null }>(pending: Promise<A>): Promise<A> {
    try {
      const answer = await pending;
      this.sync.invalidate(typeof answer?.version === 'number' ? answer.version : undefined);
      return answer;
    } catch (err) {
      if (err instanceof ApiError && err.code === 'conflict') this.sync.resync();
      throw err;
    }
  }

  send(text: string, options: { client_request_id?: string; policy?: P.InputPolicy } = {}): Promise<P.AdmissionAnswer> {
    return this.settle(this.client.http.send(this.threadId, text, { client_request_id: randomId(), ...options }));
  }

  resume(actionId: string, payload: Record<string, unknown>): Promise<P.VersionAnswer> {
    return this.settle(this.client.http.resume(this.threadId, actionId, payload));
  }

  reassign(actionId: string, to: { to_subject?: string; to_group?: string }): Promise<P.VersionAnswer> {
    return this.settle(this.client.http.reassign(this.threadId, actionId, to));
  }

  stop(): Promise<P.StopAnswer | null> {
    const run = this.getView().run;
    if (!run || run.live) return Promise.resolve(null);
    return this.settle(this.client.http.stop(this.threadId, run.id));
  }

  regenerate(messageId?: string): Promise<P.RegenerateAnswer> {
    return this.settle(this.client.http.regenerate(this.threadId, messageId));
  }

  retry(runId?: string): Promise<P.RegenerateAnswer> {
    const id = runId ?? this.sync.snapshot?.run?.id;
    if (!id) return Promise.reject(new ApiError(0, 'no_run', 'the thread has no run to retry'));
    return this.settle(this.client.http.retry(this.threadId, id));
  }

  /** Tell the others what this tab does (docs/protocol.md, "Presence"). */
  setPresence(changes: { typing?: boolean; reviewing?: string | null }): boolean {
    return this.client.socket.send({ type: 'presence.update', thread_id: this.threadId, ...changes });
  }
}

export interface InboxView {
  actions: P.PendingAction[];
  loading: boolean;
  error: unknown;
}

/**
 * The scope-wide action inbox: the list fetched after `actions.subscribed`, `actions.resync`
 * and each reconnection, with `action.pending`/`action.resolved` applied on top; per thread,
 * frames older than the version the entries come from are ignored (as `ActionsWatch` does).
 */
export class ActionInbox extends Emitter {
  private actions = new Map<string, P.PendingAction>();
  private versions = new Map<string, number>();
  private during: Frame[] | null = null;
  private view: InboxView | null = null;
  loading = true;
  error: unknown = null;
  refs = 0;

  constructor(readonly client: ThreadlineClient) {
    super();
  }

  getView = (): InboxView => {
    this.view ??= { actions: [...this.actions.values()], loading: this.loading, error: this.error };
    return this.view;
  };

  private changed(): void {
    this.view = null;
    this.emit();
  }

  async refetch(): Promise<void> {
    if (this.during) return;
    this.during = [];
    const fresh = new Map<string, P.PendingAction>();
    const versions = new Map<string, number>();
    try {
      let cursor: string | undefined;
      for (let page = 0; page < 50; page += 1) {
        const answer = await this.client.http.actions(cursor ? { cursor } : {});
        for (const action of answer.actions) {
          fresh.set(action.id, action);
          const version = Number(action.thread_version ?? 0);
          if (action.thread_id) versions.set(action.thread_id, Math.max(versions.get(action.thread_id) ?? 0, version));
        }
        if (!answer.next_cursor) break;
        cursor = answer.next_cursor;
      }
      this.actions = fresh;
      this.versions = versions;
      this.error = null;
    } catch (err) {
      this.error = err;
    }
    const late = this.during;
    this.during = null;
    this.loading = false;
    for (const frame of late) this.apply(frame);
    this.changed();
  }

  onFrame(frame: Frame): void {
    if (frame.type === 'actions.subscribed' || frame.type === 'actions.resync') {
      void this.refetch();
      return;
    }
    if (frame.type !== 'action.pending' && frame.type !== 'action.resolved') return;
    if (this.during) this.during.push(frame);
    this.apply(frame);
    this.changed();
  }

  private apply(frame: Frame): void {
    const threadId = String(frame.thread_id);
    const version = Number(frame.version);
    // Older than the entries held: stale. Equal is news: one commit may suspend two tools.
    if (version < (this.versions.get(threadId) ?? -1)) return;
    this.versions.set(threadId, version);
    if (frame.type === 'action.pending') {
      const action = frame.action as P.PendingAction;
      this.actions.set(action.id, action);
    } else {
      this.actions.delete(String(frame.action_id));
    }
  }
}

export interface ClientOptions extends HttpOptions {
  /** The websocket URL; by default derived from `baseUrl` (or the page's location). */
  wsUrl?: string;
  WebSocket?: WebSocketFactory;
  /** Timers of the socket's backoff and keepalive (a fake clock in tests). */
  clock?: Clock;
  /**
   * Subscribe with `"deltas": true` (the default): an invalidation whose snapshot delta starts
   * at the held version is applied instead of refetched. `false`: refetch after every one.
   */
  deltas?: boolean;
}

export class ThreadlineClient {
  readonly http: HttpClient;
  readonly socket: ThreadSocket;
  private readonly watches = new Map<string, ThreadWatch>();
  private inbox: ActionInbox | null = null;
  private mePromise: Promise<P.Principal> | null = null;
  readonly connection = new Emitter();

  constructor(options: ClientOptions) {
    this.http = new HttpClient(options);
    const base = options.baseUrl ? new URL(options.baseUrl) : (globalThis as unknown as { location: URL }).location;
    this.socket = new ThreadSocket({
      url: options.wsUrl ?? socketUrl(base),
      protocols: () => socketProtocols(typeof options.token === 'function' ? options.token() : options.token),
      WebSocketImpl: options.WebSocket,
      ...(options.clock ? { clock: options.clock } : {}),
      onFrame: (frame) => this.onFrame(frame),
      onStateChange: (state) => this.onSocketState(state),
      deltas: options.deltas ?? true,
    });
  }

  me(): Promise<P.Principal> {
    this.mePromise ??= this.http.me();
    return this.mePromise;
  }

  connect(): void {
    if (this.socket.state === 'idle') this.socket.connect();
  }

  close(): void {
    this.socket.close();
    for (const watch of this.watches.values()) watch.sync.dispose();
    this.watches.clear();
  }

  /** Watch a thread (reference-counted); `release` when done. */
  watch(threadId: string): ThreadWatch {
    let watch = this.watches.get(threadId);
    if (!watch) {
      watch = new ThreadWatch(this, threadId);
      this.watches.set(threadId, watch);
      this.socket.subscribe(threadId);
      watch.sync.requestRefetch({ force: true }); // show the thread without waiting for the socket
      this.connect();
    }
    watch.refs += 1;
    return watch;
  }

  release(watch: ThreadWatch): void {
    watch.refs -= 1;
    if (watch.refs > 0 || this.watches.get(watch.threadId) !== watch) return;
    this.watches.delete(watch.threadId);
    watch.sync.dispose();
    this.socket.unsubscribe(watch.threadId);
  }

  actionInbox(): ActionInbox {
    if (!this.inbox) {
      this.inbox = new ActionInbox(this);
      this.socket.keep('actions', { type: 'actions.subscribe', id: 'inbox' });
      void this.inbox.refetch();
      this.connect();
    }
    this.inbox.refs += 1;
    return this.inbox;
  }

  releaseInbox(inbox: ActionInbox): void {
    inbox.refs -= 1;
    if (inbox.refs > 0 || this.inbox !== inbox) return;
    this.inbox = null;
    this.socket.forget('actions');
    this.socket.send({ type: 'actions.unsubscribe' });
  }

  private onFrame(frame: Frame): void {
    const threadId = typeof frame.thread_id === 'string' ? frame.thread_id : null;
    if (frame.type === 'resync' && !threadId) {
      for (const watch of this.watches.values()) watch.sync.resync();
    } else if (threadId && this.watches.has(threadId)) {
      this.watches.get(threadId)?.onFrame(frame);
    }
    this.inbox?.onFrame(frame);
  }

  private onSocketState(state: SocketState): void {
    for (const watch of this.watches.values()) {
      // Presence belongs to a connection: the next one starts afresh.
      if (state !== 'open') watch.presence = {};
      watch.changed();
    }
    this.connection.emit();
  }
}
