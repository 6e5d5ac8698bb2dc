"""One worker's run-lease renewals, batched: a heartbeat per worker, not a renewal per run.

Each episode's heartbeat still asks for its own renewal, with its own deadline and timeout
(`Worker._heartbeat`); the asks that arrive within `window` of the first one go to storage
together, as one `renew_run_leases` call (an autocommit statement per 500 leases, which also
says which of the runs were asked to stop). The heartbeats are aligned on a grid of the loop's clock
(`beat_delay`), so a worker holding 2 000 streaming runs renews them all in one call every
period instead of 2 000 renewals and 2 000 run reads (docs/architecture.md, "Leases").

A storage failure fails every ask of its batch, as each single renewal would have failed; an
ask that gave up (its timeout, its episode's end) is left out of the next batch, and its answer,
when one comes, is dropped.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Protocol

from runtime.domain import Lease
from runtime.storage.store import RunLeaseRenewal

# Asks arriving this long after the first of a batch still join it (the grid's timers fire
# within a millisecond of each other; a renewal is due seconds before its lease expires).
WINDOW = 0.01


class RenewalStore(Protocol):
    async def renew_run_leases(
        self, leases: Sequence[Lease], ttl: float
    ) -> list[RunLeaseRenewal]: ...


def beat_delay(now: float, period: float) -> float:
    """Seconds from `now` to the next beat: the next multiple of `period` on the loop's clock
    that is more than half a period away (so between half a period and one and a half). Every
    heartbeat of the process beats on the same multiples, whenever its run started."""
    return (math.floor((now + period / 2) / period) + 1) * period - now


class LeaseRenewals:
    """`renew` one lease; the asks of one window share a storage call (the module's docstring)."""

    def __init__(self, store: RenewalStore, ttl: float, *, window: float = WINDOW) -> None:
        self._store = store
        self._ttl = ttl
        self._window = window
        self._asks: list[tuple[Lease, asyncio.Future[RunLeaseRenewal]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self.calls = 0  # storage calls made (for tests and benches)

    async def renew(self, lease: Lease) -> RunLeaseRenewal:
        """This lease renewed for the TTL, or `lease` None when it was lost; raises what the
        storage call raised."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[RunLeaseRenewal] = loop.create_future()
        self._asks.append((lease, answer))
        if self._timer is None:
            self._timer = loop.call_later(self._window, self._send_batch)
        return await answer

    def _send_batch(self) -> None:
        self._timer = None
        asks, self._asks = [a for a in self._asks if not a[1].done()], []
        if not asks:
            return
        task = asyncio.create_task(self._send(asks), name="lease-renewals")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, asks: list[tuple[Lease, asyncio.Future[RunLeaseRenewal]]]) -> None:
        self.calls += 1
        try:
            answers = await self._store.renew_run_leases([lease for lease, _ in asks], self._ttl)
        except asyncio.CancelledError:
            for _, answer in asks:
                answer.cancel()
            raise
        except Exception as exc:
            for _, answer in asks:
                if not answer.done():
                    answer.set_exception(exc)
            return
        for (_, answer), renewal in zip(asks, answers, strict=True):
            if not answer.done():
                answer.set_result(renewal)

    async def close(self) -> None:
        """Fail the asks not sent yet and cancel the calls in flight (the worker is stopping)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        asks, self._asks = self._asks, []
        for _, answer in asks:
            answer.cancel()
        tasks = list(self._sending)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
