"""The shared convergence vectors (tests/vectors/convergence/) replayed by the Python client.

The same files run in node through the TypeScript core (clients/typescript/test/) and in
Chromium through the static page's bundle (tests/browser/test_core_vectors.py). Here they feed
the client's own `ThreadWatch` (its `ThreadState` and its refetch scheduling: one fetch in
flight, one more owed behind it), with the websocket left out: frames go to the handlers the
socket loop calls, and snapshot fetches wait for the vector's answers.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest

from threadline_client import ThreadlineClient
from threadline_client.models import Snapshot
from threadline_client.watch import ThreadWatch

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "convergence"
FILES = sorted(VECTORS.glob("*.json"))
LOADED = {path: json.loads(path.read_text()) for path in FILES}


class Snapshots:
    """Stands in for the HTTP client: each `snapshot` call waits for the vector's next answer."""

    def __init__(self) -> None:
        self.calls = 0
        self.outstanding: list[asyncio.Future[Snapshot]] = []

    async def snapshot_with_wire(self, thread_id: str) -> tuple[Snapshot, dict[str, Any]]:
        self.calls += 1
        future: asyncio.Future[Snapshot] = asyncio.get_running_loop().create_future()
        self.outstanding.append(future)
        snapshot = await future
        return snapshot, snapshot.model_dump(mode="json", by_alias=True)


async def settle() -> None:
    for _ in range(10):  # the fetch loop's few awaits; bounded
        await asyncio.sleep(0)


def feed(watch: ThreadWatch, frame: dict[str, Any]) -> None:
    if frame["type"] == "subscribed":
        # The subscribe answer, as `_on_open` hands it over.
        watch._trigger(watch.state.subscribed(int(frame["version"])))
    elif frame["type"] in ("invalidate", "resync", "chunk"):
        watch._on_frame(frame)
    else:
        raise AssertionError(f"unknown frame type {frame['type']}")


def observe(watch: ThreadWatch, http: Snapshots) -> dict[str, Any]:
    state, snap = watch.state, watch.state.snapshot
    return {
        "version": state.version,
        "live_run": state.run.id if state.run is not None else None,
        "live_text": state.live_text(),
        "run_status": snap.run.status if snap is not None and snap.run is not None else None,
        "pending_actions": [a.id for a in snap.pending_actions] if snap is not None else [],
        "fetches": http.calls,
        "inflight": bool(http.outstanding),
        "discarded": state.discarded,
    }


def mismatches(where: str, want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    return [
        f"{where}: {key} is {got[key]!r}, expected {value!r}"
        for key, value in want.items()
        if got[key] != value
    ]


async def replay(vector: dict[str, Any]) -> list[str]:
    http = Snapshots()
    watch = ThreadWatch(cast(ThreadlineClient, http), vector["thread_id"])
    failures: list[str] = []
    try:
        for index, step in enumerate(vector["steps"]):
            where = f"{vector['name']} step {index}"
            if "frame" in step:
                feed(watch, step["frame"])
            elif "answer" in step:
                if not http.outstanding:
                    failures.append(f"{where}: a snapshot answers, but no fetch is outstanding")
                    continue
                http.outstanding.pop(0).set_result(Snapshot.model_validate(step["answer"]))
            await settle()
            if "expect" in step:
                failures += mismatches(where, step["expect"], observe(watch, http))
        return failures + mismatches(
            f"{vector['name']} final", vector["final"], observe(watch, http)
        )
    finally:
        await watch.aclose()


def test_there_are_vectors() -> None:
    assert len(FILES) >= 8, FILES


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_vector(path: Path) -> None:
    vector = LOADED[path]
    assert vector["name"] == path.stem
    assert await replay(vector) == []
