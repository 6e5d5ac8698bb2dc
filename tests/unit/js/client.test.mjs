// Session/URL handling, the HTTP client and the websocket wrapper, with fakes instead of I/O.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { ApiError, createApi, describeError, resolvedBy } from '../../../static/js/api.js';
import { readSession, threadUrl, TOKEN_KEY } from '../../../static/js/session.js';
import { ThreadSocket, backoffDelay, socketProtocols, socketUrl } from '../../../static/js/socket.js';

// A fake clock for ThreadSocket: timeouts run in due order when the test advances time
// (Node's own mock timers differ between Node 18, Debian bookworm's, and Node 20).
class FakeClock {
  constructor() {
    this.now = 0;
    this.nextId = 1;
    this.pending = new Map();
  }

  setTimeout(fn, ms) {
    const id = this.nextId++;
    this.pending.set(id, { at: this.now + ms, fn });
    return id;
  }

  clearTimeout(id) {
    this.pending.delete(id);
  }

  tick(ms) {
    const end = this.now + ms;
    for (;;) {
      let due = null;
      for (const [id, timer] of this.pending) {
        if (timer.at <= end && (due === null || timer.at < due[1].at)) due = [id, timer];
      }
      if (due === null) break;
      this.pending.delete(due[0]);
      this.now = due[1].at;
      due[1].fn();
    }
    this.now = end;
  }
}

function memoryStorage(initial = {}) {
  const data = new Map(Object.entries(initial));
  return { getItem: (k) => (data.has(k) ? data.get(k) : null), setItem: (k, v) => data.set(k, String(v)), data };
}

describe('session', () => {
  test('the printed URL: the token moves from the query to the fragment and storage', () => {
    const storage = memoryStorage();
    const s = readSession('http://127.0.0.1:8765/?token=abc.def', storage);
    assert.equal(s.token, 'abc.def');
    assert.equal(s.threadId, null);
    assert.equal(s.url, 'http://127.0.0.1:8765/#token=abc.def');
    assert.equal(storage.data.get(TOKEN_KEY), 'abc.def');
  });

  test('a copied thread URL opens the same thread in a tab without storage', () => {
    const s = readSession('http://h/?thread=th_1#token=tok', memoryStorage());
    assert.equal(s.token, 'tok');
    assert.equal(s.threadId, 'th_1');
    assert.equal(s.url, 'http://h/?thread=th_1#token=tok');
  });

  test('storage is the fallback; the query wins over the fragment', () => {
    assert.equal(readSession('http://h/?thread=x', memoryStorage({ [TOKEN_KEY]: 'stored' })).token, 'stored');
    assert.equal(readSession('http://h/?token=new#token=old', memoryStorage()).token, 'new');
    assert.equal(readSession('http://h/', memoryStorage()).token, '');
  });

  test('threadUrl keeps other parameters and sets or clears the thread', () => {
    assert.equal(threadUrl('http://h/?a=1&token=t', 'th 2', 't'), 'http://h/?a=1&thread=th+2#token=t');
    assert.equal(threadUrl('http://h/?thread=x#token=t', null, 't'), 'http://h/#token=t');
  });
});

describe('api', () => {
  function fakeFetch(status, body, record = []) {
    return async (url, init) => {
      record.push({ url, init });
      return {
        ok: status >= 200 && status < 300,
        status,
        statusText: 'X',
        text: async () => (typeof body === 'string' ? body : JSON.stringify(body)),
      };
    };
  }

  test('requests carry the bearer token and JSON; answers are parsed', async () => {
    const record = [];
    const api = createApi('tok', { fetchImpl: fakeFetch(202, { thread_id: 't', version: 3 }, record) });
    const res = await api.sendMessage('t/1', 'hi', 'req-1');
    assert.deepEqual(res, { thread_id: 't', version: 3 });
    assert.equal(record[0].url, '/v1/threads/t%2F1/messages');
    assert.equal(record[0].init.headers.Authorization, 'Bearer tok');
    assert.deepEqual(JSON.parse(record[0].init.body), { text: 'hi', client_request_id: 'req-1' });
  });

  test('error bodies become ApiError with code and details', async () => {
    const api = createApi('tok', {
      fetchImpl: fakeFetch(409, { error: { code: 'conflict', message: 'action a1 was resolved by alice', resolved_by: 'alice' } }),
    });
    const err = await api.resume('t', 'a1', { approved: true }).catch((e) => e);
    assert.ok(err instanceof ApiError);
    assert.equal(err.status, 409);
    assert.equal(err.code, 'conflict');
    assert.equal(resolvedBy(err), 'alice');
    assert.equal(describeError(err), 'Already resolved by alice');
  });

  test('network failures and non-JSON errors are still readable', async () => {
    const down = createApi('tok', { fetchImpl: async () => { throw new TypeError('Failed to fetch'); } });
    const err = await down.listThreads().catch((e) => e);
    assert.equal(err.status, 0);
    assert.match(describeError(err, 'Could not load'), /Could not load: Network error/);
    const html = createApi('tok', { fetchImpl: fakeFetch(502, '<html>bad gateway</html>') });
    const err2 = await html.me().catch((e) => e);
    assert.equal(err2.code, 'http_502');
    assert.match(describeError(err2), /502/);
  });

  test('resolvedBy reads an object or the message', () => {
    assert.equal(resolvedBy(new ApiError(409, 'conflict', 'x', { resolved_by: { subject: 'bob', role: 'user' } })), 'bob');
    assert.equal(resolvedBy(new ApiError(409, 'conflict', 'already resolved by svc-1', {})), 'svc-1');
    assert.match(describeError(new ApiError(401, 'unauthorized', 'bad token')), /Session expired or invalid token/);
  });
});

class FakeWebSocket {
  static instances = [];
  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.sent = [];
    this.closed = null;
    FakeWebSocket.instances.push(this);
  }
  send(data) {
    this.sent.push(JSON.parse(data));
  }
  close(code, reason) {
    this.closed = { code, reason };
  }
  serverOpen() {
    this.onopen();
  }
  serverFrame(frame) {
    this.onmessage({ data: JSON.stringify(frame) });
  }
  serverClose(code) {
    this.onclose({ code });
  }
}

describe('socket', () => {
  test('backoff grows, is jittered and capped', () => {
    assert.equal(backoffDelay(0, { random: () => 0 }), 250);
    assert.equal(backoffDelay(0, { random: () => 1 }), 500);
    assert.equal(backoffDelay(3, { random: () => 1 }), 4000);
    assert.equal(backoffDelay(20, { random: () => 1 }), 15000);
  });

  test('socketUrl matches the page scheme and carries no token', () => {
    assert.equal(socketUrl({ protocol: 'https:', host: 'x.io' }), 'wss://x.io/v1/ws');
    assert.equal(socketUrl({ protocol: 'http:', host: '127.0.0.1:8000' }), 'ws://127.0.0.1:8000/v1/ws');
  });

  test('the token travels as a subprotocol, next to the one the server answers', () => {
    assert.deepEqual(socketProtocols('tl_abc'), ['threadline.v1', 'bearer.tl_abc']);
    FakeWebSocket.instances = [];
    const sock = new ThreadSocket({ url: 'ws://x/v1/ws', protocols: socketProtocols('tl_abc'), WebSocketImpl: FakeWebSocket, clock: new FakeClock() });
    sock.connect();
    assert.equal(FakeWebSocket.instances[0].url, 'ws://x/v1/ws');
    assert.deepEqual(FakeWebSocket.instances[0].protocols, ['threadline.v1', 'bearer.tl_abc']);
  });

  test('subscriptions are re-sent after a reconnect; frames reach the handler', () => {
    const clock = new FakeClock();
    FakeWebSocket.instances = [];
    const frames = [];
    const states = [];
    const sock = new ThreadSocket({ url: 'ws://x/v1/ws', WebSocketImpl: FakeWebSocket, clock, onFrame: (f) => frames.push(f), onStateChange: (s) => states.push(s) });
    sock.subscribe('t1');
    sock.connect();
    const first = FakeWebSocket.instances[0];
    first.serverOpen();
    assert.deepEqual(first.sent.map((f) => [f.type, f.thread_id]), [['subscribe', 't1']]);
    first.serverFrame({ type: 'invalidate', thread_id: 't1', version: 2 });
    assert.deepEqual(frames, [{ type: 'invalidate', thread_id: 't1', version: 2 }]);
    first.serverClose(1006);
    assert.equal(sock.state, 'reconnecting');
    clock.tick(600);
    const second = FakeWebSocket.instances[1];
    assert.ok(second, 'reconnected after the backoff');
    second.serverOpen();
    assert.deepEqual(second.sent.map((f) => f.type), ['subscribe']);
    assert.deepEqual(states, ['connecting', 'open', 'reconnecting', 'connecting', 'open']);
    sock.close();
  });

  test('close code 4401 is final: no reconnect', () => {
    const clock = new FakeClock();
    FakeWebSocket.instances = [];
    const sock = new ThreadSocket({ url: 'ws://x', WebSocketImpl: FakeWebSocket, clock });
    sock.connect();
    FakeWebSocket.instances[0].serverClose(4401);
    assert.equal(sock.state, 'unauthorized');
    clock.tick(60000);
    assert.equal(FakeWebSocket.instances.length, 1);
    sock.connect();
    assert.equal(FakeWebSocket.instances.length, 1);
  });

  test('a missing pong drops the connection and reconnects', () => {
    const clock = new FakeClock();
    FakeWebSocket.instances = [];
    const sock = new ThreadSocket({ url: 'ws://x', WebSocketImpl: FakeWebSocket, clock, pingIntervalMs: 1000, pongTimeoutMs: 500 });
    sock.connect();
    const ws = FakeWebSocket.instances[0];
    ws.serverOpen();
    clock.tick(1000);
    assert.deepEqual(ws.sent.map((f) => f.type), ['ping']);
    ws.serverFrame({ type: 'pong' });
    clock.tick(1000);
    clock.tick(500);
    assert.equal(ws.closed.code, 4000);
    assert.equal(sock.state, 'reconnecting');
    clock.tick(600);
    assert.equal(FakeWebSocket.instances.length, 2);
    sock.close();
  });
});

test('a link with another token does not replace the held one unless the reader agrees', () => {
  const storage = memoryStorage({ [TOKEN_KEY]: 'mine' });
  let asked = 0;
  const keep = readSession('http://h/?token=theirs', storage, () => { asked += 1; return false; });
  assert.equal(keep.token, 'mine');
  assert.equal(storage.getItem(TOKEN_KEY), 'mine');
  assert.ok(keep.url.endsWith('#token=mine'));
  assert.equal(readSession('http://h/#token=theirs', storage).token, 'mine'); // default: keep
  const take = readSession('http://h/#token=theirs', storage, () => { asked += 1; return true; });
  assert.equal(take.token, 'theirs');
  assert.equal(storage.getItem(TOKEN_KEY), 'theirs');
  assert.equal(readSession('http://h/#token=theirs', storage, () => { asked += 1; return false; }).token, 'theirs');
  assert.equal(asked, 2); // the same token is never asked about
});
