"""Threads, snapshots, message reads and API tokens over the shared SQL plumbing."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from runtime.errors import Conflict, InvalidInput, TooLarge
from runtime.models import (
    MAX_TITLE_CHARS,
    Message,
    MessageView,
    Principal,
    QueuedItem,
    QueuedItemView,
    Role,
    Run,
    RunView,
    Snapshot,
    Thread,
    ThreadView,
    Visibility,
    pending_actions_of,
)
from runtime.storage.sql_core import Conn, SqlCore, normalize_scopes, placeholders, scope_clause
from runtime.storage.sql_rows import (
    Row,
    dumps,
    encode_metadata,
    item_from_row,
    loads,
    message_from_row,
    new_id,
    run_from_row,
    thread_from_row,
)

ACTIVE_STATUSES = "('queued', 'running', 'waiting')"
_RUN_SELECT = "SELECT r.*, t.scope FROM runs r JOIN threads t ON t.id = r.thread_id"


class ThreadOps(SqlCore):
    """Thread creation and every read that projects committed state."""

    # --- threads ------------------------------------------------------------------------

    async def create_thread(
        self,
        scope: str,
        title: str = "",
        metadata: dict[str, Any] | None = None,
        private_metadata: dict[str, Any] | None = None,
        *,
        thread_id: str | None = None,
    ) -> Thread:
        """A new thread; a caller-chosen `thread_id` that exists already raises Conflict."""
        if not isinstance(scope, str) or not scope.strip():
            raise InvalidInput("scope must be a non-empty string")
        if not isinstance(title, str):
            raise InvalidInput("title must be a string")
        if len(title) > MAX_TITLE_CHARS:
            raise TooLarge(
                f"title is longer than {MAX_TITLE_CHARS} characters", limit=MAX_TITLE_CHARS
            )
        public_json = encode_metadata(metadata, "metadata")
        private_json = encode_metadata(private_metadata, "private_metadata")
        new_thread_id = thread_id or new_id("th")

        async def tx(conn: Conn) -> Thread:
            row = await conn.fetchrow(
                "INSERT INTO threads (id, scope, title, version, metadata, private_metadata,"
                " created_at, updated_at) VALUES ($1, $2, $3, 1, $4, $5, $6, $6)"
                " ON CONFLICT (id) DO NOTHING RETURNING *",
                new_thread_id,
                scope,
                title,
                public_json,
                private_json,
                await conn.now(),
            )
            if row is None:
                raise Conflict(f"thread {new_thread_id} exists already")
            return thread_from_row(row)

        return await self._write(tx)

    async def get_thread(self, thread_id: str, scopes: Collection[str]) -> Thread:
        async def tx(conn: Conn) -> Thread:
            return thread_from_row(await self._thread_row(conn, thread_id, scopes))

        return await self._read(tx)

    async def list_threads(self, scopes: Collection[str], limit: int = 100) -> list[Thread]:
        if limit <= 0:
            return []
        clause, values = scope_clause("scope", scopes, 1)

        async def tx(conn: Conn) -> list[Thread]:
            rows = await conn.fetch(
                f"SELECT * FROM threads WHERE {clause} ORDER BY updated_at DESC, id"
                f" LIMIT ${len(values) + 1}",
                *values,
                int(limit),
            )
            return [thread_from_row(row) for row in rows]

        return await self._read(tx)

    async def thread_versions(self, thread_ids: Sequence[str]) -> dict[str, int]:
        ids = list(dict.fromkeys(thread_ids))
        if not ids:
            return {}

        async def tx(conn: Conn) -> dict[str, int]:
            versions: dict[str, int] = {}
            # Chunked so a long watch list never exceeds a backend's parameter limit.
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                rows = await conn.fetch(
                    f"SELECT id, version FROM threads WHERE id IN ({placeholders(1, len(chunk))})",
                    *chunk,
                )
                versions.update({row["id"]: int(row["version"]) for row in rows})
            return versions

        return await self._read(tx)

    # --- snapshot -----------------------------------------------------------------------

    async def snapshot(
        self, thread_id: str, scopes: Collection[str], *, include_hidden: bool = False
    ) -> Snapshot:
        async def tx(conn: Conn) -> Snapshot:
            thread = thread_from_row(await self._thread_row(conn, thread_id, scopes))
            messages = await self._messages(conn, thread_id)
            run = await self._latest_run(conn, thread_id)
            queue = await self._queued_items(conn, thread_id)
            return build_snapshot(thread, messages, run, queue, include_hidden=include_hidden)

        # One read transaction: every part of the snapshot is at the same version.
        return await self._read(tx)

    # --- message and run reads ----------------------------------------------------------

    async def list_messages(
        self, thread_id: str, up_to_position: int | None = None
    ) -> list[Message]:
        async def tx(conn: Conn) -> list[Message]:
            await self._thread_row(conn, thread_id)
            return await self._messages(conn, thread_id, up_to_position)

        return await self._read(tx)

    async def _messages(
        self, conn: Conn, thread_id: str, up_to_position: int | None = None
    ) -> list[Message]:
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

    async def _tail_row(self, conn: Conn, thread_id: str) -> Row | None:
        return await conn.fetchrow(
            "SELECT * FROM messages WHERE thread_id = $1 ORDER BY position DESC LIMIT 1",
            thread_id,
        )

    async def _run_row(self, conn: Conn, run_id: str, thread_id: str | None = None) -> Row | None:
        if thread_id is None:
            return await conn.fetchrow(f"{_RUN_SELECT} WHERE r.id = $1", run_id)
        return await conn.fetchrow(
            f"{_RUN_SELECT} WHERE r.id = $1 AND r.thread_id = $2", run_id, thread_id
        )

    async def _active_run_row(self, conn: Conn, thread_id: str) -> Row | None:
        return await conn.fetchrow(
            f"{_RUN_SELECT} WHERE r.thread_id = $1 AND r.status IN {ACTIVE_STATUSES}", thread_id
        )

    async def _latest_run(self, conn: Conn, thread_id: str) -> Run | None:
        row = await conn.fetchrow(
            f"{_RUN_SELECT} WHERE r.thread_id = $1 ORDER BY r.created_version DESC LIMIT 1",
            thread_id,
        )
        return None if row is None else run_from_row(row)

    async def _queued_items(self, conn: Conn, thread_id: str) -> list[QueuedItem]:
        rows = await conn.fetch(
            "SELECT * FROM queued_items WHERE thread_id = $1 AND status = 'queued'"
            " ORDER BY position",
            thread_id,
        )
        return [item_from_row(row) for row in rows]

    # --- principals ---------------------------------------------------------------------

    async def create_token(
        self, token_hash: str, subject: str, role: Role, scopes: Collection[str]
    ) -> None:
        if not token_hash or not subject:
            raise InvalidInput("token_hash and subject must be non-empty")
        try:
            role = Role(role)
        except ValueError as exc:
            raise InvalidInput(f"unknown role {role!r}") from exc
        scopes_json = dumps(list(normalize_scopes(scopes)))

        async def tx(conn: Conn) -> None:
            inserted = await conn.fetchval(
                "INSERT INTO api_tokens (token_hash, subject, role, scopes, created_at)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (token_hash) DO NOTHING"
                " RETURNING token_hash",
                token_hash,
                subject,
                role.value,
                scopes_json,
                await conn.now(),
            )
            if inserted is None:
                raise Conflict("a token with this hash already exists")

        await self._write(tx)

    async def principal_for_token(self, token_hash: str) -> Principal | None:
        async def tx(conn: Conn) -> Principal | None:
            row = await conn.fetchrow(
                "SELECT subject, role, scopes FROM api_tokens WHERE token_hash = $1", token_hash
            )
            if row is None:
                return None
            return Principal(
                subject=row["subject"],
                role=Role(row["role"]),
                scopes=frozenset(loads(row["scopes"])),
            )

        return await self._read(tx)

    async def db_time(self) -> float:
        async def tx(conn: Conn) -> float:
            return await conn.now()

        return await self._read(tx)


def build_snapshot(
    thread: Thread,
    messages: list[Message],
    run: Run | None,
    queue: list[QueuedItem],
    *,
    include_hidden: bool = False,
) -> Snapshot:
    """Project committed rows: public metadata only, visible messages (hidden ones too when
    asked, marked by their visibility), tail pending actions."""
    tail = messages[-1] if messages else None
    return Snapshot(
        thread=ThreadView(
            id=thread.id,
            scope=thread.scope,
            title=thread.title,
            version=thread.version,
            metadata=thread.metadata,
        ),
        messages=tuple(
            MessageView(
                id=message.id,
                role=message.role,
                visibility=message.visibility,
                parts=message.parts,
                run_id=message.run_id,
            )
            for message in messages
            if include_hidden or message.visibility is Visibility.VISIBLE
        ),
        pending_actions=tuple(pending_actions_of(tail)) if tail is not None else (),
        run=None
        if run is None
        else RunView(
            id=run.id,
            status=run.status,
            error=run.error,
            started_by=run.started_by,
            next_seq=run.next_seq,
        ),
        queue=tuple(
            QueuedItemView(
                id=item.id, text=item.text, submitted_by=item.submitted_by, interrupt=item.interrupt
            )
            for item in queue
        ),
    )


__all__ = ["ACTIVE_STATUSES", "ThreadOps", "build_snapshot"]
