// Replays a convergence vector (tests/vectors/convergence/*.json) through ThreadSync.
// A vector is frames, snapshot answers and expectations, in order:
//   {"frame": {...}}     a server frame for the thread (subscribed, invalidate, chunk, resync)
//   {"answer": {...}}    the oldest outstanding snapshot fetch answers this snapshot
//   {"expect": {...}}    fields of the observed state (below) that must hold at this point
// and `final`, the state the client must end in. The same files are replayed by the Python
// client (tests/unit/test_convergence_vectors.py) and in Chromium by the static page's bundle.
import type { Snapshot } from './generated/protocol.js';
import { type ChunkFrame, ThreadSync } from './sync.js';

export interface VectorStep {
  frame?: { type: string; [key: string]: unknown };
  answer?: Snapshot;
  expect?: Partial<VectorResult>;
}

export interface ConvergenceVector {
  name: string;
  description?: string;
  thread_id: string;
  steps: VectorStep[];
  final: Partial<VectorResult>;
}

/** What a vector can assert of a client. */
export interface VectorResult {
  version: number;
  live_run: string | null;
  /** The deltas of the live text chunks shown on top of the snapshot, concatenated. */
  live_text: string;
  run_status: string | null;
  pending_actions: string[];
  /** Snapshot fetches started so far, and whether one is outstanding. */
  fetches: number;
  inflight: boolean;
  /** Snapshots discarded because they were older than the one held. */
  discarded: number;
}

export function observe(sync: ThreadSync, outstanding: number): VectorResult {
  const snap = sync.snapshot;
  return {
    version: sync.version,
    live_run: sync.run ? sync.run.id : null,
    live_text: sync
      .liveChunks()
      .filter((c) => c.type === 'text-delta')
      .map((c) => (typeof c.delta === 'string' ? c.delta : ''))
      .join(''),
    run_status: snap && snap.run ? snap.run.status : null,
    pending_actions: (snap?.pending_actions ?? []).map((a) => a.id),
    fetches: sync.stats.fetches,
    inflight: outstanding > 0,
    discarded: sync.stats.discarded,
  };
}

const settle = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 0));

function mismatches(where: string, want: Partial<VectorResult>, got: VectorResult): string[] {
  const out: string[] = [];
  for (const [key, value] of Object.entries(want)) {
    const actual = got[key as keyof VectorResult];
    if (JSON.stringify(actual) !== JSON.stringify(value)) {
      out.push(`${where}: ${key} is ${JSON.stringify(actual)}, expected ${JSON.stringify(value)}`);
    }
  }
  return out;
}

/** Replay one vector; answers the failures (empty: the client converged as the vector says). */
export async function replayVector(vector: ConvergenceVector): Promise<string[]> {
  const pending: ((snap: Snapshot) => void)[] = [];
  const sync = new ThreadSync({
    threadId: vector.thread_id,
    fetchSnapshot: () => new Promise<Snapshot>((resolve) => pending.push(resolve)),
    schedule: () => null, // no retries: a vector's fetches never fail
  });
  const failures: string[] = [];
  for (const [index, step] of vector.steps.entries()) {
    const where = `${vector.name} step ${index}`;
    if (step.frame) {
      const frame = step.frame;
      if (frame.type === 'subscribed') sync.subscribed(frame.version as number);
      else if (frame.type === 'invalidate') sync.invalidate(frame.version as number);
      else if (frame.type === 'resync') sync.resync();
      else if (frame.type === 'chunk') sync.chunk(frame as unknown as ChunkFrame);
      else failures.push(`${where}: unknown frame type ${frame.type}`);
    } else if (step.answer) {
      const resolve = pending.shift();
      if (!resolve) {
        failures.push(`${where}: a snapshot answers, but no fetch is outstanding`);
        continue;
      }
      resolve(step.answer);
    }
    await settle();
    if (step.expect) failures.push(...mismatches(where, step.expect, observe(sync, pending.length)));
  }
  failures.push(...mismatches(`${vector.name} final`, vector.final, observe(sync, pending.length)));
  return failures;
}

export type { VectorResult as VectorState };
