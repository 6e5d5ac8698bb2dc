"""What differs between SQL backends, as one small value the shared transaction code consults."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


def _same(sql: str) -> str:
    return sql


def _octet_length(expression: str) -> str:
    return f"octet_length({expression})"


def _json_each_match(metadata: Mapping[str, str], start: int) -> tuple[str, list[Any]]:
    """Threads whose public metadata holds each key with that string value, key by key (no
    index can serve `json_each`; SQLite scans the scope's threads, which its scale allows)."""
    clauses, args = [], []
    for offset, (key, value) in enumerate(sorted(metadata.items())):
        k, v = start + 2 * offset, start + 2 * offset + 1
        clauses.append(
            "EXISTS (SELECT 1 FROM json_each(threads.metadata) j"
            f" WHERE j.key = ${k} AND j.type = 'text' AND j.value = ${v})"
        )
        args += [key, value]
    return " AND ".join(clauses) or "1 = 1", args


@dataclass(frozen=True, slots=True)
class Dialect:
    """Everything the shared SQL needs to know about a backend; the rest is common.

    Common on purpose (a backend that differs here needs a new field, not a fork): `$n`
    placeholders in the shared SQL (`render` rewrites them), upserts as `INSERT … ON CONFLICT
    (…) DO UPDATE SET … = excluded.…` and `RETURNING` (SQLite ≥ 3.35), `TRUE`/`FALSE` literals,
    JSON stored as TEXT encoded by orjson (`rows.py`), `LIKE … ESCAPE '\\'`.
    """

    # Also the migrations folder (`migrations/<name>/`) and the `backend` metric attribute.
    name: str
    # The database clock in epoch seconds: lease expiry never trusts the application's clock.
    now_sql: str
    # Appended to the thread SELECT that opens a write transaction to lock the row (Postgres
    # `FOR UPDATE`); empty where the write transaction itself holds the database lock (SQLite
    # `BEGIN IMMEDIATE`, taken by its connection pool).
    thread_lock: str
    # Whether an error is worth retrying the whole transaction for (lock contention, a dropped
    # connection); domain errors never are.
    is_transient: Callable[[BaseException], bool]
    # Run first in the migration transaction so concurrent processes migrate one at a time
    # (None: the write transaction already serialises them).
    migration_lock: str | None = None
    # Run before counting a scope's active runs (`$1` = the scope), held to the end of the
    # transaction, so concurrent admissions in one scope count one after the other and the cap
    # is exact (None: the write transaction already serialises them).
    scope_lock: str | None = None
    # The shared SQL's `$n` placeholders in the driver's spelling.
    render: Callable[[str], str] = _same
    # SQL for the size in bytes of a TEXT expression (queue bounds are in UTF-8 bytes).
    octets: Callable[[str], str] = _octet_length
    # The clock `now_sql` reads, readable in-process without a round trip (None: ask the
    # database). An SQLite file is local: its clock is this machine's wall clock.
    local_clock: Callable[[], float] | None = None
    # Whether a statement may carry data-modifying `WITH` clauses (Postgres), so that writes
    # whose results do not decide anything in between go in one round trip; SQLite has no
    # such clauses (and no round trips: its statements are local calls).
    writing_ctes: bool = False
    # A database function doing `acquire_run_lease`'s whole transaction, key claim included, in
    # one statement (`leases_tx.acquire_run_lease_call`; a migration adds it); None: the
    # transaction runs statement by statement.
    run_lease_function: str | None = None
    # A database function doing `start_run` in one statement: the run lease (as
    # `run_lease_function`, keyed alike) and `start_episode` with it
    # (`leases_tx.start_run_call`; a migration adds it); None: `start_run` takes the lease
    # alone and the episode is started by `begin_episode`.
    start_run_function: str | None = None
    # Whether this process always knows if a COMMIT went through (SQLite: COMMIT is a local
    # call, and one that fails leaves nothing committed), so a retried write needs no
    # idempotency key: its pool marks a committed `Conn` (`Conn.committed`) and the retry
    # returns what that attempt computed (`SqlTransactions._run`). False: keys (Postgres,
    # where a connection can drop while COMMIT is in flight).
    commit_outcome_known: bool = False
    # Whether a table's rows can be selected as values (`SELECT m FROM messages m`: Postgres
    # composite types), so that a bounded snapshot is one statement and needs no transaction
    # (`snapshot_statement`); SQLite reads it statement by statement in its local transaction.
    composite_rows: bool = False
    # SQL (with its arguments, numbered from the int) keeping the threads whose public
    # metadata has every key of the mapping at that string value.
    metadata_match: Callable[[Mapping[str, str], int], tuple[str, list[Any]]] = _json_each_match


__all__ = ["Dialect"]
