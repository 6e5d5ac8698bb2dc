// Presence of one thread: who is here, who types, who reviews which action (docs/protocol.md,
// "Presence"). Pure: no DOM, no network; the clock and timers are injected.

/** The member map after one presence frame (a new object; unknown frames change nothing). */
export function applyPresence(members, frame) {
  if (!frame || typeof frame !== 'object') return members;
  if (frame.type === 'presence') {
    const next = {};
    for (const m of frame.members || []) if (m && m.subject) next[m.subject] = m;
    return next;
  }
  if ((frame.type === 'presence.join' || frame.type === 'presence.update') && frame.member) {
    return { ...members, [frame.member.subject]: frame.member };
  }
  if (frame.type === 'presence.leave') {
    const next = { ...members };
    delete next[frame.subject];
    return next;
  }
  return members;
}

/**
 * What to show: everyone here (me first, then by name), the names of others typing, and per
 * action id the names of others reviewing it.
 */
export function presenceView(members, me) {
  const all = Object.values(members || {});
  const here = all
    .map((m) => ({ subject: m.subject, name: m.name || m.subject, role: m.role, connections: m.connections || 1, me: m.subject === me }))
    .sort((a, b) => (a.me === b.me ? a.name.localeCompare(b.name) : a.me ? -1 : 1));
  const others = all.filter((m) => m.subject !== me);
  const typing = others.filter((m) => m.typing).map((m) => m.name || m.subject).sort();
  const reviewing = {};
  for (const m of others) {
    if (m.reviewing) (reviewing[m.reviewing] = reviewing[m.reviewing] || []).push(m.name || m.subject);
  }
  for (const names of Object.values(reviewing)) names.sort();
  return { here, typing, reviewing };
}

/** "alice is typing…", "alice and bob are typing…", "alice, bob and 2 others are typing…". */
export function typingText(names) {
  if (!names.length) return '';
  if (names.length === 1) return `${names[0]} is typing…`;
  if (names.length === 2) return `${names[0]} and ${names[1]} are typing…`;
  return `${names[0]}, ${names[1]} and ${names.length - 2} other${names.length > 3 ? 's' : ''} are typing…`;
}

export function reviewingText(names) {
  if (!names || !names.length) return '';
  return names.length === 1 ? `${names[0]} is reviewing` : `${names.join(', ')} are reviewing`;
}

/**
 * Turns keystrokes into few `typing` updates: true on the first input, false after `idleMs`
 * without input or at once on `stop()` (a message was sent). `send(bool)` does the network.
 */
export class TypingSignal {
  constructor({ send, idleMs = 3000, schedule, cancel }) {
    this.send = send;
    this.idleMs = idleMs;
    this.schedule = schedule || ((fn, ms) => setTimeout(fn, ms));
    this.cancel = cancel || ((timer) => clearTimeout(timer));
    this.typing = false;
    this.timer = null;
  }

  input() {
    if (!this.typing) {
      this.typing = true;
      this.send(true);
    }
    if (this.timer !== null) this.cancel(this.timer);
    this.timer = this.schedule(() => {
      this.timer = null;
      this.stop();
    }, this.idleMs);
  }

  stop() {
    if (this.timer !== null) {
      this.cancel(this.timer);
      this.timer = null;
    }
    if (this.typing) {
      this.typing = false;
      this.send(false);
    }
  }

  /** Forget the state without sending (the thread changed or the connection was replaced). */
  reset() {
    if (this.timer !== null) this.cancel(this.timer);
    this.timer = null;
    this.typing = false;
  }
}
