"""Transaction function for history rewrites under an admin lease: regenerate and visibility."""

from __future__ import annotations

from typing import Any, Literal

from runtime.domain import MAX_METADATA_BYTES, Lease, LeaseKind, MessageRole, RunTrigger, Visibility
from runtime.errors import NotFound
from runtime.storage.base import RewriteResult, SetVisibility, Truncate
from runtime.storage.decisions import (
    MessageRef,
    check_rewrite_allowed,
    merge_patch,
    plan_truncate,
)
from runtime.storage.sql_core import Conn, bump
from runtime.storage.sql_leases import fence
from runtime.storage.sql_queue import create_run
from runtime.storage.sql_rows import Row, encode_json, loads
from runtime.storage.sql_threads import active_run_row


async def rewrite_history(
    conn: Conn,
    lease: Lease,
    op: Truncate | SetVisibility,
    public: dict[str, Any],
    private: dict[str, Any],
) -> RewriteResult:
    thread, _ = await fence(conn, lease, LeaseKind.ADMIN)
    thread_id = lease.thread_id
    active = await active_run_row(conn, thread_id)
    check_rewrite_allowed(thread_id, None if active is None else active["id"])
    run_id = None
    removed: tuple[str, ...] = ()
    if isinstance(op, Truncate):
        run_id, removed = await _truncate(conn, thread_id, op)
    else:
        updated = await conn.fetchval(
            "UPDATE messages SET visibility = $3, updated_at = $4"
            " WHERE id = $1 AND thread_id = $2 RETURNING id",
            op.message_id,
            thread_id,
            Visibility(op.visibility).value,
            await conn.now(),
        )
        if updated is None:
            raise NotFound(f"message {op.message_id} not found")
    await _merge_metadata(conn, thread, "metadata", public)
    await _merge_metadata(conn, thread, "private_metadata", private)
    return RewriteResult(
        thread_id=thread_id,
        version=await bump(conn, thread_id),
        run_id=run_id,
        removed_message_ids=removed,
    )


async def _truncate(conn: Conn, thread_id: str, op: Truncate) -> tuple[str, tuple[str, ...]]:
    rows = await conn.fetch(
        "SELECT id, position, role FROM messages WHERE thread_id = $1 ORDER BY position",
        thread_id,
    )
    plan = plan_truncate(
        [MessageRef(row["id"], int(row["position"]), MessageRole(row["role"])) for row in rows],
        op.from_message_id,
    )
    await conn.execute(
        "DELETE FROM messages WHERE thread_id = $1 AND position >= $2",
        thread_id,
        plan.from_position,
    )
    # Regenerating keeps the client tools the original request brought.
    tools = await conn.fetchval(
        "SELECT client_tools FROM runs WHERE input_message_id = $1"
        " ORDER BY created_version DESC LIMIT 1",
        plan.input_message_id,
    )
    run_id = await create_run(
        conn,
        thread_id,
        trigger=RunTrigger.REGENERATE,
        started_by=op.started_by,
        input_message_id=plan.input_message_id,
        client_tools_json=tools or "[]",
    )
    return run_id, plan.removed_ids


async def _merge_metadata(
    conn: Conn, thread: Row, column: Literal["metadata", "private_metadata"], patch: dict[str, Any]
) -> None:
    merged = merge_patch(loads(thread[column]), patch)
    if merged is None:
        return
    # `column` is one of two fixed names, never caller input.
    await conn.execute(
        f"UPDATE threads SET {column} = $2 WHERE id = $1",
        thread["id"],
        encode_json(merged, column, MAX_METADATA_BYTES),
    )
