// Generated from clients/typescript/src by clients/typescript/scripts/build-static.mjs: do not edit.
// Rebuild: make ts-build (tests/unit/test_ts_client.py fails when this is stale).

// src/generated/commands.ts
var COMMANDS = {
  "thread.create": { method: "POST", path: "/v1/threads", status: 201, query: false, websocket: false },
  "thread.list": { method: "GET", path: "/v1/threads", status: 200, query: true, websocket: false },
  "thread.snapshot": { method: "GET", path: "/v1/threads/{thread_id}", status: 200, query: true, websocket: false },
  "thread.rename": { method: "PATCH", path: "/v1/threads/{thread_id}", status: 200, query: false, websocket: true },
  "thread.update_metadata": { method: "PATCH", path: "/v1/threads/{thread_id}/metadata", status: 200, query: false, websocket: true },
  "subscribe": { method: null, path: null, status: null, query: false, websocket: true },
  "unsubscribe": { method: null, path: null, status: null, query: false, websocket: true },
  "message.send": { method: "POST", path: "/v1/threads/{thread_id}/messages", status: 202, query: false, websocket: true },
  "queue.cancel": { method: "DELETE", path: "/v1/threads/{thread_id}/queue/{item_id}", status: 200, query: false, websocket: true },
  "queue.item": { method: "GET", path: "/v1/threads/{thread_id}/queue/{item_id}", status: 200, query: false, websocket: false },
  "action.resume": { method: "POST", path: "/v1/threads/{thread_id}/actions/{action_id}/resume", status: 200, query: false, websocket: true },
  "action.client_result": { method: "POST", path: "/v1/threads/{thread_id}/actions/{action_id}/client-result", status: 200, query: false, websocket: true },
  "action.manual_result": { method: "POST", path: "/v1/threads/{thread_id}/actions/{action_id}/manual-result", status: 200, query: false, websocket: true },
  "run.stop": { method: "POST", path: "/v1/threads/{thread_id}/runs/{run_id}/stop", status: 202, query: false, websocket: true },
  "regenerate": { method: "POST", path: "/v1/threads/{thread_id}/regenerate", status: 202, query: false, websocket: true },
  "run.retry": { method: "POST", path: "/v1/threads/{thread_id}/runs/{run_id}/retry", status: 202, query: false, websocket: true },
  "message.visibility": { method: "POST", path: "/v1/threads/{thread_id}/messages/{message_id}/visibility", status: 200, query: false, websocket: true },
  "token.revoke": { method: "POST", path: "/v1/tokens/revoke", status: 200, query: false, websocket: false },
  "ping": { method: null, path: null, status: null, query: false, websocket: true },
  "me": { method: "GET", path: "/v1/me", status: 200, query: false, websocket: false },
  "actions.list": { method: "GET", path: "/v1/actions", status: 200, query: true, websocket: false },
  "actions.subscribe": { method: null, path: null, status: null, query: false, websocket: true },
  "actions.unsubscribe": { method: null, path: null, status: null, query: false, websocket: true },
  "presence.update": { method: null, path: null, status: null, query: false, websocket: true },
  "thread.open": { method: null, path: null, status: null, query: false, websocket: false },
  "token.list": { method: "GET", path: "/v1/tokens", status: 200, query: false, websocket: false },
  "token.revoke_id": { method: "POST", path: "/v1/tokens/{token_id}/revoke", status: 200, query: false, websocket: false },
  "auth.refresh": { method: null, path: null, status: null, query: false, websocket: true },
  "schedule.create": { method: "POST", path: "/v1/schedules", status: 201, query: false, websocket: true },
  "schedule.list": { method: "GET", path: "/v1/schedules", status: 200, query: true, websocket: false },
  "schedule.get": { method: "GET", path: "/v1/schedules/{schedule_id}", status: 200, query: false, websocket: false },
  "schedule.fires": { method: "GET", path: "/v1/schedules/{schedule_id}/fires", status: 200, query: true, websocket: false },
  "schedule.pause": { method: "POST", path: "/v1/schedules/{schedule_id}/pause", status: 200, query: false, websocket: true },
  "schedule.resume": { method: "POST", path: "/v1/schedules/{schedule_id}/resume", status: 200, query: false, websocket: true },
  "schedule.delete": { method: "DELETE", path: "/v1/schedules/{schedule_id}", status: 200, query: false, websocket: true },
  "webhook.create": { method: "POST", path: "/v1/webhooks", status: 201, query: false, websocket: false },
  "webhook.list": { method: "GET", path: "/v1/webhooks", status: 200, query: true, websocket: false },
  "webhook.update": { method: "POST", path: "/v1/webhooks/{webhook_id}", status: 200, query: false, websocket: true },
  "webhook.delete": { method: "DELETE", path: "/v1/webhooks/{webhook_id}", status: 200, query: false, websocket: true },
  "webhook.deliveries": { method: "GET", path: "/v1/webhooks/{webhook_id}/deliveries", status: 200, query: true, websocket: false },
  "delivery.attempts": { method: "GET", path: "/v1/deliveries/{delivery_id}/attempts", status: 200, query: false, websocket: false },
  "delivery.redeliver": { method: "POST", path: "/v1/deliveries/{delivery_id}/redeliver", status: 200, query: false, websocket: true },
  "audit.list": { method: "GET", path: "/v1/audit", status: 200, query: true, websocket: false },
  "action.reassign": { method: "POST", path: "/v1/threads/{thread_id}/actions/{action_id}/reassign", status: 200, query: false, websocket: true }
};

// src/delta.ts
var KNOWN = /* @__PURE__ */ new Set(["from", "etag", "thread", "messages", "set", "unset"]);
var DeltaMismatch = class extends Error {
};
function applyDelta(base, delta) {
  for (const key of Object.keys(delta)) {
    if (!KNOWN.has(key)) throw new DeltaMismatch(`unknown delta key ${key}`);
  }
  const next = { ...base };
  if (delta.thread !== void 0) {
    if (!base.thread || typeof delta.thread !== "object") throw new DeltaMismatch("no thread to patch");
    next.thread = { ...base.thread, ...delta.thread };
  }
  if (delta.messages !== void 0) {
    const held = base.messages;
    if (!Array.isArray(held) || !Array.isArray(delta.messages)) throw new DeltaMismatch("no messages to patch");
    const messages = [];
    for (const piece of delta.messages) {
      if (Array.isArray(piece)) {
        const [start, end] = piece;
        if (piece.length !== 2 || !Number.isInteger(start) || !Number.isInteger(end)) {
          throw new DeltaMismatch(`bad message range ${JSON.stringify(piece)}`);
        }
        if (!(start >= 0 && start < end && end <= held.length)) {
          throw new DeltaMismatch(`message range ${JSON.stringify(piece)} outside ${held.length} messages`);
        }
        messages.push(...held.slice(start, end));
      } else if (piece && typeof piece === "object") {
        messages.push(piece);
      } else {
        throw new DeltaMismatch("a message piece is a range or a message");
      }
    }
    next.messages = messages;
  }
  if (delta.set !== void 0) {
    if (!delta.set || typeof delta.set !== "object") throw new DeltaMismatch("set must be an object");
    Object.assign(next, delta.set);
  }
  for (const key of delta.unset ?? []) delete next[key];
  return next;
}

// src/http.ts
var ApiError = class extends Error {
  /** `status` is 0 for a network failure; `code` the server's snake_case code. */
  constructor(status, code, message, details = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
    this.name = "ApiError";
  }
  status;
  code;
  details;
};
var PATH_FIELD = /{(\w+)}/g;
function route(name, input) {
  const spec = COMMANDS[name];
  const used = /* @__PURE__ */ new Set();
  const path = spec.path.replace(PATH_FIELD, (_, field) => {
    used.add(field);
    const value = input[field];
    if (typeof value !== "string" || !value) throw new TypeError(`${name}: ${field} is required`);
    return encodeURIComponent(value);
  });
  const rest = Object.entries(input).filter(([key, value]) => !used.has(key) && value !== void 0);
  if (spec.method === "GET" || spec.method === "DELETE") {
    const query = new URLSearchParams();
    for (const [key, value] of rest) {
      if (value === null) continue;
      if (key === "metadata" && typeof value === "object") {
        for (const [k, v] of Object.entries(value)) query.append(`metadata.${k}`, String(v));
      } else {
        query.append(key, String(value));
      }
    }
    const qs = query.toString();
    return { method: spec.method, url: qs ? `${path}?${qs}` : path };
  }
  return { method: spec.method, url: path, body: Object.fromEntries(rest) };
}
var HttpClient = class {
  baseUrl;
  bearer;
  fetchImpl;
  constructor({ baseUrl = "", token, fetch: fetchImpl }) {
    this.baseUrl = baseUrl.replace(/\/$/, "");
    this.bearer = typeof token === "function" ? token : () => token;
    this.fetchImpl = fetchImpl || ((input, init) => globalThis.fetch(input, init));
  }
  /** Run a command of the table over HTTP; answers the JSON body, throws ApiError. */
  async call(name, input) {
    const { method, url, body } = route(name, input);
    const headers = { Accept: "application/json", Authorization: `Bearer ${this.bearer()}` };
    const init = { method, headers, cache: "no-store" };
    if (body !== void 0) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await this.fetchImpl(this.baseUrl + url, init);
    } catch {
      throw new ApiError(0, "network_error", "Network error: the server could not be reached.");
    }
    const text2 = await res.text().catch(() => "");
    let data = null;
    if (text2) {
      try {
        data = JSON.parse(text2);
      } catch {
        data = null;
      }
    }
    if (!res.ok) {
      const err = data?.error ?? {};
      const code = typeof err.code === "string" ? err.code : `http_${res.status}`;
      const message = typeof err.message === "string" ? err.message : `${res.status} ${res.statusText || "error"}`.trim();
      throw new ApiError(res.status, code, message, err);
    }
    return data;
  }
  me() {
    return this.call("me", {});
  }
  createThread(input = {}) {
    return this.call("thread.create", input);
  }
  listThreads(input = {}) {
    return this.call("thread.list", input);
  }
  snapshot(threadId, input = {}) {
    return this.call("thread.snapshot", { thread_id: threadId, ...input });
  }
  send(threadId, text2, options = {}) {
    return this.call("message.send", { thread_id: threadId, text: text2, ...options });
  }
  resume(threadId, actionId, payload, expectedVersion) {
    return this.call("action.resume", { thread_id: threadId, action_id: actionId, payload, expected_version: expectedVersion });
  }
  /** Hand an approval the caller may decide to one subject or one group (the policy must permit delegation). */
  reassign(threadId, actionId, to) {
    return this.call("action.reassign", { thread_id: threadId, action_id: actionId, ...to });
  }
  stop(threadId, runId) {
    return this.call("run.stop", { thread_id: threadId, run_id: runId });
  }
  regenerate(threadId, messageId) {
    return this.call("regenerate", { thread_id: threadId, message_id: messageId });
  }
  retry(threadId, runId) {
    return this.call("run.retry", { thread_id: threadId, run_id: runId });
  }
  updateMetadata(threadId, metadata) {
    return this.call("thread.update_metadata", { thread_id: threadId, metadata });
  }
  actions(input = {}) {
    return this.call("actions.list", { status: "pending", ...input });
  }
};

// src/presence.ts
function applyPresence(members, frame) {
  if (!frame || typeof frame !== "object") return members;
  const f = frame;
  if (f.type === "presence") {
    const next = {};
    for (const m of Array.isArray(f.members) ? f.members : []) if (m && m.subject) next[m.subject] = m;
    return next;
  }
  const member = f.member;
  if ((f.type === "presence.join" || f.type === "presence.update") && member && member.subject) {
    return { ...members, [member.subject]: member };
  }
  if (f.type === "presence.leave" && typeof f.subject === "string") {
    const next = { ...members };
    delete next[f.subject];
    return next;
  }
  return members;
}
function presenceView(members, me) {
  const all = Object.values(members || {});
  const here = all.map((m) => ({ subject: m.subject, name: m.name || m.subject, role: m.role, connections: m.connections || 1, me: m.subject === me })).sort((a, b) => a.me === b.me ? a.name.localeCompare(b.name) : a.me ? -1 : 1);
  const others = all.filter((m) => m.subject !== me);
  const typing = others.filter((m) => m.typing).map((m) => m.name || m.subject).sort();
  const reviewing = {};
  for (const m of others) {
    if (m.reviewing) (reviewing[m.reviewing] = reviewing[m.reviewing] || []).push(m.name || m.subject);
  }
  for (const names of Object.values(reviewing)) names.sort();
  return { here, typing, reviewing };
}

// src/socket.ts
var CLOSE_UNAUTHORIZED = 4401;
var CLOSE_FORBIDDEN = 4403;
var CLOSE_PING_TIMEOUT = 4e3;
function backoffDelay(attempt, { base = 500, max = 15e3, random = Math.random } = {}) {
  const ceiling = Math.min(max, base * 2 ** Math.max(0, attempt));
  return Math.round(ceiling / 2 + random() * (ceiling / 2));
}
function socketUrl(location) {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  return `${proto}//${location.host}/v1/ws`;
}
function socketProtocols(token) {
  return ["threadline.v1", `bearer.${token}`];
}
var TRANSITIONS = {
  idle: ["connecting", "closed"],
  connecting: ["open", "reconnecting", "unauthorized", "closed"],
  open: ["reconnecting", "unauthorized", "closed"],
  reconnecting: ["connecting", "unauthorized", "closed"],
  unauthorized: [],
  closed: []
};
var ThreadSocket = class {
  url;
  protocols;
  onFrame;
  onStateChange;
  WebSocketImpl;
  pingIntervalMs;
  pongTimeoutMs;
  clock;
  deltas;
  state = "idle";
  attempt = 0;
  ws = null;
  subscriptions = /* @__PURE__ */ new Set();
  /** Frames re-sent on every (re)connection after the subscriptions (e.g. actions.subscribe). */
  standing = /* @__PURE__ */ new Map();
  timers = { reconnect: null, ping: null, pong: null };
  nextId = 1;
  closeCode = null;
  constructor({
    url,
    protocols = [],
    onFrame,
    onStateChange,
    WebSocketImpl = globalThis.WebSocket,
    pingIntervalMs = 2e4,
    pongTimeoutMs = 1e4,
    // Where timeouts come from: the platform's by default, a fake clock in tests.
    clock = {
      setTimeout: (fn, ms) => setTimeout(fn, ms),
      clearTimeout: (id) => clearTimeout(id)
    },
    deltas = false
  }) {
    this.deltas = deltas;
    this.url = url;
    this.protocols = protocols;
    this.onFrame = onFrame || (() => {
    });
    this.onStateChange = onStateChange || (() => {
    });
    this.WebSocketImpl = WebSocketImpl;
    this.pingIntervalMs = pingIntervalMs;
    this.pongTimeoutMs = pongTimeoutMs;
    this.clock = clock;
  }
  setState(next) {
    if (next === this.state) return;
    if (!TRANSITIONS[this.state].includes(next)) return;
    this.state = next;
    this.onStateChange(next, this.attempt);
  }
  connect() {
    if (this.state === "closed" || this.state === "unauthorized") return;
    this.clearTimer("reconnect");
    this.setState("connecting");
    let ws;
    const protocols = typeof this.protocols === "function" ? this.protocols() : this.protocols;
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
      this.setState("open");
      for (const threadId of this.subscriptions) this.sendSubscribe(threadId);
      for (const frame of this.standing.values()) this.send(frame);
      this.startPing();
    };
    ws.onmessage = (event) => {
      if (ws !== this.ws) return;
      this.clearTimer("pong");
      let frame;
      try {
        frame = JSON.parse(String(event.data));
      } catch {
        return;
      }
      if (frame && typeof frame === "object" && typeof frame.type === "string") this.onFrame(frame);
    };
    ws.onclose = (event) => {
      if (ws !== this.ws) return;
      this.ws = null;
      this.closeCode = event.code;
      this.stopPing();
      if (event.code === CLOSE_UNAUTHORIZED || event.code === CLOSE_FORBIDDEN) this.setState("unauthorized");
      else if (this.state !== "closed") this.scheduleReconnect();
    };
    ws.onerror = () => {
    };
  }
  scheduleReconnect() {
    if (this.state === "closed" || this.state === "unauthorized") return;
    const delay = backoffDelay(this.attempt);
    this.attempt += 1;
    if (this.state === "reconnecting") this.onStateChange(this.state, this.attempt);
    else this.setState("reconnecting");
    this.clearTimer("reconnect");
    this.timers.reconnect = this.clock.setTimeout(() => this.connect(), delay);
  }
  /** Skip the backoff wait (the browser came back online, the tab became visible). */
  reconnectNow() {
    if (this.state === "reconnecting") this.connect();
  }
  close() {
    this.setState("closed");
    this.clearTimer("reconnect");
    this.stopPing();
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      ws.close(1e3, "bye");
    }
  }
  subscribe(threadId) {
    this.subscriptions.add(threadId);
    if (this.state === "open") this.sendSubscribe(threadId);
  }
  unsubscribe(threadId) {
    if (!this.subscriptions.delete(threadId)) return;
    if (this.state === "open") this.send({ type: "unsubscribe", thread_id: threadId });
  }
  /** A frame to send now and after every reconnection, until `forget(key)`. */
  keep(key, frame) {
    this.standing.set(key, frame);
    if (this.state === "open") this.send(frame);
  }
  forget(key) {
    this.standing.delete(key);
  }
  sendSubscribe(threadId) {
    const frame = { type: "subscribe", thread_id: threadId, id: `sub-${this.nextId++}` };
    if (this.deltas) frame.deltas = true;
    this.send(frame);
  }
  send(frame) {
    if (!this.ws || this.state !== "open") return false;
    try {
      this.ws.send(JSON.stringify(frame));
      return true;
    } catch {
      return false;
    }
  }
  startPing() {
    this.stopPing();
    const ping = () => {
      this.timers.ping = this.clock.setTimeout(ping, this.pingIntervalMs);
      if (!this.send({ type: "ping" })) return;
      if (this.timers.pong === null) {
        this.timers.pong = this.clock.setTimeout(() => {
          this.timers.pong = null;
          this.dropConnection(CLOSE_PING_TIMEOUT, "ping timeout");
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
      }
    }
    this.scheduleReconnect();
  }
  stopPing() {
    this.clearTimer("ping");
    this.clearTimer("pong");
  }
  clearTimer(name) {
    if (this.timers[name] !== null) {
      this.clock.clearTimeout(this.timers[name]);
      this.timers[name] = null;
    }
  }
};

// src/sync.ts
var ACTIVE_RUN_STATUSES = /* @__PURE__ */ new Set(["queued", "running", "waiting"]);
var TERMINAL_RUN_STATUSES = /* @__PURE__ */ new Set(["completed", "failed", "cancelled"]);
var RETIRED_RUNS_KEPT = 32;
var RETRY_DELAYS_MS = [500, 1e3, 2e3, 4e3, 8e3];
var ThreadSync = class {
  threadId;
  fetchSnapshot;
  onChange;
  onError;
  schedule;
  isRetryable;
  snapshot = null;
  run = null;
  retired = [];
  ordinal = 0;
  inflight = false;
  inflightForced = false;
  queued = false;
  forcePending = false;
  wantVersion = -1;
  failures = 0;
  retryTimer = null;
  disposed = false;
  stats = { fetches: 0, discarded: 0, deltas: 0 };
  constructor({ threadId, fetchSnapshot, onChange, onError, schedule, isRetryable }) {
    this.threadId = threadId;
    this.fetchSnapshot = fetchSnapshot;
    this.onChange = onChange || (() => {
    });
    this.onError = onError || (() => {
    });
    this.schedule = schedule || ((fn, ms) => setTimeout(fn, ms));
    this.isRetryable = isRetryable || (() => true);
  }
  get version() {
    return this.snapshot ? this.snapshot.thread.version : -1;
  }
  /** True while the client knows it is (or may be) behind: no snapshot yet or a forced refetch. */
  get resyncing() {
    return !this.snapshot || this.forcePending || this.inflight && this.inflightForced;
  }
  dispose() {
    this.disposed = true;
  }
  // --- events --------------------------------------------------------------------------
  /** The server confirmed a (re)subscription: whatever happened meanwhile, refetch. */
  subscribed(version) {
    this.requestRefetch({ force: true, version });
  }
  /** `invalidate` frame or a command's answer: refetch only if it is newer than what we hold. */
  invalidate(version) {
    if (typeof version === "number" && version <= this.version) return;
    this.requestRefetch({ version });
  }
  resync() {
    this.requestRefetch({ force: true });
  }
  /**
   * An `invalidate` frame with a `delta` (docs/protocol.md, "Snapshot deltas"): applied when it
   * starts at the held version and ends at `version`; false otherwise (refetch as for any
   * invalidation: `invalidate(version)`).
   */
  applyDelta(version, delta) {
    if (this.disposed || !this.snapshot || !delta || delta.from !== this.version) return false;
    let next;
    try {
      next = applyDelta(this.snapshot, delta);
    } catch (err) {
      if (err instanceof DeltaMismatch) return false;
      throw err;
    }
    if (!next.thread || next.thread.version !== version) return false;
    this.stats.deltas += 1;
    return this.applySnapshot(next, this.ordinal);
  }
  /** A `chunk` frame: {thread_id, run_id, seq, chunk}. */
  chunk(frame) {
    if (this.disposed || frame.thread_id !== this.threadId) return;
    const { run_id: runId, seq, chunk } = frame;
    if (typeof seq !== "number" || !chunk || this.retired.includes(runId)) return;
    const snapRun = this.snapshot && this.snapshot.run;
    if (snapRun && snapRun.id === runId && TERMINAL_RUN_STATUSES.has(snapRun.status)) return;
    if (!this.run || this.run.id !== runId) {
      if (this.run) this.retire(this.run.id);
      const base = snapRun && snapRun.id === runId ? snapRun.next_seq || 0 : 0;
      this.run = { id: runId, ordinal: ++this.ordinal, chunks: /* @__PURE__ */ new Map(), from: base, next: base, gapAt: null };
    }
    const run = this.run;
    if (chunk.type === "run-takeover") {
      const held = run.chunks.get(seq);
      if (held && held.type === "run-takeover" && held.episode === chunk.episode) return;
      if (seq < run.from) return;
      run.chunks.clear();
      run.from = seq;
      run.next = seq;
      run.gapAt = null;
      run.chunks.set(seq, chunk);
      this.advance(run);
      this.requestRefetch({ force: true });
      this.onChange();
      return;
    }
    if (seq < run.next || run.chunks.has(seq)) return;
    run.chunks.set(seq, chunk);
    this.advance(run);
    if (seq >= run.next && run.gapAt !== run.next) {
      run.gapAt = run.next;
      this.requestRefetch({ force: true });
    }
    this.onChange();
  }
  // --- refetching ----------------------------------------------------------------------
  requestRefetch({ force = false, version } = {}) {
    if (this.disposed) return;
    if (typeof version === "number" && version > this.wantVersion) this.wantVersion = version;
    if (force) this.forcePending = true;
    if (this.inflight) {
      this.queued = true;
      return;
    }
    this.startFetch();
  }
  startFetch() {
    this.inflight = true;
    this.inflightForced = this.forcePending;
    this.forcePending = false;
    this.queued = false;
    const ordinalAtStart = this.ordinal;
    this.stats.fetches += 1;
    this.onChange();
    let failed = null;
    let pending;
    try {
      pending = Promise.resolve(this.fetchSnapshot());
    } catch (err) {
      pending = Promise.reject(err);
    }
    pending.then(
      (snap) => {
        if (this.disposed) return;
        this.failures = 0;
        this.applySnapshot(snap, ordinalAtStart);
      },
      (err) => {
        failed = err ?? new Error("refetch failed");
      }
    ).finally(() => {
      if (this.disposed) return;
      const forced = this.inflightForced;
      this.inflight = false;
      this.inflightForced = false;
      if (failed) {
        this.failures += 1;
        this.onError(failed);
        if (forced) this.forcePending = true;
        if (this.isRetryable(failed) && this.failures <= RETRY_DELAYS_MS.length) {
          const delay = RETRY_DELAYS_MS[this.failures - 1];
          this.retryTimer = this.schedule(() => {
            this.retryTimer = null;
            if (!this.inflight) this.requestRefetch({ force: this.forcePending });
          }, delay);
        } else {
          this.forcePending = false;
          this.failures = 0;
        }
      } else if (this.queued && (this.forcePending || this.wantVersion > this.version)) {
        this.startFetch();
        return;
      }
      this.queued = false;
      this.onChange();
    });
  }
  /** Apply a fetched snapshot; returns false when it was older than the one held. */
  applySnapshot(snap, ordinalAtStart = this.ordinal) {
    if (!snap || !snap.thread) return false;
    if (this.snapshot && snap.thread.version < this.snapshot.thread.version) {
      this.stats.discarded += 1;
      return false;
    }
    this.snapshot = snap;
    const snapRun = snap.run;
    const run = this.run;
    if (run) {
      if (snapRun && snapRun.id === run.id) {
        if (TERMINAL_RUN_STATUSES.has(snapRun.status)) this.dropRun();
        else this.prune(run, snapRun.next_seq || 0);
      } else if (run.ordinal <= ordinalAtStart) {
        this.dropRun();
      }
    }
    this.onChange();
    return true;
  }
  prune(run, nextSeq) {
    for (const seq of run.chunks.keys()) if (seq < nextSeq) run.chunks.delete(seq);
    if (run.from < nextSeq) run.from = nextSeq;
    if (run.next < run.from) run.next = run.from;
    if (run.gapAt !== null && run.gapAt < run.next) run.gapAt = null;
    this.advance(run);
  }
  advance(run) {
    while (run.chunks.has(run.next)) run.next += 1;
  }
  dropRun() {
    if (!this.run) return;
    this.retire(this.run.id);
    this.run = null;
  }
  retire(runId) {
    if (this.retired.includes(runId)) return;
    this.retired.push(runId);
    if (this.retired.length > RETIRED_RUNS_KEPT) this.retired.shift();
  }
  // --- views ---------------------------------------------------------------------------
  /** The chunks shown live: contiguous from the display start, in seq order. */
  liveChunks() {
    const run = this.run;
    if (!run) return [];
    const out = [];
    for (let seq = run.from; seq < run.next; seq += 1) {
      const chunk = run.chunks.get(seq);
      if (chunk) out.push(chunk);
    }
    return out;
  }
  /** What to display on top of the snapshot. */
  liveView() {
    return { runId: this.run ? this.run.id : null, ...foldChunks(this.liveChunks()) };
  }
};
var text = (value) => typeof value === "string" ? value : "";
function foldChunks(chunks) {
  const parts = [];
  const toolStates = {};
  let takeover = null;
  let stepBreak = false;
  for (const c of chunks) {
    if (!c) continue;
    if (c.type === "text-delta") {
      const last = parts[parts.length - 1];
      if (last && last.type === "text" && !stepBreak) last.text += text(c.delta);
      else parts.push({ type: "text", text: text(c.delta) });
      stepBreak = false;
    } else if (c.type === "tool-call") {
      parts.push({
        type: "tool-call",
        tool_call_id: text(c.tool_call_id),
        name: text(c.name),
        input: c.input || {},
        state: "input-available"
      });
    } else if (c.type === "tool-state") {
      const update = { state: c.state };
      if (c.output !== void 0 && c.output !== null) update.output = c.output;
      if (c.error !== void 0 && c.error !== null) update.error = c.error;
      const id = text(c.tool_call_id);
      const part = parts.find((p) => p.type === "tool-call" && p.tool_call_id === id);
      if (part) Object.assign(part, update);
      else toolStates[id] = { ...toolStates[id] || {}, ...update };
    } else if (c.type === "step-start") {
      stepBreak = true;
    } else if (c.type === "run-takeover") {
      takeover = c.episode;
    }
  }
  const joined = parts.filter((p) => p.type === "text" && Boolean(p.text)).map((p) => p.text).join("\n\n");
  return { parts, toolStates, takeover, text: joined };
}
function activeRun(snapshot, live) {
  const run = snapshot && snapshot.run;
  if (run && ACTIVE_RUN_STATUSES.has(run.status)) return run;
  if (live && live.runId && !(run && run.id === live.runId)) {
    return { id: live.runId, status: "running", live: true };
  }
  return null;
}

// src/session.ts
var Emitter = class {
  listeners = /* @__PURE__ */ new Set();
  subscribe = (listener) => {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  };
  emit() {
    for (const listener of [...this.listeners]) listener();
  }
};
var randomId = () => `c-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;
var ThreadWatch = class extends Emitter {
  constructor(client, threadId) {
    super();
    this.client = client;
    this.threadId = threadId;
    this.sync = new ThreadSync({
      threadId,
      fetchSnapshot: () => client.http.snapshot(threadId),
      onChange: () => this.changed(),
      onError: (err) => {
        this.error = err;
        this.changed();
      },
      isRetryable: (err) => !(err instanceof ApiError && [401, 403, 404].includes(err.status))
    });
  }
  client;
  threadId;
  sync;
  presence = {};
  subscribedOnce = false;
  error = null;
  refs = 0;
  view = null;
  changed() {
    this.view = null;
    this.emit();
  }
  /** The current view, the same object until something changes. */
  getView = () => {
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
      runStatus: run ? run.status : snapshot?.run?.status ?? null,
      resyncing: this.sync.resyncing,
      connection: this.client.socket.state,
      presence: this.presence,
      error: this.error
    };
    return this.view;
  };
  onFrame(frame) {
    switch (frame.type) {
      case "subscribed":
        this.subscribedOnce = true;
        this.sync.subscribed(frame.version);
        break;
      case "chunk":
        this.sync.chunk(frame);
        break;
      case "invalidate":
        if (!(frame.delta && this.sync.applyDelta(frame.version, frame.delta))) {
          this.sync.invalidate(frame.version);
        }
        break;
      case "resync":
        this.sync.resync();
        break;
      case "presence":
      case "presence.join":
      case "presence.update":
      case "presence.leave":
        this.presence = applyPresence(this.presence, frame);
        this.changed();
        break;
      default:
        break;
    }
  }
  /** A command's answer names the version it committed: refetch if that is newer. */
  async settle(pending) {
    try {
      const answer = await pending;
      this.sync.invalidate(typeof answer?.version === "number" ? answer.version : void 0);
      return answer;
    } catch (err) {
      if (err instanceof ApiError && err.code === "conflict") this.sync.resync();
      throw err;
    }
  }
  send(text2, options = {}) {
    return this.settle(this.client.http.send(this.threadId, text2, { client_request_id: randomId(), ...options }));
  }
  resume(actionId, payload) {
    return this.settle(this.client.http.resume(this.threadId, actionId, payload));
  }
  reassign(actionId, to) {
    return this.settle(this.client.http.reassign(this.threadId, actionId, to));
  }
  stop() {
    const run = this.getView().run;
    if (!run || run.live) return Promise.resolve(null);
    return this.settle(this.client.http.stop(this.threadId, run.id));
  }
  regenerate(messageId) {
    return this.settle(this.client.http.regenerate(this.threadId, messageId));
  }
  retry(runId) {
    const id = runId ?? this.sync.snapshot?.run?.id;
    if (!id) return Promise.reject(new ApiError(0, "no_run", "the thread has no run to retry"));
    return this.settle(this.client.http.retry(this.threadId, id));
  }
  /** Tell the others what this tab does (docs/protocol.md, "Presence"). */
  setPresence(changes) {
    return this.client.socket.send({ type: "presence.update", thread_id: this.threadId, ...changes });
  }
};
var ActionInbox = class extends Emitter {
  constructor(client) {
    super();
    this.client = client;
  }
  client;
  actions = /* @__PURE__ */ new Map();
  versions = /* @__PURE__ */ new Map();
  during = null;
  view = null;
  loading = true;
  error = null;
  refs = 0;
  getView = () => {
    this.view ??= { actions: [...this.actions.values()], loading: this.loading, error: this.error };
    return this.view;
  };
  changed() {
    this.view = null;
    this.emit();
  }
  async refetch() {
    if (this.during) return;
    this.during = [];
    const fresh = /* @__PURE__ */ new Map();
    const versions = /* @__PURE__ */ new Map();
    try {
      let cursor;
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
  onFrame(frame) {
    if (frame.type === "actions.subscribed" || frame.type === "actions.resync") {
      void this.refetch();
      return;
    }
    if (frame.type !== "action.pending" && frame.type !== "action.resolved") return;
    if (this.during) this.during.push(frame);
    this.apply(frame);
    this.changed();
  }
  apply(frame) {
    const threadId = String(frame.thread_id);
    const version = Number(frame.version);
    if (version < (this.versions.get(threadId) ?? -1)) return;
    this.versions.set(threadId, version);
    if (frame.type === "action.pending") {
      const action = frame.action;
      this.actions.set(action.id, action);
    } else {
      this.actions.delete(String(frame.action_id));
    }
  }
};
var ThreadlineClient = class {
  http;
  socket;
  watches = /* @__PURE__ */ new Map();
  inbox = null;
  mePromise = null;
  connection = new Emitter();
  constructor(options) {
    this.http = new HttpClient(options);
    const base = options.baseUrl ? new URL(options.baseUrl) : globalThis.location;
    this.socket = new ThreadSocket({
      url: options.wsUrl ?? socketUrl(base),
      protocols: () => socketProtocols(typeof options.token === "function" ? options.token() : options.token),
      WebSocketImpl: options.WebSocket,
      ...options.clock ? { clock: options.clock } : {},
      onFrame: (frame) => this.onFrame(frame),
      onStateChange: (state) => this.onSocketState(state),
      deltas: options.deltas ?? true
    });
  }
  me() {
    this.mePromise ??= this.http.me();
    return this.mePromise;
  }
  connect() {
    if (this.socket.state === "idle") this.socket.connect();
  }
  close() {
    this.socket.close();
    for (const watch of this.watches.values()) watch.sync.dispose();
    this.watches.clear();
  }
  /** Watch a thread (reference-counted); `release` when done. */
  watch(threadId) {
    let watch = this.watches.get(threadId);
    if (!watch) {
      watch = new ThreadWatch(this, threadId);
      this.watches.set(threadId, watch);
      this.socket.subscribe(threadId);
      watch.sync.requestRefetch({ force: true });
      this.connect();
    }
    watch.refs += 1;
    return watch;
  }
  release(watch) {
    watch.refs -= 1;
    if (watch.refs > 0 || this.watches.get(watch.threadId) !== watch) return;
    this.watches.delete(watch.threadId);
    watch.sync.dispose();
    this.socket.unsubscribe(watch.threadId);
  }
  actionInbox() {
    if (!this.inbox) {
      this.inbox = new ActionInbox(this);
      this.socket.keep("actions", { type: "actions.subscribe", id: "inbox" });
      void this.inbox.refetch();
      this.connect();
    }
    this.inbox.refs += 1;
    return this.inbox;
  }
  releaseInbox(inbox) {
    inbox.refs -= 1;
    if (inbox.refs > 0 || this.inbox !== inbox) return;
    this.inbox = null;
    this.socket.forget("actions");
    this.socket.send({ type: "actions.unsubscribe" });
  }
  onFrame(frame) {
    const threadId = typeof frame.thread_id === "string" ? frame.thread_id : null;
    if (frame.type === "resync" && !threadId) {
      for (const watch of this.watches.values()) watch.sync.resync();
    } else if (threadId && this.watches.has(threadId)) {
      this.watches.get(threadId)?.onFrame(frame);
    }
    this.inbox?.onFrame(frame);
  }
  onSocketState(state) {
    for (const watch of this.watches.values()) {
      if (state !== "open") watch.presence = {};
      watch.changed();
    }
    this.connection.emit();
  }
};

// src/vectors.ts
function observe(sync, outstanding) {
  const snap = sync.snapshot;
  return {
    version: sync.version,
    live_run: sync.run ? sync.run.id : null,
    live_text: sync.liveChunks().filter((c) => c.type === "text-delta").map((c) => typeof c.delta === "string" ? c.delta : "").join(""),
    run_status: snap && snap.run ? snap.run.status : null,
    pending_actions: (snap?.pending_actions ?? []).map((a) => a.id),
    fetches: sync.stats.fetches,
    inflight: outstanding > 0,
    discarded: sync.stats.discarded
  };
}
var settle = () => new Promise((resolve) => setTimeout(resolve, 0));
function mismatches(where, want, got) {
  const out = [];
  for (const [key, value] of Object.entries(want)) {
    const actual = got[key];
    if (JSON.stringify(actual) !== JSON.stringify(value)) {
      out.push(`${where}: ${key} is ${JSON.stringify(actual)}, expected ${JSON.stringify(value)}`);
    }
  }
  return out;
}
async function replayVector(vector) {
  const pending = [];
  const sync = new ThreadSync({
    threadId: vector.thread_id,
    fetchSnapshot: () => new Promise((resolve) => pending.push(resolve)),
    schedule: () => null
    // no retries: a vector's fetches never fail
  });
  const failures = [];
  for (const [index, step] of vector.steps.entries()) {
    const where = `${vector.name} step ${index}`;
    if (step.frame) {
      const frame = step.frame;
      if (frame.type === "subscribed") sync.subscribed(frame.version);
      else if (frame.type === "invalidate") sync.invalidate(frame.version);
      else if (frame.type === "resync") sync.resync();
      else if (frame.type === "chunk") sync.chunk(frame);
      else failures.push(`${where}: unknown frame type ${frame.type}`);
    } else if (step.answer) {
      const resolve = pending.shift();
      if (!resolve) {
        failures.push(`${where}: a snapshot answers, but no fetch is outstanding`);
        continue;
      }
      resolve(step.answer);
    }
    await settle();
    if (step.expect) failures.push(...mismatches(where, step.expect, observe(sync, pending.length)));
  }
  failures.push(...mismatches(`${vector.name} final`, vector.final, observe(sync, pending.length)));
  return failures;
}
export {
  ACTIVE_RUN_STATUSES,
  ActionInbox,
  ApiError,
  CLOSE_FORBIDDEN,
  CLOSE_UNAUTHORIZED,
  COMMANDS,
  DeltaMismatch,
  HttpClient,
  TERMINAL_RUN_STATUSES,
  ThreadSocket,
  ThreadSync,
  ThreadWatch,
  ThreadlineClient,
  activeRun,
  applyDelta,
  applyPresence,
  backoffDelay,
  foldChunks,
  presenceView,
  replayVector,
  route,
  socketProtocols,
  socketUrl
};
