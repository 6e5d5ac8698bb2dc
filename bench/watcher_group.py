"""Watchers of one thread for bench/watchers.py: in its process, or in a process of their own.

A watcher holds a websocket on one gateway, subscribed to the thread, and does what a careful
client does on an `invalidate` newer than the snapshot it holds: with deltas (`"deltas": true`
in its subscribe) it applies the frame's delta when it starts at the held version
(threadline_wire.snapshot_delta.apply); otherwise it refetches `GET /v1/threads/{id}` from its
own gateway with `If-None-Match` of the snapshot it holds. Each watcher records when it first
held each version (`time.perf_counter`, CLOCK_MONOTONIC: one clock for every process of the
box), so a commit's convergence is measured the same way in and out of process.

    python bench/watcher_group.py CONFIG_JSON

runs a group in a process of its own: it prints `{"ready": true}` once its watchers are open,
then answers each `{"target": version}` line on stdin with `{"at": [...], "counts": [...]}`
(when each watcher first held that version or newer, and its refetches, 304s and deltas so
far); `{"stop": true}` or the end of stdin closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from threadline_wire.snapshot_delta import DeltaMismatch, apply

OPEN_CONCURRENCY = 50


async def get(http: httpx.AsyncClient, path: str, headers: dict[str, str]) -> httpx.Response:
    """A GET, tried once more if the server had closed the idle keep-alive connection."""
    try:
        return await http.get(path, headers=headers)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return await http.get(path, headers=headers)


async def patch(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    """A PATCH, tried once more if the server had closed the idle keep-alive connection (it was
    not read then: a rename is the same commit either way)."""
    try:
        return await http.patch(path, json=body)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return await http.patch(path, json=body)


@dataclass
class Watcher:
    ws: ClientConnection
    http: httpx.AsyncClient
    thread_id: str
    progress: asyncio.Event
    held: int = 0
    etag: str | None = None
    wire: dict[str, Any] = field(default_factory=dict)
    reached: list[tuple[int, float]] = field(default_factory=list)  # (version, first held at)
    refetches: int = 0
    not_modified: int = 0
    applied: int = 0

    async def follow(self) -> None:
        """On every invalidation newer than the held version: apply its delta when it starts
        at the held version, else refetch (one in flight)."""
        async for data in self.ws:
            frame = orjson.loads(data)
            if frame.get("type") not in ("invalidate", "resync"):
                continue
            if frame.get("version", self.held + 1) <= self.held:
                continue
            before = self.held
            if not self._apply(frame):
                await self._refetch()
            if self.held > before:
                self.reached.append((self.held, time.perf_counter()))
                self.progress.set()

    def first_held(self, version: int) -> float | None:
        return next((at for held, at in self.reached if held >= version), None)

    def _apply(self, frame: dict[str, Any]) -> bool:
        delta = frame.get("delta")
        if not isinstance(delta, dict) or delta.get("from") != self.held:
            return False
        try:
            self.wire = apply(self.wire, {k: v for k, v in delta.items() if k != "etag"})
        except DeltaMismatch:
            return False
        self.held, self.etag = self.wire["thread"]["version"], delta.get("etag")
        self.applied += 1
        return True

    async def _refetch(self) -> None:
        headers = {"If-None-Match": self.etag} if self.etag else {}
        got = await get(self.http, f"/v1/threads/{self.thread_id}", headers)
        self.refetches += 1
        if got.status_code == 200:
            self.wire = got.json()
            self.held = self.wire["thread"]["version"]
            self.etag = got.headers.get("etag")
        elif got.status_code == 304:
            self.not_modified += 1


class WatcherGroup:
    """`count` watchers over `gateways` ((http URL, websocket URL) pairs, watcher n on gateway
    (offset + n) mod their number), in this process."""

    def __init__(
        self,
        gateways: list[tuple[str, str]],
        token: str,
        thread_id: str,
        count: int,
        deltas: bool,
        offset: int = 0,
    ) -> None:
        self.gateways, self.token, self.thread_id = gateways, token, thread_id
        self.count, self.deltas, self.offset = count, deltas, offset
        self.watchers: list[Watcher] = []
        self._progress = asyncio.Event()
        self._stack = contextlib.AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> WatcherGroup:
        headers = {"Authorization": f"Bearer {self.token}"}
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        clients = [
            await self._stack.enter_async_context(
                httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits)
            )
            for url, _ in self.gateways
        ]
        gate = asyncio.Semaphore(OPEN_CONCURRENCY)

        async def one(n: int) -> Watcher:
            at = (self.offset + n) % len(self.gateways)
            async with gate:
                ws = await connect(
                    self.gateways[at][1],
                    subprotocols=["threadline.v1", f"bearer.{self.token}"],  # type: ignore[list-item]
                    open_timeout=60,
                    max_size=2**24,
                )
                frame = {"type": "subscribe", "thread_id": self.thread_id, "deltas": self.deltas}
                await ws.send(orjson.dumps(frame).decode())
                while orjson.loads(await ws.recv())["type"] != "subscribed":
                    pass
            watcher = Watcher(ws, clients[at], self.thread_id, self._progress)
            snapshot = await get(watcher.http, f"/v1/threads/{self.thread_id}", {})
            watcher.wire, watcher.etag = snapshot.json(), snapshot.headers["etag"]
            watcher.held = watcher.wire["thread"]["version"]
            return watcher

        self.watchers = list(await asyncio.gather(*(one(n) for n in range(self.count))))
        self._tasks = [asyncio.create_task(w.follow()) for w in self.watchers]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for watcher in self.watchers:
            await watcher.ws.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stack.aclose()

    async def target(self, version: int) -> tuple[list[float], list[int]]:
        """Wait until every watcher held `version` or newer: when each first did, and the
        group's refetches, 304s and deltas applied so far."""
        async with asyncio.timeout(120):
            while any(w.held < version for w in self.watchers):
                self._progress.clear()
                await self._progress.wait()
        at = [w.first_held(version) or time.perf_counter() for w in self.watchers]
        return at, self.counts()

    def counts(self) -> list[int]:
        return [
            sum(w.refetches for w in self.watchers),
            sum(w.not_modified for w in self.watchers),
            sum(w.applied for w in self.watchers),
        ]


class RemoteGroup:
    """A `WatcherGroup` in a process of its own (this script), driven over its stdin/stdout."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> RemoteGroup:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            orjson.dumps(self.config).decode(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        await self._answer()  # {"ready": true}
        return self

    async def _answer(self) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        async with asyncio.timeout(300):
            line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError("a watcher process ended early")
        answer: dict[str, Any] = orjson.loads(line)
        return answer

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(orjson.dumps(message) + b"\n")
        await self.process.stdin.drain()

    async def target(self, version: int) -> tuple[list[float], list[int]]:
        await self.send({"target": version})
        answer = await self._answer()
        return answer["at"], answer["counts"]

    async def __aexit__(self, *exc: object) -> None:
        if self.process is None:
            return
        with contextlib.suppress(Exception):
            await self.send({"stop": True})
        try:
            async with asyncio.timeout(30):
                await self.process.wait()
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


async def serve(config: dict[str, Any]) -> None:
    gateways = [(str(url), str(ws)) for url, ws in config["gateways"]]
    group = WatcherGroup(
        gateways,
        config["token"],
        config["thread_id"],
        config["count"],
        config["deltas"],
        config["offset"],
    )
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with group:
        print(orjson.dumps({"ready": True}).decode(), flush=True)
        while line := await reader.readline():
            message = orjson.loads(line)
            if message.get("stop"):
                break
            at, counts = await group.target(int(message["target"]))
            print(orjson.dumps({"at": at, "counts": counts}).decode(), flush=True)


if __name__ == "__main__":
    asyncio.run(serve(orjson.loads(sys.argv[1])))
