"""Invalidations the bus refused, published again until it takes them.

Publishing is best effort (`Publisher`): a failed chunk costs a client a refetch, because the
commit's invalidation tells it to. But a failed *invalidation* leaves a watcher behind until
something else moves it: a gateway whose own bus connection broke resyncs its subscribers when
it reconnects, yet a gateway that stayed connected, or reconnected before the commit (a Redis
Cluster failover: the gateways resubscribe while the worker's publishes still fail), is never
told. So the newest refused version of each thread is kept and published again with capped
exponential backoff until the bus accepts it, or until a later invalidation of that thread
went out (it says as much). Bounded: past `max_threads` the oldest entries are dropped (those
watchers converge at their thread's next commit, as before).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from realtime.bus_support import cancel_and_wait

log = logging.getLogger(__name__)

FIRST_DELAY = 0.1
MAX_DELAY = 2.0
MAX_THREADS = 10_000


class Reannouncer:
    """`add` a refused invalidation, `done` one that went out; `send(pending)` publishes the
    pending ones (thread id -> version) in one bus operation and says whether it worked."""

    def __init__(
        self,
        send: Callable[[dict[str, int]], Awaitable[bool]],
        *,
        first_delay: float = FIRST_DELAY,
        max_delay: float = MAX_DELAY,
        max_threads: int = MAX_THREADS,
    ) -> None:
        self._send = send
        self._first = first_delay
        self._max = max_delay
        self._max_threads = max_threads
        self._pending: OrderedDict[str, int] = OrderedDict()
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> dict[str, int]:
        return dict(self._pending)

    def add(self, thread_id: str, version: int) -> None:
        self._pending[thread_id] = max(version, self._pending.get(thread_id, version))
        self._pending.move_to_end(thread_id)
        while len(self._pending) > self._max_threads:
            self._pending.popitem(last=False)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="reannounce")

    def done(self, thread_id: str, version: int) -> None:
        """An invalidation of `thread_id` at `version` went out: nothing older is owed."""
        if self._pending.get(thread_id, version + 1) <= version:
            del self._pending[thread_id]

    async def _loop(self) -> None:
        delay = self._first
        while self._pending:
            await asyncio.sleep(delay)
            batch = dict(self._pending)
            try:
                sent = await self._send(batch)
            except Exception:  # never: the publisher's sends do not raise; kept for safety
                log.exception("republishing %d invalidations failed", len(batch))
                sent = False
            if not sent:
                delay = min(delay * 2, self._max)
                continue
            for thread_id, version in batch.items():
                self.done(thread_id, version)
            delay = self._first

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
