"""uncancellable: the work finishes before a cancellation reaches the caller."""

from __future__ import annotations

import asyncio

import pytest

from runtime.engine.shielding import uncancellable


async def test_a_cancelled_caller_waits_for_the_work_then_is_cancelled() -> None:
    gate = asyncio.Event()
    effects: list[str] = []
    seen: list[str] = []

    async def work() -> int:
        await gate.wait()
        effects.append("written")
        return 7

    async def caller() -> None:
        try:
            await uncancellable(work())
        except asyncio.CancelledError:
            seen.append(f"cancelled after {effects}")
            raise

    task = asyncio.create_task(caller())
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.sleep(0.01)
    task.cancel()  # a second cancellation does not cut the wait short either
    await asyncio.sleep(0.01)
    assert not task.done() and effects == []
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled after ['written']"]


async def test_the_work_s_own_failure_wins_over_the_cancellation() -> None:
    gate = asyncio.Event()

    async def work() -> None:
        await gate.wait()
        raise LookupError("lease lost")

    async def caller() -> int:
        try:
            await uncancellable(work())
        except LookupError:
            current = asyncio.current_task()
            assert current is not None
            return current.cancelling()
        return -1

    task = asyncio.create_task(caller())
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.sleep(0.01)
    gate.set()
    # The consumed cancellation is uncounted, so timeouts and task groups above stay correct.
    assert await task == 0


async def test_without_cancellation_it_returns_the_result() -> None:
    async def work() -> str:
        await asyncio.sleep(0)
        return "ok"

    assert await uncancellable(work()) == "ok"
