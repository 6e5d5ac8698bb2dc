"""`SqlStore`: the `Store` over a dialect and a connection pool, one transaction per method."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from realtime.base import AsyncResource
from runtime.domain import (
    Admission,
    InboxEntry,
    InputPolicy,
    Lease,
    LeaseKind,
    Message,
    Principal,
    QueuedItem,
    Resolution,
    Role,
    Run,
    Snapshot,
    Thread,
)
from runtime.errors import InvalidInput, InvariantViolation
from runtime.storage import (
    sql_actions,
    sql_history,
    sql_inbox,
    sql_keys,
    sql_leases,
    sql_queue,
    sql_runs,
    sql_threads,
)
from runtime.storage.base import (
    AdmissionLimits,
    EpisodeStart,
    HistoryRead,
    ResolveResult,
    RetryRun,
    RewriteOp,
    RewriteResult,
    SetVisibility,
    StepCommit,
    StopResult,
    Truncate,
)
from runtime.storage.dialect import Dialect
from runtime.storage.inputs import (
    check_display_name,
    check_owner,
    check_patch,
    check_submit,
    check_text,
    check_thread_fields,
    check_thread_id,
    check_token,
    check_ttl,
)
from runtime.storage.sql_core import (
    Conn,
    Pool,
    ThreadLock,
    applied_migrations,
    apply_migrations,
    migration_scripts,
    normalize_scopes,
    retry_call,
)
from runtime.storage.sql_rows import (
    dumps,
    encode_client_tools,
    encode_metadata,
    encode_parts,
    new_id,
    validate_parts,
)

T = TypeVar("T")


class SqlStore(AsyncResource):
    """Every `Store` method, written once: check the input, then run one transaction function
    through `_run` (one idempotent statement: `_write_statement`). What differs per backend is
    in `dialect` and `pool`, never in a subclass."""

    # Long enough to ride out a Postgres restart or failover (seconds), short enough that a
    # request still gets its 503 in bounded time: backoff 20 ms doubling to 2 s, plus jitter,
    # for at most 20 s after the first attempt (docs/operations.md, "Postgres is down").
    # Retrying that long is safe because writes are keyed (`_run`): a retry never repeats one.
    retry_attempts: int = 40
    retry_initial_wait: float = 0.02
    retry_max_wait: float = 2.0
    retry_budget: float = 20.0

    def __init__(self, dialect: Dialect, pool: Pool) -> None:
        self.dialect = dialect
        self.pool = pool
        self._writes = 0

    @property
    def backend(self) -> str:
        return self.dialect.name

    # --- lifecycle ----------------------------------------------------------------------

    async def open(self) -> None:
        if self.pool.is_open:
            return
        await self._retry(self.pool.open)
        try:
            await self.migrate()
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

    # --- the one path of every transaction ----------------------------------------------

    def _transaction(self, *, write: bool) -> AbstractAsyncContextManager[Conn]:
        return self.pool.transaction(write=write)

    async def _retry(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await retry_call(
            fn,
            backend=self.backend,
            is_transient=self.dialect.is_transient,
            attempts=self.retry_attempts,
            initial_wait=self.retry_initial_wait,
            max_wait=self.retry_max_wait,
            budget=self.retry_budget,
        )

    async def _run(
        self,
        fn: Callable[[Conn], Awaitable[T]],
        *,
        write: bool,
        key: str | None = None,
        lock: ThreadLock | None = None,
    ) -> T:
        """Run `fn` in one transaction, retried as a whole on transient errors (a retry re-reads
        everything it decides on).

        A write is *keyed*: a connection that drops during COMMIT leaves the outcome unknown,
        and re-running `fn` would then repeat a write that went through (a second assistant
        message, a second queued input, a resume's winner told it lost to itself). So every
        write first claims an idempotency key inside its own transaction (`sql_keys.claim`);
        a retry that finds its key claimed knows the earlier attempt committed and returns
        that attempt's result, without running `fn` again. The key is one per call (`key`
        names it for the log and the table; a random suffix keeps it unique per call).
        `lock`: the thread lock `fn` starts with, taken with the claim where that saves a round
        trip (`sql_keys.claim`)."""
        if not write:
            return await self._retry(lambda: self._attempt(fn, write=False))
        key = new_id("tx") if key is None else f"{key}:{new_id('tx')}"
        # What the attempt that got as far as COMMIT computed: the answer if COMMIT went through.
        done: list[tuple[T, list[Callable[[], None]]]] = []

        async def keyed(conn: Conn) -> T:
            if not await sql_keys.claim(conn, key, lock):
                if not done:
                    raise InvariantViolation(f"transaction {key} committed without a result")
                return done[0][0]
            result = await fn(conn)
            done[:] = [(result, conn.after_commit)]
            return result

        self._writes += 1
        if self._writes % sql_keys.PRUNE_EVERY == 0:
            await self._retry(lambda: self._attempt(sql_keys.prune, write=True))
        return await self._retry(lambda: self._attempt(keyed, write=True, done=done))

    async def _attempt(
        self,
        fn: Callable[[Conn], Awaitable[T]],
        *,
        write: bool,
        done: list[tuple[T, list[Callable[[], None]]]] | None = None,
    ) -> T:
        async with self._transaction(write=write) as conn:
            result = await fn(conn)
        # After a replayed commit, the telemetry of the attempt that wrote is what is emitted.
        callbacks = done[0][1] if done else conn.after_commit
        for callback in callbacks:
            callback()
        return result

    async def _read(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        return await self._run(fn, write=False)

    async def _read_statements(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """A read whose every statement is consistent on its own: outside a transaction."""

        async def attempt() -> T:
            async with self.pool.statements() as conn:
                return await fn(conn)

        return await self._retry(attempt)

    async def _write(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        return await self._run(fn, write=True)

    async def _write_statement(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """A write of one statement that is atomic and idempotent by itself (running it again
        after an unknown outcome changes nothing): no idempotency key, and on Postgres no
        BEGIN and COMMIT either (`Pool.autocommit`)."""

        async def attempt() -> T:
            async with self.pool.autocommit() as conn:
                result = await fn(conn)
            for callback in conn.after_commit:
                callback()
            return result

        return await self._retry(attempt)

    # --- threads and snapshots ----------------------------------------------------------

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
        check_thread_fields(scope, title)
        if thread_id is not None:
            check_thread_id(thread_id)
        public_json = encode_metadata(metadata, "metadata")
        private_json = encode_metadata(private_metadata, "private_metadata")
        thread_id = thread_id or new_id("th")
        return await self._write(
            lambda conn: sql_threads.create_thread(
                conn, thread_id, scope, title, public_json, private_json
            )
        )

    async def get_thread(self, thread_id: str, scopes: Collection[str]) -> Thread:
        return await self._read(lambda conn: sql_threads.get_thread(conn, thread_id, scopes))

    async def list_threads(self, scopes: Collection[str], limit: int = 100) -> list[Thread]:
        if limit <= 0:
            return []
        return await self._read(lambda conn: sql_threads.list_threads(conn, scopes, limit))

    async def snapshot(
        self,
        thread_id: str,
        scopes: Collection[str],
        *,
        include_hidden: bool = False,
        message_limit: int | None = None,
        before: int | None = None,
    ) -> Snapshot:
        return await self._read(
            lambda conn: sql_threads.snapshot(
                conn, thread_id, scopes, include_hidden, message_limit, before
            )
        )

    async def thread_versions(self, thread_ids: Sequence[str]) -> dict[str, int]:
        ids = list(dict.fromkeys(thread_ids))
        if not ids:
            return {}
        return await self._read(lambda conn: sql_threads.thread_versions(conn, ids))

    async def list_messages(
        self, thread_id: str, up_to_position: int | None = None
    ) -> list[Message]:
        return await self._read(
            lambda conn: sql_threads.list_messages(conn, thread_id, up_to_position)
        )

    async def read_history(self, thread_id: str, from_position: int = 0) -> HistoryRead:
        epoch, messages = await self._read_statements(
            lambda conn: sql_threads.read_history(conn, thread_id, from_position)
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
            lambda conn: sql_queue.submit_input(
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
            lambda conn: sql_queue.cancel_queued_item(conn, thread_id, scopes, item_id)
        )

    async def list_queue(self, thread_id: str) -> list[QueuedItem]:
        return await self._read(lambda conn: sql_threads.list_queue(conn, thread_id))

    # --- runs ---------------------------------------------------------------------------

    async def get_run(self, run_id: str) -> Run:
        return await self._read_statements(lambda conn: sql_runs.get_run(conn, run_id))

    async def active_run(self, thread_id: str) -> Run | None:
        return await self._read(lambda conn: sql_runs.active_run(conn, thread_id))

    async def find_runnable_runs(self, limit: int = 10) -> list[Run]:
        if limit <= 0:
            return []
        # Outside a transaction: the clock read and the query need not be one snapshot (a run
        # found runnable is leased, checked again, before anything runs it).
        return await self._read_statements(lambda conn: sql_runs.find_runnable_runs(conn, limit))

    async def request_stop(
        self, thread_id: str, scopes: Collection[str], run_id: str
    ) -> StopResult:
        return await self._write(
            lambda conn: sql_runs.request_stop(conn, thread_id, scopes, run_id)
        )

    async def start_episode(self, lease: Lease) -> tuple[Run, int]:
        return await self._write(lambda conn: sql_runs.start_episode(conn, lease))

    async def begin_episode(self, lease: Lease, history_from: int = 0) -> EpisodeStart:
        return await self._run(
            lambda conn: sql_runs.begin_episode(conn, lease, history_from),
            write=True,
            lock=ThreadLock(lease.thread_id),
        )

    async def commit(self, lease: Lease, commit: StepCommit) -> int:
        # Validate (and serialise) everything before taking any lock.
        tail = commit.update_tail
        tail_parts = validate_parts(tail.parts) if tail is not None else None
        appends = [(message, encode_parts(message.parts)) for message in commit.append]
        # Keyed by run and fencing token (plus the per-call suffix `_run` adds): a retry of this
        # commit after an unknown outcome finds it instead of appending the step twice.
        return await self._run(
            lambda conn: sql_runs.commit(conn, lease, commit, tail_parts, appends),
            write=True,
            key=f"commit:{lease.resource_id}:{lease.token}",
            lock=ThreadLock(lease.thread_id),
        )

    # --- leases -------------------------------------------------------------------------

    async def acquire_run_lease(self, run_id: str, owner: str, ttl: float) -> Lease | None:
        return await self._acquire(sql_leases.acquire_run_lease, LeaseKind.RUN, run_id, owner, ttl)

    async def acquire_admin_lease(self, thread_id: str, owner: str, ttl: float) -> Lease | None:
        return await self._acquire(
            sql_leases.acquire_admin_lease, LeaseKind.ADMIN, thread_id, owner, ttl
        )

    async def _acquire(
        self,
        acquire: Callable[[Conn, str, str, float], Awaitable[Lease | None]],
        kind: LeaseKind,
        resource_id: str,
        owner: str,
        ttl: float,
    ) -> Lease | None:
        ttl, owner = check_ttl(ttl), check_owner(owner)
        lease = await self._write(lambda conn: acquire(conn, resource_id, owner, ttl))
        if lease is None:
            sql_leases.lease_event("busy", kind)
        return lease

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        ttl = check_ttl(ttl)
        return await self._write(lambda conn: sql_leases.renew_lease(conn, lease, ttl))

    async def release_lease(self, lease: Lease) -> None:
        # One DELETE of this token's row: a retry after it went through deletes nothing.
        await self._write_statement(lambda conn: sql_leases.release_lease(conn, lease))

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
            lambda conn: sql_actions.resolve(
                conn, thread_id, scopes, action_id, resolution, expected_version
            )
        )

    async def pending_actions(
        self,
        scopes: Collection[str],
        *,
        limit: int = 100,
        after: str | None = None,
        thread_ids: Sequence[str] | None = None,
    ) -> list[InboxEntry]:
        """Pending actions of up to `limit` threads in `scopes`, by thread id after `after`."""
        if limit <= 0:
            return []
        ids = None if thread_ids is None else list(dict.fromkeys(thread_ids))
        return await self._read(
            lambda conn: sql_inbox.pending_actions(
                conn, scopes, limit=limit, after=after, thread_ids=ids
            )
        )

    async def thread_scopes(self, thread_ids: Sequence[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(thread_ids))[:500]
        if not ids:
            return {}
        return await self._read(lambda conn: sql_inbox.thread_scopes(conn, ids))

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
            lambda conn: sql_history.rewrite_history(conn, lease, op, public, private)
        )

    # --- principals and the clock -------------------------------------------------------

    async def create_token(
        self,
        token_hash: str,
        subject: str,
        role: Role,
        scopes: Collection[str],
        expires_in: float | None = None,
        display_name: str | None = None,
    ) -> None:
        role = check_token(token_hash, subject, role)
        if expires_in is not None and not expires_in > 0:
            raise InvalidInput("expires_in must be a positive number of seconds")
        name = check_display_name(display_name)
        scopes_json = dumps(list(normalize_scopes(scopes)))
        await self._write(
            lambda conn: sql_threads.create_token(
                conn, token_hash, subject, role, scopes_json, expires_in, name
            )
        )

    async def revoke_token(self, token_hash: str) -> bool:
        return await self._write(lambda conn: sql_threads.revoke_token(conn, token_hash))

    async def principal_for_token(self, token_hash: str) -> Principal | None:
        return await self._read(lambda conn: sql_threads.principal_for_token(conn, token_hash))

    async def token_expires_in(self, token_hash: str) -> float | None:
        return await self._read(lambda conn: sql_threads.token_expires_in(conn, token_hash))

    async def db_time(self) -> float:
        return await self._read(lambda conn: conn.now())


__all__ = ["SqlStore"]
