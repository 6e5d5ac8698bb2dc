"""Server -> client websocket frames, declared once: the gateway sends them, clients read them.

The live frames (`chunk`, `invalidate`, `resync`) are the bus's envelopes as they travel; the
replies answer a client frame. Lenient replies (`extra="allow"`: an `ack` carries its command's
answer); strict envelopes (the bus never carries anything else).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

# The longest id (thread, item, frame) a client may send (server.protocol.inputs checks it).
ID_MAX = 200


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ChunkEnvelope(_Envelope):
    """A live canonical chunk; its bytes are the client's `chunk` frame as is.

    `episode` is the fencing token of the run episode that streamed it: after a takeover the
    new episode streams the redone step with the same seqs, and anything an older episode still
    publishes is void (receivers drop it; see `ChunkPosition`)."""

    type: Literal["chunk"] = "chunk"
    thread_id: str
    run_id: str
    seq: int = Field(ge=0)
    episode: int = Field(default=0, ge=0)
    chunk: dict[str, Any]


class InvalidateEnvelope(_Envelope):
    """Watch invalidation: the thread committed `version`; refetch if you hold an older one."""

    type: Literal["invalidate"] = "invalidate"
    thread_id: str
    version: int = Field(ge=0)


class ResyncEnvelope(_Envelope):
    """Made by the hub, never published: live messages may have been lost, refetch the snapshot."""

    type: Literal["resync"] = "resync"
    thread_id: str


FrameId = Annotated[str, Field(max_length=ID_MAX)] | int


class ServerFrame(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json", exclude_none=True))


class Subscribed(ServerFrame):
    type: Literal["subscribed"] = "subscribed"
    thread_id: str
    version: int
    id: FrameId | None = None


class Unsubscribed(ServerFrame):
    type: Literal["unsubscribed"] = "unsubscribed"
    thread_id: str
    id: FrameId | None = None


class Ack(ServerFrame):
    """Answer to a command; carries the same fields as the HTTP answer of that command."""

    type: Literal["ack"] = "ack"
    id: FrameId | None = None


class Pong(ServerFrame):
    type: Literal["pong"] = "pong"
    id: FrameId | None = None


class ErrorFrame(ServerFrame):
    type: Literal["error"] = "error"
    code: str
    message: str
    id: FrameId | None = None


class ActionsSubscribed(ServerFrame):
    type: Literal["actions.subscribed"] = "actions.subscribed"
    scopes: list[str]
    id: FrameId | None = None


class ActionsUnsubscribed(ServerFrame):
    type: Literal["actions.unsubscribed"] = "actions.unsubscribed"
    scopes: list[str]
    id: FrameId | None = None
