"""The shared convergence vectors (tests/vectors/convergence/) replayed by the Python client.

The same files run in node through the TypeScript core (clients/typescript/test/) and in
Chromium through the static page's bundle (tests/browser/test_core_vectors.py). Here they feed
`threadline_client.convergence.ThreadState`, scheduled as `ThreadWatch` schedules it: at most
one fetch in flight, one more queued behind it (forced, or for a newer announced version).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from threadline_client.convergence import Refetch, ThreadState
from threadline_client.models import Snapshot

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "convergence"
FILES = sorted(VECTORS.glob("*.json"))


@dataclass
class Replay:
    """A ThreadState and the fetch scheduling around it; fetches answer in order."""

    state: ThreadState
    fetches: int = 0
    outstanding: list[int] = field(default_factory=list)  # ordinal at each fetch's start
    queued: bool = False
    force_pending: bool = False

    def trigger(self, refetch: Refetch | None) -> None:
        if refetch is None:
            return
        self.force_pending = self.force_pending or refetch.force
        if self.outstanding:
            self.queued = True
        else:
            self.start()

    def start(self) -> None:
        self.fetches += 1
        self.force_pending = False
        self.queued = False
        self.outstanding.append(self.state.ordinal)

    def answer(self, snapshot: dict[str, Any]) -> None:
        ordinal = self.outstanding.pop(0)
        self.state.apply_snapshot(Snapshot.model_validate(snapshot), ordinal)
        if self.queued and (self.force_pending or self.state.wants_more()):
            self.start()
        self.queued = False

    def frame(self, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        if kind == "subscribed":
            self.trigger(self.state.subscribed(frame["version"]))
        elif kind == "invalidate":
            self.trigger(self.state.invalidate(frame["version"]))
        elif kind == "resync":
            self.trigger(self.state.resync())
        elif kind == "chunk":
            self.trigger(self.state.chunk(frame))
        else:
            raise AssertionError(f"unknown frame type {kind}")

    def observe(self) -> dict[str, Any]:
        snap = self.state.snapshot
        return {
            "version": self.state.version,
            "live_run": self.state.run.id if self.state.run is not None else None,
            "live_text": self.state.live_text(),
            "run_status": snap.run.status if snap is not None and snap.run is not None else None,
            "pending_actions": [a.id for a in snap.pending_actions] if snap is not None else [],
            "fetches": self.fetches,
            "inflight": bool(self.outstanding),
            "discarded": self.state.discarded,
        }


def mismatches(where: str, want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    return [
        f"{where}: {key} is {got[key]!r}, expected {value!r}"
        for key, value in want.items()
        if got[key] != value
    ]


def replay(vector: dict[str, Any]) -> list[str]:
    run = Replay(ThreadState(vector["thread_id"]))
    failures: list[str] = []
    for index, step in enumerate(vector["steps"]):
        where = f"{vector['name']} step {index}"
        if "frame" in step:
            run.frame(step["frame"])
        elif "answer" in step:
            if not run.outstanding:
                failures.append(f"{where}: a snapshot answers, but no fetch is outstanding")
                continue
            run.answer(step["answer"])
        if "expect" in step:
            failures += mismatches(where, step["expect"], run.observe())
    return failures + mismatches(f"{vector['name']} final", vector["final"], run.observe())


def test_there_are_vectors() -> None:
    assert len(FILES) >= 8, FILES


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_vector(path: Path) -> None:
    vector = json.loads(path.read_text())
    assert vector["name"] == path.stem
    assert replay(vector) == []
