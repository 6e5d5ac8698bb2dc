"""The keepalive wheel (server/transports/ws/keepalive.py): pings of connections that opened
apart share one timer per tick, none comes early, a closed connection is not pinged, and one
that fails does not starve the others."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from server.transports.ws.keepalive import KeepaliveWheel, wheel


class Peer:
    def __init__(self, loop: asyncio.AbstractEventLoop, fail: bool = False) -> None:
        self.loop = loop
        self.fail = fail
        self.pinged: list[float] = []

    def keepalive_due(self) -> None:
        self.pinged.append(self.loop.time())
        if self.fail:
            raise RuntimeError("broken transport")


async def test_a_thousand_connections_share_the_timer_of_their_tick() -> None:
    loop = asyncio.get_running_loop()
    ticks = KeepaliveWheel(loop)
    peers = [Peer(loop) for _ in range(1000)]
    keys = [ticks.add(peer, 20.0) for peer in peers]
    # A second per tick at a 20 s interval: the thousand fall in one tick, or two when
    # the loop's clock crossed a tick's edge between them.
    assert ticks.timers() <= 2
    assert len(ticks) == 1000
    for peer, key in zip(peers, keys, strict=True):
        ticks.discard(peer, key)
    assert ticks.timers() == 0 and len(ticks) == 0


async def test_each_is_pinged_once_never_before_its_interval() -> None:
    loop = asyncio.get_running_loop()
    ticks = KeepaliveWheel(loop)
    interval = 0.1
    added: list[tuple[Peer, float]] = []
    for _ in range(20):  # opened over ~20 ms, four ticks of 5 ms
        peer = Peer(loop)
        added.append((peer, loop.time()))
        ticks.add(peer, interval)
        await asyncio.sleep(0.001)
    # Fewer timers than connections: those that opened within one tick share it.
    assert ticks.timers() <= len(added) // 2
    await asyncio.sleep(interval + 2 * KeepaliveWheel.tick_length(interval) + 0.05)
    for peer, at in added:
        assert len(peer.pinged) == 1
        late = peer.pinged[0] - at - interval
        assert 0 <= late <= KeepaliveWheel.tick_length(interval) + 0.05, late
    assert ticks.timers() == 0


async def test_a_discarded_connection_is_not_pinged_and_its_empty_tick_loses_its_timer() -> None:
    loop = asyncio.get_running_loop()
    ticks = KeepaliveWheel(loop)
    gone, stays = Peer(loop), Peer(loop)
    key = ticks.add(gone, 0.05)
    ticks.discard(gone, key)
    ticks.discard(gone, key)  # twice: nothing
    assert ticks.timers() == 0
    ticks.add(stays, 0.05)
    await asyncio.sleep(0.2)
    assert gone.pinged == [] and len(stays.pinged) == 1


async def test_a_failing_connection_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    ticks = KeepaliveWheel(loop)
    peers = [Peer(loop, fail=i == 0) for i in range(3)]
    for peer in peers:
        ticks.add(peer, 0.05)
    await asyncio.sleep(0.2)
    assert [len(peer.pinged) for peer in peers] == [1, 1, 1]
    assert "keepalive ping failed" in caplog.text


async def test_one_wheel_per_loop() -> None:
    loop = asyncio.get_running_loop()
    assert wheel(loop) is wheel(loop)


async def test_a_connection_pinged_by_a_tick_stays_one_interval_apart() -> None:
    loop = asyncio.get_running_loop()
    ticks = KeepaliveWheel(loop)
    interval = 0.02
    keys: list[tuple[int, float]] = []
    rounds = asyncio.Event()

    class Again:
        def keepalive_due(self) -> None:  # as the protocol does: ping, then schedule the next
            time.sleep(0.002)  # the batch's work before the next is scheduled: two ticks
            keys.append(ticks.add(self, interval))
            if len(keys) == 6:
                rounds.set()

    keys.append(ticks.add(Again(), interval))
    async with asyncio.timeout(5):
        await rounds.wait()
    per_round = round(interval / KeepaliveWheel.tick_length(interval))
    assert [b[0] - a[0] for a, b in itertools.pairwise(keys)][:5] == [per_round] * 5
