// Where the token and the open thread live: the page URL and the tab's sessionStorage.
//
// The server prints `http://host:port/#token=...`: the fragment, which browsers never send
// anywhere. A link with `?token=` (older servers printed one) still works: on load the token
// moves out of the query (it reaches server logs, proxies and Referer headers) into the
// fragment, and into sessionStorage for this tab. The fragment is kept
// because a new tab does not share sessionStorage: a URL copied into another tab, e.g.
// `/?thread=<id>#token=<token>`, must open the same thread. Precedence: query, fragment, storage.
// A tab that already holds a token keeps it when a link carries another one unless the reader
// agrees to switch: a crafted link must not silently make a victim type into another scope.

export const TOKEN_KEY = 'threadline.token';

/**
 * Parse the page URL. Returns {token, threadId, url, switched} where `url` is the canonical
 * form. `confirmSwitch()` is asked when the URL's token differs from the one this tab holds;
 * it decides whether to switch (default: keep the current one).
 */
export function readSession(href, storage, confirmSwitch = () => false) {
  const url = new URL(href);
  const hash = new URLSearchParams(url.hash.replace(/^#/, ''));
  const held = (safeGet(storage, TOKEN_KEY) || '').trim();
  const offered = (url.searchParams.get('token') || hash.get('token') || '').trim();
  let token = offered || held;
  if (held && offered && offered !== held && !confirmSwitch()) token = held;
  if (token) safeSet(storage, TOKEN_KEY, token);
  const threadId = url.searchParams.get('thread') || hash.get('thread') || null;
  return { token, threadId, url: threadUrl(href, threadId, token) };
}

/** The canonical URL of `threadId` (null: no thread), other query parameters kept. */
export function threadUrl(href, threadId, token) {
  const url = new URL(href);
  url.searchParams.delete('token');
  if (threadId) url.searchParams.set('thread', threadId);
  else url.searchParams.delete('thread');
  const hash = new URLSearchParams(url.hash.replace(/^#/, ''));
  hash.delete('thread');
  if (token) hash.set('token', token);
  else hash.delete('token');
  const fragment = hash.toString();
  url.hash = fragment ? `#${fragment}` : '';
  return url.toString();
}

function safeGet(storage, key) {
  try {
    return storage ? storage.getItem(key) : null;
  } catch {
    return null; // storage disabled (privacy mode)
  }
}

function safeSet(storage, key, value) {
  try {
    if (storage) storage.setItem(key, value);
  } catch {
    // storage disabled: the URL fragment still carries the token
  }
}
