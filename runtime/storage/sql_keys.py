"""Idempotency keys of writes: a retry after an unknown COMMIT outcome finds its own write."""

from __future__ import annotations

import re

from runtime.storage.sql_core import Conn

# Keys (`SqlStore._run`: a name, ids, tokens) that are safe inside a SQL string literal as is.
_LITERAL = re.compile(r"[A-Za-z0-9_:.\-]+")

# A key only has to outlive the retries of the call that made it (the retry budget, seconds);
# keys are kept far longer than that, then pruned, so the table stays small.
KEY_RETENTION_SECONDS = 600.0
# Prune once per this many keyed writes of one store: one cheap indexed DELETE, not per write.
PRUNE_EVERY = 256


async def claim(conn: Conn, key: str) -> bool:
    """Record `key` in the current transaction; False when a committed transaction holds it.

    The INSERT comes first in the transaction on purpose: on Postgres, a concurrent transaction
    that inserted the same key and has not ended yet (an earlier attempt whose COMMIT is still in
    flight on the server) makes this INSERT wait for its outcome, then do nothing if it committed.
    So "not claimed" means exactly "an earlier attempt of this call committed".
    """
    now = conn.dialect.now_sql
    if _LITERAL.fullmatch(key):
        # With the transaction's BEGIN, in one round trip, where the backend can (the key is
        # ours, checked above to need no escaping as a literal).
        status = await conn.first_statement(
            f"INSERT INTO commit_keys (key, created_at) VALUES ('{key}', {now})"
            " ON CONFLICT (key) DO NOTHING"
        )
        if status is not None:
            return status == "INSERT 0 1"
    row = await conn.fetchrow(
        f"INSERT INTO commit_keys (key, created_at) VALUES ($1, {now})"
        " ON CONFLICT (key) DO NOTHING RETURNING key",
        key,
    )
    return row is not None


async def prune(conn: Conn) -> None:
    now = conn.dialect.now_sql
    await conn.execute(
        f"DELETE FROM commit_keys WHERE created_at < {now} - $1", KEY_RETENTION_SECONDS
    )
