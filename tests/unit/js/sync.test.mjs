// Convergence rules of static/js/sync.js, run with `node --test tests/unit/js/`.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { ThreadSync, activeRun, foldChunks } from '../../../static/js/sync.js';

const flush = () => new Promise((resolve) => setImmediate(resolve));

function harness({ retryable = true } = {}) {
  const calls = [];
  const timers = [];
  const errors = [];
  let changes = 0;
  const sync = new ThreadSync({
    threadId: 't1',
    fetchSnapshot: () => new Promise((resolve, reject) => calls.push({ resolve, reject })),
    onChange: () => {
      changes += 1;
    },
    onError: (err) => errors.push(err),
    schedule: (fn, ms) => timers.push({ fn, ms }),
    isRetryable: () => retryable,
  });
  return {
    sync,
    calls,
    timers,
    errors,
    get changes() {
      return changes;
    },
    /** Answer the oldest unanswered fetch and let the promise chain settle. */
    async answer(snapshot) {
      const call = calls.find((c) => !c.done);
      assert.ok(call, 'no fetch in flight');
      call.done = true;
      call.resolve(snapshot);
      await flush();
    },
    async fail(err) {
      const call = calls.find((c) => !c.done);
      call.done = true;
      call.reject(err);
      await flush();
    },
  };
}

function snap(version, run = null, extra = {}) {
  return {
    thread: { id: 't1', scope: 'demo', title: 'T', version, metadata: {} },
    messages: [],
    pending_actions: [],
    run,
    queue: [],
    ...extra,
  };
}

const chunk = (runId, seq, c, threadId = 't1') => ({ type: 'chunk', thread_id: threadId, run_id: runId, seq, chunk: c });
const delta = (text) => ({ type: 'text-delta', delta: text });
const liveSeqs = (sync) => {
  const run = sync.run;
  return run ? Array.from({ length: run.next - run.from }, (_, i) => run.from + i) : [];
};

async function loaded(version = 1, run = null) {
  const hh = harness();
  hh.sync.subscribed(version);
  await hh.answer(snap(version, run));
  assert.equal(hh.calls.length, 1);
  return hh;
}

describe('refetch triggers', () => {
  test('an invalidation newer than the held snapshot refetches; older or equal does not', async () => {
    const hh = await loaded(3);
    hh.sync.invalidate(2);
    hh.sync.invalidate(3);
    assert.equal(hh.calls.length, 1);
    hh.sync.invalidate(4);
    assert.equal(hh.calls.length, 2);
    await hh.answer(snap(4));
    assert.equal(hh.sync.version, 4);
  });

  test('(re)subscribe refetches even when the version is not newer', async () => {
    const hh = await loaded(5);
    hh.sync.subscribed(5);
    assert.equal(hh.calls.length, 2);
    assert.equal(hh.sync.resyncing, true);
    await hh.answer(snap(5));
    assert.equal(hh.sync.resyncing, false);
  });

  test('a resync frame refetches', async () => {
    const hh = await loaded(5);
    hh.sync.resync();
    assert.equal(hh.calls.length, 2);
  });

  test('a command answer without a version still refetches', async () => {
    const hh = await loaded(5);
    hh.sync.invalidate(undefined);
    assert.equal(hh.calls.length, 2);
  });
});

describe('coalescing', () => {
  test('at most one fetch in flight and one queued behind it', async () => {
    const hh = await loaded(1);
    hh.sync.invalidate(2);
    hh.sync.invalidate(3);
    hh.sync.invalidate(4);
    hh.sync.resync();
    assert.equal(hh.calls.length, 2, 'one in flight');
    await hh.answer(snap(2));
    assert.equal(hh.calls.length, 3, 'the queued one starts');
    await hh.answer(snap(4));
    assert.equal(hh.calls.length, 3, 'nothing more is owed');
    assert.equal(hh.sync.version, 4);
  });

  test('a queued refetch is skipped when the answer already covers the newest invalidation', async () => {
    const hh = await loaded(1);
    hh.sync.invalidate(2);
    hh.sync.invalidate(3);
    await hh.answer(snap(3));
    assert.equal(hh.calls.length, 2);
  });

  test('a forced refetch requested during a fetch runs after it, even at the same version', async () => {
    const hh = await loaded(1);
    hh.sync.invalidate(2);
    hh.sync.subscribed(2);
    await hh.answer(snap(2));
    assert.equal(hh.calls.length, 3);
  });
});

describe('snapshot ordering', () => {
  test('an older snapshot never replaces a newer one', async () => {
    const hh = await loaded(5);
    assert.equal(hh.sync.applySnapshot(snap(3)), false);
    assert.equal(hh.sync.version, 5);
    hh.sync.resync();
    await hh.answer(snap(4));
    assert.equal(hh.sync.version, 5);
    assert.equal(hh.sync.stats.discarded, 1 + 1);
    assert.equal(hh.sync.applySnapshot(snap(6)), true);
    assert.equal(hh.sync.version, 6);
  });

  test('a disposed sync ignores late answers', async () => {
    const hh = harness();
    hh.sync.resync();
    hh.sync.dispose();
    await hh.answer(snap(9));
    assert.equal(hh.sync.snapshot, null);
    hh.sync.invalidate(10);
    assert.equal(hh.calls.length, 1);
  });
});

describe('live chunks', () => {
  test('text deltas are shown in seq order; duplicates are ignored', async () => {
    const hh = await loaded(1);
    hh.sync.chunk(chunk('r1', 0, delta('Hel')));
    hh.sync.chunk(chunk('r1', 1, delta('lo')));
    hh.sync.chunk(chunk('r1', 1, delta('lo')));
    assert.equal(hh.sync.liveView().text, 'Hello');
    assert.equal(hh.sync.liveView().runId, 'r1');
    assert.equal(hh.calls.length, 1, 'contiguous chunks need no refetch');
  });

  test('chunks of another thread are ignored', async () => {
    const hh = await loaded(1);
    hh.sync.chunk(chunk('r1', 0, delta('x'), 'other'));
    assert.equal(hh.sync.liveView().text, '');
  });

  test('a gap in seq refetches once per hole and shows only the contiguous prefix', async () => {
    const hh = await loaded(1, { id: 'r1', status: 'running', next_seq: 0 });
    hh.sync.chunk(chunk('r1', 0, delta('a')));
    hh.sync.chunk(chunk('r1', 2, delta('c')));
    assert.equal(hh.calls.length, 2, 'the gap triggers a refetch');
    hh.sync.chunk(chunk('r1', 3, delta('d')));
    hh.sync.chunk(chunk('r1', 4, delta('e')));
    assert.equal(hh.calls.length, 2, 'the same hole does not refetch again');
    assert.equal(hh.sync.liveView().text, 'a');
    hh.sync.chunk(chunk('r1', 1, delta('b')));
    assert.equal(hh.sync.liveView().text, 'abcde');
  });

  test('after a refetch only chunks with seq >= run.next_seq stay', async () => {
    const hh = await loaded(1, { id: 'r1', status: 'running', next_seq: 0 });
    for (let i = 0; i < 5; i += 1) hh.sync.chunk(chunk('r1', i, delta(String(i))));
    hh.sync.invalidate(2);
    await hh.answer(snap(2, { id: 'r1', status: 'running', next_seq: 3 }));
    assert.deepEqual(liveSeqs(hh.sync), [3, 4]);
    assert.equal(hh.sync.liveView().text, '34');
    hh.sync.chunk(chunk('r1', 2, delta('2')));
    assert.equal(hh.sync.liveView().text, '34', 'a committed chunk replayed late is ignored');
    hh.sync.chunk(chunk('r1', 5, delta('5')));
    assert.equal(hh.sync.liveView().text, '345');
  });

  test('a snapshot whose run is the live run and finished drops the buffer; late chunks stay out', async () => {
    const hh = await loaded(1);
    hh.sync.chunk(chunk('r1', 0, delta('hi')));
    hh.sync.invalidate(2);
    await hh.answer(snap(2, { id: 'r1', status: 'completed', next_seq: 1 }));
    assert.equal(hh.sync.liveView().text, '');
    hh.sync.chunk(chunk('r1', 1, { type: 'step-finish', step: 0 }));
    assert.equal(hh.sync.run, null);
  });

  test('joining mid-run starts the display at the snapshot boundary', async () => {
    const hh = await loaded(1);
    hh.sync.chunk(chunk('r1', 5, delta('five')));
    assert.equal(hh.calls.length, 2, 'an unknown run starting at seq 5 is a gap');
    assert.equal(hh.sync.liveView().text, '');
    await hh.answer(snap(1, { id: 'r1', status: 'running', next_seq: 5 }));
    assert.equal(hh.sync.liveView().text, 'five');
  });

  test('a run known from the snapshot continues from next_seq without a refetch', async () => {
    const hh = await loaded(4, { id: 'r1', status: 'running', next_seq: 3 });
    hh.sync.chunk(chunk('r1', 2, delta('old')));
    hh.sync.chunk(chunk('r1', 3, delta('new')));
    assert.equal(hh.sync.liveView().text, 'new');
    assert.equal(hh.calls.length, 1);
  });

  test('a new run replaces the old one; late chunks of the old run are ignored', async () => {
    const hh = await loaded(1);
    hh.sync.chunk(chunk('r1', 0, delta('one')));
    hh.sync.chunk(chunk('r2', 0, delta('two')));
    hh.sync.chunk(chunk('r1', 1, delta('late')));
    assert.equal(hh.sync.liveView().runId, 'r2');
    assert.equal(hh.sync.liveView().text, 'two');
  });

  test('a run first seen while a fetch is in flight survives a snapshot that predates it', async () => {
    const hh = await loaded(1);
    hh.sync.invalidate(2); // fetch in flight
    hh.sync.chunk(chunk('r2', 0, delta('fresh')));
    await hh.answer(snap(2, null));
    assert.equal(hh.sync.liveView().text, 'fresh');
  });

  test('a run seen before the fetch started is dropped when the snapshot names another run', async () => {
    const hh = await loaded(1);
    hh.sync.chunk(chunk('r1', 0, delta('old run')));
    hh.sync.invalidate(3);
    await hh.answer(snap(3, { id: 'r2', status: 'running', next_seq: 0 }));
    assert.equal(hh.sync.liveView().text, '');
    hh.sync.chunk(chunk('r1', 1, delta('late')));
    assert.equal(hh.sync.liveView().text, '');
  });

  test('a takeover voids the uncommitted step and refetches', async () => {
    const hh = await loaded(1, { id: 'r1', status: 'running', next_seq: 0 });
    hh.sync.chunk(chunk('r1', 0, delta('a')));
    hh.sync.chunk(chunk('r1', 1, delta('b')));
    hh.sync.chunk(chunk('r1', 2, delta('c')));
    hh.sync.chunk(chunk('r1', 1, { type: 'run-takeover', episode: 2 }));
    assert.equal(hh.calls.length, 2);
    assert.equal(hh.sync.liveView().takeover, 2);
    assert.equal(hh.sync.liveView().text, '');
    hh.sync.chunk(chunk('r1', 2, delta('B')));
    assert.equal(hh.sync.liveView().text, 'B');
    hh.sync.chunk(chunk('r1', 1, { type: 'run-takeover', episode: 2 }));
    assert.equal(hh.sync.liveView().text, 'B', 'a replayed takeover changes nothing');
    await hh.answer(snap(2, { id: 'r1', status: 'running', next_seq: 1 }));
    assert.equal(hh.sync.liveView().text, 'B');
  });

  test('a takeover older than the committed boundary is ignored', async () => {
    const hh = await loaded(1, { id: 'r1', status: 'running', next_seq: 4 });
    hh.sync.chunk(chunk('r1', 4, delta('x')));
    hh.sync.chunk(chunk('r1', 2, { type: 'run-takeover', episode: 2 }));
    assert.equal(hh.sync.liveView().text, 'x');
    assert.equal(hh.calls.length, 1);
  });
});

describe('failures', () => {
  test('a failed refetch is reported and retried with a delay; resyncing stays on meanwhile', async () => {
    const hh = harness();
    hh.sync.subscribed(1);
    await hh.fail(new Error('boom'));
    assert.equal(hh.errors.length, 1);
    assert.equal(hh.sync.resyncing, true);
    assert.equal(hh.timers.length, 1);
    hh.timers[0].fn();
    assert.equal(hh.calls.length, 2);
    await hh.answer(snap(1));
    assert.equal(hh.sync.resyncing, false);
  });

  test('a non-retryable failure is reported once and not retried', async () => {
    const hh = harness({ retryable: false });
    hh.sync.resync();
    await hh.fail(Object.assign(new Error('gone'), { status: 404 }));
    assert.equal(hh.errors.length, 1);
    assert.equal(hh.timers.length, 0);
  });
});

describe('views', () => {
  test('foldChunks builds text and tool parts; states of committed tools go to toolStates', () => {
    const view = foldChunks([
      { type: 'step-start', step: 0 },
      delta('Looking '),
      delta('it up'),
      { type: 'tool-call', tool_call_id: 'c1', name: 'get_weather', input: { city: 'Oslo' } },
      { type: 'tool-state', tool_call_id: 'c1', state: 'running' },
      { type: 'tool-state', tool_call_id: 'c1', state: 'output-available', output: { t: 3 } },
      { type: 'tool-state', tool_call_id: 'old', state: 'running' },
      { type: 'step-finish', step: 0 },
      { type: 'step-start', step: 1 },
      delta('Done'),
    ]);
    assert.equal(view.text, 'Looking it up\n\nDone');
    const tool = view.parts.find((p) => p.type === 'tool-call');
    assert.equal(tool.state, 'output-available');
    assert.deepEqual(tool.output, { t: 3 });
    assert.deepEqual(view.toolStates, { old: { state: 'running' } });
    assert.equal(view.takeover, null);
  });

  test('activeRun prefers an active snapshot run, else a live run the snapshot does not know', () => {
    assert.equal(activeRun(snap(1, { id: 'r1', status: 'waiting' }), { runId: null }).id, 'r1');
    assert.equal(activeRun(snap(1, { id: 'r1', status: 'completed' }), { runId: null }), null);
    assert.equal(activeRun(snap(1, { id: 'r1', status: 'completed' }), { runId: 'r2' }).id, 'r2');
    assert.equal(activeRun(snap(1, { id: 'r1', status: 'completed' }), { runId: 'r1' }), null);
    assert.equal(activeRun(null, { runId: null }), null);
  });
});
