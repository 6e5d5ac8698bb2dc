"""The webhook outbox at COMMIT: a change whose COMMIT never reached Postgres left no event; one
whose COMMIT went through (its answer cut) left exactly one, as every committed change does."""

from __future__ import annotations

import random

import asyncpg
import pytest

from runtime.errors import Unavailable
from runtime.storage import PostgresStore
from runtime.storage.hooks_store import WebhookEvent
from runtime.storage.sql.hooks_sql import SqlHooks
from tests.faults.conftest import via
from tests.faults.proxy import ProxyFactory

pytestmark = [pytest.mark.postgres]

ITERATIONS = 16
WRITE = b"ISOLATION LEVEL READ COMMITTED"  # the BEGIN of a write transaction
COMMIT = b"COMMIT;\x00"
SCOPE = "outbox"


async def audit(dsn: str) -> list[str]:
    """Violations of "an event exists if and only if its change committed"."""
    conn = await asyncpg.connect(dsn)
    try:
        violations = []
        for row in await conn.fetch(
            "SELECT m.id, COUNT(d.id) AS events FROM messages m LEFT JOIN webhook_deliveries d"
            " ON d.message_id = m.id AND d.event_type = 'message.committed' GROUP BY m.id"
        ):
            if row["events"] != 1:
                violations.append(f"message {row['id']} has {row['events']} events")
        for row in await conn.fetch(
            "SELECT r.id, r.status, COUNT(d.id) AS events FROM runs r LEFT JOIN"
            " webhook_deliveries d ON d.run_id = r.id AND d.event_type = 'run.cancelled'"
            " GROUP BY r.id, r.status"
        ):
            expected = 1 if row["status"] == "cancelled" else 0
            if row["events"] != expected:
                violations.append(f"run {row['id']} ({row['status']}) has {row['events']} events")
        orphans = await conn.fetchval(
            "SELECT COUNT(*) FROM webhook_deliveries d WHERE"
            " (d.message_id IS NOT NULL AND NOT EXISTS"
            "  (SELECT 1 FROM messages m WHERE m.id = d.message_id))"
            " OR (d.run_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = d.run_id))"
        )
        if orphans:
            violations.append(f"{orphans} events report changes that never committed")
        return violations
    finally:
        await conn.close()


async def test_events_exist_exactly_when_their_change_committed(
    database: str, make_proxy: ProxyFactory
) -> None:
    rng = random.Random(30)
    outcomes = {"rolled back": 0, "committed, answer lost": 0}
    async with PostgresStore(database) as direct, make_proxy() as proxy:
        hooks = SqlHooks(direct)
        await hooks.create_subscription(
            SCOPE,
            "http://127.0.0.1:9/",
            [WebhookEvent.MESSAGE_COMMITTED, WebhookEvent.RUN_CANCELLED],
            "whsec_dGVzdHRlc3R0ZXN0dGVzdA==",
            "ops",
        )
        async with PostgresStore(via(database, proxy)) as faulty:
            faulty.retry_attempts = 1  # the failure surfaces instead of being retried away
            for i in range(ITERATIONS):
                thread = await direct.create_thread(SCOPE, f"t{i}")
                forward = rng.random() < 0.5
                stopping = i % 2 == 1
                run_id = None
                if stopping:
                    admission = await direct.submit_input(
                        thread.id, [SCOPE], text="go", submitted_by="alice"
                    )
                    run_id = admission.run_id
                proxy.cut_at(COMMIT, forward=forward, after=WRITE)
                try:
                    if stopping and run_id is not None:
                        await faulty.request_stop(thread.id, [SCOPE], run_id)
                    else:
                        await faulty.submit_input(
                            thread.id, [SCOPE], text="hello", submitted_by="alice"
                        )
                except Unavailable:
                    pass
                assert proxy.trap_fired.is_set(), f"iteration {i}: the trap never met a COMMIT"
                proxy.disarm()
                # The change committed exactly when its COMMIT reached the server.
                if stopping and run_id is not None:
                    status = (await direct.get_run(run_id)).status.value
                    assert (status == "cancelled") is forward, (i, status)
                else:
                    messages = (await direct.snapshot(thread.id, [SCOPE])).messages
                    assert len(messages) == (1 if forward else 0), (i, messages)
                outcomes["committed, answer lost" if forward else "rolled back"] += 1
    violations = await audit(database)
    print(f"\noutbox at COMMIT: iterations={ITERATIONS} {outcomes} violations={violations}")
    assert violations == []
    assert all(outcomes.values())
