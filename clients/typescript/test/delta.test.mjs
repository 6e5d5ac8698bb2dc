// Snapshot deltas: the shared vectors (tests/vectors/deltas/, made by the server's
// threadline_wire/snapshot_delta.py) apply to the same snapshots here; a watch applies a delta
// from its held version instead of refetching, and refetches for any other.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { FakeClock, fakeFetch, fakeSockets, flush, snapshot } from './fakes.mjs';
import { loadCore } from './load-core.mjs';

const core = await loadCore();
const here = dirname(fileURLToPath(import.meta.url));
const VECTORS = JSON.parse(readFileSync(join(here, '..', '..', '..', 'tests', 'vectors', 'deltas', 'deltas.json'), 'utf8'));

test('the shared delta vectors apply to their snapshots', () => {
  assert.ok(VECTORS.cases.length >= 7);
  for (const { name, base, delta, new: expected } of VECTORS.cases) {
    const frozen = structuredClone(base);
    assert.deepEqual(core.applyDelta(base, delta), expected, name);
    assert.deepEqual(base, frozen, `${name}: the base is not changed`);
  }
});

test('a delta that does not fit is refused', () => {
  const { base, delta } = VECTORS.cases.find((c) => c.name === 'send');
  assert.throws(() => core.applyDelta({ ...base, messages: base.messages.slice(0, 2) }, delta), core.DeltaMismatch);
  assert.throws(() => core.applyDelta(base, { ...delta, newer: 1 }), core.DeltaMismatch);
});

function setup() {
  const clock = new FakeClock();
  const { FakeWebSocket, made } = fakeSockets();
  let version = 0;
  const { fetch, requests } = fakeFetch(async () => {
    version += 1;
    return [200, snapshot(version)];
  });
  const client = new core.ThreadlineClient({ baseUrl: 'http://127.0.0.1:8123', token: 't', fetch, WebSocket: FakeWebSocket, clock });
  return { client, made, requests };
}

test('a watch subscribes with deltas and applies one from its version without refetching', async () => {
  const { client, made, requests } = setup();
  const watch = client.watch('t1');
  await flush();
  made[0].open();
  assert.equal(made[0].sent[0].deltas, true);
  made[0].receive({ type: 'subscribed', thread_id: 't1', version: 1 });
  await flush();
  const fetched = requests.length;
  const held = watch.getView().snapshot.thread.version;
  made[0].receive({
    type: 'invalidate',
    thread_id: 't1',
    version: held + 1,
    delta: { from: held, thread: { title: 'renamed', version: held + 1 } },
  });
  await flush();
  assert.equal(requests.length, fetched, 'no refetch');
  assert.equal(watch.getView().snapshot.thread.title, 'renamed');
  assert.equal(watch.getView().snapshot.thread.version, held + 1);
  assert.equal(watch.sync.stats.deltas, 1);
  // From another version than the held one: refetched as a plain invalidation.
  made[0].receive({
    type: 'invalidate',
    thread_id: 't1',
    version: held + 3,
    delta: { from: held + 2, thread: { version: held + 3 } },
  });
  await flush();
  assert.equal(requests.length, fetched + 1);
  assert.equal(watch.sync.stats.deltas, 1);
  client.close();
});
