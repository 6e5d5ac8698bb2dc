"""The Python client's convergence rules (threadline_client.convergence), no network."""

from __future__ import annotations

from typing import Any

from threadline_client.convergence import ThreadState
from threadline_client.models import Snapshot

T = "thr_1"


def snap(version: int, run: dict[str, Any] | None = None) -> Snapshot:
    return Snapshot.model_validate(
        {
            "thread": {"id": T, "scope": "s", "title": "", "version": version, "metadata": {}},
            "messages": [],
            "pending_actions": [],
            "run": run,
            "queue": [],
        }
    )


def chunk(seq: int, run_id: str = "run_a", **fields: Any) -> dict[str, Any]:
    body = fields or {"type": "text-delta", "delta": f"<{seq}>"}
    return {"type": "chunk", "thread_id": T, "run_id": run_id, "seq": seq, "chunk": body}


def test_subscribed_always_refetches_and_invalidations_only_when_newer() -> None:
    state = ThreadState(T)
    assert state.subscribed(3).force
    assert state.apply_snapshot(snap(3))
    assert state.invalidate(3) is None and state.invalidate(2) is None
    refetch = state.invalidate(4)
    assert refetch is not None and not refetch.force
    assert state.wants_more()


def test_an_older_snapshot_never_replaces_a_newer_one() -> None:
    state = ThreadState(T)
    assert state.apply_snapshot(snap(5))
    assert not state.apply_snapshot(snap(4))
    assert state.version == 5 and state.discarded == 1


def test_live_chunks_in_order_duplicates_dropped_gap_asks_once() -> None:
    state = ThreadState(T)
    state.apply_snapshot(snap(2, {"id": "run_a", "status": "running", "next_seq": 0}))
    assert state.chunk(chunk(0)) is None
    assert state.chunk(chunk(0)) is None  # duplicate
    assert state.chunk(chunk(1)) is None
    gap = state.chunk(chunk(3))
    assert gap is not None and gap.reason == "gap" and gap.force
    assert state.chunk(chunk(4)) is None  # the same hole: asked already
    assert state.live_text() == "<0><1>"
    assert state.chunk(chunk(2)) is None
    assert state.live_text() == "<0><1><2><3><4>"


def test_a_snapshot_prunes_committed_chunks_and_a_terminal_run_drops_the_live_run() -> None:
    state = ThreadState(T)
    state.apply_snapshot(snap(2, {"id": "run_a", "status": "running", "next_seq": 0}))
    for seq in range(4):
        state.chunk(chunk(seq))
    state.apply_snapshot(snap(3, {"id": "run_a", "status": "running", "next_seq": 2}))
    assert state.live_text() == "<2><3>"
    state.apply_snapshot(snap(4, {"id": "run_a", "status": "completed", "next_seq": 4}))
    assert state.run is None and state.live_text() == ""
    assert state.chunk(chunk(4)) is None and state.run is None  # a retired run stays retired


def test_takeover_voids_the_uncommitted_step_and_forces_a_refetch() -> None:
    state = ThreadState(T)
    state.apply_snapshot(snap(2, {"id": "run_a", "status": "running", "next_seq": 2}))
    for seq in range(2, 6):
        state.chunk(chunk(seq))
    refetch = state.chunk(chunk(2, type="run-takeover", episode=2))
    assert refetch is not None and refetch.reason == "run-takeover" and refetch.force
    assert state.chunk(chunk(2, type="run-takeover", episode=2)) is None  # repeated
    assert state.chunk(chunk(3)) is None
    assert state.live_text() == "<3>"


def test_a_new_run_after_the_snapshot_is_kept_when_its_chunks_came_during_the_fetch() -> None:
    state = ThreadState(T)
    state.apply_snapshot(snap(2, {"id": "run_a", "status": "completed", "next_seq": 5}))
    started = state.ordinal
    state.chunk(chunk(0, run_id="run_b"))
    # The fetch began before run_b's first chunk: its snapshot may predate run_b.
    state.apply_snapshot(snap(3, {"id": "run_a", "status": "completed", "next_seq": 5}), started)
    assert state.run is not None and state.live_text() == "<0>"
    # A snapshot fetched after it arrived and naming another run means run_b is committed.
    state.apply_snapshot(snap(4, {"id": "run_a", "status": "completed", "next_seq": 5}))
    assert state.run is None


def test_foreign_threads_and_malformed_chunks_are_ignored() -> None:
    state = ThreadState(T)
    assert state.chunk({**chunk(0), "thread_id": "other"}) is None
    assert state.chunk({**chunk(0), "seq": "x"}) is None
    assert state.run is None
