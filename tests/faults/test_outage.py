"""A real server process loses Postgres for seconds mid-run (proxy outage, then a stall)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from realtime import connect_bus, open_bus
from realtime.channels import thread_channel
from runtime.domain import Role
from runtime.storage import PostgresStore
from server.auth import create_token
from tests.e2e import harness
from tests.faults.conftest import via
from tests.faults.invariants import Observed, check_store
from tests.faults.proxy import ProxyFactory
from tests.services import require_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

# About 60 chunks at 20 ms: the reply streams for 1.5-2 s, so a fault that starts 0.5 s in and
# lasts 3 s is still on when the step commits (and the run transition after it).
PROMPT = "a long enough message to stream for a while " * 7
FAULT_SECONDS = 3.0


@contextlib.asynccontextmanager
async def observe(thread_id: str, observed: Observed) -> AsyncIterator[None]:
    """Record the server's live chunks and invalidations for `thread_id` (default prefix)."""
    bus = open_bus(require_redis())
    await connect_bus(bus, timeout=10)
    ready = asyncio.Event()

    async def pump() -> None:
        async with bus.subscribe(thread_channel(thread_id)) as subscription:
            ready.set()
            async for data in subscription:
                observed.record(orjson.loads(data))

    task = asyncio.create_task(pump())
    try:
        await asyncio.wait_for(ready.wait(), 5)
        yield
    finally:
        await asyncio.sleep(0.2)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await bus.close()


async def settled(client: httpx.AsyncClient, thread_id: str, timeout: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        response = await client.get(f"/v1/threads/{thread_id}")
        if response.status_code == 200:
            snapshot: dict[str, Any] = response.json()
            run = snapshot.get("run")
            if run and run["status"] in ("completed", "failed", "cancelled"):
                return snapshot
        if loop.time() > deadline:
            raise AssertionError(f"run did not settle: {response.text[:2000]}")
        await asyncio.sleep(0.2)


async def test_postgres_outage_mid_run(
    database: str, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    async with PostgresStore(database) as store:
        token = await create_token(store, subject="alice", role=Role.USER, scopes=["acme"])
    observed = Observed()
    faults = ("outage", "stall")
    async with make_proxy() as proxy:
        env = harness.server_env(
            via(database, proxy),
            {
                "THREADLINE_REDIS_URL": require_redis(),
                "THREADLINE_DEMO_DELAY_MS": "20",
                "THREADLINE_POLL_INTERVAL": "0.2",
            },
        )
        server = await asyncio.to_thread(harness.start, "all", env, log_dir=tmp_path)
        try:
            async with httpx.AsyncClient(
                base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=40
            ) as client:
                for fault in faults:
                    created = await client.post("/v1/threads", json={"title": fault})
                    thread_id = created.json()["thread"]["id"]
                    async with observe(thread_id, observed):
                        sent = await client.post(
                            f"/v1/threads/{thread_id}/messages", json={"text": PROMPT}
                        )
                        assert sent.status_code == 202, sent.text
                        await asyncio.sleep(0.5)  # mid-stream
                        if fault == "outage":
                            await proxy.outage(FAULT_SECONDS)
                        else:
                            await proxy.stall(FAULT_SECONDS)
                        final = await settled(client, thread_id, 60)
                    assert final["run"]["status"] == "completed", server.log()[-3000:]
                    replies = [m for m in final["messages"] if m["role"] == "assistant"]
                    assert len(replies) == 1
                    assert replies[0]["parts"][0]["text"] == f"You said: {PROMPT}"
        finally:
            await asyncio.to_thread(server.stop)
    # Ridden out by the storage retries, not by a takeover after the lease ran out.
    conn = await asyncpg.connect(database)
    try:
        episodes = [row["episode"] for row in await conn.fetch("SELECT episode FROM runs")]
    finally:
        await conn.close()
    assert episodes == [1, 1]
    report = await check_store(database, observed)
    print(
        f"\npostgres outage/stall mid-run: iterations={len(faults)} faults injected="
        f"{proxy.faults} (each {FAULT_SECONDS}s) {report.summary()}"
    )
    assert report.violations == []
