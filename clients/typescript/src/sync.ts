// Convergence of one thread: committed snapshots plus a display-only buffer of live chunks.
//
// Rules (docs/protocol.md, "How a client converges"; vectors: tests/vectors/convergence/):
// - live chunks are applied for display only; the snapshot is the truth;
// - refetch the snapshot on every invalidation newer than the held snapshot, on (re)subscribe,
//   on resync, on a `run-takeover` chunk and on a gap in a run's `seq` (seq starts at 0 per run
//   and has no gaps);
// - after a refetch the live buffer keeps only chunks of the snapshot's run with
//   seq >= run.next_seq (the older ones are committed, hence in the snapshot);
// - at most one refetch in flight, at most one more queued behind it;
// - an older snapshot never replaces a newer one.
// No DOM, no network: `fetchSnapshot` and `schedule` are injected. The static page runs this
// very code (static/js/core.js is its bundle).
import { applyDelta, DeltaMismatch, type SnapshotDelta } from './delta.js';
import type { Snapshot } from './generated/protocol.js';

export const ACTIVE_RUN_STATUSES: ReadonlySet<string> = new Set(['queued', 'running', 'waiting']);
export const TERMINAL_RUN_STATUSES: ReadonlySet<string> = new Set(['completed', 'failed', 'cancelled']);
const RETIRED_RUNS_KEPT = 32;
const RETRY_DELAYS_MS = [500, 1000, 2000, 4000, 8000];

/** A live chunk's body, `{type, ...}` (the StreamChunk union, read leniently). */
export interface LiveChunk {
  type: string;
  [key: string]: unknown;
}

/** The `chunk` frame: `{thread_id, run_id, seq, episode?, chunk}`. */
export interface ChunkFrame {
  thread_id: string;
  run_id: string;
  seq: number;
  episode?: number;
  chunk: LiveChunk;
}

interface LiveRun {
  id: string;
  ordinal: number;
  chunks: Map<number, LiveChunk>;
  from: number;
  next: number;
  gapAt: number | null;
}

export interface ThreadSyncOptions {
  threadId: string;
  fetchSnapshot: () => Promise<Snapshot> | Snapshot;
  onChange?: () => void;
  onError?: (err: unknown) => void;
  schedule?: (fn: () => void, ms: number) => unknown;
  isRetryable?: (err: unknown) => boolean;
}

export interface LiveToolCall {
  type: 'tool-call';
  tool_call_id: string;
  name: string;
  input: Record<string, unknown>;
  state: string;
  output?: unknown;
  error?: unknown;
}

export type LivePart = { type: 'text'; text: string } | LiveToolCall;

export interface LiveView {
  runId: string | null;
  parts: LivePart[];
  toolStates: Record<string, Record<string, unknown>>;
  takeover: unknown;
  text: string;
}

export class ThreadSync {
  readonly threadId: string;
  fetchSnapshot: () => Promise<Snapshot> | Snapshot;
  onChange: () => void;
  onError: (err: unknown) => void;
  schedule: (fn: () => void, ms: number) => unknown;
  isRetryable: (err: unknown) => boolean;
  snapshot: Snapshot | null = null;
  run: LiveRun | null = null;
  retired: string[] = [];
  ordinal = 0;
  inflight = false;
  inflightForced = false;
  queued = false;
  forcePending = false;
  wantVersion = -1;
  failures = 0;
  retryTimer: unknown = null;
  disposed = false;
  stats = { fetches: 0, discarded: 0, deltas: 0 };

  constructor({ threadId, fetchSnapshot, onChange, onError, schedule, isRetryable }: ThreadSyncOptions) {
    this.threadId = threadId;
    this.fetchSnapshot = fetchSnapshot;
    this.onChange = onChange || (() => {});
    this.onError = onError || (() => {});
    this.schedule = schedule || ((fn, ms) => setTimeout(fn, ms));
    this.isRetryable = isRetryable || (() => true);
  }

  get version(): number {
    return this.snapshot ? this.snapshot.thread.version : -1;
  }

  /** True while the client knows it is (or may be) behind: no snapshot yet or a forced refetch. */
  get resyncing(): boolean {
    return !this.snapshot || this.forcePending || (this.inflight && this.inflightForced);
  }

  dispose(): void {
    this.disposed = true;
  }

  // --- events --------------------------------------------------------------------------

  /** The server confirmed a (re)subscription: whatever happened meanwhile, refetch. */
  subscribed(version?: number): void {
    this.requestRefetch({ force: true, version });
  }

  /** `invalidate` frame or a command's answer: refetch only if it is newer than what we hold. */
  invalidate(version?: number): void {
    if (typeof version === 'number' && version <= this.version) return;
    this.requestRefetch({ version });
  }

  resync(): void {
    this.requestRefetch({ force: true });
  }

  /**
   * An `invalidate` frame with a `delta` (docs/protocol.md, "Snapshot deltas"): applied when it
   * starts at the held version and ends at `version`; false otherwise (refetch as for any
   * invalidation: `invalidate(version)`).
   */
  applyDelta(version: number, delta: SnapshotDelta): boolean {
    if (this.disposed || !this.snapshot || !delta || delta.from !== this.version) return false;
    let next: Snapshot;
    try {
      next = applyDelta(this.snapshot, delta);
    } catch (err) {
      if (err instanceof DeltaMismatch) return false;
      throw err;
    }
    if (!next.thread || next.thread.version !== version) return false;
    this.stats.deltas += 1;
    return this.applySnapshot(next, this.ordinal);
  }

  /** A `chunk` frame: {thread_id, run_id, seq, chunk}. */
  chunk(frame: ChunkFrame): void {
    if (this.disposed || frame.thread_id !== this.threadId) return;
    const { run_id: runId, seq, chunk } = frame;
    if (typeof seq !== 'number' || !chunk || this.retired.includes(runId)) return;
    const snapRun = this.snapshot && this.snapshot.run;
    if (snapRun && snapRun.id === runId && TERMINAL_RUN_STATUSES.has(snapRun.status)) return;
    if (!this.run || this.run.id !== runId) {
      if (this.run) this.retire(this.run.id);
      const base = snapRun && snapRun.id === runId ? snapRun.next_seq || 0 : 0;
      this.run = { id: runId, ordinal: ++this.ordinal, chunks: new Map(), from: base, next: base, gapAt: null };
    }
    const run = this.run;
    if (chunk.type === 'run-takeover') {
      const held = run.chunks.get(seq);
      if (held && held.type === 'run-takeover' && held.episode === chunk.episode) return;
      if (seq < run.from) return; // older than the committed boundary we hold: already applied
      // A new episode redoes the uncommitted step: what we hold of it is void; the committed
      // part comes with the refetch below.
      run.chunks.clear();
      run.from = seq;
      run.next = seq;
      run.gapAt = null;
      run.chunks.set(seq, chunk);
      this.advance(run);
      this.requestRefetch({ force: true });
      this.onChange();
      return;
    }
    if (seq < run.next || run.chunks.has(seq)) return; // duplicate or replayed
    run.chunks.set(seq, chunk);
    this.advance(run);
    if (seq >= run.next && run.gapAt !== run.next) {
      // Missing seq run.next: ask once per hole; the step's commit closes it otherwise.
      run.gapAt = run.next;
      this.requestRefetch({ force: true });
    }
    this.onChange();
  }

  // --- refetching ----------------------------------------------------------------------

  requestRefetch({ force = false, version }: { force?: boolean; version?: number } = {}): void {
    if (this.disposed) return;
    if (typeof version === 'number' && version > this.wantVersion) this.wantVersion = version;
    if (force) this.forcePending = true;
    if (this.inflight) {
      this.queued = true;
      return;
    }
    this.startFetch();
  }

  startFetch(): void {
    this.inflight = true;
    this.inflightForced = this.forcePending;
    this.forcePending = false;
    this.queued = false;
    const ordinalAtStart = this.ordinal;
    this.stats.fetches += 1;
    this.onChange();
    let failed: unknown = null;
    let pending: Promise<Snapshot>;
    try {
      pending = Promise.resolve(this.fetchSnapshot());
    } catch (err) {
      pending = Promise.reject(err);
    }
    pending
      .then(
        (snap) => {
          if (this.disposed) return;
          this.failures = 0;
          this.applySnapshot(snap, ordinalAtStart);
        },
        (err: unknown) => {
          failed = err ?? new Error('refetch failed');
        },
      )
      .finally(() => {
        if (this.disposed) return;
        const forced = this.inflightForced;
        this.inflight = false;
        this.inflightForced = false;
        if (failed) {
          this.failures += 1;
          this.onError(failed);
          if (forced) this.forcePending = true; // still owed; keeps `resyncing` true
          if (this.isRetryable(failed) && this.failures <= RETRY_DELAYS_MS.length) {
            const delay = RETRY_DELAYS_MS[this.failures - 1];
            this.retryTimer = this.schedule(() => {
              this.retryTimer = null;
              if (!this.inflight) this.requestRefetch({ force: this.forcePending });
            }, delay);
          } else {
            this.forcePending = false;
            this.failures = 0; // the next event starts a fresh series of retries
          }
        } else if (this.queued && (this.forcePending || this.wantVersion > this.version)) {
          this.startFetch();
          return;
        }
        this.queued = false;
        this.onChange();
      });
  }

  /** Apply a fetched snapshot; returns false when it was older than the one held. */
  applySnapshot(snap: Snapshot | null | undefined, ordinalAtStart: number = this.ordinal): boolean {
    if (!snap || !snap.thread) return false;
    if (this.snapshot && snap.thread.version < this.snapshot.thread.version) {
      this.stats.discarded += 1;
      return false;
    }
    this.snapshot = snap;
    const snapRun = snap.run;
    const run = this.run;
    if (run) {
      if (snapRun && snapRun.id === run.id) {
        if (TERMINAL_RUN_STATUSES.has(snapRun.status)) this.dropRun();
        else this.prune(run, snapRun.next_seq || 0);
      } else if (run.ordinal <= ordinalAtStart) {
        // The snapshot was read after this run's chunks arrived, and names another run (or
        // none): the live run is over and committed.
        this.dropRun();
      }
      // else: the run's first chunk arrived while the fetch was in flight; the snapshot may
      // predate it, and the run's own invalidation brings the next refetch.
    }
    this.onChange();
    return true;
  }

  prune(run: LiveRun, nextSeq: number): void {
    for (const seq of run.chunks.keys()) if (seq < nextSeq) run.chunks.delete(seq);
    if (run.from < nextSeq) run.from = nextSeq;
    if (run.next < run.from) run.next = run.from;
    if (run.gapAt !== null && run.gapAt < run.next) run.gapAt = null;
    this.advance(run);
  }

  advance(run: LiveRun): void {
    while (run.chunks.has(run.next)) run.next += 1;
  }

  dropRun(): void {
    if (!this.run) return;
    this.retire(this.run.id);
    this.run = null;
  }

  retire(runId: string): void {
    if (this.retired.includes(runId)) return;
    this.retired.push(runId);
    if (this.retired.length > RETIRED_RUNS_KEPT) this.retired.shift();
  }

  // --- views ---------------------------------------------------------------------------

  /** The chunks shown live: contiguous from the display start, in seq order. */
  liveChunks(): LiveChunk[] {
    const run = this.run;
    if (!run) return [];
    const out: LiveChunk[] = [];
    for (let seq = run.from; seq < run.next; seq += 1) {
      const chunk = run.chunks.get(seq);
      if (chunk) out.push(chunk);
    }
    return out;
  }

  /** What to display on top of the snapshot. */
  liveView(): LiveView {
    return { runId: this.run ? this.run.id : null, ...foldChunks(this.liveChunks()) };
  }
}

const text = (value: unknown): string => (typeof value === 'string' ? value : '');

/**
 * Fold live chunks into display parts. `toolStates` holds state changes of tool calls that are
 * not among the live parts (committed ones, e.g. an approved call now running).
 */
export function foldChunks(chunks: readonly (LiveChunk | null | undefined)[]): Omit<LiveView, 'runId'> {
  const parts: LivePart[] = [];
  const toolStates: Record<string, Record<string, unknown>> = {};
  let takeover: unknown = null;
  let stepBreak = false;
  for (const c of chunks) {
    if (!c) continue;
    if (c.type === 'text-delta') {
      const last = parts[parts.length - 1];
      if (last && last.type === 'text' && !stepBreak) last.text += text(c.delta);
      else parts.push({ type: 'text', text: text(c.delta) });
      stepBreak = false;
    } else if (c.type === 'tool-call') {
      parts.push({
        type: 'tool-call',
        tool_call_id: text(c.tool_call_id),
        name: text(c.name),
        input: (c.input as Record<string, unknown>) || {},
        state: 'input-available',
      });
    } else if (c.type === 'tool-state') {
      const update: Record<string, unknown> = { state: c.state };
      if (c.output !== undefined && c.output !== null) update.output = c.output;
      if (c.error !== undefined && c.error !== null) update.error = c.error;
      const id = text(c.tool_call_id);
      const part = parts.find((p): p is LiveToolCall => p.type === 'tool-call' && p.tool_call_id === id);
      if (part) Object.assign(part, update);
      else toolStates[id] = { ...(toolStates[id] || {}), ...update };
    } else if (c.type === 'step-start') {
      stepBreak = true;
    } else if (c.type === 'run-takeover') {
      takeover = c.episode;
    }
  }
  const joined = parts
    .filter((p): p is { type: 'text'; text: string } => p.type === 'text' && Boolean(p.text))
    .map((p) => p.text)
    .join('\n\n');
  return { parts, toolStates, takeover, text: joined };
}

export interface ActiveRun {
  id: string;
  status: string;
  live?: boolean;
  [key: string]: unknown;
}

/** The run to show as active: the snapshot's, or a live one the snapshot does not know yet. */
export function activeRun(snapshot: Snapshot | null, live: Pick<LiveView, 'runId'> | null): ActiveRun | null {
  const run = snapshot && snapshot.run;
  if (run && ACTIVE_RUN_STATUSES.has(run.status)) return run;
  if (live && live.runId && !(run && run.id === live.runId)) {
    return { id: live.runId, status: 'running', live: true };
  }
  return null;
}
