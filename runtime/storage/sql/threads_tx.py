"""Transaction functions for threads: creation, renames, listing, and the rows others read."""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.authorization import ThreadMatch
from runtime.domain import (
    Message,
    QueuedItem,
    Run,
    Thread,
)
from runtime.errors import Conflict, NotFound
from runtime.storage.sql import keys_tx
from runtime.storage.sql.core import Conn, bump, lock_thread, placeholders, scope_clause, thread_row
from runtime.storage.sql.rows import (
    Row,
    encode_metadata,
    item_from_row,
    loads,
    message_from_row,
    run_from_row,
    thread_from_row,
)
from runtime.storage.thread_query import ThreadQuery, ThreadStatus, merge_patch, read_cursor

ACTIVE_STATUSES = "('queued', 'running', 'waiting')"
RUN_SELECT = "SELECT r.*, t.scope FROM runs r JOIN threads t ON t.id = r.thread_id"
# Chunked so a long watch list never exceeds a backend's parameter limit.
_VERSIONS_CHUNK = 500


async def create_thread(
    conn: Conn,
    thread_id: str,
    scope: str,
    title: str,
    public_json: str,
    private_json: str,
    owner: str | None = None,
) -> Thread:
    row = await conn.fetchrow(
        "INSERT INTO threads (id, scope, title, version, metadata, private_metadata,"
        " created_at, updated_at, owner) VALUES ($1, $2, $3, 1, $4, $5, $6, $6, $7)"
        " ON CONFLICT (id) DO NOTHING RETURNING *",
        thread_id,
        scope,
        title,
        public_json,
        private_json,
        await conn.now(),
        owner,
    )
    if row is None:
        raise Conflict(f"thread {thread_id} exists already")
    return thread_from_row(row)


async def create_thread_call(
    conn: Conn,
    key: str,
    thread_id: str,
    scope: str,
    title: str,
    public_json: str,
    private_json: str,
    owner: str | None = None,
) -> Thread:
    """`create_thread` as one keyed statement, where writes can be WITH clauses (Postgres): no
    BEGIN, no clock read, no COMMIT. `key` is claimed in the statement and the thread inserted
    only with the claim, so the key's row exists if and only if this creation committed. A
    thread that exists already fails the whole statement (its primary key), claim and all:
    `Conflict`. A replay after an unknown outcome finds the key claimed, inserts nothing, and
    answers the thread as that creation left it (it is not this call's to change since)."""
    conn.defer_unique("threads_pkey", Conflict(f"thread {thread_id} exists already"))
    row = await conn.fetchrow(
        f"WITH claim AS ({keys_tx.claim_sql(conn, '$1')} RETURNING created_at)"
        " INSERT INTO threads (id, scope, title, version, metadata, private_metadata,"
        " created_at, updated_at, owner) SELECT $2, $3, $4, 1, $5, $6, claim.created_at,"
        " claim.created_at, $7 FROM claim RETURNING *",
        key,
        thread_id,
        scope,
        title,
        public_json,
        private_json,
        owner,
    )
    if row is None:  # the key was claimed: an earlier attempt of this call committed
        created = await conn.fetchrow("SELECT * FROM threads WHERE id = $1", thread_id)
        if created is None:
            raise NotFound(f"thread {thread_id} not found")
        row = {
            **created,
            "title": title,
            "version": 1,
            "metadata": public_json,
            "private_metadata": private_json,
            "updated_at": created["created_at"],
            "owner": owner,
        }
    return thread_from_row(row)


async def rename_thread(conn: Conn, thread_id: str, scopes: Collection[str], title: str) -> Thread:
    row = await lock_thread(conn, thread_id, scopes)
    await conn.execute("UPDATE threads SET title = $2 WHERE id = $1", thread_id, title)
    version = await bump(conn, thread_id)
    # The row as this transaction leaves it (on Postgres the bump may be held until COMMIT,
    # so a read now would not see it).
    return thread_from_row(
        {**row, "title": title, "version": version, "updated_at": await conn.now()}
    )


async def get_thread(conn: Conn, thread_id: str, scopes: Collection[str]) -> Thread:
    return thread_from_row(await thread_row(conn, thread_id, scopes))


async def thread_version(conn: Conn, thread_id: str, scopes: Collection[str]) -> int:
    clause, values = scope_clause("scope", scopes, 2)
    row = await conn.fetchrow(
        f"SELECT version FROM threads WHERE id = $1 AND {clause}", thread_id, *values
    )
    if row is None:
        raise NotFound(f"thread {thread_id} not found")
    return int(row["version"])


async def update_metadata(
    conn: Conn, thread_id: str, scopes: Collection[str], patch: dict[str, Any]
) -> Thread:
    row = await lock_thread(conn, thread_id, scopes)
    metadata = merge_patch(loads(row["metadata"]), patch)
    encoded = encode_metadata(metadata, "metadata")  # the merged object within the bound
    await conn.execute("UPDATE threads SET metadata = $2 WHERE id = $1", thread_id, encoded)
    version = await bump(conn, thread_id)
    return thread_from_row(
        {**row, "metadata": encoded, "version": version, "updated_at": await conn.now()}
    )


# The thread's state by its active run (at most one: `runs_one_active`, which serves these).
_STATUS_SQL = {
    ThreadStatus.RUNNING: "EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = threads.id"
    " AND r.status IN ('queued', 'running'))",
    ThreadStatus.WAITING: "EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = threads.id"
    " AND r.status = 'waiting')",
    ThreadStatus.IDLE: "NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = threads.id"
    f" AND r.status IN {ACTIVE_STATUSES})",
}


def allowed_clause(conn: Conn, allowed: Sequence[ThreadMatch], start: int) -> tuple[str, list[Any]]:
    """SQL keeping the rows of `threads` matching one of `allowed` (an authorization hook's
    `Narrow`): owner equal, and the metadata keys at their values, as the metadata filter."""
    alternatives: list[str] = []
    args: list[Any] = []
    for match in allowed:
        terms: list[str] = []
        if match.owner is not None:
            args.append(match.owner)
            terms.append(f"threads.owner = ${start + len(args) - 1}")
        if match.metadata:
            sql, values = conn.dialect.metadata_match(match.metadata, start + len(args))
            terms.append(sql)
            args += values
        alternatives.append("(" + (" AND ".join(terms) or "1 = 1") + ")")
    return "(" + (" OR ".join(alternatives) or "1 = 0") + ")", args


def list_threads_sql(
    conn: Conn, scopes: Collection[str], limit: int, query: ThreadQuery
) -> tuple[str, list[Any]]:
    """The list's statement and arguments (apart, so a test can EXPLAIN it)."""
    clause, args = scope_clause("scope", scopes, 1)
    where = [clause]
    if query.metadata:
        sql, values = conn.dialect.metadata_match(query.metadata, len(args) + 1)
        where.append(sql)
        args += values
    if query.allowed is not None:
        sql, values = allowed_clause(conn, query.allowed, len(args) + 1)
        where.append(sql)
        args += values
    if query.status is not None:
        where.append(_STATUS_SQL[query.status])
    if query.updated_after is not None:
        args.append(float(query.updated_after))
        where.append(f"updated_at > ${len(args)}")
    if query.updated_before is not None:
        args.append(float(query.updated_before))
        where.append(f"updated_at < ${len(args)}")
    if query.after is not None:
        position = read_cursor(query.after)
        args += [position.at, position.key]
        n = len(args)
        where.append(f"(updated_at < ${n - 1} OR (updated_at = ${n - 1} AND id > ${n}))")
    args.append(int(limit))
    sql = (
        f"SELECT * FROM threads WHERE {' AND '.join(where)}"
        f" ORDER BY updated_at DESC, id LIMIT ${len(args)}"
    )
    return sql, args


async def list_threads(
    conn: Conn, scopes: Collection[str], limit: int, query: ThreadQuery | None = None
) -> list[Thread]:
    sql, args = list_threads_sql(conn, scopes, limit, query or ThreadQuery())
    return [thread_from_row(row) for row in await conn.fetch(sql, *args)]


async def thread_versions(conn: Conn, ids: Sequence[str]) -> dict[str, int]:
    versions: dict[str, int] = {}
    for start in range(0, len(ids), _VERSIONS_CHUNK):
        chunk = ids[start : start + _VERSIONS_CHUNK]
        rows = await conn.fetch(
            f"SELECT id, version FROM threads WHERE id IN ({placeholders(1, len(chunk))})",
            *chunk,
        )
        versions.update({row["id"]: int(row["version"]) for row in rows})
    return versions


async def message_authors(conn: Conn, thread_id: str, ids: Sequence[str]) -> dict[str, str]:
    """Who wrote each message of `ids`: the subject that started the run that wrote it, or for
    a user message the one that submitted it, i.e. started its first run (a regenerate or a
    retry answers it again with a later run and must not make the requester its author)."""
    authors: dict[str, str] = {}
    for start in range(0, len(ids), _VERSIONS_CHUNK):
        chunk = ids[start : start + _VERSIONS_CHUNK]
        rows = await conn.fetch(
            "SELECT m.id AS id, COALESCE(r.started_by, (SELECT i.started_by FROM runs i"
            " WHERE i.input_message_id = m.id ORDER BY i.created_version, i.created_at"
            " LIMIT 1)) AS author FROM messages m LEFT JOIN runs r ON r.id = m.run_id"
            f" WHERE m.thread_id = $1 AND m.id IN ({placeholders(2, len(chunk))})",
            thread_id,
            *chunk,
        )
        authors.update({row["id"]: row["author"] for row in rows if row["author"] is not None})
    return authors


async def list_messages(conn: Conn, thread_id: str, up_to_position: int | None) -> list[Message]:
    await thread_row(conn, thread_id)
    return await messages(conn, thread_id, up_to_position)


async def list_queue(conn: Conn, thread_id: str) -> list[QueuedItem]:
    await thread_row(conn, thread_id)
    return await queued_items(conn, thread_id)


# --- reads shared by the other concerns ---------------------------------------------------


async def messages(conn: Conn, thread_id: str, up_to_position: int | None = None) -> list[Message]:
    if up_to_position is None:
        rows = await conn.fetch(
            "SELECT * FROM messages WHERE thread_id = $1 ORDER BY position", thread_id
        )
    else:
        rows = await conn.fetch(
            "SELECT * FROM messages WHERE thread_id = $1 AND position <= $2 ORDER BY position",
            thread_id,
            int(up_to_position),
        )
    return [message_from_row(row) for row in rows]


async def read_history(conn: Conn, thread_id: str, from_position: int) -> tuple[int, list[Message]]:
    """(history epoch, messages from `from_position` on), in one statement: one snapshot, so
    it needs no transaction (the thread row comes even when no message is at the position)."""
    rows = await conn.fetch(
        "SELECT t.history_epoch AS history_epoch_, m.* FROM threads t"
        " LEFT JOIN messages m ON m.thread_id = t.id AND m.position >= $2"
        " WHERE t.id = $1 ORDER BY m.position",
        thread_id,
        int(from_position),
    )
    if not rows:
        raise NotFound(f"thread {thread_id} not found")
    messages = [message_from_row(row) for row in rows if row["id"] is not None]
    return int(rows[0]["history_epoch_"]), messages


@dataclass(frozen=True)
class Prefixed:
    """A table's row read beside other rows in one SELECT: its columns, as `alias.c AS
    prefix + c`, and the row taken back out of the result."""

    alias: str
    prefix: str
    columns: tuple[str, ...]

    @functools.cached_property
    def _names(self) -> tuple[tuple[str, str], ...]:
        """(column, its name in the SELECT) pairs, built once (rows are read per commit)."""
        return tuple((c, f"{self.prefix}{c}") for c in self.columns)

    def select(self) -> str:
        """`, a.id AS p_id, …` for a SELECT list (with its leading comma)."""
        return "".join(f", {self.alias}.{c} AS {name}" for c, name in self._names)

    def row(self, row: Row) -> Row:
        return {c: row[name] for c, name in self._names}

    def joined(self, row: Row) -> Row | None:
        """The row an outer join found, or None where it found none (its id is NULL)."""
        return None if row[f"{self.prefix}id"] is None else self.row(row)


# The thread (alias `t`), its tail message (`m`, `tail_join`) and its first queued item (`q`,
# `first_queued_join`, as `admit_next` reads it), for statements that read them together.
THREAD = Prefixed(
    "t",
    "thread__",
    (
        "id",
        "scope",
        "title",
        "version",
        "metadata",
        "private_metadata",
        "created_at",
        "updated_at",
        "history_epoch",
    ),
)
TAIL = Prefixed(
    "m",
    "tail_",
    (
        "id",
        "thread_id",
        "position",
        "role",
        "parts",
        "visibility",
        "run_id",
        "client_request_id",
        "created_at",
        "updated_at",
    ),
)
FIRST_QUEUED = Prefixed(
    "q",
    "queued_",
    (
        "id",
        "thread_id",
        "text",
        "submitted_by",
        "client_request_id",
        "status",
        "interrupt",
        "client_tools",
        "position",
        "traceparent",
        "created_at",
    ),
)


def tail_join(thread: str) -> str:
    """A LEFT JOIN of the tail message (alias `m`) of the thread whose id is `thread` (SQL),
    so one statement reads what `tail_row` would beside other rows."""
    return (
        f" LEFT JOIN messages m ON m.thread_id = {thread} AND m.position ="
        f" (SELECT MAX(position) FROM messages WHERE thread_id = {thread})"
    )


def first_queued_join(thread: str) -> str:
    """A LEFT JOIN of the thread's first queued item, as `admit_next` reads it."""
    return (
        " LEFT JOIN queued_items q ON q.id = (SELECT id FROM queued_items"
        f" WHERE thread_id = {thread} AND status = 'queued' ORDER BY position LIMIT 1)"
    )


async def tail_row(conn: Conn, thread_id: str) -> Row | None:
    return await conn.fetchrow(
        "SELECT * FROM messages WHERE thread_id = $1 ORDER BY position DESC LIMIT 1",
        thread_id,
    )


async def run_row(conn: Conn, run_id: str, thread_id: str | None = None) -> Row | None:
    """A runs row joined with its thread's scope (what `run_from_row` reads)."""
    if thread_id is None:
        return await conn.fetchrow(f"{RUN_SELECT} WHERE r.id = $1", run_id)
    return await conn.fetchrow(
        f"{RUN_SELECT} WHERE r.id = $1 AND r.thread_id = $2", run_id, thread_id
    )


async def active_run_row(conn: Conn, thread_id: str) -> Row | None:
    return await conn.fetchrow(
        f"{RUN_SELECT} WHERE r.thread_id = $1 AND r.status IN {ACTIVE_STATUSES}", thread_id
    )


async def latest_run(conn: Conn, thread_id: str) -> Run | None:
    row = await conn.fetchrow(
        f"{RUN_SELECT} WHERE r.thread_id = $1 ORDER BY r.created_version DESC LIMIT 1",
        thread_id,
    )
    return None if row is None else run_from_row(row)


async def queued_items(conn: Conn, thread_id: str) -> list[QueuedItem]:
    rows = await conn.fetch(
        "SELECT * FROM queued_items WHERE thread_id = $1 AND status = 'queued' ORDER BY position",
        thread_id,
    )
    return [item_from_row(row) for row in rows]


__all__ = ["ACTIVE_STATUSES"]
