"""Transaction function for the scope-wide inbox: pending actions across a principal's threads."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from runtime.authorization import ThreadMatch
from runtime.domain import InboxEntry, pending_actions_of
from runtime.storage.sql.core import Conn, placeholders, scope_clause
from runtime.storage.sql.rows import Row, like_pattern, loads, message_from_row
from runtime.storage.sql.threads_tx import allowed_clause

# Only a candidate filter on the encoded parts; the projection decides (pending_actions_of).
_AWAITING = like_pattern('"awaiting-action"')
_MAX_BATCHES = 20


async def pending_actions(
    conn: Conn,
    scopes: Collection[str],
    *,
    limit: int,
    after: str | None = None,
    thread_ids: Sequence[str] | None = None,
    allowed: Sequence[ThreadMatch] | None = None,
) -> list[InboxEntry]:
    """The pending actions of up to `limit` threads in `scopes` (threads with none are left
    out), in thread id order after the thread `after` (the page cursor); `thread_ids` and
    `allowed` (an authorization hook's `Narrow`) narrow the threads. Pending actions live
    only in a thread's tail, so one row per thread suffices."""
    if thread_ids is not None and not thread_ids:
        return []
    entries: list[InboxEntry] = []
    # A tail can still say awaiting-action once resolved (until the worker moves it on): such
    # candidates project to nothing, so read on until the page is full or the rows run out.
    for _ in range(_MAX_BATCHES):
        rows = await _candidates(conn, scopes, limit, after, thread_ids, allowed)
        for row in rows:
            message = message_from_row(row)
            actions = tuple(pending_actions_of(message))
            if actions and len(entries) < limit:
                entries.append(
                    InboxEntry(
                        thread_id=message.thread_id,
                        scope=row["thread_scope"],
                        thread_version=int(row["thread_version"]),
                        created_at=message.created_at,
                        actions=actions,
                        thread_owner=row["thread_owner"],
                        thread_metadata=loads(row["thread_metadata"]),
                    )
                )
        if len(rows) < limit or len(entries) >= limit:
            return entries
        after = rows[-1]["thread_id"]
    return entries


async def _candidates(
    conn: Conn,
    scopes: Collection[str],
    limit: int,
    after: str | None,
    thread_ids: Sequence[str] | None,
    allowed: Sequence[ThreadMatch] | None = None,
) -> list[Row]:
    clause, values = scope_clause("t.scope", scopes, 1)
    sql = (
        "SELECT m.*, t.scope AS thread_scope, t.version AS thread_version,"
        " t.owner AS thread_owner, t.metadata AS thread_metadata"
        " FROM threads t JOIN messages m ON m.thread_id = t.id"
        f" WHERE {clause}"
        " AND m.position = (SELECT MAX(position) FROM messages x WHERE x.thread_id = t.id)"
        f" AND m.parts LIKE ${len(values) + 1} ESCAPE '\\'"
    )
    values.append(_AWAITING)
    if after is not None:
        values.append(after)
        sql += f" AND t.id > ${len(values)}"
    if thread_ids is not None:
        sql += f" AND t.id IN ({placeholders(len(values) + 1, len(thread_ids))})"
        values.extend(thread_ids)
    if allowed is not None:
        narrow, narrow_values = allowed_clause(conn, allowed, len(values) + 1)
        sql += f" AND t.id IN (SELECT threads.id FROM threads WHERE {narrow})"
        values.extend(narrow_values)
    values.append(int(limit))
    return await conn.fetch(f"{sql} ORDER BY t.id LIMIT ${len(values)}", *values)


async def thread_scopes(conn: Conn, ids: Sequence[str]) -> dict[str, str]:
    """The scope of each existing thread of `ids` (a thread's scope never changes)."""
    rows = await conn.fetch(
        f"SELECT id, scope FROM threads WHERE id IN ({placeholders(1, len(ids))})", *ids
    )
    return {row["id"]: row["scope"] for row in rows}
