"""Durable model context: committed, visible messages up to the step-start physical anchor."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.domain import Message, MessageRole
from runtime.engine.message_cache import HistoryCache, context_of
from runtime.providers.model_api import ContextMessage
from runtime.storage.store import MessageStore


def to_context(messages: Sequence[Message]) -> list[ContextMessage]:
    """Visible messages as model context; hidden ones never reach a model."""
    return [c for c in map(context_of, messages) if c is not None]


class DurableContext:
    """The leaf of resolve_model_context: reads storage lazily, capped at the anchor. Parsed
    messages come from the worker's `HistoryCache`: only the thread's tail is read, and nothing
    when `current` says the cache holds what storage does up to the anchor (the episode read
    it in `begin_episode`'s transaction and has committed nothing since)."""

    def __init__(
        self,
        store: MessageStore,
        thread_id: str,
        anchor: int,
        history: HistoryCache | None = None,
        *,
        current: bool = False,
    ) -> None:
        self._store = store
        self._thread_id = thread_id
        self.anchor = anchor
        self._history = history if history is not None else HistoryCache()
        self._current = current

    async def __call__(self) -> list[ContextMessage]:
        if self._current:
            cached = self._history.cached_context(self._thread_id, self.anchor)
            if cached is not None:
                return cached
        return await self._history.context(self._store, self._thread_id, self.anchor)


def last_user_text(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if message.role is MessageRole.USER:
            return message.text()
    return ""
