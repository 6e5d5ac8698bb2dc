"""A thin blocking wrapper over the async client, for scripts and notebooks."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from pydantic import BaseModel

from threadline_client.client import Policy, ThreadlineClient
from threadline_client.models import (
    Admission,
    PendingAction,
    Principal,
    RegenerateAnswer,
    Snapshot,
    StopAnswer,
    ThreadInfo,
    VersionAnswer,
)
from threadline_client.watch import ThreadWatch, WatchEvent

T = TypeVar("T")


class SyncThreadlineClient:
    """The same calls as `ThreadlineClient`, blocking. An event loop runs in a daemon thread of
    its own, so this works inside a notebook whose loop is already running."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="threadline-client", daemon=True
        )
        self._thread.start()
        self._client = self._call(self._make(base_url, token, timeout))

    @staticmethod
    async def _make(base_url: str, token: str, timeout: float) -> ThreadlineClient:
        return ThreadlineClient(base_url, token, timeout=timeout)

    def _call(self, coroutine: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()  # type: ignore[arg-type]

    def _iterate(self, iterator: AsyncIterator[T]) -> Iterator[T]:
        while True:
            try:
                yield self._call(iterator.__anext__())
            except StopAsyncIteration:
                return

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def me(self) -> Principal:
        return self._call(self._client.me())

    def create_thread(self, title: str | None = None, **kwargs: Any) -> Snapshot:
        return self._call(self._client.create_thread(title, **kwargs))

    def list_threads(self, limit: int = 100) -> list[ThreadInfo]:
        return self._call(self._client.list_threads(limit))

    def snapshot(self, thread_id: str, *, include_hidden: bool = False) -> Snapshot:
        return self._call(self._client.snapshot(thread_id, include_hidden=include_hidden))

    def send(
        self,
        thread_id: str,
        text: str,
        *,
        client_request_id: str | None = None,
        policy: Policy | None = None,
    ) -> Admission:
        return self._call(
            self._client.send(thread_id, text, client_request_id=client_request_id, policy=policy)
        )

    def stop(self, thread_id: str, run_id: str) -> StopAnswer:
        return self._call(self._client.stop(thread_id, run_id))

    def regenerate(self, thread_id: str, message_id: str | None = None) -> RegenerateAnswer:
        return self._call(self._client.regenerate(thread_id, message_id))

    def pending(self, *, page_size: int = 100) -> Iterator[PendingAction]:
        return self._iterate(self._client.pending(page_size=page_size))

    def resume(
        self,
        action: PendingAction | str,
        payload: BaseModel | Mapping[str, Any],
        *,
        thread_id: str | None = None,
        expected_version: int | None = None,
    ) -> VersionAnswer:
        return self._call(
            self._client.resume(
                action, payload, thread_id=thread_id, expected_version=expected_version
            )
        )

    def wait(
        self,
        thread_id: str,
        predicate: Callable[[Snapshot], bool],
        timeout: float = 30.0,
    ) -> Snapshot:
        """Watch `thread_id` until `predicate(snapshot)` holds for a converged snapshot."""

        async def watch() -> Snapshot:
            async with self._client.watch(thread_id) as view:
                await view.until(
                    lambda w: w.settled and w.snapshot is not None and predicate(w.snapshot),
                    timeout,
                )
                snapshot: Snapshot = view.snapshot
                return snapshot

        return self._call(watch())

    def events(self, thread_id: str, limit: int) -> list[WatchEvent]:
        """The first `limit` events of a watch of `thread_id` (then the watch closes)."""

        async def collect() -> list[WatchEvent]:
            view: ThreadWatch
            async with self._client.watch(thread_id) as view:
                events = []
                async for event in view:
                    events.append(event)
                    if len(events) >= limit:
                        break
                return events

        return self._call(collect())
