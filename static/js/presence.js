// Presence of one thread: who is here, who types, who reviews which action (docs/protocol.md,
// "Presence"). Pure: no DOM, no network; the clock and timers are injected.

// The member map and what to show of it: the TypeScript client's core
// (clients/typescript/src/presence.ts), bundled into core.js.
export { applyPresence, presenceView } from './core.js';

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
