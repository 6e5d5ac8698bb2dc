"""Building blocks shared by the bus backends: lifecycle state, bounded subscriptions, listeners."""

from __future__ import annotations

import abc
import asyncio
import enum
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, Generic, Self, TypeVar
from urllib.parse import urlsplit, urlunsplit

from realtime.bus_metrics import DROPPED, safe_add

log = logging.getLogger(__name__)

ReconnectListener = Callable[[], Awaitable[None] | None]

DEFAULT_MAX_QUEUE = 1000

K = TypeVar("K", str, bytes)


class BusState(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class AsyncResource(abc.ABC):
    """`async with` support for anything with `open()` and `close()`."""

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def redact_url(url: str) -> str:
    """The URL with its password masked, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def check_message(data: bytes) -> None:
    """A bus message is bytes; anything else is refused alike by every backend."""
    if not isinstance(data, bytes):
        raise TypeError(f"bus messages are bytes, got {type(data).__name__}")


def check_replay_bounds(limit: int, max_bytes: int | None) -> None:
    """The arguments of `Bus.append_replay` every backend refuses alike."""
    if limit < 1:
        raise ValueError("replay limit must be at least 1")
    if max_bytes is not None and max_bytes < 1:
        raise ValueError("replay max_bytes must be at least 1")


class QueueSubscription:
    """One local subscription to a channel: a bounded queue of messages, iterated in order.

    A subscriber that falls more than `maxsize` messages behind loses its *oldest* queued message
    and `dropped` grows. We drop rather than end the iteration because delivery is at-most-once
    anyway and clients recover from gaps by refetching; ending the iteration would force every
    consumer to resubscribe. Consumers that care (the hub) watch `dropped` and tell clients to
    resync. Once closed, the messages already queued are still yielded, then iteration ends.
    """

    __slots__ = ("_closed", "_event", "_items", "_maxsize", "channel", "dropped")

    def __init__(self, channel: str, maxsize: int = DEFAULT_MAX_QUEUE) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.channel = channel
        self.dropped = 0
        self._maxsize = maxsize
        self._items: deque[bytes] = deque()
        self._event = asyncio.Event()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)

    def push(self, data: bytes) -> None:
        if self._closed:
            return
        if len(self._items) >= self._maxsize:
            self._items.popleft()
            self.dropped += 1
            safe_add(DROPPED, 1)
        self._items.append(data)
        self._event.set()

    def close(self) -> None:
        self._closed = True
        self._event.set()

    def __aiter__(self) -> QueueSubscription:
        return self

    async def __anext__(self) -> bytes:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._event.clear()
            await self._event.wait()
        return self._items.popleft()


class LocalSubscriptions(Generic[K]):
    """The local subscriptions of a bus by channel key; what it delivers each message to."""

    def __init__(self, max_queue: int = DEFAULT_MAX_QUEUE) -> None:
        self._max_queue = max_queue
        self._by_key: dict[K, set[QueueSubscription]] = {}

    def keys(self) -> set[K]:
        return set(self._by_key)

    def count(self, key: K) -> int:
        return len(self._by_key.get(key, ()))

    def add(self, key: K, channel: str) -> QueueSubscription:
        subscription = QueueSubscription(channel, self._max_queue)
        self._by_key.setdefault(key, set()).add(subscription)
        return subscription

    def remove(self, key: K, subscription: QueueSubscription) -> None:
        """Close `subscription` and forget it; the key goes with its last subscription."""
        subscription.close()
        subscriptions = self._by_key.get(key)
        if subscriptions is not None:
            subscriptions.discard(subscription)
            if not subscriptions:
                del self._by_key[key]

    def push(self, key: K, data: bytes) -> None:
        for subscription in self._by_key.get(key, ()):
            subscription.push(data)

    def close_all(self) -> None:
        """Close every subscription (their iterations end after what is queued)."""
        for subscriptions in self._by_key.values():
            for subscription in subscriptions:
                subscription.close()
        self._by_key.clear()


class ConfirmationWaiters:
    """Callers waiting for the server to confirm a channel's subscription.

    `wait` returns once the channel is confirmed (`confirm`), when every waiter is released
    (`release_all`: the connection was lost or the bus closed), or after `timeout` seconds.
    """

    def __init__(self) -> None:
        self._waiters: dict[bytes, list[asyncio.Future[None]]] = {}

    async def wait(self, key: bytes, timeout: float) -> bool:
        """False if `timeout` passed first (the caller decides whether to go on anyway)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(key, [])
        waiters.append(future)
        try:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that races the
            # confirmation, leaving a cancelled caller running.
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            return False
        finally:
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                self._waiters.pop(key, None)
        return True

    def confirm(self, key: bytes) -> None:
        for future in self._waiters.pop(key, ()):
            if not future.done():
                future.set_result(None)

    def release_all(self) -> None:
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(None)
        self._waiters.clear()


class ReconnectListeners:
    """Callbacks run after a bus re-established its connection (sync or async, errors logged)."""

    def __init__(self) -> None:
        self._callbacks: list[ReconnectListener] = []

    def add(self, callback: ReconnectListener) -> None:
        self._callbacks.append(callback)

    def remove(self, callback: ReconnectListener) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    async def notify(self) -> None:
        for callback in list(self._callbacks):
            try:
                result = callback()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("reconnect listener %r failed", callback)


async def cancel_and_wait(task: asyncio.Task[None], *, recancel_every: float = 0.1) -> None:
    """Cancel a task and wait until it has really finished.

    The cancellation is repeated until the task is done: on Python 3.11 `asyncio.wait_for` (used
    inside libraries such as redis-py) can swallow a cancellation that races a completed
    operation, and an orderly shutdown must not hang on that. `asyncio.wait` never raises on
    the task's outcome, so only our own cancellation propagates.
    """
    await cancel_and_wait_all((task,), recancel_every=recancel_every)


async def cancel_and_wait_all(
    tasks: Iterable[asyncio.Task[Any] | None], *, recancel_every: float = 0.1
) -> None:
    """`cancel_and_wait` for several tasks (None: none), cancelled together and waited for in
    one `asyncio.wait` per round: a room or a watch of three tasks costs one wait, not three."""
    every = [task for task in tasks if task is not None]
    pending = {task for task in every if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=recancel_every)
    for task in every:
        if not task.cancelled() and task.exception() is not None:
            log.warning("background task %s had failed", task.get_name(), exc_info=task.exception())
