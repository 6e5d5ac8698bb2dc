"""Transaction functions for input admission: idempotent sends, the queue, admitting the next."""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from runtime import instruments
from runtime.domain import (
    Admission,
    InputPolicy,
    MessageRole,
    QueuedItemStatus,
    RunTrigger,
    Visibility,
)
from runtime.errors import Conflict, NotFound, QueueFull, RunActive, ScopeRunsExceeded
from runtime.storage.decisions import AdmissionAction, admission_action, check_append
from runtime.storage.sql.core import Conn, bump, lock_thread, prelocked, scope_clause
from runtime.storage.sql.rows import Row, decode_parts, new_id, text_parts
from runtime.storage.sql.threads_tx import ACTIVE_STATUSES, TAIL, THREAD, tail_join, tail_row
from runtime.storage.store import AdmissionLimits


def _queue_event(conn: Conn, event: str) -> None:
    conn.on_commit(lambda: instruments.safe_add(instruments.QUEUE_EVENTS, 1, {"event": event}))


async def submit_input(
    conn: Conn,
    thread_id: str,
    scopes: Collection[str],
    *,
    text: str,
    submitted_by: str,
    client_request_id: str | None,
    policy: InputPolicy,
    tools_json: str,
    limits: AdmissionLimits | None = None,
) -> Admission:
    # The thread lock, and the scope check, come first. Taken with the transaction's BEGIN
    # (`Conn.locked`) or by SQLite's write transaction, they are the statement below's, unless
    # the duplicate check must run before it.
    locked = prelocked(conn, thread_id) or not conn.dialect.thread_lock
    if client_request_id is not None or not locked:
        await lock_thread(conn, thread_id, scopes)
    if client_request_id is not None:
        duplicate = await _duplicate(conn, thread_id, client_request_id)
        if duplicate is not None:
            return duplicate
    # One statement: the thread, the active run, the tail and the clock (after the lock).
    clause, values = scope_clause("t.scope", scopes, 2)
    row = await conn.fetchrow(
        f"SELECT r.id AS active_id_{THREAD.select()}{TAIL.select()}{conn.now_column()}"
        f" FROM threads t LEFT JOIN runs r ON r.thread_id = t.id AND r.status IN"
        f" {ACTIVE_STATUSES}{tail_join('t.id')} WHERE t.id = $1 AND {clause}",
        thread_id,
        *values,
    )
    if row is None:
        raise NotFound(f"thread {thread_id} not found")
    thread = THREAD.row(row)
    conn.take_now(row)
    conn.note_version(thread_id, int(thread["version"]))
    active_id: str | None = row["active_id_"]
    action = admission_action(active_id, policy)
    if action is AdmissionAction.REJECT:
        assert active_id is not None
        instruments.safe_add(instruments.QUEUE_EVENTS, 1, {"event": "rejected"})
        raise RunActive(f"thread {thread_id} has an active run", run_id=active_id)
    if action is AdmissionAction.START_RUN:
        appended = await append_message(
            conn,
            thread_id,
            role=MessageRole.USER,
            parts_json=text_parts(text),
            client_request_id=client_request_id,
            tail=TAIL.joined(row),
        )
        message_id = str(appended["id"])
        run_id = await create_run(
            conn,
            thread_id,
            trigger=RunTrigger.MESSAGE,
            started_by=submitted_by,
            input_message_id=message_id,
            client_tools_json=tools_json,
            traceparent=instruments.current_traceparent(),
        )
        version = await bump(conn, thread_id)
        if limits is not None:
            # Last, so the scope's lock is held from here to COMMIT only (the count and COMMIT).
            await _check_scope_runs(conn, str(thread["scope"]), limits, run_id)
        _queue_event(conn, "admitted")
        return Admission(thread_id=thread_id, version=version, run_id=run_id, message_id=message_id)
    assert active_id is not None
    if limits is not None:
        await _check_queue(conn, thread_id, text, limits)
    item_id = await _enqueue(
        conn,
        thread_id,
        text=text,
        submitted_by=submitted_by,
        client_request_id=client_request_id,
        interrupt=action is AdmissionAction.INTERRUPT,
        client_tools_json=tools_json,
    )
    interrupted = None
    if action is AdmissionAction.INTERRUPT:
        interrupted = active_id
        await conn.execute(
            "UPDATE runs SET stop_requested = TRUE, updated_at = $2 WHERE id = $1",
            interrupted,
            await conn.now(),
        )
    _queue_event(conn, "enqueued")
    return Admission(
        thread_id=thread_id,
        version=await bump(conn, thread_id),
        queued_item_id=item_id,
        interrupted_run_id=interrupted,
    )


async def cancel_queued_item(
    conn: Conn, thread_id: str, scopes: Collection[str], item_id: str
) -> int:
    await lock_thread(conn, thread_id, scopes)
    status = await conn.fetchval(
        "SELECT status FROM queued_items WHERE id = $1 AND thread_id = $2", item_id, thread_id
    )
    if status is None:
        raise NotFound(f"queued item {item_id} not found")
    if status != QueuedItemStatus.QUEUED:
        raise Conflict(f"queued item {item_id} is already {status}", status=status)
    await conn.execute("UPDATE queued_items SET status = 'cancelled' WHERE id = $1", item_id)
    _queue_event(conn, "cancelled")
    return await bump(conn, thread_id)


async def _check_queue(conn: Conn, thread_id: str, text: str, limits: AdmissionLimits) -> None:
    """Refuse an item that would take the thread's queue over its bounds (under the lock)."""
    row = await conn.fetchrow(
        f"SELECT COUNT(*) AS items, COALESCE(SUM({conn.dialect.octets('text')}), 0) AS size"
        " FROM queued_items WHERE thread_id = $1 AND status = 'queued'",
        thread_id,
    )
    assert row is not None
    items, size = int(row["items"]), int(row["size"])
    cap_items, cap_bytes = limits.queue_max_items, limits.queue_max_bytes
    over_items = cap_items is not None and items + 1 > cap_items
    over_bytes = cap_bytes is not None and size + len(text.encode("utf-8")) > cap_bytes
    if over_items or over_bytes:
        instruments.safe_add(instruments.QUEUE_EVENTS, 1, {"event": "queue_full"})
        raise QueueFull(
            f"the thread's queue is full ({items} items, {size} bytes; at most"
            f" {cap_items} items and {cap_bytes} bytes)",
            retry_after=limits.retry_after,
            limit_items=cap_items,
            limit_bytes=cap_bytes,
        )


async def _check_scope_runs(conn: Conn, scope: str, limits: AdmissionLimits, run_id: str) -> None:
    """Refuse the new run `run_id` (written by this transaction, which the refusal rolls back)
    when the scope already had its maximum of queued or running runs without it.

    Exact under concurrency: the thread lock orders starts in one thread, and the dialect's
    scope lock (held to COMMIT) orders starts in different threads of the scope; the count is
    a statement after the lock, so it sees every run committed before the lock was granted
    (SQLite's write transaction serialises everything). The check is the admission's last
    statement: the lock, shared by every admission of the scope, is held for the count and the
    COMMIT, not for the admission's writes (docs/benchmarks.md, ninth pass).
    """
    cap = limits.scope_max_active_runs
    if cap is None:
        return
    if conn.dialect.scope_lock is not None:
        # The admission's held writes go with it: one round trip for both.
        await conn.lock(conn.dialect.scope_lock, scope)
    # Counted from the active runs (the partial indexes' condition, spelled as they are, so
    # SQLite may use them; CROSS JOIN keeps runs first there), not from the scope's threads:
    # a scope's threads only grow, its active runs are capped. Planned from the scope's
    # threads, every admission read all of them (docs/benchmarks.md, eighth pass).
    active = await conn.fetchval(
        "SELECT COUNT(*) FROM runs r CROSS JOIN threads t WHERE t.id = r.thread_id"
        " AND r.status IN ('queued', 'running', 'waiting') AND r.status <> 'waiting'"
        " AND t.scope = $1 AND r.id <> $2",
        scope,
        run_id,
    )
    if int(active) >= cap:
        instruments.safe_add(instruments.QUEUE_EVENTS, 1, {"event": "scope_runs_full"})
        raise ScopeRunsExceeded(
            f"scope {scope!r} already has {int(active)} active runs (at most {cap})",
            retry_after=limits.retry_after,
            limit=cap,
        )


# --- used inside other locked write transactions too ---------------------------------------


async def _duplicate(conn: Conn, thread_id: str, request_id: str) -> Admission | None:
    """The admission of the first request with this id, or None if it is new."""
    item = await conn.fetchrow(
        "SELECT id FROM queued_items WHERE thread_id = $1 AND client_request_id = $2",
        thread_id,
        request_id,
    )
    message = await conn.fetchrow(
        "SELECT id FROM messages WHERE thread_id = $1 AND client_request_id = $2",
        thread_id,
        request_id,
    )
    if item is None and message is None:
        return None
    run_id = None
    if message is not None:
        run_id = await conn.fetchval(
            "SELECT id FROM runs WHERE input_message_id = $1 ORDER BY created_version LIMIT 1",
            message["id"],
        )
    version = await conn.fetchval("SELECT version FROM threads WHERE id = $1", thread_id)
    _queue_event(conn, "duplicate")
    return Admission(
        thread_id=thread_id,
        version=int(version),
        run_id=run_id,
        message_id=None if message is None else message["id"],
        queued_item_id=None if item is None else item["id"],
        duplicate=True,
    )


async def append_message(
    conn: Conn,
    thread_id: str,
    *,
    role: MessageRole,
    parts_json: str,
    client_request_id: str | None = None,
    run_id: str | None = None,
    message_id: str | None = None,
    tail: Row | Literal["unread"] | None = "unread",
) -> Row:
    """Append after the tail; refused while the tail still holds a pending action. `tail`:
    the tail row when the caller read it already in this transaction (None: no message).
    Returns the row written: the thread's tail from now on in this transaction (what
    `tail_row` would read back, timestamps as written), so a caller that needs the tail again
    reads nothing."""
    if isinstance(tail, str):
        tail = await tail_row(conn, thread_id)
    check_append(None if tail is None else tail["id"], decode_parts(tail["parts"]) if tail else ())
    now = await conn.now()
    row: Row = {
        "id": message_id or new_id("msg"),
        "thread_id": thread_id,
        "position": 0 if tail is None else int(tail["position"]) + 1,
        "role": role.value,
        "parts": parts_json,
        "visibility": Visibility.VISIBLE.value,
        "run_id": run_id,
        "client_request_id": client_request_id,
        "created_at": now,
        "updated_at": now,
    }
    await conn.execute_later(
        "INSERT INTO messages (id, thread_id, position, role, parts, visibility, run_id,"
        " client_request_id, created_at, updated_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)",
        row["id"],
        thread_id,
        row["position"],
        role.value,
        parts_json,
        Visibility.VISIBLE.value,
        run_id,
        client_request_id,
        now,
    )
    return row


async def create_run(
    conn: Conn,
    thread_id: str,
    *,
    trigger: RunTrigger,
    started_by: str,
    input_message_id: str | None,
    client_tools_json: str,
    traceparent: str | None,
) -> str:
    """A queued run. `traceparent`: the trace context of the request that started it (the
    current one, `instruments.current_traceparent()`, or the queued input's), stored so the
    episode links to it whichever way a worker takes the run."""
    version = await bump(conn, thread_id)
    run_id = new_id("run")
    await conn.execute_later(
        "INSERT INTO runs (id, thread_id, status, trigger, started_by, input_message_id,"
        " episode, next_seq, stop_requested, error, client_tools, created_version,"
        " created_at, updated_at, traceparent)"
        " VALUES ($1, $2, 'queued', $3, $4, $5, 0, 0, FALSE, NULL, $6, $7, $8, $8, $9)",
        run_id,
        thread_id,
        trigger.value,
        started_by,
        input_message_id,
        client_tools_json,
        version,
        await conn.now(),
        traceparent,
    )
    return run_id


async def _enqueue(
    conn: Conn,
    thread_id: str,
    *,
    text: str,
    submitted_by: str,
    client_request_id: str | None,
    interrupt: bool,
    client_tools_json: str,
) -> str:
    position = await conn.fetchval(
        "SELECT COALESCE(MAX(position), -1) + 1 FROM queued_items WHERE thread_id = $1",
        thread_id,
    )
    item_id = new_id("qi")
    await conn.execute(
        "INSERT INTO queued_items (id, thread_id, text, submitted_by, client_request_id,"
        " status, interrupt, client_tools, position, created_at, traceparent)"
        " VALUES ($1, $2, $3, $4, $5, 'queued', $6, $7, $8, $9, $10)",
        item_id,
        thread_id,
        text,
        submitted_by,
        client_request_id,
        interrupt,
        client_tools_json,
        int(position),
        await conn.now(),
        instruments.current_traceparent(),  # the run admitted from it links to this request
    )
    return item_id


async def admit_next(
    conn: Conn, thread_id: str, first: Row | Literal["unread"] | None = "unread"
) -> str | None:
    """Turn the thread's first queued item into a user message and a queued run.

    Called in the same transaction that ended the previous run, so the thread is never
    observed idle with input waiting. `first`: that item's row when the caller read it already
    under the thread lock (None: nothing is queued).
    """
    item = first
    if isinstance(item, str):
        item = await conn.fetchrow(
            "SELECT * FROM queued_items WHERE thread_id = $1 AND status = 'queued'"
            " ORDER BY position LIMIT 1",
            thread_id,
        )
    if item is None:
        return None
    await conn.execute("UPDATE queued_items SET status = 'admitted' WHERE id = $1", item["id"])
    appended = await append_message(
        conn,
        thread_id,
        role=MessageRole.USER,
        parts_json=text_parts(item["text"]),
        client_request_id=item["client_request_id"],
    )
    message_id = str(appended["id"])
    run_id = await create_run(
        conn,
        thread_id,
        trigger=RunTrigger.QUEUED,
        started_by=item["submitted_by"],
        input_message_id=message_id,
        client_tools_json=item["client_tools"],
        traceparent=item["traceparent"],  # the request that queued it, not this commit's
    )
    _queue_event(conn, "admitted")
    return run_id


async def queue_depth(conn: Conn) -> dict[str, int]:
    """Counts for the queue-depth gauges: queued runs (no worker yet) and queued items."""
    runs = await conn.fetchval("SELECT COUNT(*) FROM runs WHERE status = 'queued'")
    items = await conn.fetchval("SELECT COUNT(*) FROM queued_items WHERE status = 'queued'")
    return {"runs": int(runs or 0), "items": int(items or 0)}
