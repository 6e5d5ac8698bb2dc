// Tiny DOM helpers: build elements from data without ever parsing server text as HTML.

/**
 * h('button', {testid: 'send-button', class: 'btn', onclick: fn}, 'Send')
 * Attribute keys: `class`, `testid` (-> data-testid), `dataset` (object), `on<event>` (listener),
 * `hidden`/`disabled`/... (boolean: set when truthy), anything else via setAttribute.
 * Children: strings and numbers become text nodes; null/undefined/false are skipped; arrays flatten.
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'testid') el.dataset.testid = value;
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else if (value === true) el.setAttribute(key, '');
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

/**
 * Keyed reconciliation of `container`'s children with `items`.
 * A child is rebuilt only when its signature changed, so form state and focus inside unchanged
 * children survive re-renders; nodes are moved only when the order actually differs.
 */
export function reconcile(container, items, { key, signature, create }) {
  const existing = new Map();
  for (const node of Array.from(container.children)) {
    if (node.dataset.key !== undefined) existing.set(node.dataset.key, node);
    else node.remove();
  }
  const wanted = [];
  for (const item of items) {
    const k = String(key(item));
    const sig = signature ? signature(item) : '';
    let node = existing.get(k);
    if (node && node.dataset.sig !== sig) {
      const fresh = create(item);
      node.replaceWith(fresh);
      node = fresh;
    } else if (!node) {
      node = create(item);
    }
    node.dataset.key = k;
    node.dataset.sig = sig;
    existing.delete(k);
    wanted.push(node);
  }
  for (const node of existing.values()) node.remove();
  wanted.forEach((node, i) => {
    if (container.children[i] !== node) container.insertBefore(node, container.children[i] || null);
  });
}

/** JSON for display: strings as they are, everything else pretty-printed. */
export function formatValue(value) {
  if (typeof value === 'string') return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** Short random id; crypto.randomUUID is missing outside secure contexts (plain http on a LAN). */
export function randomId() {
  if (globalThis.crypto?.randomUUID) return globalThis.crypto.randomUUID();
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}
