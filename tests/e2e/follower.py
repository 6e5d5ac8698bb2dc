"""A websocket client that follows docs/protocol.md's convergence rules, recording what it saw."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

TIMEOUT = 10.0
LIVE_TYPES = frozenset({"chunk", "invalidate", "resync"})


@dataclass
class Received:
    at: float
    frame: dict[str, Any]


@dataclass
class Follower:
    """Watches one thread over one websocket and refetches snapshots exactly when the protocol
    says so: an invalidation newer than the held version, a `resync`, a `run-takeover` chunk, a
    gap in a run's `seq`, and right after subscribing. At most one fetch is in flight; a trigger
    during a fetch causes one more fetch after it."""

    base_url: str
    ws_url: str
    token: str
    name: str = "follower"
    frames: list[Received] = field(default_factory=list)
    snapshot: dict[str, Any] | None = None
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    close_code: int | None = None
    thread_id: str | None = None
    _ws: ClientConnection | None = None
    _http: httpx.AsyncClient | None = None
    _reader: asyncio.Task[None] | None = None
    _fetcher: asyncio.Task[None] | None = None
    _again: bool = False
    _next_seq: dict[str, int] = field(default_factory=dict)
    _answers: dict[Any, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    _ids: Any = field(default_factory=itertools.count)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    errors: list[BaseException] = field(default_factory=list)

    async def __aenter__(self) -> Follower:
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=TIMEOUT,
        )
        self._ws = await connect(
            f"{self.ws_url}?token={self.token}",
            open_timeout=TIMEOUT,
            close_timeout=2,
            max_size=2**24,
        )
        self._reader = asyncio.create_task(self._read(), name=f"{self.name}-reader")
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in (self._fetcher, self._reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
        if self._http is not None:
            await self._http.aclose()

    # --- commands ------------------------------------------------------------------------

    async def request(self, frame: dict[str, Any], timeout: float = TIMEOUT) -> dict[str, Any]:
        """Send `frame` with a fresh id and return its answer (live frames are recorded)."""
        assert self._ws is not None
        frame_id = f"{self.name}-{next(self._ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._answers[frame_id] = future
        await self._ws.send(orjson.dumps({**frame, "id": frame_id}).decode())
        try:
            async with asyncio.timeout(timeout):
                return await future
        finally:
            self._answers.pop(frame_id, None)

    async def subscribe(self, thread_id: str) -> dict[str, Any]:
        """Subscribe, then fetch the snapshot (protocol step 1)."""
        self.thread_id = thread_id
        answer = await self.request({"type": "subscribe", "thread_id": thread_id})
        assert answer["type"] == "subscribed", answer
        self._trigger("subscribed")
        return answer

    async def http(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        assert self._http is not None
        return await self._http.request(method, path, **kwargs)

    async def server_snapshot(self) -> dict[str, Any]:
        response = await self.http("GET", f"/v1/threads/{self.thread_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    # --- what was seen -------------------------------------------------------------------

    def live(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [
            r.frame
            for r in self.frames
            if r.frame.get("type") in LIVE_TYPES and (kind is None or r.frame["type"] == kind)
        ]

    def chunks(self, run_id: str | None = None) -> list[dict[str, Any]]:
        return [f for f in self.live("chunk") if run_id is None or f["run_id"] == run_id]

    def invalidations(self) -> list[int]:
        return [int(f["version"]) for f in self.live("invalidate")]

    async def wait_for(
        self, predicate: Callable[[Follower], bool], timeout: float = TIMEOUT
    ) -> None:
        """Until `predicate(self)` holds (checked whenever a frame or a snapshot arrives)."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                self._raise_errors()
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await self._changed.wait()

    async def converge(self, expected: dict[str, Any], timeout: float = TIMEOUT) -> None:
        """Until the last snapshot this client fetched equals `expected` (no extra fetches)."""
        try:
            await self.wait_for(lambda f: f.snapshot == expected and f._fetcher is None, timeout)
        except TimeoutError:
            held = self.snapshot["thread"]["version"] if self.snapshot else None
            raise AssertionError(
                f"{self.name} holds version {held}, server has {expected['thread']['version']};"
                f" refetch reasons {dict(self.reasons)}; last frames"
                f" {[r.frame for r in self.frames[-5:]]}"
            ) from None

    def _raise_errors(self) -> None:
        if self.errors:
            raise AssertionError(f"{self.name} failed: {self.errors[0]!r}") from self.errors[0]

    # --- protocol ------------------------------------------------------------------------

    @property
    def held_version(self) -> int:
        return int(self.snapshot["thread"]["version"]) if self.snapshot else -1

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for message in self._ws:
                frame = dict(orjson.loads(message))
                self.frames.append(Received(time.monotonic(), frame))
                self._on_frame(frame)
                self._changed.set()
        except ConnectionClosed as exc:
            self.close_code = exc.rcvd.code if exc.rcvd else None
        except Exception as exc:
            self.errors.append(exc)
        finally:
            if self._ws is not None and self._ws.close_code is not None:
                self.close_code = self._ws.close_code
            self._changed.set()

    def _on_frame(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        future = self._answers.get(frame.get("id"))
        if future is not None and kind not in LIVE_TYPES and not future.done():
            future.set_result(frame)
            return
        if kind == "invalidate":
            if frame["version"] > self.held_version:
                self._trigger("invalidate")
        elif kind == "resync":
            self._trigger("resync")
        elif kind == "chunk":
            self._on_chunk(frame)

    def _on_chunk(self, frame: dict[str, Any]) -> None:
        run_id, seq = frame["run_id"], frame["seq"]
        if frame["chunk"].get("type") == "run-takeover":
            self._next_seq[run_id] = seq + 1
            self._trigger("run-takeover")
            return
        expected = self._next_seq.get(run_id, 0)
        if seq < expected:
            return  # already in the snapshot (or replayed)
        self._next_seq[run_id] = seq + 1
        if seq > expected:
            self._trigger("gap")

    def _trigger(self, reason: str) -> None:
        self.reasons[reason] += 1
        if self._fetcher is not None:
            self._again = True
            return
        self._fetcher = asyncio.create_task(self._fetch_loop(), name=f"{self.name}-fetch")

    async def _fetch_loop(self) -> None:
        try:
            while True:
                self._again = False
                snapshot = await self.server_snapshot()
                if snapshot["thread"]["version"] >= self.held_version:
                    self.snapshot = snapshot
                    self.snapshots.append(snapshot)
                    run = snapshot.get("run")
                    if run is not None:
                        # Chunks below next_seq are in the snapshot; expect next_seq next.
                        # Live chunks already applied past it stay applied.
                        run_id = run["id"]
                        self._next_seq[run_id] = max(
                            self._next_seq.get(run_id, 0), int(run["next_seq"])
                        )
                if not self._again:
                    break
        except Exception as exc:
            self.errors.append(exc)
        finally:
            self._fetcher = None
            self._changed.set()
