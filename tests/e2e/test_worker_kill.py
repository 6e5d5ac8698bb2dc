"""A worker SIGKILLed mid-step: another takes the run over, nothing is lost or duplicated."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e import cluster
from tests.e2e.follower import Follower
from tests.services import require_postgres, require_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

RUN_TIMEOUT = 30.0


@pytest.fixture
def running() -> Iterator[cluster.Cluster]:
    require_postgres()
    require_redis()
    with cluster.cluster(["gateway"]) as started:
        yield started


def seqs(chunks: list[dict[str, Any]]) -> list[int]:
    return [int(c["seq"]) for c in chunks]


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["chunk"]["delta"] for c in chunks if c["chunk"]["type"] == "text-delta")


async def wait_completed(follower: Follower) -> dict[str, Any]:
    deadline = time.monotonic() + RUN_TIMEOUT
    snapshot: dict[str, Any] = {}
    while time.monotonic() < deadline:
        snapshot = await follower.server_snapshot()
        if snapshot["run"] and snapshot["run"]["status"] in ("completed", "failed"):
            return snapshot
        await asyncio.sleep(0.05)
    raise AssertionError(f"the run never ended: {snapshot}")


async def test_sigkilled_worker_is_taken_over(running: cluster.Cluster) -> None:
    # Worker A: a 1 s lease (renewed every third of it) and a slow stream: 40 ms per piece.
    (worker_a,) = running.start(
        ["worker"], {"THREADLINE_LEASE_TTL": "1", "THREADLINE_DEMO_DELAY_MS": "40"}
    )
    gateway = running.gateways[0]
    token = running.tokens({"alice": ("kill", "user", "alice")})["alice"]
    text = " ".join(f"part{i:02d}" for i in range(60))  # about 75 pieces: 3 s at 40 ms
    async with Follower(gateway.url, gateway.ws_url, token, "watcher") as watcher:
        async with httpx.AsyncClient(
            base_url=gateway.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
        ) as http:
            thread = (await http.post("/v1/threads", json={})).json()["thread"]
            await watcher.subscribe(thread["id"])
            response = await http.post(f"/v1/threads/{thread['id']}/messages", json={"text": text})
            assert response.status_code == 202, response.text
            sent = response.json()
        run_id = sent["run_id"]
        await watcher.wait_for(lambda f: len(f.chunks(run_id)) >= 10)
        worker_a.process.kill()  # SIGKILL: no shutdown, the lease simply stops being renewed
        worker_a.process.wait(timeout=10)
        before_kill = [dict(c) for c in watcher.chunks(run_id)]
        held_at_kill = watcher.snapshot
        assert held_at_kill is not None
        running.start(["worker"], {"THREADLINE_LEASE_TTL": "5", "THREADLINE_DEMO_DELAY_MS": "10"})

        def taken_over(f: Follower) -> bool:
            return any(c["chunk"]["type"] == "run-takeover" for c in f.chunks(run_id))

        await watcher.wait_for(taken_over, RUN_TIMEOUT)
        # A client joining after the takeover gets the replay of the redone step.
        async with Follower(gateway.url, gateway.ws_url, token, "late") as late:
            await late.subscribe(thread["id"])
            final = await wait_completed(watcher)
            await watcher.converge(final)
            await late.converge(final)

    assert final["run"]["status"] == "completed", final
    assert final["run"]["id"] == run_id
    # Nothing committed lost, nothing duplicated: one user message, one complete reply.
    assert [m["role"] for m in final["messages"]] == ["user", "assistant"]
    assert final["messages"][0]["id"] == sent["message_id"]
    assert "".join(p["text"] for p in final["messages"][0]["parts"]) == text
    assert "".join(p["text"] for p in final["messages"][1]["parts"]) == f"You said: {text}"
    held = held_at_kill["messages"]
    assert final["messages"][: len(held)] == held
    assert final["thread"]["version"] >= held_at_kill["thread"]["version"]

    # What the watcher saw: episode 1 gap-free from 0, then the takeover chunk at the committed
    # next_seq, then episode 2 gap-free up to the final commit's next_seq.
    chunks = watcher.chunks(run_id)
    cut = next(i for i, c in enumerate(chunks) if c["chunk"]["type"] == "run-takeover")
    first, takeover, second = chunks[:cut], chunks[cut], chunks[cut + 1 :]
    assert seqs(first) == list(range(len(first))) and len(first) >= len(before_kill)
    assert takeover["chunk"]["episode"] >= 2
    assert takeover["seq"] <= len(first)
    assert seqs(second) == list(range(takeover["seq"] + 1, takeover["seq"] + 1 + len(second)))
    assert second[-1]["chunk"]["type"] == "step-finish"
    assert final["run"]["next_seq"] == second[-1]["seq"] + 1
    assert text_of(second) == f"You said: {text}"
    assert f"You said: {text}".startswith(text_of(first))
    assert watcher.reasons["run-takeover"] == 1
    # ThreadVersions only ever grew, in invalidations and in the fetched snapshots.
    versions = watcher.invalidations()
    assert versions == sorted(set(versions)) and versions[-1] == final["thread"]["version"]
    fetched = [s["thread"]["version"] for s in watcher.snapshots]
    assert fetched == sorted(fetched)
    # The late joiner's replay is the redone step from the takeover on, without the dead
    # episode's chunks (they reuse the same seqs).
    late_chunks = late.chunks(run_id)
    assert late_chunks[0] == takeover, [(c["seq"], c["chunk"]["type"]) for c in late_chunks]
    assert seqs(late_chunks) == seqs([takeover, *second])
    assert text_of(late_chunks) == f"You said: {text}"
