"""Input admission: idempotent submits, the per-thread queue, and admitting the next queued item."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from runtime import telemetry
from runtime.errors import Conflict, InvalidInput, InvariantViolation, NotFound, RunActive, TooLarge
from runtime.models import (
    MAX_TEXT_CHARS,
    Admission,
    InputPolicy,
    MessageRole,
    QueuedItem,
    QueuedItemStatus,
    RunTrigger,
    Visibility,
)
from runtime.storage.sql_core import Conn
from runtime.storage.sql_rows import (
    decode_parts,
    encode_client_tools,
    has_pending,
    new_id,
    text_parts,
)
from runtime.storage.sql_threads import ThreadOps

MAX_CLIENT_REQUEST_ID_CHARS = 200


def _queue_event(conn: Conn, event: str) -> None:
    conn.on_commit(lambda: telemetry.safe_add(telemetry.QUEUE_EVENTS, 1, {"event": event}))


def validate_text(text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("text must be a non-empty string")
    if len(text) > MAX_TEXT_CHARS:
        raise TooLarge(f"text is longer than {MAX_TEXT_CHARS} characters", limit=MAX_TEXT_CHARS)
    return text


class QueueOps(ThreadOps):
    """Queue admission: the only way user input enters a thread."""

    async def submit_input(
        self,
        thread_id: str,
        scopes: Collection[str],
        *,
        text: str,
        submitted_by: str,
        client_request_id: str | None = None,
        policy: InputPolicy = InputPolicy.ENQUEUE,
        client_tools: Sequence[dict[str, Any]] = (),
    ) -> Admission:
        text = validate_text(text)
        if not isinstance(submitted_by, str) or not submitted_by:
            raise InvalidInput("submitted_by must be a non-empty string")
        if client_request_id is not None and (
            not isinstance(client_request_id, str)
            or not client_request_id
            or len(client_request_id) > MAX_CLIENT_REQUEST_ID_CHARS
        ):
            raise InvalidInput(
                f"client_request_id must be 1..{MAX_CLIENT_REQUEST_ID_CHARS} characters"
            )
        try:
            policy = InputPolicy(policy)
        except ValueError as exc:
            raise InvalidInput(f"unknown input policy {policy!r}") from exc
        tools_json = encode_client_tools(client_tools)

        async def tx(conn: Conn) -> Admission:
            await self._lock_thread(conn, thread_id, scopes)
            if client_request_id is not None:
                duplicate = await self._duplicate(conn, thread_id, client_request_id)
                if duplicate is not None:
                    return duplicate
            active = await self._active_run_row(conn, thread_id)
            if active is None:
                message_id = await self._append_message(
                    conn,
                    thread_id,
                    role=MessageRole.USER,
                    parts_json=text_parts(text),
                    client_request_id=client_request_id,
                )
                run_id = await self._create_run(
                    conn,
                    thread_id,
                    trigger=RunTrigger.MESSAGE,
                    started_by=submitted_by,
                    input_message_id=message_id,
                    client_tools_json=tools_json,
                )
                _queue_event(conn, "admitted")
                return Admission(
                    thread_id=thread_id,
                    version=await self._bump(conn, thread_id),
                    run_id=run_id,
                    message_id=message_id,
                )
            if policy is InputPolicy.REJECT:
                telemetry.safe_add(telemetry.QUEUE_EVENTS, 1, {"event": "rejected"})
                raise RunActive(f"thread {thread_id} has an active run", run_id=active["id"])
            item_id = await self._enqueue(
                conn,
                thread_id,
                text=text,
                submitted_by=submitted_by,
                client_request_id=client_request_id,
                interrupt=policy is InputPolicy.INTERRUPT,
                client_tools_json=tools_json,
            )
            interrupted = None
            if policy is InputPolicy.INTERRUPT:
                interrupted = active["id"]
                await conn.execute(
                    "UPDATE runs SET stop_requested = TRUE, updated_at = $2 WHERE id = $1",
                    interrupted,
                    await conn.now(),
                )
            _queue_event(conn, "enqueued")
            return Admission(
                thread_id=thread_id,
                version=await self._bump(conn, thread_id),
                queued_item_id=item_id,
                interrupted_run_id=interrupted,
            )

        return await self._write(tx)

    async def cancel_queued_item(
        self, thread_id: str, scopes: Collection[str], item_id: str
    ) -> int:
        async def tx(conn: Conn) -> int:
            await self._lock_thread(conn, thread_id, scopes)
            status = await conn.fetchval(
                "SELECT status FROM queued_items WHERE id = $1 AND thread_id = $2",
                item_id,
                thread_id,
            )
            if status is None:
                raise NotFound(f"queued item {item_id} not found")
            if status != QueuedItemStatus.QUEUED:
                raise Conflict(f"queued item {item_id} is already {status}", status=status)
            await conn.execute(
                "UPDATE queued_items SET status = 'cancelled' WHERE id = $1", item_id
            )
            _queue_event(conn, "cancelled")
            return await self._bump(conn, thread_id)

        return await self._write(tx)

    async def list_queue(self, thread_id: str) -> list[QueuedItem]:
        async def tx(conn: Conn) -> list[QueuedItem]:
            await self._thread_row(conn, thread_id)
            return await self._queued_items(conn, thread_id)

        return await self._read(tx)

    # --- helpers inside a locked write transaction --------------------------------------

    async def _duplicate(self, conn: Conn, thread_id: str, request_id: str) -> Admission | None:
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

    async def _append_message(
        self,
        conn: Conn,
        thread_id: str,
        *,
        role: MessageRole,
        parts_json: str,
        client_request_id: str | None = None,
        run_id: str | None = None,
        message_id: str | None = None,
    ) -> str:
        """Append after the tail; refused while the tail still holds a pending action."""
        tail = await self._tail_row(conn, thread_id)
        if tail is not None and has_pending(decode_parts(tail["parts"])):
            raise InvariantViolation(
                f"message {tail['id']} holds a pending action; nothing may be appended after it"
            )
        position = 0 if tail is None else int(tail["position"]) + 1
        message_id = message_id or new_id("msg")
        now = await conn.now()
        await conn.execute(
            "INSERT INTO messages (id, thread_id, position, role, parts, visibility, run_id,"
            " client_request_id, created_at, updated_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)",
            message_id,
            thread_id,
            position,
            role.value,
            parts_json,
            Visibility.VISIBLE.value,
            run_id,
            client_request_id,
            now,
        )
        return message_id

    async def _create_run(
        self,
        conn: Conn,
        thread_id: str,
        *,
        trigger: RunTrigger,
        started_by: str,
        input_message_id: str | None,
        client_tools_json: str,
    ) -> str:
        version = await self._bump(conn, thread_id)
        run_id = new_id("run")
        await conn.execute(
            "INSERT INTO runs (id, thread_id, status, trigger, started_by, input_message_id,"
            " episode, next_seq, stop_requested, error, client_tools, created_version,"
            " created_at, updated_at)"
            " VALUES ($1, $2, 'queued', $3, $4, $5, 0, 0, FALSE, NULL, $6, $7, $8, $8)",
            run_id,
            thread_id,
            trigger.value,
            started_by,
            input_message_id,
            client_tools_json,
            version,
            await conn.now(),
        )
        return run_id

    async def _enqueue(
        self,
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
            " status, interrupt, client_tools, position, created_at)"
            " VALUES ($1, $2, $3, $4, $5, 'queued', $6, $7, $8, $9)",
            item_id,
            thread_id,
            text,
            submitted_by,
            client_request_id,
            interrupt,
            client_tools_json,
            int(position),
            await conn.now(),
        )
        return item_id

    async def _admit_next(self, conn: Conn, thread_id: str) -> str | None:
        """Turn the thread's first queued item into a user message and a queued run.

        Called in the same transaction that ended the previous run, so the thread is never
        observed idle with input waiting.
        """
        item = await conn.fetchrow(
            "SELECT * FROM queued_items WHERE thread_id = $1 AND status = 'queued'"
            " ORDER BY position LIMIT 1",
            thread_id,
        )
        if item is None:
            return None
        await conn.execute("UPDATE queued_items SET status = 'admitted' WHERE id = $1", item["id"])
        message_id = await self._append_message(
            conn,
            thread_id,
            role=MessageRole.USER,
            parts_json=text_parts(item["text"]),
            client_request_id=item["client_request_id"],
        )
        run_id = await self._create_run(
            conn,
            thread_id,
            trigger=RunTrigger.QUEUED,
            started_by=item["submitted_by"],
            input_message_id=message_id,
            client_tools_json=item["client_tools"],
        )
        _queue_event(conn, "admitted")
        return run_id
