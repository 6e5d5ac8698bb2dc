// Browser sign-in at an OIDC issuer: authorization code + PKCE (S256, WebCrypto), a public client.
//
// The server puts the sign-in's public settings in the page (<meta name="threadline-oidc">,
// docs/operations.md, "Browser sign-in"). The issuer answers with `response_mode=fragment`, so
// the code comes back in the fragment and reaches no request to Threadline; the tokens live in
// this tab's sessionStorage only (never in a URL), the access token is the bearer of every
// request and of the websocket, and a refresh token renews it before it expires.

export const TOKENS_KEY = 'threadline.oidc.tokens';
const PENDING_KEY = 'threadline.oidc.pending';
// Renew this long before expiry, but at most a quarter of the token's life (as the Python client).
const REFRESH_MARGIN_MS = 30000;

/** The sign-in settings the server put in the page, or null (then the page takes a tl_ token). */
export function signInConfig(doc) {
  const meta = doc.querySelector('meta[name="threadline-oidc"]');
  if (!meta) return null;
  try {
    const config = JSON.parse(meta.getAttribute('content') || '');
    return config && config.issuer && config.client_id ? config : null;
  } catch {
    return null;
  }
}

export function base64url(bytes) {
  let text = '';
  for (const byte of bytes) text += String.fromCharCode(byte);
  return btoa(text).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

export function randomToken(bytes = 32, cryptoImpl = globalThis.crypto) {
  return base64url(cryptoImpl.getRandomValues(new Uint8Array(bytes)));
}

/** The S256 code challenge of a PKCE verifier (RFC 7636). */
export async function codeChallenge(verifier, cryptoImpl = globalThis.crypto) {
  const digest = await cryptoImpl.subtle.digest('SHA-256', new TextEncoder().encode(verifier));
  return base64url(new Uint8Array(digest));
}

/** A JWT's `exp` in milliseconds, read without verifying (the server verifies); null if none. */
export function jwtExpiryMs(token) {
  const parts = String(token || '').split('.');
  if (parts.length !== 3) return null;
  try {
    const json = atob(parts[1].replace(/-/g, '+').replace(/_/g, '/'));
    const exp = JSON.parse(json).exp;
    return typeof exp === 'number' ? exp * 1000 : null;
  } catch {
    return null;
  }
}

/** Milliseconds from `now` until a token received at `since` and expiring at `exp` is renewed. */
export function refreshDelayMs(since, exp, now, margin = REFRESH_MARGIN_MS) {
  const life = Math.max(0, exp - since);
  return Math.max(0, since + life - Math.min(margin, life / 4) - now);
}

export class OidcSession {
  constructor(config, { storage, fetchImpl = globalThis.fetch.bind(globalThis), onToken = () => {}, clock = globalThis } = {}) {
    this.config = config;
    this.storage = storage;
    this.fetch = fetchImpl;
    this.onToken = onToken;
    this.clock = clock;
    this.metadata = null;
    this.timer = null;
    this.tokens = this.load(TOKENS_KEY);
  }

  get accessToken() {
    return (this.tokens && this.tokens.access_token) || '';
  }

  redirectUri(location) {
    return `${location.origin}/`;
  }

  async discover() {
    if (!this.metadata) {
      const url = `${this.config.issuer.replace(/\/$/, '')}/.well-known/openid-configuration`;
      const res = await this.fetch(url, { headers: { Accept: 'application/json' } });
      if (!res.ok) throw new Error(`the identity provider's discovery failed (${res.status})`);
      this.metadata = await res.json();
    }
    return this.metadata;
  }

  /** Go to the issuer's login page; the thread to come back to is kept for the callback. */
  async begin(location) {
    const metadata = await this.discover();
    const verifier = randomToken(48);
    const state = randomToken(16);
    const returnTo = `${location.pathname}${location.search}`;
    this.save(PENDING_KEY, { state, verifier, returnTo });
    const params = new URLSearchParams({
      response_type: 'code',
      response_mode: 'fragment',
      client_id: this.config.client_id,
      redirect_uri: this.redirectUri(location),
      scope: this.config.scopes || 'openid',
      state,
      code_challenge: await codeChallenge(verifier),
      code_challenge_method: 'S256',
      ...(this.config.params || {}),
    });
    location.assign(`${metadata.authorization_endpoint}?${params}`);
  }

  /**
   * Finish a sign-in when `href` is the issuer's redirect (`#code=…&state=…`): exchange the
   * code for tokens. Returns the URL to show instead (the thread the sign-in started from),
   * or null when `href` is no callback.
   */
  async complete(href) {
    const url = new URL(href);
    const answer = new URLSearchParams(url.hash.replace(/^#/, ''));
    if (!answer.has('state') || !(answer.has('code') || answer.has('error'))) return null;
    const pending = this.load(PENDING_KEY);
    this.remove(PENDING_KEY);
    if (!pending || pending.state !== answer.get('state')) throw new Error('the sign-in answer does not match this tab’s request');
    if (answer.has('error')) throw new Error(`sign-in refused: ${answer.get('error_description') || answer.get('error')}`);
    const metadata = await this.discover();
    // RFC 9207: an answer naming another issuer is a mix-up, whatever its code.
    if (answer.has('iss') && answer.get('iss') !== metadata.issuer) throw new Error('the sign-in answer comes from another issuer');
    await this.grant(metadata, {
      grant_type: 'authorization_code',
      code: answer.get('code'),
      redirect_uri: `${url.origin}/`,
      client_id: this.config.client_id,
      code_verifier: pending.verifier,
    });
    return new URL(pending.returnTo || '/', url.origin).toString();
  }

  /** Renew the access token with the refresh token; false when there is none or it failed. */
  async refresh() {
    const refreshToken = this.tokens && this.tokens.refresh_token;
    if (!refreshToken) return false;
    try {
      const metadata = await this.discover();
      await this.grant(metadata, { grant_type: 'refresh_token', refresh_token: refreshToken, client_id: this.config.client_id });
      return true;
    } catch {
      return false;
    }
  }

  async grant(metadata, form) {
    const res = await this.fetch(metadata.token_endpoint, {
      method: 'POST',
      headers: { 'Content-Type': 'application/x-www-form-urlencoded', Accept: 'application/json' },
      body: new URLSearchParams(form).toString(),
    });
    const body = await res.json().catch(() => ({}));
    if (!res.ok || !body.access_token) throw new Error(`token request failed: ${body.error || res.status}`);
    this.tokens = {
      access_token: body.access_token,
      // A refresh answer may leave the refresh token out: the old one stays valid then.
      refresh_token: body.refresh_token || (this.tokens && this.tokens.refresh_token) || null,
      received_at: Date.now(),
    };
    this.save(TOKENS_KEY, this.tokens);
    this.schedule();
    this.onToken(body.access_token);
  }

  /** Renew the access token a little before it expires (again after each renewal). */
  schedule() {
    if (this.timer !== null) this.clock.clearTimeout(this.timer);
    this.timer = null;
    const exp = jwtExpiryMs(this.accessToken);
    if (exp === null || !this.tokens.refresh_token) return;
    const delay = refreshDelayMs(this.tokens.received_at || Date.now(), exp, Date.now());
    this.timer = this.clock.setTimeout(() => {
      this.timer = null;
      this.refresh();
    }, delay);
  }

  /** Forget the tokens (a refused token): the next page load signs in again. */
  forget() {
    this.tokens = null;
    this.remove(TOKENS_KEY);
    if (this.timer !== null) this.clock.clearTimeout(this.timer);
    this.timer = null;
  }

  load(key) {
    try {
      const raw = this.storage ? this.storage.getItem(key) : null;
      return raw ? JSON.parse(raw) : null;
    } catch {
      return null;
    }
  }

  save(key, value) {
    try {
      if (this.storage) this.storage.setItem(key, JSON.stringify(value));
    } catch {
      // storage disabled: the session lasts as long as the page
    }
  }

  remove(key) {
    try {
      if (this.storage) this.storage.removeItem(key);
    } catch {
      // nothing stored
    }
  }
}

/**
 * The page's sign-in: finish a callback, reuse this tab's tokens (renewed first if they are
 * about to expire), or go to the issuer's login page. Resolves to the session with a valid
 * access token, or null while the browser is on its way to the login page.
 */
export async function signIn(config, { location, history, storage, onToken }) {
  const oidc = new OidcSession(config, { storage, onToken });
  const back = await oidc.complete(location.href);
  if (back) history.replaceState(null, '', back);
  const exp = jwtExpiryMs(oidc.accessToken);
  if (oidc.accessToken && exp !== null && exp - Date.now() < 5000 && !(await oidc.refresh())) oidc.forget();
  if (!oidc.accessToken) {
    await oidc.begin(location);
    return null;
  }
  oidc.schedule();
  return oidc;
}
