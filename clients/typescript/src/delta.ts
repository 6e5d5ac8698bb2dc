// Snapshot deltas: apply the `delta` of an `invalidate` frame to the snapshot held at its
// `from` version (docs/protocol.md, "Snapshot deltas"; the reference is
// threadline_wire/snapshot_delta.py, and tests/vectors/deltas/ pins both to the same answers).
import type { Snapshot } from './generated/protocol.js';

/** An `invalidate` frame's `delta`: absent keys are unchanged. */
export interface SnapshotDelta {
  from: number;
  etag?: string;
  thread?: Record<string, unknown>;
  /** The new message list: `[start, end]` ranges of the held list, or new/changed messages. */
  messages?: (readonly [number, number] | Record<string, unknown>)[];
  set?: Record<string, unknown>;
  unset?: string[];
}

const KNOWN = new Set(['from', 'etag', 'thread', 'messages', 'set', 'unset']);

/** The delta does not apply to this snapshot (another base, an unknown key, a bad range). */
export class DeltaMismatch extends Error {}

/** `base` with `delta` applied, as a new object (`base` is not changed). */
export function applyDelta(base: Snapshot, delta: SnapshotDelta): Snapshot {
  for (const key of Object.keys(delta)) {
    if (!KNOWN.has(key)) throw new DeltaMismatch(`unknown delta key ${key}`);
  }
  const next: Record<string, unknown> = { ...(base as unknown as Record<string, unknown>) };
  if (delta.thread !== undefined) {
    if (!base.thread || typeof delta.thread !== 'object') throw new DeltaMismatch('no thread to patch');
    next.thread = { ...base.thread, ...delta.thread };
  }
  if (delta.messages !== undefined) {
    const held = base.messages;
    if (!Array.isArray(held) || !Array.isArray(delta.messages)) throw new DeltaMismatch('no messages to patch');
    const messages: unknown[] = [];
    for (const piece of delta.messages) {
      if (Array.isArray(piece)) {
        const [start, end] = piece as readonly unknown[];
        if (piece.length !== 2 || !Number.isInteger(start) || !Number.isInteger(end)) {
          throw new DeltaMismatch(`bad message range ${JSON.stringify(piece)}`);
        }
        if (!((start as number) >= 0 && (start as number) < (end as number) && (end as number) <= held.length)) {
          throw new DeltaMismatch(`message range ${JSON.stringify(piece)} outside ${held.length} messages`);
        }
        messages.push(...held.slice(start as number, end as number));
      } else if (piece && typeof piece === 'object') {
        messages.push(piece);
      } else {
        throw new DeltaMismatch('a message piece is a range or a message');
      }
    }
    next.messages = messages;
  }
  if (delta.set !== undefined) {
    if (!delta.set || typeof delta.set !== 'object') throw new DeltaMismatch('set must be an object');
    Object.assign(next, delta.set);
  }
  for (const key of delta.unset ?? []) delete next[key];
  return next as unknown as Snapshot;
}
