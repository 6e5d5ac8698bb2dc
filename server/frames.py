"""Websocket frames: client commands and server answers as pydantic models."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from runtime.models import InputPolicy, Visibility
from server.bodies import ID_MAX, ClientToolBody

FrameId = Annotated[str, Field(max_length=ID_MAX)] | int
ThreadId = Annotated[str, Field(min_length=1, max_length=ID_MAX)]
ItemId = Annotated[str, Field(min_length=1, max_length=ID_MAX)]


class _ClientFrame(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: FrameId | None = None


class Subscribe(_ClientFrame):
    type: Literal["subscribe"]
    thread_id: ThreadId


class Unsubscribe(_ClientFrame):
    type: Literal["unsubscribe"]
    thread_id: ThreadId


class MessageSend(_ClientFrame):
    type: Literal["message.send"]
    thread_id: ThreadId
    text: str = Field(min_length=1)
    client_request_id: str | None = Field(default=None, min_length=1, max_length=ID_MAX)
    policy: InputPolicy = InputPolicy.ENQUEUE
    client_tools: list[ClientToolBody] = Field(default_factory=list, max_length=64)


class ActionResume(_ClientFrame):
    type: Literal["action.resume"]
    thread_id: ThreadId
    action_id: ItemId
    payload: dict[str, Any]
    expected_version: int | None = Field(default=None, ge=0)


class ActionClientResult(_ClientFrame):
    type: Literal["action.client_result"]
    thread_id: ThreadId
    action_id: ItemId
    output: Any = None
    error: str | None = None
    expected_version: int | None = Field(default=None, ge=0)


class ActionManualResult(_ClientFrame):
    type: Literal["action.manual_result"]
    thread_id: ThreadId
    action_id: ItemId
    output: Any = None
    error: str | None = None
    expected_version: int | None = Field(default=None, ge=0)


class RunStop(_ClientFrame):
    type: Literal["run.stop"]
    thread_id: ThreadId
    run_id: ItemId


class Regenerate(_ClientFrame):
    type: Literal["regenerate"]
    thread_id: ThreadId
    message_id: ItemId | None = None


class MessageVisibility(_ClientFrame):
    type: Literal["message.visibility"]
    thread_id: ThreadId
    message_id: ItemId
    visibility: Visibility


class QueueCancel(_ClientFrame):
    type: Literal["queue.cancel"]
    thread_id: ThreadId
    item_id: ItemId


class Ping(_ClientFrame):
    type: Literal["ping"]


ClientFrame = Annotated[
    Subscribe
    | Unsubscribe
    | MessageSend
    | ActionResume
    | ActionClientResult
    | ActionManualResult
    | RunStop
    | Regenerate
    | MessageVisibility
    | QueueCancel
    | Ping,
    Field(discriminator="type"),
]
ClientFrameAdapter: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)
CLIENT_FRAME_TYPES: tuple[str, ...] = (
    "subscribe",
    "unsubscribe",
    "message.send",
    "action.resume",
    "action.client_result",
    "action.manual_result",
    "run.stop",
    "regenerate",
    "message.visibility",
    "queue.cancel",
    "ping",
)


# --- server -> client (chunk and invalidate frames come pre-serialised from the bus) --------


class _ServerFrame(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json", exclude_none=True))


class Subscribed(_ServerFrame):
    type: Literal["subscribed"] = "subscribed"
    thread_id: str
    version: int
    id: FrameId | None = None


class Unsubscribed(_ServerFrame):
    type: Literal["unsubscribed"] = "unsubscribed"
    thread_id: str
    id: FrameId | None = None


class Ack(_ServerFrame):
    """Answer to a command; carries the same fields as the HTTP answer of that command."""

    type: Literal["ack"] = "ack"
    id: FrameId | None = None


class Pong(_ServerFrame):
    type: Literal["pong"] = "pong"
    id: FrameId | None = None


class ErrorFrame(_ServerFrame):
    type: Literal["error"] = "error"
    code: str
    message: str
    id: FrameId | None = None


class Resync(_ServerFrame):
    """The bus reconnected: live frames may have been lost, refetch the snapshot."""

    type: Literal["resync"] = "resync"
    thread_id: str


class FrameError(Exception):
    """A frame that cannot be decoded; answered with an error frame, the connection stays open."""

    def __init__(
        self, code: str, message: str, frame_id: Any = None, errors: list[Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.frame_id = frame_id
        self.errors = errors

    def to_frame(self) -> ErrorFrame:
        extra = {"errors": self.errors} if self.errors else {}
        return ErrorFrame(code=self.code, message=self.message, id=self.frame_id, **extra)


def _echo_id(data: dict[str, Any]) -> Any:
    """The frame's id when it is one we can echo back (even if the rest of the frame is bad)."""
    value = data.get("id")
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, str) and len(value) <= ID_MAX):
        return value
    return None


def decode_frame(raw: str | bytes) -> ClientFrame:
    """Parse and validate one client frame; raises FrameError describing what is wrong."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise FrameError("invalid_json", f"the frame is not valid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise FrameError("invalid_frame", "a frame must be a JSON object")
    frame_id = _echo_id(data)
    kind = data.get("type")
    if not isinstance(kind, str):
        raise FrameError("invalid_frame", "the frame has no 'type'", frame_id)
    if kind not in CLIENT_FRAME_TYPES:
        raise FrameError("unknown_type", f"unknown frame type {kind[:64]!r}", frame_id)
    try:
        return ClientFrameAdapter.validate_python(data)
    except RecursionError as exc:
        # orjson parses up to 1024 levels; validating that deep exhausts Python's stack.
        message = f"invalid {kind} frame: nested too deeply"
        raise FrameError("invalid_input", message, frame_id) from exc
    except ValidationError as exc:
        errors = [
            {"loc": [str(part) for part in err["loc"][1:]], "msg": err["msg"]}
            for err in exc.errors()
        ]
        raise FrameError(
            "invalid_input", f"invalid {kind} frame", frame_id, errors=errors
        ) from exc
