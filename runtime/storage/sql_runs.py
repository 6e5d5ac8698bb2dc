"""Runs: reads, stop requests, episodes and the owner-fenced step commit."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from runtime.errors import Conflict, InvariantViolation, NotFound
from runtime.models import (
    Lease,
    LeaseKind,
    NewMessage,
    Part,
    Run,
    RunStatus,
    ToolCallPart,
    ToolState,
    check_run_transition,
    check_tool_transition,
)
from runtime.storage.base import StepCommit, StopResult
from runtime.storage.sql_core import Conn
from runtime.storage.sql_leases import LeaseOps
from runtime.storage.sql_rows import (
    decode_parts,
    encode_parts,
    has_pending,
    run_from_row,
    validate_parts,
)
from runtime.storage.sql_threads import ACTIVE_STATUSES


def check_tail_rewrite(old: Sequence[Part], new: Sequence[Part]) -> None:
    """Tool parts of the tail only move forward, and a committed resolution is never undone
    (it may have been written by a concurrent resolve since the worker last read the tail)."""
    before = {part.tool_call_id: part for part in old if isinstance(part, ToolCallPart)}
    for part in new:
        if not isinstance(part, ToolCallPart) or part.tool_call_id not in before:
            continue
        stored = before[part.tool_call_id]
        if stored.state is not part.state:
            check_tool_transition(stored.state, part.state)
        resolved = stored.waiting is not None and stored.waiting.resolution is not None
        if (
            resolved
            and part.is_pending
            and part.waiting is not None
            and stored.waiting is not None
            and part.waiting.action_id == stored.waiting.action_id
        ):
            raise InvariantViolation(
                f"tool call {part.tool_call_id} was already resolved; the update would undo it"
            )


def _cancel_waiting(parts: Sequence[Part]) -> tuple[list[Part], bool]:
    """Parts with every still-awaiting tool part cancelled (terminal tool finalisation)."""
    changed = False
    result: list[Part] = []
    for part in parts:
        if isinstance(part, ToolCallPart) and part.state is ToolState.AWAITING_ACTION:
            part = part.transition(ToolState.CANCELLED, error=part.error or "run ended")
            changed = True
        result.append(part)
    return result, changed


class RunOps(LeaseOps):
    """Run reads and the runtime's fenced writes."""

    async def get_run(self, run_id: str) -> Run:
        async def tx(conn: Conn) -> Run:
            row = await self._run_row(conn, run_id)
            if row is None:
                raise NotFound(f"run {run_id} not found")
            return run_from_row(row)

        return await self._read(tx)

    async def active_run(self, thread_id: str) -> Run | None:
        async def tx(conn: Conn) -> Run | None:
            row = await self._active_run_row(conn, thread_id)
            return None if row is None else run_from_row(row)

        return await self._read(tx)

    async def find_runnable_runs(self, limit: int = 10) -> list[Run]:
        if limit <= 0:
            return []

        async def tx(conn: Conn) -> list[Run]:
            rows = await conn.fetch(
                "SELECT r.*, t.scope FROM runs r JOIN threads t ON t.id = r.thread_id"
                f" WHERE r.status IN {ACTIVE_STATUSES}"
                " AND (r.status <> 'waiting' OR r.stop_requested = TRUE)"
                " AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.kind = 'run'"
                "   AND l.resource_id = r.id AND l.expires_at > $1)"
                " AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.kind = 'admin'"
                "   AND l.resource_id = r.thread_id AND l.expires_at > $1)"
                " ORDER BY r.created_at, r.id LIMIT $2",
                await conn.now(),
                int(limit),
            )
            return [run_from_row(row) for row in rows]

        return await self._read(tx)

    async def request_stop(
        self, thread_id: str, scopes: Collection[str], run_id: str
    ) -> StopResult:
        async def tx(conn: Conn) -> StopResult:
            thread = await self._lock_thread(conn, thread_id, scopes)
            run = await self._run_row(conn, run_id, thread_id)
            if run is None:
                raise NotFound(f"run {run_id} not found")
            status = RunStatus(run["status"])
            version = int(thread["version"])
            leased = await self._live_lease(conn, LeaseKind.RUN, run_id) is not None
            if status is RunStatus.QUEUED and not leased:
                # Never started: nobody has to finalise it, so it ends right here. (A queued
                # run under a live lease is being started; its worker handles the stop.)
                await conn.execute(
                    "UPDATE runs SET status = 'cancelled', stop_requested = FALSE,"
                    " updated_at = $2 WHERE id = $1",
                    run_id,
                    await conn.now(),
                )
                await self._admit_next(conn, thread_id)
                version = await self._bump(conn, thread_id)
                status = RunStatus.CANCELLED
            elif status.is_active and not run["stop_requested"]:
                # Not part of a snapshot: the worker finalises and commits the visible change.
                await conn.execute(
                    "UPDATE runs SET stop_requested = TRUE, updated_at = $2 WHERE id = $1",
                    run_id,
                    await conn.now(),
                )
            return StopResult(thread_id=thread_id, version=version, run_id=run_id, status=status)

        return await self._write(tx)

    async def start_episode(self, lease: Lease) -> tuple[Run, int]:
        async def tx(conn: Conn) -> tuple[Run, int]:
            thread, run = await self._fence(conn, lease, LeaseKind.RUN)
            assert run is not None
            status = RunStatus(run["status"])
            version = int(thread["version"])
            if status.is_terminal:
                # Ended (e.g. stopped while queued) after the lease was taken: nothing to run.
                return run_from_row(run), version
            target = RunStatus.RUNNING if status is RunStatus.QUEUED else status
            await conn.execute(
                "UPDATE runs SET episode = episode + 1, status = $2, updated_at = $3 WHERE id = $1",
                lease.resource_id,
                target.value,
                await conn.now(),
            )
            if target is not status:
                version = await self._bump(conn, lease.thread_id)
            updated = await self._run_row(conn, lease.resource_id)
            assert updated is not None
            return run_from_row(updated), version

        return await self._write(tx)

    async def commit(self, lease: Lease, commit: StepCommit) -> int:
        # Validate (and serialise) everything before taking any lock.
        tail_parts = (
            validate_parts(commit.update_tail.parts) if commit.update_tail is not None else None
        )
        appends = [(message, encode_parts(message.parts)) for message in commit.append]

        async def tx(conn: Conn) -> int:
            thread, run = await self._fence(conn, lease, LeaseKind.RUN)
            assert run is not None
            run_id = lease.resource_id
            thread_id = lease.thread_id
            status = RunStatus(run["status"])
            if status.is_terminal:
                raise InvariantViolation(f"run {run_id} already ended ({status})")
            changed = False
            if commit.update_tail is not None and tail_parts is not None:
                await self._update_tail(conn, thread_id, commit.update_tail.message_id, tail_parts)
                changed = True
            for message, parts_json in appends:
                await self._append_run_message(conn, thread_id, run_id, message, parts_json)
                changed = True
            terminal = False
            if commit.run is not None:
                target = commit.run.status
                check_run_transition(status, target)
                terminal = target.is_terminal
                if await self._check_run_target(conn, thread_id, run_id, target):
                    await conn.execute(
                        "UPDATE runs SET status = $2, error = $3,"
                        " stop_requested = CASE WHEN $4 THEN FALSE ELSE stop_requested END,"
                        " updated_at = $5 WHERE id = $1",
                        run_id,
                        target.value,
                        commit.run.error,
                        terminal,
                        await conn.now(),
                    )
                    changed = True
            if commit.next_seq is not None and commit.next_seq != int(run["next_seq"]):
                if commit.next_seq < int(run["next_seq"]):
                    raise InvariantViolation(
                        f"next_seq may not go back from {run['next_seq']} to {commit.next_seq}"
                    )
                await conn.execute(
                    "UPDATE runs SET next_seq = $2 WHERE id = $1", run_id, commit.next_seq
                )
                changed = True
            if terminal and commit.admit_next:
                await self._admit_next(conn, thread_id)
            if not changed:
                return int(thread["version"])
            return await self._bump(conn, thread_id)

        return await self._write(tx)

    # --- helpers inside a fenced transaction --------------------------------------------

    async def _update_tail(
        self, conn: Conn, thread_id: str, message_id: str, parts: list[Part]
    ) -> None:
        tail = await self._tail_row(conn, thread_id)
        if tail is None or tail["id"] != message_id:
            raise InvariantViolation(
                f"message {message_id} is not the tail of thread {thread_id};"
                " only the tail message may be updated"
            )
        check_tail_rewrite(decode_parts(tail["parts"]), parts)
        await conn.execute(
            "UPDATE messages SET parts = $2, updated_at = $3 WHERE id = $1",
            message_id,
            encode_parts(parts),
            await conn.now(),
        )

    async def _append_run_message(
        self, conn: Conn, thread_id: str, run_id: str, message: NewMessage, parts_json: str
    ) -> None:
        if message.run_id is not None and message.run_id != run_id:
            raise InvariantViolation(
                f"run {run_id} cannot append a message of run {message.run_id}"
            )
        if message.id is not None and await conn.fetchval(
            "SELECT 1 FROM messages WHERE id = $1", message.id
        ):
            raise Conflict(f"message {message.id} already exists")
        if message.client_request_id is not None and await conn.fetchval(
            "SELECT 1 FROM messages WHERE thread_id = $1 AND client_request_id = $2",
            thread_id,
            message.client_request_id,
        ):
            raise Conflict(f"client_request_id {message.client_request_id} is already used")
        await self._append_message(
            conn,
            thread_id,
            role=message.role,
            parts_json=parts_json,
            client_request_id=message.client_request_id,
            run_id=run_id,
            message_id=message.id,
        )

    async def _check_run_target(
        self, conn: Conn, thread_id: str, run_id: str, target: RunStatus
    ) -> bool:
        """Keep pending actions and the run status consistent; False: leave the status as is.

        A waiting run must have something to wait for. If every action of the tail was resolved
        between the commit that suspended them and this transition, the run stays `running`
        (runnable, so a worker resumes it) instead of waiting for nothing. An ending run leaves
        no action awaiting in its tail.
        """
        if target is not RunStatus.WAITING and not target.is_terminal:
            return True
        tail = await self._tail_row(conn, thread_id)
        own_tail = tail is not None and tail["run_id"] == run_id
        parts = decode_parts(tail["parts"]) if tail is not None else ()
        if target is RunStatus.WAITING:
            if own_tail and has_pending(parts):
                return True
            if own_tail and any(
                isinstance(part, ToolCallPart) and part.state is ToolState.AWAITING_ACTION
                for part in parts
            ):
                return False
            raise InvariantViolation(
                f"run {run_id} cannot wait: its tail message holds no pending action"
            )
        if own_tail and tail is not None:
            finalised, changed = _cancel_waiting(parts)
            if changed:
                await conn.execute(
                    "UPDATE messages SET parts = $2, updated_at = $3 WHERE id = $1",
                    tail["id"],
                    encode_parts(finalised),
                    await conn.now(),
                )
        return True


__all__ = ["RunOps", "check_tail_rewrite"]
