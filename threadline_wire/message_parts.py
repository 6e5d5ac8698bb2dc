"""A snapshot's parts as the wire carries them: message parts, pending actions, run, queue.

Lenient here (`extra="allow"`), so an older client still reads a newer server's parts; the
server's own `runtime.domain` parts extend these models, strictly, with their bounds, the
resolution's and approval's own models and the tool part's state machine (as
`runtime.domain.Admission` extends `AdmissionAnswer`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter

from threadline_wire.approval_progress import ApprovalProgress
from threadline_wire.enums import Role, RunStatus, ToolState, WaitKind


class _WirePart(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)


class Waiting(_WirePart):
    """What a suspended tool part waits for: a pending action while `resolution` is None."""

    action_id: str
    kind: WaitKind
    payload_schema: dict[str, Any] = Field(alias="schema")
    allowed_roles: tuple[Role, ...]
    resolution: Any = None
    # The tool's approval policy and its decisions so far (None: one resolution decides).
    approval: Any = None


class TextPart(_WirePart):
    type: Literal["text"] = "text"
    text: str


class ToolCallPart(_WirePart):
    type: Literal["tool-call"] = "tool-call"
    tool_call_id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    state: ToolState = ToolState.INPUT_AVAILABLE
    output: Any = None
    error: str | None = None
    waiting: Waiting | None = None


class OtherPart(_WirePart):
    """A part of a type this client does not know (a newer server's): kept, fields and all."""

    type: str


class QueuedItemView(_WirePart):
    """An input queued behind the active run, as a snapshot's `queue` lists it."""

    id: str
    text: str
    submitted_by: str
    interrupt: bool = False
    # Set when `text` is only a preview; the full text has its own route (docs/protocol.md).
    truncated: bool = False
    size: int | None = None


class RunView(_WirePart):
    """A snapshot's run: the thread's latest, with the seq its live chunks continue from."""

    id: str
    status: RunStatus
    error: str | None = None
    started_by: str | None = None
    next_seq: int = 0


class PendingAction(_WirePart):
    """A suspended tool part waiting for a caller: an approval, a client tool's result or a
    manual result, with the JSON Schema (`schema`) its payload must match."""

    id: str
    kind: WaitKind
    tool_call_id: str
    tool_name: str
    input: dict[str, Any] = Field(default_factory=dict)
    payload_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    allowed_roles: tuple[Role, ...] = ()
    run_id: str | None = None
    message_id: str | None = None
    # An approval under a policy: its policy and progress (docs/protocol.md, "Approval policies").
    approval: Any = None


class ListedAction(PendingAction):
    """A pending action as a client reads it: from a snapshot (`thread_id` filled in from the
    snapshot's thread), the scope-wide inbox (`GET /v1/actions`) or an `action.pending` frame,
    its approval's progress typed."""

    thread_id: str | None = None
    scope: str | None = None
    created_at: Any = None
    approval: ApprovalProgress | None = None


def _part_type(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("text", "tool-call") else "other"


# What a client reads: the known parts by their `type`, anything else as an `OtherPart`.
MessagePart = Annotated[
    Annotated[TextPart, Tag("text")]
    | Annotated[ToolCallPart, Tag("tool-call")]
    | Annotated[OtherPart, Tag("other")],
    Discriminator(_part_type),
]
MessagePartsAdapter: TypeAdapter[list[MessagePart]] = TypeAdapter(list[MessagePart])

__all__ = [
    "ListedAction",
    "MessagePart",
    "MessagePartsAdapter",
    "OtherPart",
    "PendingAction",
    "QueuedItemView",
    "RunView",
    "TextPart",
    "ToolCallPart",
    "Waiting",
]
