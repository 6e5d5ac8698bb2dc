"""The leases half of `SqlStore`: granting, starting, renewing and releasing the leases that own
runs and thread administration, each one keyed statement or transaction."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence

from runtime.domain import Lease, LeaseKind
from runtime.storage.decisions import check_lease_kind
from runtime.storage.input_checks import check_owner, check_ttl
from runtime.storage.sql import leases_tx, runs_tx
from runtime.storage.sql.core import Conn
from runtime.storage.sql.rows import new_id
from runtime.storage.sql.sql_tokens import SqlTokenStore
from runtime.storage.store import RunLeaseRenewal, RunStart


class SqlLeaseStore(SqlTokenStore):
    """Lease methods of `Store` over the SQL backends (`SqlStore` adds the rest)."""

    async def acquire_run_lease(self, run_id: str, owner: str, ttl: float) -> Lease | None:
        if self.dialect.run_lease_function is None:
            return await self._acquire(
                leases_tx.acquire_run_lease, LeaseKind.RUN, run_id, owner, ttl
            )
        # One statement, keyed inside the database function (the key is claimed there first,
        # as `_run` claims it): a retry after an unknown outcome grants nothing twice.
        ttl, owner, key = check_ttl(ttl), check_owner(owner), new_id("tx")
        lease = await self._write_statement(
            lambda conn: leases_tx.acquire_run_lease_call(conn, key, run_id, owner, ttl)
        )
        if lease is None:
            leases_tx.lease_event("busy", LeaseKind.RUN)
        return lease

    async def start_run(
        self,
        run_id: str,
        owner: str,
        ttl: float,
        *,
        thread_id: str | None = None,
        history_from: int = 0,
    ) -> RunStart | None:
        function = self.dialect.start_run_function
        ttl, owner = check_ttl(ttl), check_owner(owner)
        history = None if thread_id is None else (thread_id, int(history_from))
        if function is None:
            # One transaction, the lease and the start together (keyed where `_run` keys).
            start = await self._run(
                lambda conn: runs_tx.start_run(conn, run_id, owner, ttl, history),
                write=True,
            )
            if start is None:
                leases_tx.lease_event("busy", LeaseKind.RUN)
            return start
        # One statement, keyed inside the database function, as `acquire_run_lease`'s.
        key = new_id("tx")
        start = await self._write_statement(
            lambda conn: leases_tx.start_run_call(conn, key, run_id, owner, ttl, history)
        )
        if start is None:
            leases_tx.lease_event("busy", LeaseKind.RUN)
        return start

    async def acquire_admin_lease(self, thread_id: str, owner: str, ttl: float) -> Lease | None:
        return await self._acquire(
            leases_tx.acquire_admin_lease, LeaseKind.ADMIN, thread_id, owner, ttl
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
            leases_tx.lease_event("busy", kind)
        return lease

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        ttl = check_ttl(ttl)
        return await self._write(lambda conn: leases_tx.renew_lease(conn, lease, ttl))

    async def renew_run_leases(self, leases: Sequence[Lease], ttl: float) -> list[RunLeaseRenewal]:
        ttl = check_ttl(ttl)
        for lease in leases:
            check_lease_kind(lease, LeaseKind.RUN)
        renewed: dict[tuple[str, int], tuple[Lease, bool]] = {}
        step = leases_tx.RENEWALS_PER_STATEMENT
        for start in range(0, len(leases), step):
            renew = functools.partial(
                leases_tx.renew_run_leases, leases=leases[start : start + step], ttl=ttl
            )
            renewed.update(await self._write_statement(renew))
        return leases_tx.renewal_answers(leases, renewed)

    async def release_lease(self, lease: Lease) -> None:
        # One DELETE of this token's row: a retry after it went through deletes nothing.
        await self._write_statement(lambda conn: leases_tx.release_lease(conn, lease))


__all__ = ["SqlLeaseStore"]
