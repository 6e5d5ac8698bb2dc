"""A bounded snapshot in one statement, where rows can be selected as values (Postgres).

`snapshots_tx.snapshot` reads a bounded snapshot in five statements (the thread, the page of
messages, the last message, the latest run, the queued items), so it needs one REPEATABLE READ
transaction for them to agree: on Postgres that is seven round trips (BEGIN, five, COMMIT).
Here the same five reads are subqueries of one statement, each table's rows selected whole as
composite values (`SELECT m FROM messages m`), which the driver decodes with the same column
names and types as `SELECT *`. One statement reads one snapshot of the database, so it needs no
transaction: one round trip, and the rows go through the very same assembly
(`snapshots_tx.page_snapshot`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from runtime.domain import Snapshot
from runtime.errors import NotFound
from runtime.storage.sql.core import Conn, scope_clause
from runtime.storage.sql.rows import Row, item_from_row, run_from_row, thread_from_row
from runtime.storage.sql.snapshots_tx import page_snapshot


def _row(value: Any) -> Row:
    """A composite value (the driver's record) as the dict `SELECT *` gives for its row."""
    return dict(value) if not isinstance(value, dict) else value


def statement(
    scopes: Collection[str], include_hidden: bool, before: int | None
) -> tuple[str, list[Any]]:
    """The SQL and its arguments after `$1` (thread id) and `$2` (limit + 1)."""
    clause, values = scope_clause("t.scope", scopes, 3)
    args: list[Any] = list(values)
    visible = "" if include_hidden else " AND m.visibility = 'visible'"
    older = ""
    if before is not None:
        args.append(before)
        older = f" AND m.position < ${len(args) + 2}"
    sql = (
        "SELECT t AS thread,"
        " ARRAY(SELECT m FROM messages m"
        f" WHERE m.thread_id = t.id{visible}{older} ORDER BY m.position DESC LIMIT $2) AS page,"
        " (SELECT m FROM messages m WHERE m.thread_id = t.id"
        " ORDER BY m.position DESC LIMIT 1) AS tail,"
        " (SELECT r FROM runs r WHERE r.thread_id = t.id"
        " ORDER BY r.created_version DESC LIMIT 1) AS run,"
        " ARRAY(SELECT q FROM queued_items q WHERE q.thread_id = t.id AND q.status = 'queued'"
        " ORDER BY q.position) AS queue"
        f" FROM threads t WHERE t.id = $1 AND {clause}"
    )
    return sql, args


async def bounded_snapshot(
    conn: Conn,
    thread_id: str,
    scopes: Collection[str],
    include_hidden: bool,
    limit: int,
    before: int | None,
) -> Snapshot:
    """What `snapshots_tx.snapshot` answers with a `message_limit`, in one statement."""
    sql, args = statement(scopes, include_hidden, before)
    found = await conn.fetchrow(sql, thread_id, limit + 1, *args)
    if found is None:
        raise NotFound(f"thread {thread_id} not found")
    thread_values = _row(found["thread"])
    run = found["run"]
    run_values: Mapping[str, Any] | None = None
    if run is not None:  # as `threads_tx.RUN_SELECT` reads it: with its thread's scope
        run_values = {**_row(run), "scope": thread_values["scope"]}
    return page_snapshot(
        thread_from_row(thread_values),
        [_row(m) for m in found["page"] or ()],
        None if found["tail"] is None else _row(found["tail"]),
        None if run_values is None else run_from_row(dict(run_values)),
        [item_from_row(_row(q)) for q in found["queue"] or ()],
        limit,
    )
