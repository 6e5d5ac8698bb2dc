"""Idempotency keys of writes: a retry after an unknown COMMIT outcome finds its own write
(backends whose COMMIT outcome is always known, SQLite, claim none: `SqlTransactions._run`)."""

from __future__ import annotations

from runtime.storage.sql.core import LITERAL, Conn, ThreadLock

# A key only has to outlive the retries of the call that made it (the retry budget, seconds);
# keys are kept far longer than that, then pruned, so the table stays small.
KEY_RETENTION_SECONDS = 600.0
# Prune once per this many keyed writes of one store: one cheap indexed DELETE, not per write.
PRUNE_EVERY = 256


def claim_sql(conn: Conn, key: str) -> str:
    """The INSERT that claims the key `key` (SQL: a literal or a parameter) on the database
    clock, doing nothing where it is claimed already."""
    return (
        f"INSERT INTO commit_keys (key, created_at) VALUES ({key}, {conn.dialect.now_sql})"
        " ON CONFLICT (key) DO NOTHING"
    )


async def claim(conn: Conn, key: str, lock: ThreadLock | None = None) -> bool:
    """Record `key` in the current transaction; False when a committed transaction holds it.

    The INSERT comes first in the transaction on purpose: on Postgres, a concurrent transaction
    that inserted the same key and has not ended yet (an earlier attempt whose COMMIT is still in
    flight on the server) makes this INSERT wait for its outcome, then do nothing if it committed.
    So "not claimed" means exactly "an earlier attempt of this call committed".

    With `lock`, where the backend sends BEGIN lazily, the thread lock the transaction starts
    with goes first, in the same round trip (`Conn.locked` then names the thread): an earlier
    attempt still committing holds that lock too, so the INSERT still runs only once it ended.
    """
    if LITERAL.fullmatch(key):
        # With the transaction's BEGIN, in one round trip, where the backend can (the key is
        # ours, checked above to need no escaping as a literal).
        locking = None if lock is None else lock.sql(conn.dialect)
        insert = claim_sql(conn, f"'{key}'")
        status = await conn.first_statement(insert if locking is None else f"{locking}; {insert}")
        if status is not None:
            if locking is not None:
                assert lock is not None
                conn.locked = lock.thread_id
            return status == "INSERT 0 1"
    row = await conn.fetchrow(f"{claim_sql(conn, '$1')} RETURNING key", key)
    return row is not None


async def prune(conn: Conn) -> None:
    now = conn.dialect.now_sql
    await conn.execute(
        f"DELETE FROM commit_keys WHERE created_at < {now} - $1", KEY_RETENTION_SECONDS
    )
