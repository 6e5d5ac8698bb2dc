"""The snapshot read of the command table: its query parameters and its call, through the
gateway's snapshot cache when there is one."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

from runtime.domain import Snapshot
from runtime.errors import InvalidInput
from server.live.snapshot_cache import ReadKey
from server.protocol.command_model import Caller
from server.protocol.inputs import GetSnapshot


def _include_hidden(query: Mapping[str, str]) -> dict[str, Any]:
    value = query.get("include_hidden", "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise InvalidInput("query parameter 'include_hidden' must be true or false")
    return {"include_hidden": value in ("true", "1")}


def snapshot_query(query: Mapping[str, str]) -> dict[str, Any]:
    fields = _include_hidden(query)
    for name, low, high in (("before", 0, 2**62), ("limit", 1, 500)):
        raw = query.get(name)
        if raw is None:
            continue
        if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
            raise InvalidInput(f"query parameter {name!r} must be an integer from {low} to {high}")
        fields[name] = int(raw)
    return fields


async def read_snapshot(c: Caller, i: GetSnapshot) -> Snapshot:
    """The thread's snapshot as the caller sees it: through the gateway's cache when it has
    one (the same answer: it serves only what is still the newest version it knows of)."""
    hidden, before, limit = i.include_hidden, i.before, i.limit
    if c.snapshots is None:
        return await c.service.snapshot(
            c.principal, i.thread_id, include_hidden=hidden, before=before, limit=limit
        )

    def read() -> Awaitable[Snapshot]:
        return c.service.committed_snapshot(
            c.principal, i.thread_id, include_hidden=hidden, before=before, limit=limit
        )

    def view(committed: Snapshot) -> Awaitable[Snapshot]:
        return c.service.view_snapshot(c.principal, committed)

    key = ReadKey(i.thread_id, hidden, before, limit)
    return await c.snapshots.snapshot(c.principal, key, read, view)
