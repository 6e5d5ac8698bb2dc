"""An approval deadline whose worker is SIGKILLed while it holds the timer's lease, just before
the fire: after takeover the deadline fires exactly once (escalation, then the expiry), every
websocket watcher converges to the committed snapshot, and the audit chain verifies."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.e2e import cluster, harness
from tests.e2e.follower import Follower
from tests.faults.deadline_agent import MARKER_ENV

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
T = "/v1/threads"
TIMEOUT = 40.0


async def _poll(what: str, probe: Any, timeout: float = TIMEOUT) -> Any:
    """`await probe()` until it returns something truthy; bounded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = await probe()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} never happened")


async def _lease_owner(database_url: str) -> str | None:
    """The owner of the approval deadline's timer lease, once a worker holds it."""
    connection = await asyncpg.connect(database_url)
    try:
        owner = await connection.fetchval(
            "SELECT owner FROM timers WHERE kind = 'approval_deadline' AND owner IS NOT NULL"
        )
        return None if owner is None else str(owner)
    finally:
        await connection.close()


@pytest.fixture
def deadline_cluster(tmp_path: Path) -> Iterator[cluster.Cluster]:
    extra = {
        "PYTHONPATH": str(harness.ROOT),
        "THREADLINE_AGENT": "tests.faults.deadline_agent:agent",
        "THREADLINE_DEMO_DELAY_MS": "0",
        "THREADLINE_TIMER_LEASE_TTL": "1.5",
        "THREADLINE_TIMER_POLL_INTERVAL": "0.1",
        MARKER_ENV: str(tmp_path / "lingering"),
    }
    with cluster.cluster(["gateway", "worker", "worker"], extra=extra, log_dir=tmp_path) as run:
        yield run


async def test_deadline_fires_once_after_its_worker_is_killed(
    deadline_cluster: cluster.Cluster,
) -> None:
    run = deadline_cluster
    marker = Path(run.env[MARKER_ENV])
    tokens = run.tokens(
        {
            "alice": ("acme", "user", "alice"),
            "olga": ("acme", "user", "olga"),
            "admin": ("acme", "admin", "root"),
        }
    )
    gateway = run.gateways[0]
    headers = {"Authorization": f"Bearer {tokens['admin']}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=30) as http:
        created = await http.post(T, json={})
        thread_id = created.json()["thread"]["id"]
        watchers = [
            Follower(gateway.url, gateway.ws_url, tokens[who], name=who)
            for who in ("alice", "olga", "admin")
        ]
        for watcher in watchers:
            await watcher.__aenter__()
        try:
            for watcher in watchers:
                await watcher.subscribe(thread_id)
            sent = await http.post(f"{T}/{thread_id}/messages", json={"text": "email d@x.io"})
            assert sent.status_code == 202, sent.text

            async def waiting() -> dict[str, Any] | None:
                snap: dict[str, Any] = (await http.get(f"{T}/{thread_id}")).json()
                return snap if snap["pending_actions"] else None

            first = (await _poll("the suspension", waiting))["pending_actions"][0]
            assert first["approval"]["stage"] == 0
            assert first["approval"]["waiting_for"] == "group ops"
            assert first["approval"]["due_at"] is not None

            # The worker holding the lease is the one the owner names (its pid).
            owner = await _poll("a claim", lambda: _lease_owner(run.env["THREADLINE_DATABASE_URL"]))
            await _poll("the linger", lambda: asyncio.to_thread(marker.exists))
            pid = int(owner.split("-")[1].split("_")[0])
            [holder] = [p for p in run.processes if p.process.pid == pid]
            assert holder.role == "worker"
            holder.process.kill()  # SIGKILL while it holds the lease, before the fire
            await asyncio.to_thread(holder.process.wait)

            async def ended() -> dict[str, Any] | None:
                snap: dict[str, Any] = (await http.get(f"{T}/{thread_id}")).json()
                status = snap["run"]["status"]
                return snap if status in ("completed", "failed", "cancelled") else None

            final = await _poll("the run's end", ended)
            audit = (await http.get("/v1/audit", params={"thread": thread_id})).json()
            for watcher in watchers:
                await watcher.converge(await watcher.server_snapshot())
        finally:
            for watcher in watchers:
                await watcher.__aexit__(None, None, None)
    for process in run.processes:
        if process is not holder:
            assert process.alive(), f"{process.role} died\n{run.logs()}"
    verified = await asyncio.to_thread(
        harness.run_command, ["audit", "verify", "--scope", "acme"], run.env
    )

    # Committed state: one escalation, one expiry, one model-visible result, the run went on.
    events = [entry["event"] for entry in audit["entries"]]
    print(f"killed worker {pid}; audit events {events}")
    assert events == ["action.escalated", "action.expired.deny"], events
    assert all(entry["subject"] == "system" for entry in audit["entries"])
    assert final["run"]["status"] == "completed", final["run"]
    assert final["pending_actions"] == []
    tool_parts = [
        part
        for message in final["messages"]
        for part in message["parts"]
        if part["type"] == "tool-call"
    ]
    assert len(tool_parts) == 1
    [part] = tool_parts
    assert part["state"] == "rejected"
    assert part["error"] == "expired: neither ops nor finance answered"
    resolution = part["waiting"]["resolution"]
    assert (resolution["subject"], resolution["by_deadline"]) == ("system", "deny")
    assert part["waiting"]["approval"]["stage"] == 1
    assert verified.returncode == 0, verified.stdout + verified.stderr
