"""Durable model context: committed, visible messages up to the step-start physical anchor."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.domain import Message, MessageRole, Visibility
from runtime.providers.base import ContextMessage
from runtime.storage.base import Store


def to_context(messages: Sequence[Message]) -> list[ContextMessage]:
    """Visible messages as model context; hidden ones never reach a model."""
    return [
        ContextMessage(role=m.role, parts=m.parts)
        for m in messages
        if m.visibility is Visibility.VISIBLE and m.parts
    ]


class DurableContext:
    """The leaf of resolve_model_context: reads storage lazily, capped at the anchor."""

    def __init__(self, store: Store, thread_id: str, anchor: int) -> None:
        self._store = store
        self._thread_id = thread_id
        self.anchor = anchor

    async def __call__(self) -> list[ContextMessage]:
        messages = await self._store.list_messages(self._thread_id, up_to_position=self.anchor)
        return to_context(messages)


def last_user_text(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if message.role is MessageRole.USER:
            return message.text()
    return ""
