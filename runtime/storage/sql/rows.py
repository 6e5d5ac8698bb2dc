"""Codecs for the SQL stores: ids, JSON text columns, input validation and rows -> domain models."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from runtime.domain import (
    MAX_METADATA_BYTES,
    MAX_PARTS_PER_MESSAGE,
    Lease,
    LeaseKind,
    Message,
    MessageRole,
    Part,
    PartsAdapter,
    QueuedItem,
    QueuedItemStatus,
    Run,
    RunStatus,
    RunTrigger,
    Thread,
    Visibility,
)
from runtime.errors import InvalidInput, TooLarge

# Rows are plain dicts on every backend so the shared logic never sees driver types.
Row = dict[str, Any]


def new_id(prefix: str) -> str:
    """`prefix_` and a random UUID4 in hex (what `uuid.uuid4().hex` gives, without building
    the UUID object: several ids per run)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return f"{prefix}_{raw.hex()}"


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def loads(text: str) -> Any:
    return orjson.loads(text)


def encode_json(value: Any, what: str, limit: int | None = None) -> str:
    """Serialise caller data, turning unserialisable or oversized values into domain errors."""
    try:
        data = orjson.dumps(value)
    except TypeError as exc:
        raise InvalidInput(f"{what} is not JSON-serialisable: {exc}") from exc
    if limit is not None and len(data) > limit:
        raise TooLarge(f"{what} is larger than {limit} bytes", limit=limit)
    return data.decode()


def encode_metadata(value: Any, what: str) -> str:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    return encode_json(value, what, MAX_METADATA_BYTES)


def encode_client_tools(tools: Iterable[Any]) -> str:
    tools = list(tools)
    if not all(isinstance(tool, dict) for tool in tools):
        raise InvalidInput("client_tools must be a list of JSON objects")
    return encode_json(tools, "client_tools", MAX_METADATA_BYTES)


def _plain(part: Any) -> Any:
    return part.model_dump(mode="json", by_alias=True) if isinstance(part, BaseModel) else part


def validate_parts(parts: Sequence[Any]) -> list[Part]:
    """Re-validate parts even when typed: models built with `model_construct` skip validation."""
    if len(parts) > MAX_PARTS_PER_MESSAGE:
        raise TooLarge(f"a message holds at most {MAX_PARTS_PER_MESSAGE} parts")
    try:
        return PartsAdapter.validate_python([_plain(part) for part in parts])
    except ValidationError as exc:
        if any(error["type"] == "string_too_long" for error in exc.errors()):
            raise TooLarge(f"message part too large: {exc.errors()[0]['msg']}") from exc
        raise InvalidInput(
            f"malformed message parts: {exc.errors()[0]['msg']}",
            errors=exc.errors(include_url=False, include_context=False, include_input=False),
        ) from exc


def encode_parts(parts: Sequence[Any]) -> str:
    validated = validate_parts(parts)
    return dumps(PartsAdapter.dump_python(validated, mode="json", by_alias=True))


def decode_parts(text: str) -> tuple[Part, ...]:
    return tuple(PartsAdapter.validate_json(text))


def text_parts(text: str) -> str:
    return dumps([{"type": "text", "text": text}])


def like_pattern(fragment: str) -> str:
    """A LIKE pattern (escape character backslash) matching `fragment` anywhere."""
    escaped = fragment.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def thread_from_row(row: Row) -> Thread:
    return Thread(
        id=row["id"],
        scope=row["scope"],
        title=row["title"],
        version=int(row["version"]),
        metadata=loads(row["metadata"]),
        private_metadata=loads(row["private_metadata"]),
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
        # The worker's fenced reads name their columns and leave the owner out: it never asks.
        owner=row.get("owner"),
    )


def message_from_row(row: Row) -> Message:
    return Message(
        id=row["id"],
        thread_id=row["thread_id"],
        position=int(row["position"]),
        role=MessageRole(row["role"]),
        parts=decode_parts(row["parts"]),
        visibility=Visibility(row["visibility"]),
        run_id=row["run_id"],
        client_request_id=row["client_request_id"],
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
    )


def run_from_row(row: Row) -> Run:
    """`row` is a runs row joined with its thread's `scope`."""
    return Run(
        id=row["id"],
        thread_id=row["thread_id"],
        scope=row["scope"],
        status=RunStatus(row["status"]),
        trigger=RunTrigger(row["trigger"]),
        started_by=row["started_by"],
        input_message_id=row["input_message_id"],
        episode=int(row["episode"]),
        resumed_episode=int(row["resumed_episode"]),
        next_seq=int(row["next_seq"]),
        stop_requested=bool(row["stop_requested"]),
        error=row["error"],
        client_tools=tuple(loads(row["client_tools"])),
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
        traceparent=row.get("traceparent"),
    )


def item_from_row(row: Row) -> QueuedItem:
    return QueuedItem(
        id=row["id"],
        thread_id=row["thread_id"],
        text=row["text"],
        submitted_by=row["submitted_by"],
        client_request_id=row["client_request_id"],
        status=QueuedItemStatus(row["status"]),
        interrupt=bool(row["interrupt"]),
        client_tools=tuple(loads(row["client_tools"])),
        position=int(row["position"]),
        created_at=float(row["created_at"]),
    )


def lease_from_row(row: Row) -> Lease:
    return Lease(
        kind=LeaseKind(row["kind"]),
        resource_id=row["resource_id"],
        thread_id=row["thread_id"],
        owner=row["owner"],
        token=int(row["token"]),
        expires_at=float(row["expires_at"]),
    )
