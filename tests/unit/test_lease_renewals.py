"""The worker's batched lease renewals (runtime/engine/renewals.py) and its beat grid."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from runtime.domain import Lease, LeaseKind
from runtime.engine.renewals import LeaseRenewals, beat_delay
from runtime.storage.store import RunLeaseRenewal


def lease(n: int) -> Lease:
    return Lease(
        kind=LeaseKind.RUN,
        resource_id=f"run-{n}",
        thread_id=f"thr-{n}",
        owner="w1",
        token=n,
        expires_at=100.0,
    )


class Recording:
    """Renews every lease but the ones listed as lost; records each call's leases."""

    def __init__(self, lost: Sequence[str] = (), fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.lost = set(lost)
        self.fail = fail

    async def renew_run_leases(self, leases: Sequence[Lease], ttl: float) -> list[RunLeaseRenewal]:
        self.calls.append([item.resource_id for item in leases])
        await asyncio.sleep(0)
        if self.fail:
            raise ConnectionError("storage down")
        return [
            RunLeaseRenewal(
                None
                if item.resource_id in self.lost
                else item.model_copy(update={"expires_at": item.expires_at + ttl}),
                item.resource_id == "run-2",
            )
            for item in leases
        ]


def test_every_beat_falls_on_the_shared_grid() -> None:
    period = 5.0
    for now in (0.0, 0.1, 2.4, 2.6, 4.99, 1234.5678):
        delay = beat_delay(now, period)
        assert period / 2 < delay <= 1.5 * period
        beat = now + delay
        assert abs(beat / period - round(beat / period)) < 1e-9
    # Two heartbeats started apart beat together.
    assert 1.0 + beat_delay(1.0, period) == pytest.approx(2.0 + beat_delay(2.0, period))


async def test_asks_within_the_window_share_one_storage_call() -> None:
    store = Recording(lost=["run-3"])
    renewals = LeaseRenewals(store, 30.0, window=0.02)
    answers = await asyncio.gather(*(renewals.renew(lease(n)) for n in range(5)))
    assert store.calls == [[f"run-{n}" for n in range(5)]]
    assert [a.lease is not None for a in answers] == [True, True, True, False, True]
    assert [a.stop for a in answers] == [False, False, True, False, False]
    assert answers[0].lease is not None and answers[0].lease.expires_at == 130.0
    # A later ask is the next call.
    await renewals.renew(lease(7))
    assert store.calls[-1] == ["run-7"] and renewals.calls == 2


async def test_an_ask_that_gave_up_is_left_out() -> None:
    store = Recording()
    renewals = LeaseRenewals(store, 30.0, window=0.02)
    gave_up = asyncio.create_task(renewals.renew(lease(1)))
    kept = asyncio.create_task(renewals.renew(lease(2)))
    await asyncio.sleep(0)
    gave_up.cancel()
    answer = await kept
    assert store.calls == [["run-2"]] and answer.stop


async def test_a_storage_failure_fails_every_ask_of_its_batch() -> None:
    renewals = LeaseRenewals(Recording(fail=True), 30.0, window=0.01)
    results = await asyncio.gather(
        *(renewals.renew(lease(n)) for n in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, ConnectionError) for r in results)


async def test_close_cancels_the_asks_not_answered() -> None:
    renewals = LeaseRenewals(Recording(), 30.0, window=10.0)
    waiting = asyncio.create_task(renewals.renew(lease(1)))
    await asyncio.sleep(0)
    await renewals.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting
