"""Every server -> client websocket frame as a client reads it, by its `type`.

`parse_frame` turns a received frame into its model; a frame of a type this client does not
know (a newer server's), or a known type with fields it cannot read, becomes an `OtherFrame`
with every field kept, so a newer server never crashes an older client.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter, ValidationError

from threadline_wire.frames import (
    Ack,
    ActionsSubscribed,
    ActionsUnsubscribed,
    ErrorFrame,
    Pong,
    ServerFrame,
    Subscribed,
    Unsubscribed,
)
from threadline_wire.presence_frames import (
    PresenceJoined,
    PresenceLeft,
    PresenceSet,
    PresenceUpdated,
)
from threadline_wire.thread_snapshot import PendingAction


class ChunkFrame(ServerFrame):
    """A live chunk of a run (`chunk` a `threadline_wire.chunks` chunk as a mapping)."""

    type: Literal["chunk"] = "chunk"
    thread_id: str
    run_id: str
    seq: int
    episode: int = 0
    chunk: dict[str, Any] = Field(default_factory=dict)


class InvalidateFrame(ServerFrame):
    type: Literal["invalidate"] = "invalidate"
    thread_id: str
    version: int


class ResyncFrame(ServerFrame):
    type: Literal["resync"] = "resync"
    thread_id: str


class ActionPendingFrame(ServerFrame):
    """An action of a subscribed scope is pending, or its progress moved (read at `version`)."""

    type: Literal["action.pending"] = "action.pending"
    scope: str
    thread_id: str
    version: int
    action: PendingAction


class ActionResolvedFrame(ServerFrame):
    type: Literal["action.resolved"] = "action.resolved"
    scope: str
    thread_id: str
    version: int
    action_id: str


class ActionsResyncFrame(ServerFrame):
    """Announcements of `scope` may have been lost: refetch the inbox."""

    type: Literal["actions.resync"] = "actions.resync"
    scope: str


class OtherFrame(ServerFrame):
    """A frame this client cannot read as a known one: kept, fields and all."""

    type: str = ""


_KNOWN: tuple[type[ServerFrame], ...] = (
    Subscribed,
    Unsubscribed,
    Ack,
    Pong,
    ErrorFrame,
    ActionsSubscribed,
    ActionsUnsubscribed,
    ChunkFrame,
    InvalidateFrame,
    ResyncFrame,
    ActionPendingFrame,
    ActionResolvedFrame,
    ActionsResyncFrame,
    PresenceSet,
    PresenceJoined,
    PresenceUpdated,
    PresenceLeft,
)
KNOWN_TYPES: frozenset[str] = frozenset(str(m.model_fields["type"].default) for m in _KNOWN)


def _frame_type(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) and kind in KNOWN_TYPES else "other"


LiveFrame = Annotated[
    Annotated[Subscribed, Tag("subscribed")]
    | Annotated[Unsubscribed, Tag("unsubscribed")]
    | Annotated[Ack, Tag("ack")]
    | Annotated[Pong, Tag("pong")]
    | Annotated[ErrorFrame, Tag("error")]
    | Annotated[ActionsSubscribed, Tag("actions.subscribed")]
    | Annotated[ActionsUnsubscribed, Tag("actions.unsubscribed")]
    | Annotated[ChunkFrame, Tag("chunk")]
    | Annotated[InvalidateFrame, Tag("invalidate")]
    | Annotated[ResyncFrame, Tag("resync")]
    | Annotated[ActionPendingFrame, Tag("action.pending")]
    | Annotated[ActionResolvedFrame, Tag("action.resolved")]
    | Annotated[ActionsResyncFrame, Tag("actions.resync")]
    | Annotated[PresenceSet, Tag("presence")]
    | Annotated[PresenceJoined, Tag("presence.join")]
    | Annotated[PresenceUpdated, Tag("presence.update")]
    | Annotated[PresenceLeft, Tag("presence.leave")]
    | Annotated[OtherFrame, Tag("other")],
    Discriminator(_frame_type),
]
LiveFrameAdapter: TypeAdapter[LiveFrame] = TypeAdapter(LiveFrame)


def parse_frame(frame: dict[str, Any]) -> LiveFrame:
    """`frame` as its model; an `OtherFrame` when its type is unknown or it does not fit."""
    try:
        return LiveFrameAdapter.validate_python(frame)
    except ValidationError:
        kind = frame.get("type")
        return OtherFrame.model_validate({**frame, "type": kind if isinstance(kind, str) else ""})


__all__ = [
    "KNOWN_TYPES",
    "ActionPendingFrame",
    "ActionResolvedFrame",
    "ActionsResyncFrame",
    "ChunkFrame",
    "InvalidateFrame",
    "LiveFrame",
    "LiveFrameAdapter",
    "OtherFrame",
    "ResyncFrame",
    "parse_frame",
]
