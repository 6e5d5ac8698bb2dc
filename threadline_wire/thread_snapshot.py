"""A thread's snapshot as the wire carries it (`GET /v1/threads/{id}`, the `thread.get` answer).

Lenient (`extra="allow"`: docs/protocol.md says clients ignore fields they do not know); the
server builds it as `runtime.domain.Snapshot` (strict) and `threadline_client` reads it as these.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from threadline_wire import message_parts
from threadline_wire.command_answers import ThreadInfo
from threadline_wire.enums import MessageRole, Visibility
from threadline_wire.message_parts import MessagePart, QueuedItemView, TextPart


class WireModel(BaseModel):
    """Lenient on input (a server may add fields, docs/protocol.md says clients ignore them)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)


class Message(WireModel):
    """A message of a snapshot; its parts are the server's own part models (text, tool
    calls), a newer server's unknown ones kept as `OtherPart`."""

    id: str
    role: MessageRole
    visibility: Visibility = Visibility.VISIBLE
    run_id: str | None = None
    parts: list[MessagePart] = Field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))


class PendingAction(message_parts.ListedAction):
    """A pending action as a snapshot, the scope-wide inbox or an `action.pending` frame
    carries it (`approval`: its policy and progress, a `threadline_wire` `ApprovalProgress`)."""


class Run(message_parts.RunView):
    """The thread's latest run, as a snapshot holds it."""


class Page(WireModel):
    """Which messages a snapshot holds: the last `limit` before a cursor. `before` not None:
    older messages exist; `snapshot(thread_id, before=page.before)` reads the next older page."""

    limit: int
    before: int | None = None


class Snapshot(WireModel):
    """A thread's projected, committed state at one version (its messages: one page)."""

    thread: ThreadInfo
    messages: list[Message] = Field(default_factory=list)
    pending_actions: list[PendingAction] = Field(default_factory=list)
    run: Run | None = None
    queue: list[QueuedItemView] = Field(default_factory=list)
    page: Page | None = None

    @model_validator(mode="before")
    @classmethod
    def _actions_know_their_thread(cls, data: Any) -> Any:
        """A snapshot's actions omit `thread_id` (it is the snapshot's); filled in so that one
        can be passed to `resume` as the inbox's actions are."""
        if not isinstance(data, dict) or not isinstance(data.get("thread"), dict):
            return data
        thread_id = data["thread"].get("id")
        actions = [
            {"thread_id": thread_id, **a} if isinstance(a, dict) else a
            for a in data.get("pending_actions") or []
        ]
        return {**data, "pending_actions": actions}

    @property
    def version(self) -> int:
        return self.thread.version

    def assistant_text(self) -> str:
        """The text of the thread's assistant messages, in order."""
        return "".join(m.text for m in self.messages if m.role == "assistant")


__all__ = ["Message", "Page", "PendingAction", "Run", "Snapshot", "WireModel"]
