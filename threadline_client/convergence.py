"""Sans-I/O convergence of one thread: committed snapshots plus live chunks, as static/js/sync.js.

The rules (docs/protocol.md, "How a client converges"), mirrored from the browser's ThreadSync so
a script sees what a tab sees:
- live chunks are for display only; the snapshot is the truth;
- refetch on every invalidation newer than the held snapshot, on (re)subscribe, on resync, on a
  `run-takeover` chunk and on a gap in a run's `seq`;
- after a refetch, keep only live chunks of the snapshot's run with seq >= run.next_seq;
- an older snapshot never replaces a newer one.
Each event method returns whether a refetch is due; the caller schedules it (at most one in
flight, one more queued behind it) and hands the result to `apply_snapshot`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from threadline_client.models import TERMINAL_RUN_STATUSES, Snapshot

RETIRED_RUNS_KEPT = 32


@dataclass
class LiveRun:
    """The live chunks of one run: `from_seq` is the display start, `next_seq` the first hole."""

    id: str
    ordinal: int
    from_seq: int
    next_seq: int
    chunks: dict[int, dict[str, Any]] = field(default_factory=dict)
    gap_at: int | None = None

    def advance(self) -> None:
        while self.next_seq in self.chunks:
            self.next_seq += 1

    def prune(self, committed: int) -> None:
        for seq in [s for s in self.chunks if s < committed]:
            del self.chunks[seq]
        self.from_seq = max(self.from_seq, committed)
        self.next_seq = max(self.next_seq, self.from_seq)
        if self.gap_at is not None and self.gap_at < self.next_seq:
            self.gap_at = None
        self.advance()


@dataclass
class Refetch:
    """Why a refetch is due; `force` means even a snapshot at the held version must be read."""

    reason: str
    force: bool = False


class ThreadState:
    """What a client holds of one thread: the newest snapshot and the in-flight run's chunks."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        self.snapshot: Snapshot | None = None
        self.run: LiveRun | None = None
        self.ordinal = 0
        self.want_version = -1
        self._retired: deque[str] = deque(maxlen=RETIRED_RUNS_KEPT)
        self.discarded = 0

    @property
    def version(self) -> int:
        return self.snapshot.thread.version if self.snapshot is not None else -1

    # --- events ----------------------------------------------------------------------------

    def subscribed(self, version: int) -> Refetch:
        """A (re)subscription: whatever happened while not subscribed, refetch."""
        self.want_version = max(self.want_version, version)
        return Refetch("subscribed", force=True)

    def invalidate(self, version: int) -> Refetch | None:
        if version <= self.version:
            return None
        self.want_version = max(self.want_version, version)
        return Refetch("invalidate")

    def resync(self) -> Refetch:
        return Refetch("resync", force=True)

    def chunk(self, frame: dict[str, Any]) -> Refetch | None:
        """A `chunk` frame `{thread_id, run_id, seq, chunk}`; a refetch on a gap or a takeover."""
        run_id, seq, chunk = frame.get("run_id"), frame.get("seq"), frame.get("chunk")
        if frame.get("thread_id") != self.thread_id or not isinstance(chunk, dict):
            return None
        if not isinstance(run_id, str) or not isinstance(seq, int) or run_id in self._retired:
            return None
        snap_run = self.snapshot.run if self.snapshot is not None else None
        finished = snap_run is not None and snap_run.status in TERMINAL_RUN_STATUSES
        if finished and snap_run is not None and snap_run.id == run_id:
            return None
        if self.run is None or self.run.id != run_id:
            if self.run is not None:
                self._retire(self.run.id)
            base = snap_run.next_seq if snap_run is not None and snap_run.id == run_id else 0
            self.ordinal += 1
            self.run = LiveRun(run_id, self.ordinal, base, base)
        run = self.run
        if chunk.get("type") == "run-takeover":
            held = run.chunks.get(seq)
            if held is not None and held.get("episode") == chunk.get("episode"):
                return None
            if seq < run.from_seq:
                return None  # older than the committed boundary we hold: already applied
            # A new episode redoes the uncommitted step: what we hold of it is void.
            run.chunks.clear()
            run.from_seq = run.next_seq = seq
            run.gap_at = None
            run.chunks[seq] = chunk
            run.advance()
            return Refetch("run-takeover", force=True)
        if seq < run.next_seq or seq in run.chunks:
            return None  # duplicate or replayed
        run.chunks[seq] = chunk
        run.advance()
        if seq >= run.next_seq and run.gap_at != run.next_seq:
            run.gap_at = run.next_seq  # ask once per hole; the step's commit closes it otherwise
            return Refetch("gap", force=True)
        return None

    def wants_more(self) -> bool:
        """After a fetch: is a newer version than the held one already announced?"""
        return self.want_version > self.version

    # --- snapshots -------------------------------------------------------------------------

    def apply_snapshot(self, snapshot: Snapshot, ordinal_at_start: int | None = None) -> bool:
        """Hold `snapshot` unless it is older than the one held; False when it was discarded.

        `ordinal_at_start` is `self.ordinal` when the fetch began: a run whose first chunk came
        after that may be newer than the snapshot and is kept.
        """
        start = self.ordinal if ordinal_at_start is None else ordinal_at_start
        if self.snapshot is not None and snapshot.thread.version < self.snapshot.thread.version:
            self.discarded += 1
            return False
        self.snapshot = snapshot
        run, snap_run = self.run, snapshot.run
        if run is not None:
            if snap_run is not None and snap_run.id == run.id:
                if snap_run.status in TERMINAL_RUN_STATUSES:
                    self._drop_run()
                else:
                    run.prune(snap_run.next_seq)
            elif run.ordinal <= start:
                # Read after this run's chunks arrived and naming another run: it is committed.
                self._drop_run()
        return True

    # --- views -----------------------------------------------------------------------------

    def live_chunks(self) -> list[dict[str, Any]]:
        """The live chunks on top of the snapshot: contiguous from the display start."""
        run = self.run
        if run is None:
            return []
        return [run.chunks[seq] for seq in range(run.from_seq, run.next_seq)]

    def live_text(self) -> str:
        """Assistant text streamed live and not yet in the snapshot."""
        return "".join(
            str(c.get("delta", "")) for c in self.live_chunks() if c.get("type") == "text-delta"
        )

    def _drop_run(self) -> None:
        if self.run is not None:
            self._retire(self.run.id)
            self.run = None

    def _retire(self, run_id: str) -> None:
        if run_id not in self._retired:
            self._retired.append(run_id)
