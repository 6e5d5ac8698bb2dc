// The websocket to /v1/ws: subscriptions that survive reconnects, ping/pong, backoff.
// Authentication by subprotocol, never in the URL (docs/protocol.md, "Authentication").

export const CLOSE_UNAUTHORIZED = 4401;
export const CLOSE_FORBIDDEN = 4403;
const CLOSE_PING_TIMEOUT = 4000;

export interface BackoffOptions {
  base?: number;
  max?: number;
  random?: () => number;
}

/** Exponential backoff with "equal jitter": half fixed, half random; capped. */
export function backoffDelay(attempt: number, { base = 500, max = 15000, random = Math.random }: BackoffOptions = {}): number {
  const ceiling = Math.min(max, base * 2 ** Math.max(0, attempt));
  return Math.round(ceiling / 2 + random() * (ceiling / 2));
}

/** ws:// or wss:// matching the page (or an http(s) base URL). No token in it: URLs reach logs. */
export function socketUrl(location: { protocol: string; host: string }): string {
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  return `${proto}//${location.host}/v1/ws`;
}

/**
 * The subprotocols that authenticate the websocket (browsers cannot set its headers): the
 * server answers `threadline.v1` and reads the token from `bearer.<token>` (docs/protocol.md).
 */
export function socketProtocols(token: string): string[] {
  return ['threadline.v1', `bearer.${token}`];
}

export type SocketState = 'idle' | 'connecting' | 'open' | 'reconnecting' | 'unauthorized' | 'closed';

// idle -> connecting -> open -> (reconnecting -> connecting -> open)*; `unauthorized` (close
// 4401 or 4403: a bad or revoked token, retrying cannot help) and `closed` are final.
const TRANSITIONS: Record<SocketState, SocketState[]> = {
  idle: ['connecting', 'closed'],
  connecting: ['open', 'reconnecting', 'unauthorized', 'closed'],
  open: ['reconnecting', 'unauthorized', 'closed'],
  reconnecting: ['connecting', 'unauthorized', 'closed'],
  unauthorized: [],
  closed: [],
};

/** The part of the platform's WebSocket this uses (the browser's, node's, or a fake). */
export interface WebSocketLike {
  onopen: ((event: unknown) => void) | null;
  onmessage: ((event: { data: unknown }) => void) | null;
  onclose: ((event: { code: number }) => void) | null;
  onerror: ((event: unknown) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}

export type WebSocketFactory = new (url: string, protocols?: string | string[]) => WebSocketLike;

export interface Clock {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(id: unknown): void;
}

export type Frame = { type: string; [key: string]: unknown };

export interface ThreadSocketOptions {
  url: string;
  /** The subprotocols, or a function giving them per connection (a reconnect uses the newest token). */
  protocols?: string[] | (() => string[]);
  onFrame?: (frame: Frame) => void;
  onStateChange?: (state: SocketState, attempt: number) => void;
  WebSocketImpl?: WebSocketFactory;
  pingIntervalMs?: number;
  pongTimeoutMs?: number;
  clock?: Clock;
  /** Subscribe with `"deltas": true`: invalidations may carry the snapshot delta. */
  deltas?: boolean;
}

type TimerName = 'reconnect' | 'ping' | 'pong';

export class ThreadSocket {
  url: string;
  protocols: string[] | (() => string[]);
  onFrame: (frame: Frame) => void;
  onStateChange: (state: SocketState, attempt: number) => void;
  WebSocketImpl: WebSocketFactory;
  pingIntervalMs: number;
  pongTimeoutMs: number;
  clock: Clock;
  deltas: boolean;
  state: SocketState = 'idle';
  attempt = 0;
  ws: WebSocketLike | null = null;
  subscriptions = new Set<string>();
  /** Frames re-sent on every (re)connection after the subscriptions (e.g. actions.subscribe). */
  standing = new Map<string, Frame>();
  timers: Record<TimerName, unknown> = { reconnect: null, ping: null, pong: null };
  nextId = 1;
  closeCode: number | null = null;

  constructor({
    url,
    protocols = [],
    onFrame,
    onStateChange,
    WebSocketImpl = (globalThis as unknown as { WebSocket: WebSocketFactory }).WebSocket,
    pingIntervalMs = 20000,
    pongTimeoutMs = 10000,
    // Where timeouts come from: the platform's by default, a fake clock in tests.
    clock = {
      setTimeout: (fn, ms) => setTimeout(fn, ms),
      clearTimeout: (id) => clearTimeout(id as ReturnType<typeof setTimeout>),
    },
    deltas = false,
  }: ThreadSocketOptions) {
    this.deltas = deltas;
    this.url = url;
    this.protocols = protocols;
    this.onFrame = onFrame || (() => {});
    this.onStateChange = onStateChange || (() => {});
    this.WebSocketImpl = WebSocketImpl;
    this.pingIntervalMs = pingIntervalMs;
    this.pongTimeoutMs = pongTimeoutMs;
    this.clock = clock;
  }

  setState(next: SocketState): void {
    if (next === this.state) return;
    if (!TRANSITIONS[this.state].includes(next)) return; // final states stay final
    this.state = next;
    this.onStateChange(next, this.attempt);
  }

  connect(): void {
    if (this.state === 'closed' || this.state === 'unauthorized') return;
    this.clearTimer('reconnect');
    this.setState('connecting');
    let ws: WebSocketLike;
    const protocols = typeof this.protocols === 'function' ? this.protocols() : this.protocols;
    try {
      ws = protocols.length ? new this.WebSocketImpl(this.url, protocols) : new this.WebSocketImpl(this.url);
    } catch {
      this.scheduleReconnect();
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      if (ws !== this.ws) return;
      this.attempt = 0;
      this.setState('open');
      for (const threadId of this.subscriptions) this.sendSubscribe(threadId);
      for (const frame of this.standing.values()) this.send(frame);
      this.startPing();
    };
    ws.onmessage = (event) => {
      if (ws !== this.ws) return;
      this.clearTimer('pong'); // any frame proves the connection is alive
      let frame: unknown;
      try {
        frame = JSON.parse(String(event.data));
      } catch {
        return;
      }
      if (frame && typeof frame === 'object' && typeof (frame as Frame).type === 'string') this.onFrame(frame as Frame);
    };
    ws.onclose = (event) => {
      if (ws !== this.ws) return;
      this.ws = null;
      this.closeCode = event.code;
      this.stopPing();
      if (event.code === CLOSE_UNAUTHORIZED || event.code === CLOSE_FORBIDDEN) this.setState('unauthorized');
      else if (this.state !== 'closed') this.scheduleReconnect();
    };
    ws.onerror = () => {
      // The close event follows and carries what we need; nothing to log twice.
    };
  }

  scheduleReconnect(): void {
    if (this.state === 'closed' || this.state === 'unauthorized') return;
    const delay = backoffDelay(this.attempt);
    this.attempt += 1;
    if (this.state === 'reconnecting') this.onStateChange(this.state, this.attempt);
    else this.setState('reconnecting');
    this.clearTimer('reconnect');
    this.timers.reconnect = this.clock.setTimeout(() => this.connect(), delay);
  }

  /** Skip the backoff wait (the browser came back online, the tab became visible). */
  reconnectNow(): void {
    if (this.state === 'reconnecting') this.connect();
  }

  close(): void {
    this.setState('closed');
    this.clearTimer('reconnect');
    this.stopPing();
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      ws.close(1000, 'bye');
    }
  }

  subscribe(threadId: string): void {
    this.subscriptions.add(threadId);
    if (this.state === 'open') this.sendSubscribe(threadId);
  }

  unsubscribe(threadId: string): void {
    if (!this.subscriptions.delete(threadId)) return;
    if (this.state === 'open') this.send({ type: 'unsubscribe', thread_id: threadId });
  }

  /** A frame to send now and after every reconnection, until `forget(key)`. */
  keep(key: string, frame: Frame): void {
    this.standing.set(key, frame);
    if (this.state === 'open') this.send(frame);
  }

  forget(key: string): void {
    this.standing.delete(key);
  }

  sendSubscribe(threadId: string): void {
    const frame: Frame = { type: 'subscribe', thread_id: threadId, id: `sub-${this.nextId++}` };
    if (this.deltas) frame.deltas = true;
    this.send(frame);
  }

  send(frame: Frame): boolean {
    if (!this.ws || this.state !== 'open') return false;
    try {
      this.ws.send(JSON.stringify(frame));
      return true;
    } catch {
      return false;
    }
  }

  startPing(): void {
    this.stopPing();
    // A chain of timeouts rather than an interval: one kind of timer to schedule and clear.
    const ping = (): void => {
      this.timers.ping = this.clock.setTimeout(ping, this.pingIntervalMs);
      if (!this.send({ type: 'ping' })) return;
      if (this.timers.pong === null) {
        this.timers.pong = this.clock.setTimeout(() => {
          this.timers.pong = null;
          // No answer: the connection is dead, and a closing handshake may never finish.
          // Drop it (its late events are ignored) and reconnect right away.
          this.dropConnection(CLOSE_PING_TIMEOUT, 'ping timeout');
        }, this.pongTimeoutMs);
      }
    };
    this.timers.ping = this.clock.setTimeout(ping, this.pingIntervalMs);
  }

  dropConnection(code: number, reason: string): void {
    const ws = this.ws;
    this.ws = null;
    this.stopPing();
    if (ws) {
      try {
        ws.close(code, reason);
      } catch {
        // already closing
      }
    }
    this.scheduleReconnect();
  }

  stopPing(): void {
    this.clearTimer('ping');
    this.clearTimer('pong');
  }

  clearTimer(name: TimerName): void {
    if (this.timers[name] !== null) {
      this.clock.clearTimeout(this.timers[name]);
      this.timers[name] = null;
    }
  }
}
