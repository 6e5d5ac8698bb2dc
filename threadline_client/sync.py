"""A thin blocking wrapper over the async client, for scripts and notebooks."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any, Concatenate, Generic, Literal, ParamSpec, Self, TypeVar, overload

from threadline_client.client import ThreadlineClient
from threadline_client.models import Snapshot
from threadline_client.tokens import TokenProvider
from threadline_client.watch import ActionsWatch, Backoff, ThreadWatch, WatchEvent

T = TypeVar("T")
P = ParamSpec("P")


class _Blocking(Generic[P, T]):
    """A blocking method of `SyncThreadlineClient` made from an async one of `ThreadlineClient`:
    the signature is the async method's own, so the two cannot drift apart."""

    def __init__(self, method: Callable[Concatenate[ThreadlineClient, P], Awaitable[T]]) -> None:
        self.method = method
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, instance: SyncThreadlineClient, owner: type[Any]) -> Callable[P, T]: ...
    def __get__(self, instance: SyncThreadlineClient | None, owner: type[Any]) -> Any:
        if instance is None:
            return self

        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return instance._call(self.method(instance._client, *args, **kwargs))

        return call


class _Iterating(Generic[P, T]):
    """A blocking iterator method made from an async-iterator one of `ThreadlineClient`."""

    def __init__(
        self, method: Callable[Concatenate[ThreadlineClient, P], AsyncIterator[T]]
    ) -> None:
        self.method = method
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(
        self, instance: SyncThreadlineClient, owner: type[Any]
    ) -> Callable[P, Iterator[T]]: ...
    def __get__(self, instance: SyncThreadlineClient | None, owner: type[Any]) -> Any:
        if instance is None:
            return self

        def call(*args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
            return instance._iterate(self.method(instance._client, *args, **kwargs))

        return call


W = TypeVar("W", ThreadWatch, ActionsWatch)


class SyncWatch(Generic[W]):
    """A watch (`ThreadWatch` or `ActionsWatch`) driven from blocking code: `with` opens and
    closes it, iterating yields its events, `until` blocks; its state (`snapshot`, `settled`,
    `state`, `pending`, …) reads straight from the async watch, which the client's loop keeps
    current."""

    def __init__(self, client: SyncThreadlineClient, watch: W) -> None:
        self._client = client
        self.watch: W = watch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.watch, name)

    def __enter__(self) -> Self:
        self._client._call(self.watch.__aenter__())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._client._call(self.watch.aclose())

    def __iter__(self) -> Iterator[WatchEvent]:
        return self._client._iterate(self.watch)

    def until(self, predicate: Callable[[W], bool], timeout: float = 30.0) -> Self:
        """Block until `predicate(watch)` holds (see the async `until`); returns self."""
        self._client._call(self.watch.until(predicate, timeout))
        return self


class SyncThreadlineClient:
    """The same calls as `ThreadlineClient`, blocking. An event loop runs in a daemon thread of
    its own, so this works inside a notebook whose loop is already running."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        token_provider: TokenProvider | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="threadline-client", daemon=True
        )
        self._thread.start()
        self._client = self._call(self._make(base_url, token, timeout, token_provider))

    @staticmethod
    async def _make(
        base_url: str, token: str | None, timeout: float, provider: TokenProvider | None
    ) -> ThreadlineClient:
        # A sync provider runs on the client's loop thread; an async one on that loop.
        return ThreadlineClient(base_url, token, timeout=timeout, token_provider=provider)

    def _call(self, coroutine: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(_coro(coroutine), self._loop).result()

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

    # The calls of ThreadlineClient, blocking (same names, same arguments, same answers).
    me = _Blocking(ThreadlineClient.me)
    bearer = _Blocking(ThreadlineClient.bearer)
    create_thread = _Blocking(ThreadlineClient.create_thread)
    list_threads = _Blocking(ThreadlineClient.list_threads)
    snapshot = _Blocking(ThreadlineClient.snapshot)
    snapshot_with_wire = _Blocking(ThreadlineClient.snapshot_with_wire)
    history = _Blocking(ThreadlineClient.history)
    send = _Blocking(ThreadlineClient.send)
    stop = _Blocking(ThreadlineClient.stop)
    regenerate = _Blocking(ThreadlineClient.regenerate)
    retry = _Blocking(ThreadlineClient.retry)
    resume = _Blocking(ThreadlineClient.resume)
    reassign = _Blocking(ThreadlineClient.reassign)
    submit_result = _Blocking(ThreadlineClient.submit_result)
    pending = _Iterating(ThreadlineClient.pending)
    pages = _Iterating(ThreadlineClient.pages)
    threads = _Iterating(ThreadlineClient.threads)
    update_metadata = _Blocking(ThreadlineClient.update_metadata)
    # Schedules and webhooks (threadline_client/hooks.py).
    create_schedule = _Blocking(ThreadlineClient.create_schedule)
    list_schedules = _Blocking(ThreadlineClient.list_schedules)
    schedules = _Iterating(ThreadlineClient.schedules)
    pause_schedule = _Blocking(ThreadlineClient.pause_schedule)
    resume_schedule = _Blocking(ThreadlineClient.resume_schedule)
    delete_schedule = _Blocking(ThreadlineClient.delete_schedule)
    schedule_fires = _Iterating(ThreadlineClient.schedule_fires)
    create_webhook = _Blocking(ThreadlineClient.create_webhook)
    list_webhooks = _Blocking(ThreadlineClient.list_webhooks)
    webhooks = _Iterating(ThreadlineClient.webhooks)
    set_webhook_enabled = _Blocking(ThreadlineClient.set_webhook_enabled)
    delete_webhook = _Blocking(ThreadlineClient.delete_webhook)
    deliveries = _Iterating(ThreadlineClient.deliveries)
    delivery_attempts = _Blocking(ThreadlineClient.delivery_attempts)
    redeliver = _Blocking(ThreadlineClient.redeliver)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """`ThreadlineClient.request`, blocking."""
        return self._call(self._client.request(method, path, **kwargs))

    def watch(
        self, thread_id: str, *, backoff: Backoff | None = None, deltas: bool = True
    ) -> SyncWatch[ThreadWatch]:
        """`ThreadlineClient.watch`, blocking: use with `with`."""
        return SyncWatch(self, self._client.watch(thread_id, backoff=backoff, deltas=deltas))

    def watch_actions(
        self, *, backoff: Backoff | None = None, assigned: Literal["me"] | None = None
    ) -> SyncWatch[ActionsWatch]:
        """`ThreadlineClient.watch_actions`, blocking: use with `with`."""
        return SyncWatch(self, self._client.watch_actions(backoff=backoff, assigned=assigned))

    def aclose(self) -> None:
        """`close` under the async client's name (the two surfaces have the same names)."""
        self.close()

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
                assert view.snapshot is not None  # the predicate saw it
                return view.snapshot

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


async def _coro(awaitable: Awaitable[T]) -> T:
    """Any awaitable as the coroutine `run_coroutine_threadsafe` takes."""
    return await awaitable
