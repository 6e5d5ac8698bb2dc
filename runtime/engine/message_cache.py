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
from runtime.providers.model_api import ContextMessage
from runtime.storage.store import HistoryRead, MessageStore

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
        self, store: MessageStore, thread_id: str, up_to_position: int | None = None
    ) -> list[Message]:
        """The thread's committed messages (hidden ones included), at or before
        `up_to_position` when given: what `Store.list_messages` returns."""
        entry = await self._refresh(store, thread_id)
        return entry.messages[: entry.count(up_to_position)]

    async def context(
        self, store: MessageStore, thread_id: str, up_to_position: int
    ) -> list[ContextMessage]:
        """Visible messages at or before `up_to_position`, as model context."""
        entry = await self._refresh(store, thread_id)
        return [c for c in entry.contexts[: entry.count(up_to_position)] if c is not None]

    def cached_context(self, thread_id: str, up_to_position: int) -> list[ContextMessage] | None:
        """`context` as cached, without reading storage: for a caller that knows the cache is
        current (the episode that just refreshed it, `EpisodeState.history_current`); None when
        the thread is not cached (evicted since), and the caller reads."""
        entry = self._threads.get(thread_id)
        if entry is None:
            return None
        return [c for c in entry.contexts[: entry.count(up_to_position)] if c is not None]

    def read_from(self, thread_id: str) -> int | None:
        """Where a read of the thread should start: its cached tail (None: not cached, read
        the whole thread)."""
        entry = self._threads.get(thread_id)
        return entry.positions[-1] if entry is not None and entry.messages else None

    def apply(
        self, thread_id: str, from_position: int | None, read: HistoryRead
    ) -> list[Message] | None:
        """Take a read made from `read_from(thread_id)` (from 0 for None) elsewhere, e.g. in
        `begin_episode`'s transaction: the thread's messages, or None when the read cannot be
        used (a rewrite since, or the entry changed meanwhile) and the caller must call
        `messages`."""
        entry = self._update(thread_id, from_position, read)
        return None if entry is None else list(entry.messages)

    async def _refresh(self, store: MessageStore, thread_id: str) -> _Thread:
        start = self.read_from(thread_id)
        entry = self._update(thread_id, start, await store.read_history(thread_id, start or 0))
        if entry is None:
            entry = self._update(thread_id, None, await store.read_history(thread_id, 0))
            assert entry is not None  # a read from 0 always replaces the entry
        return entry

    def _update(
        self, thread_id: str, from_position: int | None, read: HistoryRead
    ) -> _Thread | None:
        self.reads += 1
        entry = self._threads.get(thread_id)
        if from_position is None or entry is None or not entry.messages:
            if from_position is not None:
                return None
            self.reloads += 1
            fresh = _Thread(epoch=read.epoch)
            fresh.extend(read.messages)
            self._forget(thread_id)
            self._threads[thread_id] = fresh
            self._size += len(fresh.messages)
            self._evict()
            return fresh
        tail = entry.messages[-1]
        # Usable when no rewrite happened since the entry was read, and the read starts at the
        # entry's tail (it was made from `read_from`, and no other read changed the entry since).
        if (
            read.epoch != entry.epoch
            or tail.position != from_position
            or not read.messages
            or read.messages[0].id != tail.id
        ):
            return None
        # Only the tail may have changed since it was read: replace it.
        entry.drop_tail()
        entry.extend(read.messages)
        self._size += len(read.messages) - 1
        self._threads.move_to_end(thread_id)
        self._evict()
        return entry

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
