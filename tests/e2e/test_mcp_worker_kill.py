"""A worker SIGKILLed after an approved, non-idempotent MCP tool ran and before its result was
committed: the takeover does not call it again (the server counts), the model is told
"interrupted; may or may not have run"."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx

from runtime.engine.toolcalls import INTERRUPTED
from tests.e2e import harness
from tests.mcp_servers import http_test_server

RUN_TIMEOUT = 60.0


async def wait_snapshot(http: httpx.AsyncClient, thread_id: str, check: Any) -> dict[str, Any]:
    deadline = time.monotonic() + RUN_TIMEOUT
    snapshot: dict[str, Any] = {}
    while time.monotonic() < deadline:
        snapshot = (await http.get(f"/v1/threads/{thread_id}")).json()
        if check(snapshot):
            return snapshot
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out: {snapshot}")


def tool_part(snapshot: dict[str, Any]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        p for m in snapshot["messages"] for p in m["parts"] if p["type"] == "tool-call"
    ]
    assert len(parts) == 1, parts
    return parts[0]


async def test_a_takeover_does_not_rerun_a_destructive_mcp_tool(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.touch()  # the server answers delete_record only once this file is gone
    with http_test_server(tmp_path, {"MCP_TEST_HOLD": str(hold)}) as mcp_server:
        servers = [{"type": "http", "name": "tests", "url": mcp_server.url}]
        env = harness.server_env(
            harness.sqlite_url(tmp_path),
            {
                "THREADLINE_AGENT": "tests.mcp_agent:agent",
                "THREADLINE_MCP_SERVERS": json.dumps(servers),
                "THREADLINE_LEASE_TTL": "1",
                "THREADLINE_POLL_INTERVAL": "0.2",
            },
        )
        first = harness.start("all", env, log_dir=tmp_path)
        token = first.token("kill", "user", "alice")
        approver = first.token("kill", "user", "bob")
        async with httpx.AsyncClient(
            base_url=first.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
        ) as http:
            thread_id = (await http.post("/v1/threads", json={})).json()["thread"]["id"]
            sent = await http.post(f"/v1/threads/{thread_id}/messages", json={"text": "delete r7"})
            assert sent.status_code == 202, sent.text
            waiting = await wait_snapshot(http, thread_id, lambda s: s["pending_actions"])
            (action,) = waiting["pending_actions"]
            assert action["tool_name"] == "tests__delete_record"
            resumed = await http.post(
                f"/v1/threads/{thread_id}/actions/{action['id']}/resume",
                json={"payload": {"approved": True}},
                headers={"Authorization": f"Bearer {approver}"},
            )
            assert resumed.status_code == 200, resumed.text
            # The tool ran on the server (counted) and holds its answer: kill the worker now.
            deadline = time.monotonic() + RUN_TIMEOUT
            while not mcp_server.events("delete_record"):
                assert time.monotonic() < deadline, "the tool never ran"
                await asyncio.sleep(0.05)
            running = tool_part((await http.get(f"/v1/threads/{thread_id}")).json())
            assert running["state"] == "running"
            first.process.kill()
            first.process.wait(10)
            first.stop()  # closes its log
        hold.unlink()
        second = harness.start("all", env, log_dir=tmp_path)
        try:
            async with httpx.AsyncClient(
                base_url=second.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
            ) as http:
                final = await wait_snapshot(
                    http,
                    thread_id,
                    lambda s: s["run"] and s["run"]["status"] in ("completed", "failed"),
                )
        finally:
            second.stop()
    assert final["run"]["status"] == "completed", final
    part = tool_part(final)
    assert part["state"] == "output-error" and part["error"] == INTERRUPTED
    assert len(mcp_server.events("delete_record")) == 1  # ran once, never again
