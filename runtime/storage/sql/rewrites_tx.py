"""Transaction function for history rewrites under an admin lease: regenerate, retry, visibility."""

from __future__ import annotations

from typing import Any, Literal

from runtime import instruments
from runtime.domain import MAX_METADATA_BYTES, Lease, LeaseKind, MessageRole, RunTrigger, Visibility
from runtime.errors import NotFound
from runtime.storage.decisions import (
    MessageRef,
    check_expected_version,
    check_retryable,
    check_rewrite_allowed,
    merge_patch,
    plan_truncate,
)
from runtime.storage.sql.core import Conn, bump
from runtime.storage.sql.leases_tx import fence
from runtime.storage.sql.queue_tx import create_run
from runtime.storage.sql.rows import Row, encode_json, loads
from runtime.storage.sql.threads_tx import active_run_row
from runtime.storage.store import RetryRun, RewriteOp, RewriteResult, Truncate


async def rewrite_history(
    conn: Conn,
    lease: Lease,
    op: RewriteOp,
    public: dict[str, Any],
    private: dict[str, Any],
) -> RewriteResult:
    thread = (await fence(conn, lease, LeaseKind.ADMIN)).thread
    thread_id = lease.thread_id
    # Checked on the locked row: nothing can change the thread between this and the commit.
    check_expected_version(thread_id, int(thread["version"]), op.expected_version)
    active = await active_run_row(conn, thread_id)
    check_rewrite_allowed(thread_id, None if active is None else active["id"])
    run_id = None
    removed: tuple[str, ...] = ()
    if isinstance(op, Truncate):
        run_id, removed = await _truncate(conn, thread_id, op)
    elif isinstance(op, RetryRun):
        run_id, removed = await _retry(conn, thread_id, op)
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
    # Messages before the tail changed (or went): readers caching them must re-read.
    await conn.execute(
        "UPDATE threads SET history_epoch = history_epoch + 1 WHERE id = $1", thread_id
    )
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
        traceparent=instruments.current_traceparent(),
    )
    return run_id, plan.removed_ids


async def _retry(conn: Conn, thread_id: str, op: RetryRun) -> tuple[str, tuple[str, ...]]:
    latest = await conn.fetchrow(
        "SELECT id, status, input_message_id, client_tools FROM runs WHERE thread_id = $1"
        " ORDER BY created_version DESC LIMIT 1",
        thread_id,
    )
    check_retryable(
        op.run_id,
        None if latest is None else latest["id"],
        None if latest is None else latest["status"],
    )
    assert latest is not None  # check_retryable refused a thread without runs
    # The latest run's messages are the thread's tail: removing them keeps the tail invariant.
    removed = await conn.fetch(
        "SELECT id FROM messages WHERE thread_id = $1 AND run_id = $2 ORDER BY position",
        thread_id,
        op.run_id,
    )
    await conn.execute(
        "DELETE FROM messages WHERE thread_id = $1 AND run_id = $2", thread_id, op.run_id
    )
    run_id = await create_run(
        conn,
        thread_id,
        trigger=RunTrigger.RETRY,
        started_by=op.started_by,
        input_message_id=latest["input_message_id"],
        client_tools_json=latest["client_tools"] or "[]",
        traceparent=instruments.current_traceparent(),
    )
    return run_id, tuple(row["id"] for row in removed)


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
