// The session: no token in the URL, resubscribe and resync after a reconnect, backoff, final
// refusals, the inbox.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { FakeClock, fakeFetch, fakeSockets, flush, snapshot } from './fakes.mjs';
import { loadCore } from './load-core.mjs';

const core = await loadCore();

function setup(snapshots) {
  const clock = new FakeClock();
  const { FakeWebSocket, made } = fakeSockets();
  let version = 0;
  const { fetch, requests } = fakeFetch(async (method, url) => {
    if (url.includes('/v1/actions')) return [200, snapshots.actions ? snapshots.actions() : { actions: [], next_cursor: null }];
    version += 1;
    return [200, snapshots.thread(version)];
  });
  const client = new core.ThreadlineClient({
    baseUrl: 'http://127.0.0.1:8123',
    token: 'tl_secret',
    fetch,
    WebSocket: FakeWebSocket,
    clock,
  });
  return { client, clock, made, requests };
}

test('the websocket URL carries no token; the token is a subprotocol', async () => {
  const { client, made } = setup({ thread: (v) => snapshot(v) });
  client.watch('t1');
  assert.equal(made.length, 1);
  assert.equal(made[0].url, 'ws://127.0.0.1:8123/v1/ws');
  assert.ok(!made[0].url.includes('tl_secret'));
  assert.deepEqual(made[0].protocols, ['threadline.v1', 'bearer.tl_secret']);
  client.close();
});

test('a dropped connection reconnects with backoff, resubscribes and refetches the snapshot', async () => {
  const { client, clock, made, requests } = setup({ thread: (v) => snapshot(v, { id: 'r1', status: 'running', next_seq: 0 }) });
  const watch = client.watch('t1');
  await flush();
  assert.equal(watch.getView().snapshot.thread.version, 1); // fetched without waiting for the socket
  made[0].open();
  assert.deepEqual(made[0].sent.map((f) => f.type), ['subscribe']);
  made[0].receive({ type: 'subscribed', thread_id: 't1', version: 1 });
  await flush();
  made[0].receive({ type: 'chunk', thread_id: 't1', run_id: 'r1', seq: 0, chunk: { type: 'text-delta', delta: 'hi' } });
  assert.equal(watch.getView().liveText, 'hi');
  made[0].drop(1006);
  assert.equal(client.socket.state, 'reconnecting');
  assert.equal(made.length, 1);
  clock.advance(20000);
  assert.equal(made.length, 2, 'one new connection after the backoff');
  const fetchesBefore = requests.length;
  made[1].open();
  assert.equal(made[1].sent[0].type, 'subscribe');
  assert.equal(made[1].sent[0].thread_id, 't1');
  made[1].receive({ type: 'subscribed', thread_id: 't1', version: 1 });
  await flush();
  assert.equal(requests.length, fetchesBefore + 1, 'a (re)subscription refetches, even at the same version');
  assert.equal(watch.getView().snapshot.thread.version, requests.length);
  client.close();
});

test('4401 and 4403 are final: no reconnection', () => {
  for (const code of [4401, 4403]) {
    const { client, clock, made } = setup({ thread: (v) => snapshot(v) });
    client.watch('t1');
    made[0].open();
    made[0].drop(code);
    assert.equal(client.socket.state, 'unauthorized');
    clock.advance(60000);
    assert.equal(made.length, 1);
  }
});

test('an invalidation newer than the snapshot refetches; commands settle on their version', async () => {
  const { client, made, requests } = setup({ thread: (v) => snapshot(v) });
  const watch = client.watch('t1');
  await flush();
  made[0].open();
  made[0].receive({ type: 'invalidate', thread_id: 't1', version: 1 });
  await flush();
  const reads = requests.filter((r) => r.method === 'GET').length;
  assert.equal(reads, 1, 'not newer: nothing fetched');
  made[0].receive({ type: 'invalidate', thread_id: 't1', version: 2 });
  await flush();
  assert.equal(watch.getView().snapshot.thread.version, 2);
  client.close();
});

test('presence frames build the member map; a new connection starts afresh', async () => {
  const { client, made } = setup({ thread: (v) => snapshot(v) });
  const watch = client.watch('t1');
  made[0].open();
  made[0].receive({ type: 'presence', thread_id: 't1', members: [{ subject: 'alice', name: 'alice' }] });
  made[0].receive({ type: 'presence.join', thread_id: 't1', member: { subject: 'bob', name: 'bob' } });
  assert.deepEqual(Object.keys(watch.getView().presence).sort(), ['alice', 'bob']);
  made[0].receive({ type: 'presence.leave', thread_id: 't1', subject: 'alice' });
  assert.deepEqual(Object.keys(watch.getView().presence), ['bob']);
  made[0].drop(1006);
  assert.deepEqual(watch.getView().presence, {});
  client.close();
});

test('the inbox fetches after actions.subscribed, applies newer frames, ignores older ones', async () => {
  const listed = { id: 'a1', kind: 'approval', thread_id: 't1', thread_version: 3, tool_call_id: 'c', tool_name: 'x' };
  const { client, made } = setup({ thread: (v) => snapshot(v), actions: () => ({ actions: [listed], next_cursor: null }) });
  const inbox = client.actionInbox();
  made[0].open();
  assert.deepEqual(made[0].sent.map((f) => f.type), ['actions.subscribe']);
  made[0].receive({ type: 'actions.subscribed', scopes: ['demo'] });
  await flush();
  assert.deepEqual(inbox.getView().actions.map((a) => a.id), ['a1']);
  made[0].receive({ type: 'action.resolved', thread_id: 't1', version: 2, action_id: 'a1' });
  assert.deepEqual(inbox.getView().actions.map((a) => a.id), ['a1'], 'older than the list: ignored');
  made[0].receive({ type: 'action.pending', thread_id: 't2', version: 1, action: { ...listed, id: 'a2', thread_id: 't2' } });
  // One commit may suspend two tools: two announcements at one version.
  made[0].receive({ type: 'action.pending', thread_id: 't2', version: 1, action: { ...listed, id: 'a3', thread_id: 't2' } });
  made[0].receive({ type: 'action.resolved', thread_id: 't1', version: 4, action_id: 'a1' });
  assert.deepEqual(inbox.getView().actions.map((a) => a.id), ['a2', 'a3']);
  made[0].drop(1006);
  client.close();
});
