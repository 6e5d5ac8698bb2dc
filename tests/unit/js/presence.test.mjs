// Presence view logic of static/js/presence.js, run with `node --test tests/unit/js/`.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { TypingSignal, applyPresence, presenceView, reviewingText, typingText } from '../../../static/js/presence.js';

const member = (subject, extra = {}) => ({ subject, name: subject, role: 'user', connections: 1, typing: false, reviewing: null, ...extra });

test('frames build the member set: whole set, join, update, leave', () => {
  let m = applyPresence({}, { type: 'presence', members: [member('alice'), member('bob')] });
  assert.deepEqual(Object.keys(m).sort(), ['alice', 'bob']);
  m = applyPresence(m, { type: 'presence.join', member: member('carol') });
  m = applyPresence(m, { type: 'presence.update', member: member('bob', { typing: true }) });
  m = applyPresence(m, { type: 'presence.leave', subject: 'alice' });
  assert.deepEqual(Object.keys(m).sort(), ['bob', 'carol']);
  assert.equal(m.bob.typing, true);
  assert.equal(applyPresence(m, { type: 'chunk' }), m);
});

test('the view puts me first and leaves me out of typing and reviewing', () => {
  const members = {
    alice: member('alice', { typing: true, reviewing: 'act_1', connections: 2 }),
    bob: member('bob', { typing: true, reviewing: 'act_1' }),
    carol: member('carol', { reviewing: 'act_2' }),
  };
  const view = presenceView(members, 'alice');
  assert.deepEqual(view.here.map((p) => p.name), ['alice', 'bob', 'carol']);
  assert.equal(view.here[0].connections, 2);
  assert.deepEqual(view.typing, ['bob']);
  assert.deepEqual(view.reviewing, { act_1: ['bob'], act_2: ['carol'] });
  assert.equal(typingText(['bob']), 'bob is typing…');
  assert.equal(typingText(['a', 'b', 'c', 'd']), 'a, b and 2 others are typing…');
  assert.equal(reviewingText(['carol']), 'carol is reviewing');
});

test('typing is sent once per burst and cleared after the idle time or on stop', () => {
  const sent = [];
  const timers = [];
  const signal = new TypingSignal({
    send: (v) => sent.push(v),
    idleMs: 1000,
    schedule: (fn) => timers.push(fn) - 1,
    cancel: (i) => { timers[i] = null; },
  });
  signal.input();
  signal.input();
  signal.input();
  assert.deepEqual(sent, [true]);
  timers.filter(Boolean).at(-1)();
  assert.deepEqual(sent, [true, false]);
  signal.input();
  signal.stop();
  signal.stop();
  assert.deepEqual(sent, [true, false, true, false]);
});
