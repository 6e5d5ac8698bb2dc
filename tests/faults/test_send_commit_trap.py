"""The campaign's `sendcommit` fault at the lowest level: the proxy cuts the COMMIT of the
transaction that binds a send's text (not of one binding the demo agent's echo of it), and the
store's retry of that send, COMMIT outcome unknown, commits it exactly once."""

from __future__ import annotations

import asyncpg
import pytest

from runtime.storage import PostgresStore
from tests.campaign.nemesis import SEND_TEXT
from tests.faults.conftest import via
from tests.faults.proxy import ProxyFactory

pytestmark = [pytest.mark.postgres]

SCOPE = "trap"


async def committed(dsn: str, text: str) -> int:
    """How many user messages and queued items hold `text`."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT (SELECT COUNT(*) FROM messages WHERE role = 'user' AND parts::text"
                " LIKE '%' || $1 || '\"%') + (SELECT COUNT(*) FROM queued_items WHERE text = $1)",
                text,
            )
        )
    finally:
        await conn.close()


async def test_a_sends_cut_commit_is_retried_into_exactly_one_send(
    database: str, make_proxy: ProxyFactory
) -> None:
    async with make_proxy() as proxy, PostgresStore(via(database, proxy)) as store:
        thread = await store.create_thread(SCOPE, "t")
        # The first send starts a run, the others queue behind it: both inserts are aimed at,
        # each on a prepared statement after the first time (only the parameters are sent).
        for i, forward in enumerate((True, False, True, True, False)):
            text = f"note m-c0-{i}"
            proxy.cut_commit_after(SEND_TEXT, forward=forward)
            # A write binding the agent's echo of the text, not the send's: the trap stays armed.
            echo = await asyncpg.connect(via(database, proxy))
            try:
                async with echo.transaction():
                    await echo.execute("SELECT $1::text", f"You said: {text}")
            finally:
                await echo.close()
            assert not proxy.trap_fired.is_set(), i
            await store.submit_input(thread.id, [SCOPE], text=text, submitted_by="alice")
            assert proxy.trap_fired.is_set(), f"send {i}: the trap never met its COMMIT"
            assert proxy.matched == text.encode()
            proxy.disarm()
            assert await committed(database, text) == 1, (i, forward)
    print(f"\nsend COMMIT cuts: {proxy.faults}")
    assert proxy.faults == 5
