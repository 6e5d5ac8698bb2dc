"""Command answers declared once: the server's command table builds them, the client reads them.

Lenient on input (`extra="allow"`: a newer server may add fields, docs/protocol.md says clients
ignore them); `to_wire()` is the body the server sends, every declared field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from threadline_wire.enums import Role, RunStatus


class WireAnswer(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

    def to_wire(self) -> dict[str, Any]:
        """The answer body (JSON-ready: enums as their values)."""
        body: dict[str, Any] = self.model_dump(mode="json", by_alias=True)
        return body


class ThreadInfo(WireAnswer):
    """A thread as the list shows it (its private metadata never leaves the server)."""

    id: str
    scope: str
    title: str
    version: int
    metadata: dict[str, Any] = Field(default_factory=dict)
    owner: str | None = None
    created_at: float | None = None
    updated_at: float | None = None


class ThreadPage(WireAnswer):
    """A page of `GET /v1/threads`; `next_cursor` pages on (None: the last page)."""

    threads: list[ThreadInfo]
    next_cursor: str | None = None


class VersionAnswer(WireAnswer):
    thread_id: str
    version: int


class MetadataAnswer(VersionAnswer):
    metadata: dict[str, Any]


class StopAnswer(VersionAnswer):
    run_id: str
    status: RunStatus


class RegenerateAnswer(VersionAnswer):
    run_id: str


class Principal(WireAnswer):
    subject: str
    role: Role
    scopes: list[str]
    name: str | None = None  # the token's display name, else the subject (newer servers)


__all__ = [
    "MetadataAnswer",
    "Principal",
    "RegenerateAnswer",
    "StopAnswer",
    "ThreadInfo",
    "ThreadPage",
    "VersionAnswer",
    "WireAnswer",
]
