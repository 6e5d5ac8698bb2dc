"""`SqlStore`: the `Store` over a dialect and a connection pool, one transaction per method."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Self, TypeVar

from runtime.domain import (
    Admission,
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
from runtime.errors import InvalidInput
from runtime.storage import sql_actions, sql_history, sql_leases, sql_queue, sql_runs, sql_threads
from runtime.storage.base import (
    AdmissionLimits,
    ResolveResult,
    RewriteResult,
    SetVisibility,
    StepCommit,
    StopResult,
    Truncate,
)
from runtime.storage.dialect import Dialect
from runtime.storage.inputs import (
    check_owner,
    check_patch,
    check_submit,
    check_text,
    check_thread_fields,
    check_token,
    check_ttl,
)
from runtime.storage.sql_core import (
    Conn,
    Pool,
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


class SqlStore:
    """Every `Store` method, written once: check the input, then run one transaction function
    through `_run`. What differs per backend is in `dialect` and `pool`, never in a subclass."""

    retry_attempts: int = 6
    retry_initial_wait: float = 0.02
    retry_max_wait: float = 1.0

    def __init__(self, dialect: Dialect, pool: Pool) -> None:
        self.dialect = dialect
        self.pool = pool

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

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def migrate(self) -> list[str]:
        """Apply pending migrations in one transaction; returns the names applied now."""
        scripts = migration_scripts(self.dialect)
        return await self._write(lambda conn: apply_migrations(conn, scripts))

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
        )

    async def _run(self, fn: Callable[[Conn], Awaitable[T]], *, write: bool) -> T:
        # The whole transaction function is retried: a retry re-reads everything it decides on.
        # (A per-transaction idempotency key would be checked and recorded here, around `fn`,
        # inside the same transaction: see docs/architecture.md, "Storage and its invariants".)
        async def once() -> T:
            async with self._transaction(write=write) as conn:
                result = await fn(conn)
            for callback in conn.after_commit:
                callback()
            return result

        return await self._retry(once)

    async def _read(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        return await self._run(fn, write=False)

    async def _write(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        return await self._run(fn, write=True)

    # --- threads and snapshots ----------------------------------------------------------

    async def create_thread(
        self,
        scope: str,
        title: str = "",
        metadata: dict[str, Any] | None = None,
        private_metadata: dict[str, Any] | None = None,
    ) -> Thread:
        check_thread_fields(scope, title)
        public_json = encode_metadata(metadata, "metadata")
        private_json = encode_metadata(private_metadata, "private_metadata")
        thread_id = new_id("th")
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
        return await self._write(
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
            )
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
        return await self._read(lambda conn: sql_runs.get_run(conn, run_id))

    async def active_run(self, thread_id: str) -> Run | None:
        return await self._read(lambda conn: sql_runs.active_run(conn, thread_id))

    async def find_runnable_runs(self, limit: int = 10) -> list[Run]:
        if limit <= 0:
            return []
        return await self._read(lambda conn: sql_runs.find_runnable_runs(conn, limit))

    async def request_stop(
        self, thread_id: str, scopes: Collection[str], run_id: str
    ) -> StopResult:
        return await self._write(
            lambda conn: sql_runs.request_stop(conn, thread_id, scopes, run_id)
        )

    async def start_episode(self, lease: Lease) -> tuple[Run, int]:
        return await self._write(lambda conn: sql_runs.start_episode(conn, lease))

    async def commit(self, lease: Lease, commit: StepCommit) -> int:
        # Validate (and serialise) everything before taking any lock.
        tail = commit.update_tail
        tail_parts = validate_parts(tail.parts) if tail is not None else None
        appends = [(message, encode_parts(message.parts)) for message in commit.append]
        return await self._write(
            lambda conn: sql_runs.commit(conn, lease, commit, tail_parts, appends)
        )

    # --- leases -------------------------------------------------------------------------

    async def acquire_run_lease(self, run_id: str, owner: str, ttl: float) -> Lease | None:
        ttl, owner = check_ttl(ttl), check_owner(owner)
        lease = await self._write(
            lambda conn: sql_leases.acquire_run_lease(conn, run_id, owner, ttl)
        )
        if lease is None:
            sql_leases.lease_event("busy", LeaseKind.RUN)
        return lease

    async def acquire_admin_lease(self, thread_id: str, owner: str, ttl: float) -> Lease | None:
        ttl, owner = check_ttl(ttl), check_owner(owner)
        lease = await self._write(
            lambda conn: sql_leases.acquire_admin_lease(conn, thread_id, owner, ttl)
        )
        if lease is None:
            sql_leases.lease_event("busy", LeaseKind.ADMIN)
        return lease

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        ttl = check_ttl(ttl)
        return await self._write(lambda conn: sql_leases.renew_lease(conn, lease, ttl))

    async def release_lease(self, lease: Lease) -> None:
        await self._write(lambda conn: sql_leases.release_lease(conn, lease))

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

    async def rewrite_history(
        self,
        lease: Lease,
        op: Truncate | SetVisibility,
        public_patch: dict[str, Any] | None = None,
        private_patch: dict[str, Any] | None = None,
    ) -> RewriteResult:
        if not isinstance(op, Truncate | SetVisibility):
            raise InvalidInput("op must be Truncate or SetVisibility")
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
    ) -> None:
        role = check_token(token_hash, subject, role)
        if expires_in is not None and not expires_in > 0:
            raise InvalidInput("expires_in must be a positive number of seconds")
        scopes_json = dumps(list(normalize_scopes(scopes)))
        await self._write(
            lambda conn: sql_threads.create_token(
                conn, token_hash, subject, role, scopes_json, expires_in
            )
        )

    async def revoke_token(self, token_hash: str) -> bool:
        return await self._write(lambda conn: sql_threads.revoke_token(conn, token_hash))

    async def principal_for_token(self, token_hash: str) -> Principal | None:
        return await self._read(lambda conn: sql_threads.principal_for_token(conn, token_hash))

    async def db_time(self) -> float:
        return await self._read(lambda conn: conn.now())


__all__ = ["SqlStore"]
