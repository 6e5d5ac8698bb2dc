"""`SqlAuditLog`: the audit log's reads over a `SqlStore`'s dialect and pool (migration 0012)."""

from __future__ import annotations

from runtime.storage.audit_chain import AuditEntry
from runtime.storage.sql import audit_tx
from runtime.storage.sql.sql_store import SqlStore
from runtime.storage.sql.transactions import SqlTransactions


class SqlAuditLog(SqlTransactions):
    """Shares the store's pool (opened and closed by the store). Appends happen in the store's
    own transactions (`audit_tx.append`); this only reads."""

    def __init__(self, store: SqlStore) -> None:
        super().__init__(store.dialect, store.pool)

    async def open(self) -> None:
        """Nothing: the store opens the shared pool and applies the migrations."""

    async def close(self) -> None:
        """Nothing: the store closes the shared pool."""

    async def audit_entries(
        self, scope: str, *, thread_id: str | None = None, after: int = 0, limit: int = 100
    ) -> list[AuditEntry]:
        limit = max(1, min(int(limit), 1000))
        return await self._read(
            lambda conn: audit_tx.entries(conn, scope, thread_id, max(0, int(after)), limit)
        )
