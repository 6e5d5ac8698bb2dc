// The HTTP commands: routes from the generated command table, bodies, queries, errors.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { fakeFetch } from './fakes.mjs';
import { loadCore } from './load-core.mjs';

const core = await loadCore();

test('every command with a route has a method and a path from the table', () => {
  const routed = Object.entries(core.COMMANDS).filter(([, c]) => c.path);
  assert.ok(routed.length > 20);
  assert.deepEqual(core.COMMANDS['message.send'], {
    method: 'POST',
    path: '/v1/threads/{thread_id}/messages',
    status: 202,
    query: false,
    websocket: true,
  });
  assert.equal(core.COMMANDS.subscribe.path, null);
});

test('path fields are filled in and escaped; the rest is the body', () => {
  const r = core.route('action.resume', { thread_id: 't 1', action_id: 'a/2', payload: { approved: true } });
  assert.deepEqual(r, { method: 'POST', url: '/v1/threads/t%201/actions/a%2F2/resume', body: { payload: { approved: true } } });
  assert.throws(() => core.route('run.stop', { thread_id: 't1' }), /run_id is required/);
});

test('reads put their fields in the query, metadata filters as metadata.<key>', () => {
  const r = core.route('thread.list', { limit: 5, metadata: { color: 'blue' }, status: 'idle', cursor: undefined });
  assert.equal(r.method, 'GET');
  assert.equal(r.url, '/v1/threads?limit=5&metadata.color=blue&status=idle');
  assert.equal(r.body, undefined);
});

test('the client sends the bearer header, parses answers and raises ApiError with the code', async () => {
  const { fetch, requests } = fakeFetch(async (method, url) =>
    url.endsWith('/resume')
      ? [409, { error: { code: 'conflict', message: 'resolved by bob', resolved_by: 'bob' } }]
      : [202, { thread_id: 't1', version: 4, run_id: 'r1' }],
  );
  const http = new core.HttpClient({ baseUrl: 'http://127.0.0.1:9/', token: 'tl_abc', fetch });
  const answer = await http.send('t1', 'hello', { client_request_id: 'c-1' });
  assert.equal(answer.version, 4);
  assert.equal(requests[0].url, 'http://127.0.0.1:9/v1/threads/t1/messages');
  assert.equal(requests[0].headers.Authorization, 'Bearer tl_abc');
  assert.deepEqual(requests[0].body, { text: 'hello', client_request_id: 'c-1' });
  await assert.rejects(http.resume('t1', 'a1', { approved: true }), (err) => {
    assert.ok(err instanceof core.ApiError);
    assert.equal(err.status, 409);
    assert.equal(err.code, 'conflict');
    assert.equal(err.details.resolved_by, 'bob');
    return true;
  });
});

test('a network failure is an ApiError with status 0', async () => {
  const http = new core.HttpClient({ token: 't', fetch: async () => Promise.reject(new TypeError('refused')) });
  await assert.rejects(http.me(), (err) => err.status === 0 && err.code === 'network_error');
});
