// The websocket to /v1/ws: subscriptions that survive reconnects, ping/pong, backoff.

export const CLOSE_UNAUTHORIZED = 4401;
const CLOSE_PING_TIMEOUT = 4000;

/** Exponential backoff with "equal jitter": half fixed, half random; capped. */
export function backoffDelay(attempt, { base = 500, max = 15000, random = Math.random } = {}) {
  const ceiling = Math.min(max, base * 2 ** Math.max(0, attempt));
  return Math.round(ceiling / 2 + random() * (ceiling / 2));
}

/** ws:// or wss:// matching the page. No token in it: URLs reach logs and proxies. */
export function socketUrl(location) {
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  return `${proto}//${location.host}/v1/ws`;
}

/**
 * The subprotocols that authenticate the websocket (browsers cannot set its headers): the
 * server answers `threadline.v1` and reads the token from `bearer.<token>` (docs/protocol.md).
 */
export function socketProtocols(token) {
  return ['threadline.v1', `bearer.${token}`];
}

// Connection states: idle -> connecting -> open -> (reconnecting -> connecting -> open)*;
// `unauthorized` (close 4401) and `closed` (close() called) are final.
const TRANSITIONS = {
  idle: ['connecting', 'closed'],
  connecting: ['open', 'reconnecting', 'unauthorized', 'closed'],
  open: ['reconnecting', 'unauthorized', 'closed'],
  reconnecting: ['connecting', 'unauthorized', 'closed'],
  unauthorized: [],
  closed: [],
};

export class ThreadSocket {
  constructor({
    url,
    protocols = [],
    onFrame,
    onStateChange,
    WebSocketImpl = globalThis.WebSocket,
    pingIntervalMs = 20000,
    pongTimeoutMs = 10000,
    // Where timeouts come from: the platform's by default, a fake clock in tests.
    clock = { setTimeout: (fn, ms) => setTimeout(fn, ms), clearTimeout: (id) => clearTimeout(id) },
  }) {
    this.url = url;
    this.protocols = protocols;
    this.onFrame = onFrame || (() => {});
    this.onStateChange = onStateChange || (() => {});
    this.WebSocketImpl = WebSocketImpl;
    this.pingIntervalMs = pingIntervalMs;
    this.pongTimeoutMs = pongTimeoutMs;
    this.clock = clock;
    this.state = 'idle';
    this.attempt = 0;
    this.ws = null;
    this.subscriptions = new Set();
    this.timers = { reconnect: null, ping: null, pong: null };
    this.nextId = 1;
  }

  setState(next) {
    if (next === this.state) return;
    if (!TRANSITIONS[this.state].includes(next)) return; // final states stay final
    this.state = next;
    this.onStateChange(next, this.attempt);
  }

  connect() {
    if (this.state === 'closed' || this.state === 'unauthorized') return;
    this.clearTimer('reconnect');
    this.setState('connecting');
    let ws;
    // A function gives the protocols of each connection: a reconnect uses the newest token.
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
      this.startPing();
    };
    ws.onmessage = (event) => {
      if (ws !== this.ws) return;
      this.clearTimer('pong'); // any frame proves the connection is alive
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return;
      }
      if (frame && typeof frame === 'object') this.onFrame(frame);
    };
    ws.onclose = (event) => {
      if (ws !== this.ws) return;
      this.ws = null;
      this.stopPing();
      if (event.code === CLOSE_UNAUTHORIZED) this.setState('unauthorized');
      else if (this.state !== 'closed') this.scheduleReconnect();
    };
    ws.onerror = () => {
      // The close event follows and carries what we need; nothing to log twice.
    };
  }

  scheduleReconnect() {
    if (this.state === 'closed' || this.state === 'unauthorized') return;
    const delay = backoffDelay(this.attempt);
    this.attempt += 1;
    if (this.state === 'reconnecting') this.onStateChange(this.state, this.attempt);
    else this.setState('reconnecting');
    this.clearTimer('reconnect');
    this.timers.reconnect = this.clock.setTimeout(() => this.connect(), delay);
  }

  /** Skip the backoff wait (the browser came back online, the tab became visible). */
  reconnectNow() {
    if (this.state === 'reconnecting') this.connect();
  }

  close() {
    this.setState('closed');
    this.clearTimer('reconnect');
    this.stopPing();
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      ws.close(1000, 'bye');
    }
  }

  subscribe(threadId) {
    this.subscriptions.add(threadId);
    if (this.state === 'open') this.sendSubscribe(threadId);
  }

  unsubscribe(threadId) {
    if (!this.subscriptions.delete(threadId)) return;
    if (this.state === 'open') this.send({ type: 'unsubscribe', thread_id: threadId });
  }

  sendSubscribe(threadId) {
    this.send({ type: 'subscribe', thread_id: threadId, id: `sub-${this.nextId++}` });
  }

  send(frame) {
    if (!this.ws || this.state !== 'open') return false;
    try {
      this.ws.send(JSON.stringify(frame));
      return true;
    } catch {
      return false;
    }
  }

  startPing() {
    this.stopPing();
    // A chain of timeouts rather than an interval: one kind of timer to schedule and clear.
    const ping = () => {
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

  dropConnection(code, reason) {
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

  stopPing() {
    this.clearTimer('ping');
    this.clearTimer('pong');
  }

  clearTimer(name) {
    if (this.timers[name] !== null) {
      this.clock.clearTimeout(this.timers[name]);
      this.timers[name] = null;
    }
  }
}
