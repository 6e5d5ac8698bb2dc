"""`SqlStore`: the `Store` over a dialect and a connection pool, one transaction per method."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from runtime.approvals import Reassignment
from runtime.authorization import ThreadMatch
from runtime.domain import (
    Admission,
    InboxEntry,
    InputPolicy,
    Lease,
    Message,
    Origin,
    QueuedItem,
    Resolution,
    Run,
    Snapshot,
    Thread,
)
from runtime.errors import InvalidInput
from runtime.storage.input_checks import (
    check_patch,
    check_submit,
    check_text,
    check_thread_fields,
    check_thread_id,
    check_title,
)
from runtime.storage.sql import (
    act_tx,
    actions_tx,
    inbox_tx,
    queue_tx,
    rewrites_tx,
    runs_tx,
    snapshot_statement,
    snapshots_tx,
    threads_tx,
)
from runtime.storage.sql.core import (
    ThreadLock,
    applied_migrations,
    apply_migrations,
    migration_scripts,
    normalize_scopes,
)
from runtime.storage.sql.rows import (
    encode_client_tools,
    encode_metadata,
    encode_parts,
    new_id,
    validate_parts,
)
from runtime.storage.sql.sql_leases import SqlLeaseStore
from runtime.storage.store import (
    ActOp,
    ActResult,
    AdmissionLimits,
    CommitResult,
    EpisodeStart,
    HistoryRead,
    InputOp,
    ResolveResult,
    RetryRun,
    RewriteOp,
    RewriteResult,
    SetVisibility,
    StepCommit,
    StopResult,
    Truncate,
)
from runtime.storage.thread_query import ThreadQuery, read_cursor


class SqlStore(SqlLeaseStore):
    """Every `Store` method, written once: check the input, then run one transaction function
    through `_run` (`SqlTransactions`). What differs per backend is in `dialect` and `pool`,
    never in a subclass."""

    # --- lifecycle ----------------------------------------------------------------------

    # The migrations `open` applied (what `threadline migrate` and the server's start report).
    migrated: tuple[str, ...] = ()

    async def open(self) -> None:
        if self.pool.is_open:
            return
        await self._retry(self.pool.open)
        try:
            self.migrated = tuple(await self.migrate())
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self.pool.close()

    async def migrate(self) -> list[str]:
        """Apply pending migrations in one transaction; returns the names applied now."""
        scripts = migration_scripts(self.dialect)
        # Unkeyed: the key table is created by a migration, and migrating twice is harmless.
        return await self._retry(
            lambda: self._attempt(lambda conn: apply_migrations(conn, scripts), write=True)
        )

    async def applied_migrations(self) -> list[str]:
        return await self._read(applied_migrations)

    async def pending_migrations(self) -> list[str]:
        """Migrations this code has that the database has not applied (readiness)."""
        done = set(await self.applied_migrations())
        return [name for name, _ in migration_scripts(self.dialect) if name not in done]

    async def queue_depth(self) -> dict[str, int]:
        """Runs waiting for a worker, and queued input waiting behind an active run (metrics)."""
        return await self._read(queue_tx.queue_depth)

    # --- threads and snapshots ----------------------------------------------------------

    async def create_thread(
        self,
        scope: str,
        title: str = "",
        metadata: dict[str, Any] | None = None,
        private_metadata: dict[str, Any] | None = None,
        *,
        thread_id: str | None = None,
        owner: str | None = None,
    ) -> Thread:
        """A new thread; a caller-chosen `thread_id` that exists already raises Conflict."""
        check_thread_fields(scope, title)
        if thread_id is not None:
            check_thread_id(thread_id)
        public_json = encode_metadata(metadata, "metadata")
        private_json = encode_metadata(private_metadata, "private_metadata")
        thread_id = thread_id or new_id("th")
        if self.dialect.writing_ctes:
            key, new = new_id("tx"), thread_id
            return await self._write_statement(
                lambda conn: threads_tx.create_thread_call(
                    conn, key, new, scope, title, public_json, private_json, owner
                )
            )
        return await self._write(
            lambda conn: threads_tx.create_thread(
                conn, thread_id, scope, title, public_json, private_json, owner
            )
        )

    async def rename_thread(self, thread_id: str, scopes: Collection[str], title: str) -> Thread:
        check_title(title)
        return await self._write(
            lambda conn: threads_tx.rename_thread(conn, thread_id, scopes, title)
        )

    async def get_thread(self, thread_id: str, scopes: Collection[str]) -> Thread:
        return await self._read_statements(
            lambda conn: threads_tx.get_thread(conn, thread_id, scopes)
        )

    async def thread_version(self, thread_id: str, scopes: Collection[str]) -> int:
        return await self._read_statements(
            lambda conn: threads_tx.thread_version(conn, thread_id, scopes)
        )

    async def update_metadata(
        self, thread_id: str, scopes: Collection[str], patch: dict[str, Any]
    ) -> Thread:
        if not isinstance(patch, dict):
            raise InvalidInput("a metadata patch must be a JSON object")
        encode_metadata(patch, "metadata")  # the patch alone within the bound, before a lock
        return await self._write(
            lambda conn: threads_tx.update_metadata(conn, thread_id, scopes, patch)
        )

    async def list_threads(
        self, scopes: Collection[str], limit: int = 100, query: ThreadQuery | None = None
    ) -> list[Thread]:
        if limit <= 0:
            return []
        if query is not None and query.after is not None:
            read_cursor(query.after)  # a bad cursor is refused before any transaction
        return await self._read(lambda conn: threads_tx.list_threads(conn, scopes, limit, query))

    async def snapshot(
        self,
        thread_id: str,
        scopes: Collection[str],
        *,
        include_hidden: bool = False,
        message_limit: int | None = None,
        before: int | None = None,
    ) -> Snapshot:
        if message_limit is not None and self.dialect.composite_rows:
            limit = message_limit
            return await self._read_statements(
                lambda conn: snapshot_statement.bounded_snapshot(
                    conn, thread_id, scopes, include_hidden, limit, before
                )
            )
        return await self._read(
            lambda conn: snapshots_tx.snapshot(
                conn, thread_id, scopes, include_hidden, message_limit, before
            )
        )

    async def thread_versions(self, thread_ids: Sequence[str]) -> dict[str, int]:
        ids = list(dict.fromkeys(thread_ids))
        if not ids:
            return {}
        # Each thread's version stands alone: the statements need no common transaction.
        return await self._read_statements(lambda conn: threads_tx.thread_versions(conn, ids))

    async def message_authors(self, thread_id: str, message_ids: Sequence[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(message_ids))
        if not ids:
            return {}
        return await self._read(lambda conn: threads_tx.message_authors(conn, thread_id, ids))

    async def list_messages(
        self, thread_id: str, up_to_position: int | None = None
    ) -> list[Message]:
        return await self._read(
            lambda conn: threads_tx.list_messages(conn, thread_id, up_to_position)
        )

    async def read_history(self, thread_id: str, from_position: int = 0) -> HistoryRead:
        epoch, messages = await self._read_statements(
            lambda conn: threads_tx.read_history(conn, thread_id, from_position)
        )
        return HistoryRead(epoch=epoch, messages=tuple(messages))

    # --- input and queue admission ------------------------------------------------------

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
        limits: AdmissionLimits | None = None,
    ) -> Admission:
        text = check_text(text)
        policy = check_submit(submitted_by, client_request_id, policy)
        tools_json = encode_client_tools(client_tools)
        return await self._run(
            lambda conn: queue_tx.submit_input(
                conn,
                thread_id,
                scopes,
                text=text,
                submitted_by=submitted_by,
                client_request_id=client_request_id,
                policy=policy,
                tools_json=tools_json,
                limits=limits,
            ),
            write=True,
            lock=ThreadLock(thread_id, normalize_scopes(scopes)),
        )

    async def cancel_queued_item(
        self, thread_id: str, scopes: Collection[str], item_id: str
    ) -> int:
        return await self._write(
            lambda conn: queue_tx.cancel_queued_item(conn, thread_id, scopes, item_id)
        )

    async def list_queue(self, thread_id: str) -> list[QueuedItem]:
        return await self._read(lambda conn: threads_tx.list_queue(conn, thread_id))

    # --- runs ---------------------------------------------------------------------------

    async def get_run(self, run_id: str) -> Run:
        return await self._read_statements(lambda conn: runs_tx.get_run(conn, run_id))

    async def active_run(self, thread_id: str) -> Run | None:
        # One statement: consistent on its own, no transaction around it.
        return await self._read_statements(lambda conn: runs_tx.active_run(conn, thread_id))

    async def find_runnable_runs(self, limit: int = 10) -> list[Run]:
        if limit <= 0:
            return []
        # Outside a transaction: the clock read and the query need not be one snapshot (a run
        # found runnable is leased, checked again, before anything runs it).
        return await self._read_statements(lambda conn: runs_tx.find_runnable_runs(conn, limit))

    async def request_stop(
        self, thread_id: str, scopes: Collection[str], run_id: str
    ) -> StopResult:
        return await self._write(lambda conn: runs_tx.request_stop(conn, thread_id, scopes, run_id))

    async def start_episode(self, lease: Lease) -> tuple[Run, int]:
        return await self._write(lambda conn: runs_tx.start_episode(conn, lease))

    async def begin_episode(self, lease: Lease, history_from: int = 0) -> EpisodeStart:
        return await self._run(
            lambda conn: runs_tx.begin_episode(conn, lease, history_from),
            write=True,
            lock=ThreadLock(lease.thread_id),
        )

    async def commit(self, lease: Lease, commit: StepCommit) -> CommitResult:
        # Validate (and serialise) everything before taking any lock.
        tail = commit.update_tail
        tail_parts = validate_parts(tail.parts) if tail is not None else None
        appends = [(message, encode_parts(message.parts)) for message in commit.append]
        # Keyed by run and fencing token (plus the per-call suffix `_run` adds): a retry of this
        # commit after an unknown outcome finds it instead of appending the step twice.
        return await self._run(
            lambda conn: runs_tx.commit(conn, lease, commit, tail_parts, appends),
            write=True,
            key=f"commit:{lease.resource_id}:{lease.token}",
            lock=ThreadLock(lease.thread_id),
        )

    # --- pending actions and history rewrites -------------------------------------------

    async def resolve_action(
        self,
        thread_id: str,
        scopes: Collection[str],
        action_id: str,
        resolution: Resolution,
        expected_version: int | None = None,
    ) -> ResolveResult:
        return await self._write(
            lambda conn: actions_tx.resolve(
                conn, thread_id, scopes, action_id, resolution, expected_version
            )
        )

    async def reassign_action(
        self,
        thread_id: str,
        scopes: Collection[str],
        action_id: str,
        change: Reassignment,
        origin: Origin | None = None,
    ) -> ResolveResult:
        return await self._write(
            lambda conn: actions_tx.reassign(conn, thread_id, scopes, action_id, change, origin)
        )

    async def act(
        self,
        thread_id: str,
        scopes: Collection[str],
        ops: Sequence[ActOp],
        limits: AdmissionLimits | None = None,
    ) -> ActResult:
        # Every input checked (and its tools encoded) as `submit_input` does, before any lock.
        prepared: list[tuple[ActOp, str]] = []
        for op in ops:
            if isinstance(op, InputOp):
                check_text(op.text)
                check_submit(op.submitted_by, op.client_request_id, op.policy)
                prepared.append((op, encode_client_tools(op.client_tools)))
            else:
                prepared.append((op, ""))
        return await self._run(
            lambda conn: act_tx.act(conn, thread_id, scopes, prepared, limits),
            write=True,
            lock=ThreadLock(thread_id, normalize_scopes(scopes)),
        )

    async def pending_actions(
        self,
        scopes: Collection[str],
        *,
        limit: int = 100,
        after: str | None = None,
        thread_ids: Sequence[str] | None = None,
        allowed: Sequence[ThreadMatch] | None = None,
    ) -> list[InboxEntry]:
        """Pending actions of up to `limit` threads in `scopes`, by thread id after `after`."""
        if limit <= 0:
            return []
        ids = None if thread_ids is None else list(dict.fromkeys(thread_ids))
        return await self._read(
            lambda conn: inbox_tx.pending_actions(
                conn, scopes, limit=limit, after=after, thread_ids=ids, allowed=allowed
            )
        )

    async def thread_scopes(self, thread_ids: Sequence[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(thread_ids))[:500]
        if not ids:
            return {}
        # One statement (a thread's scope never changes): no transaction around it.
        return await self._read_statements(lambda conn: inbox_tx.thread_scopes(conn, ids))

    async def rewrite_history(
        self,
        lease: Lease,
        op: RewriteOp,
        public_patch: dict[str, Any] | None = None,
        private_patch: dict[str, Any] | None = None,
    ) -> RewriteResult:
        if not isinstance(op, Truncate | SetVisibility | RetryRun):
            raise InvalidInput("op must be Truncate, SetVisibility or RetryRun")
        public = check_patch(public_patch, "public_patch")
        private = check_patch(private_patch, "private_patch")
        return await self._write(
            lambda conn: rewrites_tx.rewrite_history(conn, lease, op, public, private)
        )


__all__ = ["SqlStore"]
