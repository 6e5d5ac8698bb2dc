"""cancel_and_wait_all: every task ends, one that swallows its first cancellation included,
waited for together; failures are logged, finished tasks and None are fine."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from realtime.bus_support import cancel_and_wait, cancel_and_wait_all


async def stubborn(swallowed: list[int]) -> None:
    """Swallows the first cancellation (as a racing `wait_for` can on 3.11), then parks."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        swallowed.append(1)
    await asyncio.Event().wait()


async def failing() -> None:
    raise RuntimeError("broke")


async def test_every_task_ends_even_one_that_swallows_a_cancellation() -> None:
    swallowed: list[int] = []
    parked = asyncio.create_task(asyncio.Event().wait())
    tough = asyncio.create_task(stubborn(swallowed))
    done = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    assert done.done()
    # Bounded: a cancellation that is not repeated would leave `tough` running for ever.
    await asyncio.wait_for(
        cancel_and_wait_all((parked, None, tough, done), recancel_every=0.01), 30
    )
    assert parked.cancelled() and tough.cancelled() and swallowed == [1]
    assert done.done() and not done.cancelled()


async def test_failures_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    broken = asyncio.create_task(failing(), name="broken-task")
    with contextlib.suppress(RuntimeError):
        await asyncio.wait({broken})
    with caplog.at_level(logging.WARNING):
        await cancel_and_wait_all((broken,))
        await cancel_and_wait(broken)
    assert [r.getMessage() for r in caplog.records] == [
        "background task broken-task had failed"
    ] * 2
