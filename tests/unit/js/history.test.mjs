// Older pages of a bounded snapshot, merged in front of each refetched window.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { OlderMessages } from '../../../static/js/history.js';

const msgs = (...ids) => ids.map((id) => ({ id }));
const ids = (list) => list.map((m) => m.id);

test('an unbounded snapshot has nothing older', () => {
  const history = new OlderMessages();
  assert.deepEqual(ids(history.absorb({ messages: msgs('a', 'b') })), ['a', 'b']);
  assert.equal(history.hasMore, false);
});

test('older pages go in front and stay when the window slides on', () => {
  const history = new OlderMessages();
  history.absorb({ messages: msgs('c', 'd'), page: { limit: 2, before: 2 } });
  assert.equal(history.hasMore, true);
  history.prepend({ messages: msgs('a', 'b'), page: { limit: 2, before: null } });
  assert.equal(history.hasMore, false);
  assert.deepEqual(ids(history.messages()), ['a', 'b', 'c', 'd']);
  // A new message: the window is now d, e; c slid out of it and is kept.
  assert.deepEqual(ids(history.absorb({ messages: msgs('d', 'e'), page: { before: 3 } })), ['a', 'b', 'c', 'd', 'e']);
});

test('a window that no longer joins the loaded pages starts over', () => {
  const history = new OlderMessages();
  history.absorb({ messages: msgs('c', 'd'), page: { before: 2 } });
  history.prepend({ messages: msgs('a', 'b'), page: { before: null } });
  assert.deepEqual(ids(history.absorb({ messages: msgs('x', 'y'), page: { before: 7 } })), ['x', 'y']);
  assert.equal(history.cursor, 7);
});
