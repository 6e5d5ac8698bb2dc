"""Server -> client websocket frames that answer client frames (live frames come from the bus)."""

from __future__ import annotations

from typing import Annotated, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from server.protocol.inputs import ID_MAX

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
