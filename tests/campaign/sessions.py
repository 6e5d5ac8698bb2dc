"""A websocket session of a campaign client: a Follower whose snapshot fetches ride out faults."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from tests.e2e.follower import Follower

FETCH_PATIENCE = 30.0  # a gateway restart or a Postgres outage lasts seconds, never this long


class Session(Follower):
    """One websocket connection of one client (its name is the history's session key)."""

    async def server_snapshot(self) -> dict[str, Any]:
        deadline = time.monotonic() + FETCH_PATIENCE
        while True:
            try:
                response = await self.http("GET", f"/v1/threads/{self.thread_id}")
                if response.status_code == 200:
                    return dict(response.json())
                if response.status_code < 500:
                    raise AssertionError(f"snapshot answered {response.status_code}")
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no snapshot for {FETCH_PATIENCE:.0f} s")
            await asyncio.sleep(0.2)

    @property
    def broken(self) -> bool:
        reader = self._reader
        return bool(self.errors) or reader is None or reader.done()

    def frames_seen(self) -> list[dict[str, Any]]:
        return [r.frame for r in self.frames]

    def versions_applied(self) -> list[int]:
        return [int(s["thread"]["version"]) for s in self.snapshots]
