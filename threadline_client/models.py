"""Typed views of Threadline's wire bodies (the answers: threadline_wire's); unknown fields kept."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from threadline_wire import AdmissionAnswer
from threadline_wire.chunks import StreamChunk, StreamChunkAdapter
from threadline_wire.command_answers import (
    MetadataAnswer,
    Principal,
    RegenerateAnswer,
    StopAnswer,
    ThreadInfo,
    ThreadPage,
    VersionAnswer,
)
from threadline_wire.enums import RunStatus

# A snapshot and what it holds: the wire's models, which the server's snapshot serializes to.
from threadline_wire.thread_snapshot import Message, Page, PendingAction, Run, Snapshot, WireModel

ACTIVE_RUN_STATUSES = frozenset(status for status in RunStatus if status.is_active)
TERMINAL_RUN_STATUSES = frozenset(status for status in RunStatus if status.is_terminal)


# The answer to sending a message: declared once, in threadline_wire, for the server and here.
Admission = AdmissionAnswer


def typed_chunk(chunk: dict[str, Any]) -> StreamChunk | dict[str, Any]:
    """A `chunk` frame's chunk as the runtime's own model (`TextDeltaChunk`, `ToolCallChunk`,
    ...); one this client does not know (a newer server's) stays a dict."""
    try:
        return StreamChunkAdapter.validate_python(chunk)
    except ValidationError:
        return chunk


__all__ = [
    "ACTIVE_RUN_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "Admission",
    "Message",
    "MetadataAnswer",
    "Page",
    "PendingAction",
    "Principal",
    "RegenerateAnswer",
    "Run",
    "Snapshot",
    "StopAnswer",
    "ThreadInfo",
    "ThreadPage",
    "VersionAnswer",
    "WireModel",
    "typed_chunk",
]
