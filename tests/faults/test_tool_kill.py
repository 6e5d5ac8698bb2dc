"""A worker killed after a non-idempotent tool had its effect, before the result's commit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.domain import Role
from runtime.engine.toolcalls import INTERRUPTED
from runtime.storage import PostgresStore
from server.auth import create_token
from tests.e2e import harness
from tests.faults.agent import EFFECTS_ENV, LINGER_ENV
from tests.faults.invariants import check_store
from tests.faults.test_outage import settled
from tests.services import require_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

ITERATIONS = 2


async def _wait_for_effect(path: Path, timeout: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await asyncio.to_thread(lambda: path.exists() and bool(path.read_text())):
        if loop.time() > deadline:
            raise AssertionError("the tool never ran")
        await asyncio.sleep(0.05)


async def test_killed_between_tool_effect_and_commit(database: str, tmp_path: Path) -> None:
    async with PostgresStore(database) as store:
        token = await create_token(store, subject="alice", role=Role.USER, scopes=["acme"])
    killed = 0
    for i in range(ITERATIONS):
        effects = tmp_path / f"effects-{i}.txt"
        env = harness.server_env(
            database,
            {
                "THREADLINE_REDIS_URL": require_redis(),
                "THREADLINE_AGENT": "tests.faults.agent:fault_agent",
                "THREADLINE_LEASE_TTL": "1.5",
                "THREADLINE_POLL_INTERVAL": "0.2",
                EFFECTS_ENV: str(effects),
                LINGER_ENV: "60",
            },
        )
        first = await asyncio.to_thread(harness.start, "all", env, log_dir=tmp_path)
        second = None
        try:
            async with httpx.AsyncClient(
                base_url=first.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
            ) as client:
                created = await client.post("/v1/threads", json={"title": f"kill {i}"})
                thread_id = created.json()["thread"]["id"]
                sent = await client.post(
                    f"/v1/threads/{thread_id}/messages", json={"text": f"email to b{i}@x.org"}
                )
                assert sent.status_code == 202, sent.text
                await _wait_for_effect(effects)
            first.process.kill()  # SIGKILL: the result is never committed
            killed += 1
            await asyncio.to_thread(first.stop)
            second = await asyncio.to_thread(
                harness.start, "all", {**env, LINGER_ENV: "0"}, log_dir=tmp_path
            )
            async with httpx.AsyncClient(
                base_url=second.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
            ) as client:
                final: dict[str, Any] = await settled(client, thread_id, 30)
        finally:
            await asyncio.to_thread(first.stop)
            if second is not None:
                await asyncio.to_thread(second.stop)
        # Executed at most once: the takeover did not run the non-idempotent tool again.
        assert len(effects.read_text().splitlines()) == 1
        assert final["run"]["status"] == "completed"
        tools = [p for m in final["messages"] for p in m["parts"] if p["type"] == "tool-call"]
        assert len(tools) == 1
        assert tools[0]["state"] == "output-error" and tools[0]["error"] == INTERRUPTED
        # The model saw the interrupted error and answered from it.
        assert final["messages"][-1]["parts"][-1]["text"] == "I did not send the email."
    report = await check_store(database)
    print(
        f"\nworker killed between tool effect and commit: iterations={ITERATIONS}"
        f" faults injected={killed} {report.summary()}"
    )
    assert report.violations == []
