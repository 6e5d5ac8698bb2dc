"""The wire models' JSON Schema and the command table's routes, for clients/typescript/.

`python scripts/ts_protocol.py OUT.json` writes one document: `schema` (every wire model the
TypeScript client types, as pydantic's JSON Schema, in `$defs`) and `commands` (each command of
`server/protocol/commands.py`: name, HTTP method and path, websocket frame or not). The node
script `clients/typescript/scripts/generate.mjs` turns it into `src/generated/`; the drift test
(tests/unit/test_ts_client.py) regenerates both and compares them with the committed files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import models_json_schema

from runtime.domain import Part
from server.protocol.commands import COMMANDS
from threadline_client.models import Admission, PendingAction, Snapshot
from threadline_wire.chunks import StreamChunk
from threadline_wire.command_answers import (
    MetadataAnswer,
    Principal,
    RegenerateAnswer,
    StopAnswer,
    ThreadPage,
    VersionAnswer,
)
from threadline_wire.frames import (
    Ack,
    ActionsSubscribed,
    ActionsUnsubscribed,
    ChunkEnvelope,
    ErrorFrame,
    InvalidateEnvelope,
    Pong,
    ResyncEnvelope,
    Subscribed,
    Unsubscribed,
)

REF = "#/$defs/{model}"
# Answers and frames, by the name the TypeScript side exports.
MODELS: tuple[type[BaseModel], ...] = (
    Snapshot,
    PendingAction,
    ThreadPage,
    MetadataAnswer,
    VersionAnswer,
    StopAnswer,
    RegenerateAnswer,
    Principal,
    Admission,
    ChunkEnvelope,
    InvalidateEnvelope,
    ResyncEnvelope,
    Subscribed,
    Unsubscribed,
    Ack,
    Pong,
    ErrorFrame,
    ActionsSubscribed,
    ActionsUnsubscribed,
)
# Discriminated unions: a named alias over their members.
UNIONS: dict[str, Any] = {"Part": Part, "StreamChunk": StreamChunk}


def _inputs() -> list[type[BaseModel]]:
    """Every command's input model, once each, in table order."""
    seen: dict[str, type[BaseModel]] = {}
    for command in COMMANDS:
        seen.setdefault(command.input.__name__, command.input)
    return list(seen.values())


def schema() -> dict[str, Any]:
    models = [*MODELS, *_inputs()]
    # Inputs are read (validation), answers written (serialization): one mode each, as sent.
    pairs = [(m, "serialization" if m in MODELS else "validation") for m in models]
    _, top = models_json_schema(pairs, ref_template=REF)  # type: ignore[arg-type]
    defs: dict[str, Any] = dict(top.get("$defs", {}))
    for name, union in UNIONS.items():
        adapted = TypeAdapter(union).json_schema(ref_template=REF, mode="serialization")
        defs.update(adapted.pop("$defs", {}))
        defs[name] = adapted
    inputs = {m.__name__ for m in _inputs()}  # a client may leave an input's default out
    for name, definition in defs.items():
        if name not in inputs:
            _literals_required(definition)
    return {"title": "ThreadlineProtocol", "$defs": dict(sorted(defs.items()))}


def _literals_required(definition: dict[str, Any]) -> None:
    """A `Literal` discriminator (`type`) is always on the wire, default or not: required, so
    TypeScript can narrow the unions on it."""
    properties = definition.get("properties", {})
    constants = [name for name, field in properties.items() if "const" in field]
    if constants:
        definition["required"] = sorted({*definition.get("required", []), *constants})


def commands() -> list[dict[str, Any]]:
    rows = []
    for command in COMMANDS:
        http = command.http
        rows.append(
            {
                "name": command.name,
                "input": command.input.__name__,
                "method": http.method if http else None,
                "path": http.path if http else None,
                "status": http.status if http else None,
                "query": bool(http and http.query is not None),
                "websocket": command.reply is not None,
            }
        )
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python scripts/ts_protocol.py OUT.json", file=sys.stderr)
        return 2
    document = {"schema": schema(), "commands": commands()}
    Path(argv[1]).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
