// The browser's OIDC sign-in logic (static/js/oidc.js) with fake storage, fetch and location.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, test } from 'node:test';

import { createApi } from '../../../static/js/api.js';
import {
  OidcSession,
  TOKENS_KEY,
  codeChallenge,
  jwtExpiryMs,
  refreshDelayMs,
  signInConfig,
} from '../../../static/js/oidc.js';

class MemoryStorage {
  constructor() {
    this.items = new Map();
  }

  getItem(key) {
    return this.items.has(key) ? this.items.get(key) : null;
  }

  setItem(key, value) {
    this.items.set(key, String(value));
  }

  removeItem(key) {
    this.items.delete(key);
  }
}

const ISSUER = 'http://127.0.0.1:9/';
const METADATA = {
  issuer: ISSUER,
  authorization_endpoint: 'http://127.0.0.1:9/auth',
  token_endpoint: 'http://127.0.0.1:9/token',
};

function jwt(claims) {
  const part = (value) => Buffer.from(JSON.stringify(value)).toString('base64url');
  return `${part({ alg: 'RS256' })}.${part(claims)}.sig`;
}

// A fetch that answers discovery and records token requests, answering with `tokens()`.
function fakeFetch(tokens) {
  const requests = [];
  const fetchImpl = async (url, init = {}) => {
    requests.push({ url, init });
    const body = url.endsWith('/.well-known/openid-configuration') ? METADATA : tokens(init);
    return { ok: !body.error, status: body.error ? 400 : 200, json: async () => body };
  };
  return { fetchImpl, requests };
}

const noTimers = { setTimeout: () => 1, clearTimeout: () => {} };

describe('oidc', () => {
  test('the S256 challenge is base64url(sha256(verifier)), unpadded (RFC 7636)', async () => {
    for (const verifier of ['dBjftJeZ4CVP-mJ92IQ-tEpCgkNM2v5GcPoE9sqGTXk', 'x'.repeat(43), 'a-b_c~d.e']) {
      const expected = createHash('sha256').update(verifier).digest('base64url');
      assert.equal(await codeChallenge(verifier), expected);
    }
  });

  test('exp is read from a JWT, and nothing from a tl_ token', () => {
    assert.equal(jwtExpiryMs(jwt({ exp: 1700000000 })), 1700000000000);
    assert.equal(jwtExpiryMs('tl_abc'), null);
    assert.equal(jwtExpiryMs('a.!!!.c'), null);
  });

  test('renewal comes a quarter of a short life early, 30 s early for a long one', () => {
    assert.equal(refreshDelayMs(0, 8000, 0), 6000);
    assert.equal(refreshDelayMs(0, 600000, 0), 570000);
    assert.equal(refreshDelayMs(0, 8000, 9000), 0); // already due
  });

  test('the config comes from the page, and a page without it has none', () => {
    const config = { issuer: ISSUER, client_id: 'web' };
    const doc = (content) => ({
      querySelector: () => (content === null ? null : { getAttribute: () => content }),
    });
    assert.deepEqual(signInConfig(doc(JSON.stringify(config))), config);
    assert.equal(signInConfig(doc(null)), null);
    assert.equal(signInConfig(doc('{not json')), null);
  });

  test('sign-in: PKCE to the login page, the code exchanged with its verifier', async () => {
    const storage = new MemoryStorage();
    const access = jwt({ exp: Math.floor(Date.now() / 1000) + 600 });
    const { fetchImpl, requests } = fakeFetch(() => ({ access_token: access, refresh_token: 'r1' }));
    const renewed = [];
    const config = { issuer: ISSUER, client_id: 'web', scopes: 'openid', params: { resource: 'api' } };
    const session = new OidcSession(config, { storage, fetchImpl, clock: noTimers, onToken: (t) => renewed.push(t) });
    let target = '';
    const location = { origin: 'http://127.0.0.1:8000', pathname: '/', search: '?thread=th_1', assign: (u) => (target = u) };
    await session.begin(location);
    const asked = new URL(target);
    assert.equal(asked.origin + asked.pathname, METADATA.authorization_endpoint);
    const params = asked.searchParams;
    assert.equal(params.get('code_challenge_method'), 'S256');
    assert.equal(params.get('response_mode'), 'fragment');
    assert.equal(params.get('redirect_uri'), 'http://127.0.0.1:8000/');
    assert.equal(params.get('resource'), 'api');

    // A callback with another state is refused and exchanges nothing.
    const forged = `http://127.0.0.1:8000/#code=c&state=forged`;
    const stash = storage.getItem('threadline.oidc.pending');
    await assert.rejects(session.complete(forged), /does not match/);
    assert.equal(requests.filter((r) => r.url === METADATA.token_endpoint).length, 0);

    // An answer naming another issuer (RFC 9207 mix-up) is refused too.
    storage.setItem('threadline.oidc.pending', stash);
    const mixUp = `http://127.0.0.1:8000/#code=c&iss=http%3A%2F%2Fevil&state=${params.get('state')}`;
    await assert.rejects(session.complete(mixUp), /another issuer/);
    assert.equal(requests.filter((r) => r.url === METADATA.token_endpoint).length, 0);

    storage.setItem('threadline.oidc.pending', stash);
    const back = await session.complete(`http://127.0.0.1:8000/#code=c1&state=${params.get('state')}`);
    assert.equal(back, 'http://127.0.0.1:8000/?thread=th_1');
    const exchange = new URLSearchParams(requests.at(-1).init.body);
    assert.equal(exchange.get('grant_type'), 'authorization_code');
    assert.equal(await codeChallenge(exchange.get('code_verifier')), params.get('code_challenge'));
    assert.equal(session.accessToken, access);
    assert.deepEqual(renewed, [access]);
    assert.equal(JSON.parse(storage.getItem(TOKENS_KEY)).refresh_token, 'r1');
    assert.equal(await session.complete('http://127.0.0.1:8000/?thread=th_1'), null); // no callback
  });

  test('refresh keeps the old refresh token when the answer has none; failure is false', async () => {
    const storage = new MemoryStorage();
    let answer = { access_token: 'a2' };
    const { fetchImpl, requests } = fakeFetch(() => answer);
    storage.setItem(TOKENS_KEY, JSON.stringify({ access_token: 'a1', refresh_token: 'r1' }));
    const session = new OidcSession({ issuer: ISSUER, client_id: 'web' }, { storage, fetchImpl, clock: noTimers });
    assert.equal(await session.refresh(), true);
    assert.equal(session.accessToken, 'a2');
    assert.equal(new URLSearchParams(requests.at(-1).init.body).get('refresh_token'), 'r1');
    assert.equal(session.tokens.refresh_token, 'r1');
    answer = { error: 'invalid_grant' };
    assert.equal(await session.refresh(), false);
    assert.equal(session.accessToken, 'a2');
  });

  test('the HTTP client sends the current token of a getter', async () => {
    let token = 'first';
    const seen = [];
    const api = createApi(() => token, {
      fetchImpl: async (url, init) => {
        seen.push(init.headers.Authorization);
        return { ok: true, status: 200, text: async () => '{}' };
      },
    });
    await api.me();
    token = 'second';
    await api.me();
    assert.deepEqual(seen, ['Bearer first', 'Bearer second']);
  });
});
