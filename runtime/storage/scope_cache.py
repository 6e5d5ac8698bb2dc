"""The scope of a thread by id, cached: a thread never changes scope, so entries never go stale."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

MAX_CACHED = 10_000


class ScopeSource(Protocol):
    async def thread_scopes(self, thread_ids: Sequence[str]) -> dict[str, str]: ...


class ScopeCache:
    """`scope_of(thread_id)` for the publisher's per-scope announcements, one read per thread
    (least recently used entries go first past `max_cached`)."""

    def __init__(self, source: ScopeSource, max_cached: int = MAX_CACHED) -> None:
        self._source = source
        self._max = max_cached
        self._scopes: OrderedDict[str, str] = OrderedDict()

    def remember(self, thread_id: str, scope: str) -> None:
        """A scope learnt from a read or a write made anyway (a thread created, an episode
        started): the first announcement of that thread needs no read of its own."""
        self._scopes[thread_id] = scope
        self._scopes.move_to_end(thread_id)
        if len(self._scopes) > self._max:
            self._scopes.popitem(last=False)

    async def scope_of(self, thread_id: str) -> str | None:
        scope = self._scopes.get(thread_id)
        if scope is not None:
            self._scopes.move_to_end(thread_id)
            return scope
        scope = (await self._source.thread_scopes([thread_id])).get(thread_id)
        if scope is not None:
            self.remember(thread_id, scope)
        return scope
