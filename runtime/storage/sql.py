"""`SqlStore`: the Store logic written once; pending-action resolution and history rewrites."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from runtime.errors import (
    ActionConflict,
    Forbidden,
    InvalidInput,
    NotFound,
    RunActive,
    VersionMismatch,
)
from runtime.models import (
    MAX_METADATA_BYTES,
    Lease,
    LeaseKind,
    MessageRole,
    Resolution,
    RunStatus,
    RunTrigger,
    ToolCallPart,
    Visibility,
)
from runtime.storage.base import (
    ResolveResult,
    RewriteResult,
    SetVisibility,
    Truncate,
)
from runtime.storage.sql_core import Conn
from runtime.storage.sql_rows import (
    Row,
    decode_parts,
    dumps,
    encode_json,
    encode_parts,
    has_pending,
    like_pattern,
    loads,
)
from runtime.storage.sql_runs import RunOps


def _conflict(action_id: str, part: ToolCallPart) -> ActionConflict:
    resolution = part.waiting.resolution if part.waiting is not None else None
    if resolution is not None:
        message = f"action {action_id} was already resolved by {resolution.subject}"
    else:
        message = f"action {action_id} is no longer awaiting a resolution ({part.state})"
    return ActionConflict(
        message,
        resolved_by=None if resolution is None else resolution.subject,
        state=part.state.value,
    )


def _find_action(parts: tuple[Any, ...], action_id: str) -> int | None:
    for index, part in enumerate(parts):
        if (
            isinstance(part, ToolCallPart)
            and part.waiting is not None
            and part.waiting.action_id == action_id
        ):
            return index
    return None


def _check_patch(patch: dict[str, Any] | None, what: str) -> dict[str, Any]:
    if patch is None:
        return {}
    if not isinstance(patch, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    encode_json(patch, what, MAX_METADATA_BYTES)
    return patch


class SqlStore(RunOps):
    """Every Store method, written once over `Conn`; backends add connections and the clock."""

    async def resolve_action(
        self,
        thread_id: str,
        scopes: Collection[str],
        action_id: str,
        resolution: Resolution,
        expected_version: int | None = None,
    ) -> ResolveResult:
        async def tx(conn: Conn) -> ResolveResult:
            # The thread lock makes the compare-and-set on the tool part race-free: of
            # concurrent resolutions the first to lock wins, every later one sees its result.
            thread = await self._lock_thread(conn, thread_id, scopes)
            current = int(thread["version"])
            if expected_version is not None and expected_version != current:
                raise VersionMismatch(
                    f"thread {thread_id} is at version {current}, not {expected_version}",
                    current_version=current,
                )
            tail = await self._tail_row(conn, thread_id)
            if tail is not None:
                parts = decode_parts(tail["parts"])
                index = _find_action(parts, action_id)
                if index is not None:
                    return await self._resolve_in_tail(conn, tail, parts, index, resolution)
            rows = await conn.fetch(
                "SELECT parts FROM messages WHERE thread_id = $1 AND parts LIKE $2 ESCAPE '\\'"
                " ORDER BY position DESC",
                thread_id,
                like_pattern(dumps(action_id)[1:-1]),
            )
            for row in rows:
                parts = decode_parts(row["parts"])
                index = _find_action(parts, action_id)
                if index is not None:
                    part = parts[index]
                    assert isinstance(part, ToolCallPart)
                    raise _conflict(action_id, part)
            raise NotFound(f"action {action_id} not found")

        return await self._write(tx)

    async def _resolve_in_tail(
        self,
        conn: Conn,
        tail: Row,
        parts: tuple[Any, ...],
        index: int,
        resolution: Resolution,
    ) -> ResolveResult:
        part = parts[index]
        assert isinstance(part, ToolCallPart) and part.waiting is not None
        action_id = part.waiting.action_id
        if not part.is_pending:
            raise _conflict(action_id, part)
        if resolution.role not in part.waiting.allowed_roles:
            raise Forbidden(f"role {resolution.role} may not resolve action {action_id}")
        resolved = part.model_copy(
            update={"waiting": part.waiting.model_copy(update={"resolution": resolution})}
        )
        new_parts = (*parts[:index], resolved, *parts[index + 1 :])
        await conn.execute(
            "UPDATE messages SET parts = $2, updated_at = $3 WHERE id = $1",
            tail["id"],
            encode_parts(new_parts),
            await conn.now(),
        )
        thread_id = tail["thread_id"]
        run_id = tail["run_id"]
        resumed = False
        if run_id is not None and not has_pending(new_parts):
            status = await conn.fetchval("SELECT status FROM runs WHERE id = $1", run_id)
            if status == RunStatus.WAITING:
                await conn.execute(
                    "UPDATE runs SET status = 'running', updated_at = $2 WHERE id = $1",
                    run_id,
                    await conn.now(),
                )
                resumed = True
        return ResolveResult(
            thread_id=thread_id,
            version=await self._bump(conn, thread_id),
            run_id=run_id,
            run_resumed=resumed,
        )

    async def rewrite_history(
        self,
        lease: Lease,
        op: Truncate | SetVisibility,
        public_patch: dict[str, Any] | None = None,
        private_patch: dict[str, Any] | None = None,
    ) -> RewriteResult:
        if not isinstance(op, Truncate | SetVisibility):
            raise InvalidInput("op must be Truncate or SetVisibility")
        public = _check_patch(public_patch, "public_patch")
        private = _check_patch(private_patch, "private_patch")

        async def tx(conn: Conn) -> RewriteResult:
            thread, _ = await self._fence(conn, lease, LeaseKind.ADMIN)
            thread_id = lease.thread_id
            active = await self._active_run_row(conn, thread_id)
            if active is not None:
                raise RunActive(
                    f"thread {thread_id} has an active run; history cannot be rewritten",
                    run_id=active["id"],
                )
            run_id = None
            removed: tuple[str, ...] = ()
            if isinstance(op, Truncate):
                run_id, removed = await self._truncate(conn, thread_id, op)
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
            await self._merge_metadata(conn, thread, public, private)
            return RewriteResult(
                thread_id=thread_id,
                version=await self._bump(conn, thread_id),
                run_id=run_id,
                removed_message_ids=removed,
            )

        return await self._write(tx)

    async def _truncate(
        self, conn: Conn, thread_id: str, op: Truncate
    ) -> tuple[str, tuple[str, ...]]:
        position = await conn.fetchval(
            "SELECT position FROM messages WHERE id = $1 AND thread_id = $2",
            op.from_message_id,
            thread_id,
        )
        if position is None:
            raise NotFound(f"message {op.from_message_id} not found")
        user = await conn.fetchrow(
            "SELECT id FROM messages WHERE thread_id = $1 AND position < $2 AND role = $3"
            " ORDER BY position DESC LIMIT 1",
            thread_id,
            int(position),
            MessageRole.USER.value,
        )
        if user is None:
            raise InvalidInput("no user message remains before the truncation point")
        removed = await conn.fetch(
            "DELETE FROM messages WHERE thread_id = $1 AND position >= $2 RETURNING id, position",
            thread_id,
            int(position),
        )
        # Regenerating keeps the client tools the original request brought.
        tools = await conn.fetchval(
            "SELECT client_tools FROM runs WHERE input_message_id = $1"
            " ORDER BY created_version DESC LIMIT 1",
            user["id"],
        )
        run_id = await self._create_run(
            conn,
            thread_id,
            trigger=RunTrigger.REGENERATE,
            started_by=op.started_by,
            input_message_id=user["id"],
            client_tools_json=tools or "[]",
        )
        ordered = sorted(removed, key=lambda row: int(row["position"]))
        return run_id, tuple(row["id"] for row in ordered)

    async def _merge_metadata(
        self, conn: Conn, thread: Row, public: dict[str, Any], private: dict[str, Any]
    ) -> None:
        if public:
            merged = {**loads(thread["metadata"]), **public}
            await conn.execute(
                "UPDATE threads SET metadata = $2 WHERE id = $1",
                thread["id"],
                encode_json(merged, "metadata", MAX_METADATA_BYTES),
            )
        if private:
            merged = {**loads(thread["private_metadata"]), **private}
            await conn.execute(
                "UPDATE threads SET private_metadata = $2 WHERE id = $1",
                thread["id"],
                encode_json(merged, "private_metadata", MAX_METADATA_BYTES),
            )


__all__ = ["SqlStore"]
