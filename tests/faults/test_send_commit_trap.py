"""The campaign's `sendcommit` fault at the lowest level: the proxy cuts the COMMIT of the
gateway's transaction that binds a send's text (not of one binding the demo agent's echo of it,
nor of another process's), and the store's retry of that send, its COMMIT's outcome unknown,
commits it exactly once."""

from __future__ import annotations

import asyncpg
import pytest

from runtime.storage import PostgresStore
from tests.campaign.nemesis import GATEWAY, SEND_TEXT, UNKEYED_SEND_TEXT
from tests.campaign.topology import GATEWAY_APPLICATION, named_url
from tests.faults.conftest import via
from tests.faults.proxy import FaultProxy, ProxyFactory

pytestmark = [pytest.mark.postgres]

SCOPE = "trap"


async def committed(dsn: str, marker: str) -> int:
    """How many user messages and queued items hold `marker`."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT (SELECT COUNT(*) FROM messages WHERE role = 'user' AND parts::text"
                " LIKE '%' || $1 || '\"%') + (SELECT COUNT(*) FROM queued_items"
                " WHERE text LIKE '%' || $1)",
                marker,
            )
        )
    finally:
        await conn.close()


async def bind(url: str, text: str) -> None:
    """A write transaction that binds `text`, on a connection of its own."""
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute("SELECT $1::text", text)
    finally:
        await conn.close()


async def test_a_sends_cut_commit_is_retried_into_exactly_one_send(
    database: str, make_proxy: ProxyFactory
) -> None:
    proxy: FaultProxy
    async with make_proxy() as proxy:
        gateway = named_url(via(database, proxy), GATEWAY_APPLICATION)
        async with PostgresStore(gateway) as store:
            thread = await store.create_thread(SCOPE, "t")
            # The first send starts a run, the others queue behind it: both inserts are aimed
            # at, each on a prepared statement after the first time (only parameters are sent).
            for i, forward in enumerate((True, False, True, True, False, True)):
                keyed = i % 2 == 1
                marker = f"m-c0-{i}"
                text = f"note {marker}" if keyed else f"unkeyed note {marker}"
                proxy.cut_commit_after(
                    SEND_TEXT if keyed else UNKEYED_SEND_TEXT, forward=forward, origin=GATEWAY
                )
                # The agent's echo of the text on a gateway's connection, the text itself on
                # another process's (a worker admitting a queued item), an unkeyed pattern's
                # keyed send: none of them springs the trap.
                await bind(gateway, f"You said: {text}")
                await bind(via(database, proxy), text)
                if not keyed:
                    await bind(gateway, f"note m-c1-{i}")
                assert not proxy.trap_fired.is_set(), i
                await store.submit_input(
                    thread.id,
                    [SCOPE],
                    text=text,
                    submitted_by="alice",
                    client_request_id=marker if keyed else None,
                )
                assert proxy.trap_fired.is_set(), f"send {i}: the trap never met its COMMIT"
                assert proxy.matched == text.encode()
                proxy.disarm()
                assert await committed(database, marker) == 1, (i, forward)
    print(f"\nsend COMMIT cuts: {proxy.faults}")
    assert proxy.faults == 6
