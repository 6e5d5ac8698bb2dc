"""Send, then stop after a random small delay, many times: a stop may land anywhere from before
the worker claims the run to after it completed, and committed state must stay whole."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from runtime.domain import MessageRole, RunStatus
from tests.faults.conftest import via
from tests.faults.invariants import check_store
from tests.faults.proxy import ProxyFactory
from tests.faults.runtime import ALICE, fault_runtime

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

ITERATIONS = 60
THREADS = 3


async def test_send_then_stop(
    database: str, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never a failed run, never two assistant messages for the demo's one step, every run
    ended, and the store's invariants hold (the final version of every thread invalidated,
    committed text equal to what was streamed)."""
    monkeypatch.setenv("THREADLINE_DEMO_DELAY_MS", "0")
    rng = random.Random(8_9)
    outcomes: Counter[str] = Counter()
    violations: list[str] = []
    loop = asyncio.get_running_loop()
    async with make_proxy() as proxy:
        async with fault_runtime(database, via(database, proxy)) as rt:
            threads = []
            for t in range(THREADS):
                snapshot = await rt.service.create_thread(ALICE, title=f"send-stop {t}")
                threads.append(snapshot.thread.id)
                await rt.watch(snapshot.thread.id)
            # One run without a stop measures how long a run takes here (a loaded machine is
            # slower): the stops then land from before the claim to after the end.
            started = loop.time()
            durations = []
            for w in range(3):  # the median of three: the first also warms caches up
                began = loop.time()
                warm_up = await rt.service.send_message(ALICE, threads[0], f"warm up {w}")
                assert warm_up.run_id is not None
                # Polled every 2 ms, not at `settle`'s 50 ms: a demo run at zero delay ends
                # within a few ms, and a coarse measure would put most stops after the end.
                while not (await rt.service_store.get_run(warm_up.run_id)).status.is_terminal:
                    if loop.time() - began > 30:
                        raise AssertionError("a warm-up run did not end")
                    await asyncio.sleep(0.002)
                durations.append(loop.time() - began)
                await rt.settle(threads[0])
            duration = sorted(durations)[1]
            run_ids: list[tuple[str, str]] = []
            for i in range(ITERATIONS):
                thread_id = threads[i % THREADS]
                admission = await rt.service.send_message(ALICE, thread_id, f"stop me {i}")
                assert admission.run_id is not None
                run_ids.append((thread_id, admission.run_id))
                # A third of the stops at once (before or around the claim: a zero-delay run
                # leaves a stop only a few ms), the rest spread to past the run's end.
                if rng.random() >= 1 / 3:
                    await asyncio.sleep(rng.uniform(0, 1.5 * duration))
                await rt.service.stop_run(ALICE, thread_id, admission.run_id)
                await rt.settle(thread_id)
            finals = {t: await rt.settle(t) for t in threads}
            looped = loop.time() - started
            for thread_id, run_id in run_ids:
                run = await rt.service_store.get_run(run_id)
                outcomes[run.status.value] += 1
                if run.status not in (RunStatus.COMPLETED, RunStatus.CANCELLED):
                    violations.append(f"{run_id} ended {run.status.value}: {run.error}")
                replies = [
                    m
                    for m in finals[thread_id].messages
                    if m.run_id == run_id and m.role is MessageRole.ASSISTANT
                ]
                if len(replies) > 1:
                    violations.append(f"{run_id}: {len(replies)} assistant messages for one step")
        report = await check_store(database, rt.observed)
    print(
        f"\nsend-then-stop: iterations={ITERATIONS} in {looped:.1f} s"
        f" (a run takes {duration:.3f} s)"
        f" faults injected={ITERATIONS} outcomes={dict(outcomes)}"
        f" {report.summary()} run violations={len(violations)}"
    )
    assert violations == []
    assert report.violations == []
    # The delays spread the stops: some runs were cancelled, some completed first.
    assert outcomes["cancelled"] > 0
