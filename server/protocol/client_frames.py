"""Client -> server websocket frames, generated from the command table, and their decoding."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union, cast

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from runtime.errors import ThreadlineError
from runtime.service.thread_service import validation_field_errors
from server.protocol.command_model import Command
from server.protocol.commands import COMMANDS
from server.protocol.inputs import ID_MAX
from threadline_wire.frames import FrameId


class Frame(BaseModel):
    """The envelope every client frame adds to its command's input: `type`, and an echoed `id`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    id: FrameId | None = None


def _frame_model(command: Command[Any, Any]) -> type[Frame]:
    words = command.name.replace(".", "_").split("_")
    model = create_model(
        "".join(word.capitalize() for word in words) + "Frame",
        __base__=(command.input, Frame),
        __module__=__name__,
        type=(Literal[command.name], ...),  # type: ignore[arg-type]
    )
    return cast(type[Frame], model)


FRAME_MODELS: dict[str, type[Frame]] = {
    command.name: _frame_model(command) for command in COMMANDS if command.reply is not None
}
CLIENT_FRAME_TYPES: tuple[str, ...] = tuple(FRAME_MODELS)
# Built at import time from the command table, so a runtime value, not a static type.
ClientFrame: Any = Annotated[
    Union[tuple(FRAME_MODELS.values())],  # noqa: UP007
    Field(discriminator="type"),
]
ClientFrameAdapter: TypeAdapter[Frame] = TypeAdapter(ClientFrame)


class FrameError(ThreadlineError):
    """A frame that cannot be decoded; answered with an error frame, the connection stays open."""

    def __init__(
        self, code: str, message: str, frame_id: Any = None, errors: list[Any] | None = None
    ) -> None:
        details = {"errors": errors} if errors else {}
        super().__init__(message, **details)
        self.code = code
        self.frame_id = frame_id
        self.errors = errors


def _echo_id(data: dict[str, Any]) -> Any:
    """The frame's id when it is one we can echo back (even if the rest of the frame is bad)."""
    value = data.get("id")
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, str) and len(value) <= ID_MAX):
        return value
    return None


def decode_frame(raw: str | bytes) -> Frame:
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
    if kind not in FRAME_MODELS:
        raise FrameError("unknown_type", f"unknown frame type {kind[:64]!r}", frame_id)
    try:
        return ClientFrameAdapter.validate_python(data)
    except RecursionError as exc:
        # orjson parses up to 1024 levels; validating that deep exhausts Python's stack.
        message = f"invalid {kind} frame: nested too deeply"
        raise FrameError("invalid_input", message, frame_id) from exc
    except ValidationError as exc:
        # The first part of each loc is the union's tag (the frame type): not a field.
        errors = validation_field_errors(exc, skip=1)
        raise FrameError("invalid_input", f"invalid {kind} frame", frame_id, errors=errors) from exc


__all__ = [
    "CLIENT_FRAME_TYPES",
    "FRAME_MODELS",
    "ClientFrame",
    "ClientFrameAdapter",
    "Frame",
    "FrameError",
    "decode_frame",
]
