// The browser offers only the actions the snapshot's `permissions` allow.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { permissionsOf } from '../../../static/js/render.js';

test('without permissions in the snapshot everything stays offered', () => {
  const allowed = permissionsOf({ messages: [] });
  assert.equal(allowed.regenerate, true);
  assert.equal(allowed.stop, true);
  assert.equal(allowed.visibility('m1'), true);
  assert.equal(allowed.cancelQueued('q1'), true);
});

test('permissions name exactly what may be done', () => {
  const allowed = permissionsOf({
    permissions: { regenerate: false, stop: true, visibility: ['m1'], cancel_queued: ['q2'] },
  });
  assert.equal(allowed.regenerate, false);
  assert.equal(allowed.stop, true);
  assert.equal(allowed.visibility('m1'), true);
  assert.equal(allowed.visibility('m2'), false);
  assert.equal(allowed.cancelQueued('q1'), false);
  assert.equal(allowed.cancelQueued('q2'), true);
});

test('retry is offered only when the snapshot allows it (and by servers that do not say)', () => {
  assert.equal(permissionsOf({ permissions: { retry: false } }).retry, false);
  assert.equal(permissionsOf({ permissions: { retry: true } }).retry, true);
  assert.equal(permissionsOf({ permissions: { regenerate: true } }).retry, true);
  assert.equal(permissionsOf({ messages: [] }).retry, true);
});
