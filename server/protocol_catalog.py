"""The wire protocol in one place: commands, frames, envelopes, chunks and close codes.

Where each part is declared (this module re-exports them; docs/protocol.md describes them):

- commands, one row each, for both transports: `server.protocol.commands.COMMANDS`
- their inputs (HTTP bodies and frame fields): `server.protocol.inputs`
- client -> server websocket frames, generated from the commands: `server.protocol.client_frames`
- server -> client answers to frames (`subscribed`, `ack`, `pong`, `error`, ...):
  `threadline_wire.frames`
- live server -> client frames, published on the bus (`chunk`, `invalidate`, `resync`):
  `realtime.envelopes`
- the `chunk` payloads of a step (`text-delta`, `tool-call`, ...): `threadline_wire.chunks`
- websocket close codes: `realtime.closecodes.CloseCode`
- error codes and their HTTP statuses: `server.protocol.wire_errors.STATUS`

Run `python -m server.protocol_catalog --write` to regenerate the command tables of
docs/protocol.md.
"""

from __future__ import annotations

import enum
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from realtime.closecodes import CloseCode
from realtime.envelopes import ChunkEnvelope, InvalidateEnvelope, ResyncEnvelope
from server.protocol.client_frames import (
    CLIENT_FRAME_TYPES,
    FRAME_MODELS,
    ClientFrame,
    FrameError,
    decode_frame,
)
from server.protocol.command_model import Command, Http
from server.protocol.commands import BY_NAME, COMMANDS
from server.protocol.inputs import Input
from server.protocol.wire_errors import STATUS, WireError, wire_error
from server.transports.http_routes import body_model
from threadline_wire.chunks import StreamChunk
from threadline_wire.frames import Ack, ErrorFrame, Pong, ServerFrame, Subscribed, Unsubscribed

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"


# --- the command tables of docs/protocol.md -----------------------------------------------


def _type_doc(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_doc(args[0])
    if origin in (typing.Union, types.UnionType):
        return "\\|".join(_type_doc(arg) for arg in args if arg is not type(None))
    if origin is typing.Literal:
        return "\\|".join(f'"{arg}"' for arg in args)
    if origin is list:
        return f"[{_type_doc(args[0])}]"
    if annotation is dict or origin is dict:
        return "{...}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "\\|".join(f'"{member.value}"' for member in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _fields_doc(annotation, typed=False)
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _fields_doc(model: type[BaseModel], *, typed: bool, skip: tuple[str, ...] = ()) -> str:
    parts = []
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        key = f'"{name}"' + ("" if info.is_required() else "?")
        parts.append(f"{key}: {_type_doc(info.annotation)}" if typed else key)
    return "{" + ", ".join(parts) + "}"


def _route_doc(http: Http, command: Command[Any, Any]) -> str:
    query = [
        f"{name}={_type_doc(info.annotation)}"
        for name, info in command.input.model_fields.items()
        if name not in http.path_fields
    ]
    tail = f"[?{'&'.join(query)}]" if http.query is not None else ""
    return f"`{http.method} {http.path}{tail}`"


def _body_doc(command: Command[Any, Any]) -> str:
    body = body_model(command)
    if body is None:
        return ""
    if not body.model_fields:
        return "none (or `{}`)"
    return f"`{_fields_doc(body, typed=True)}`"


def _frame_doc(command: Command[Any, Any]) -> str:
    fields = _fields_doc(command.input, typed=False)
    inner = fields[1:-1]
    return f'`{{"type": "{command.name}"' + (f", {inner}" if inner else "") + "}`"


def http_table() -> str:
    rows = ["| route | body | answer |", "| --- | --- | --- |"]
    for command in COMMANDS:
        if command.http is not None:
            http = command.http
            answer = f"{http.status} {command.answer_doc}"
            rows.append(f"| {_route_doc(http, command)} | {_body_doc(command)} | {answer} |")
    return "\n".join(rows)


def frame_table() -> str:
    rows = ["| frame | answer |", "| --- | --- |"]
    for command in COMMANDS:
        if command.reply is Ack:
            rows.append(f"| {_frame_doc(command)} | `ack` {command.answer_doc} |")
        elif command.reply is not None:
            rows.append(f"| {_frame_doc(command)} | {command.answer_doc} |")
    return "\n".join(rows)


def command_table() -> str:
    rows = ["| command | HTTP | websocket | why one transport only |", "| --- | --- | --- | --- |"]
    for command in COMMANDS:
        http = f"`{command.http.method} {command.http.path}`" if command.http else command.sse
        http = http or "—"
        ws = f'`"{command.name}"`' if command.reply is not None else "—"
        rows.append(f"| {command.name} | {http} | {ws} | {command.note} |")
    return "\n".join(rows)


TABLES = {"commands": command_table, "http": http_table, "frames": frame_table}


def _markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- generated: {name} (python -m server.protocol_catalog --write) -->",
        f"<!-- end generated: {name} -->",
    )


def render(document: str) -> str:
    """`document` with every generated table replaced by what the command table says now."""
    for name, table in TABLES.items():
        begin, end = _markers(name)
        head, found, rest = document.partition(begin)
        if not found:
            raise ValueError(f"docs/protocol.md has no {begin!r}")
        _, found, tail = rest.partition(end)
        if not found:
            raise ValueError(f"docs/protocol.md has no {end!r}")
        document = f"{head}{begin}\n{table()}\n{end}{tail}"
    return document


def main(argv: list[str]) -> int:
    current = DOC.read_text(encoding="utf-8")
    fresh = render(current)
    if "--write" in argv:
        DOC.write_text(fresh, encoding="utf-8")
        return 0
    if fresh != current:
        print("docs/protocol.md is stale: run python -m server.protocol_catalog --write")
        return 1
    return 0


__all__ = [
    "BY_NAME",
    "CLIENT_FRAME_TYPES",
    "COMMANDS",
    "FRAME_MODELS",
    "STATUS",
    "Ack",
    "ChunkEnvelope",
    "ClientFrame",
    "CloseCode",
    "Command",
    "ErrorFrame",
    "FrameError",
    "Http",
    "Input",
    "InvalidateEnvelope",
    "Pong",
    "ResyncEnvelope",
    "ServerFrame",
    "StreamChunk",
    "Subscribed",
    "Unsubscribed",
    "WireError",
    "decode_frame",
    "wire_error",
]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
