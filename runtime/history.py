"""Parsed messages of recently run threads, kept between steps and runs: an episode's start and
each step's durable context read only the thread's tail from storage, not its whole history.

Correct because of two storage rules: only the tail message is ever updated, and every other
change to existing messages (regenerate, retry, visibility) is a history rewrite, which bumps
the thread's history epoch (`Store.read_history`). So a cached thread is refreshed by reading
from its cached tail's position on: if the epoch is unchanged and the cached tail is still
there, every message before it is current, and the rows read replace the tail and follow it.
Anything else (a rewrite, a vanished tail) reloads the whole thread once.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field

from runtime.domain import Message, Visibility
from runtime.providers.base import ContextMessage
from runtime.storage.base import Store

# Bounds of one cache (per worker): threads kept, and messages kept over all of them.
MAX_THREADS = 256
MAX_MESSAGES = 50_000


def context_of(message: Message) -> ContextMessage | None:
    """A message as model context; hidden or empty ones never reach a model (None)."""
    if message.visibility is not Visibility.VISIBLE or not message.parts:
        return None
    return ContextMessage(role=message.role, parts=message.parts)


@dataclass
class _Thread:
    epoch: int
    messages: list[Message] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    contexts: list[ContextMessage | None] = field(default_factory=list)

    def extend(self, messages: tuple[Message, ...] | list[Message]) -> None:
        for message in messages:
            self.messages.append(message)
            self.positions.append(message.position)
            self.contexts.append(context_of(message))

    def drop_tail(self) -> None:
        del self.messages[-1], self.positions[-1], self.contexts[-1]

    def count(self, up_to_position: int | None) -> int:
        """How many cached messages are at or before `up_to_position` (all for None)."""
        if up_to_position is None:
            return len(self.messages)
        return bisect.bisect_right(self.positions, up_to_position)


class HistoryCache:
    """Per-thread parsed messages and their model context, least recently used evicted first.
    Every read is validated against storage (one tail read), so any number of processes may
    each keep one; a cache is shared by the episodes of one worker."""

    def __init__(self, max_threads: int = MAX_THREADS, max_messages: int = MAX_MESSAGES) -> None:
        self._threads: OrderedDict[str, _Thread] = OrderedDict()
        self._max_threads = max_threads
        self._max_messages = max_messages
        self._size = 0
        # Reads made, and how many of them had to reload a whole thread (for tests and benches).
        self.reads = 0
        self.reloads = 0

    async def messages(
        self, store: Store, thread_id: str, up_to_position: int | None = None
    ) -> list[Message]:
        """The thread's committed messages (hidden ones included), at or before
        `up_to_position` when given: what `Store.list_messages` returns."""
        entry = await self._refresh(store, thread_id)
        return entry.messages[: entry.count(up_to_position)]

    async def context(
        self, store: Store, thread_id: str, up_to_position: int
    ) -> list[ContextMessage]:
        """Visible messages at or before `up_to_position`, as model context."""
        entry = await self._refresh(store, thread_id)
        return [c for c in entry.contexts[: entry.count(up_to_position)] if c is not None]

    async def _refresh(self, store: Store, thread_id: str) -> _Thread:
        self.reads += 1
        entry = self._threads.get(thread_id)
        if entry is not None and entry.messages:
            tail, cached = entry.messages[-1], len(entry.messages)
            read = await store.read_history(thread_id, tail.position)
            current = read.epoch == entry.epoch and bool(read.messages)
            # ... and no other read of this thread changed the entry meanwhile.
            if (
                current
                and read.messages[0].id == tail.id
                and self._threads.get(thread_id) is entry
                and len(entry.messages) == cached
                and entry.messages[-1] is tail
            ):
                # Only the tail may have changed since it was read: replace it.
                entry.drop_tail()
                entry.extend(read.messages)
                self._size += len(read.messages) - 1
                self._threads.move_to_end(thread_id)
                self._evict()
                return entry
        self.reloads += 1
        read = await store.read_history(thread_id, 0)
        fresh = _Thread(epoch=read.epoch)
        fresh.extend(read.messages)
        self._forget(thread_id)
        self._threads[thread_id] = fresh
        self._size += len(fresh.messages)
        self._evict()
        return fresh

    def _forget(self, thread_id: str) -> None:
        old = self._threads.pop(thread_id, None)
        if old is not None:
            self._size -= len(old.messages)

    def _evict(self) -> None:
        # The newest thread stays even when it alone is over the bound: it is being read now.
        while len(self._threads) > 1 and (
            len(self._threads) > self._max_threads or self._size > self._max_messages
        ):
            self._forget(next(iter(self._threads)))


__all__ = ["HistoryCache", "context_of"]
