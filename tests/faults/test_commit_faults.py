"""Faults at COMMIT: connections cut while a step's, a run's or a resume's COMMIT is in flight."""

from __future__ import annotations

import random

import pytest

from runtime.domain import MessageRole, RunStatus, ToolCallPart
from tests.faults.conftest import via
from tests.faults.invariants import check_store
from tests.faults.proxy import ProxyFactory
from tests.faults.runtime import ALICE, fault_runtime

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

STEP_ITERATIONS = 16
# The BEGIN of a write transaction (PostgresPool: READ COMMITTED; reads are REPEATABLE READ).
WRITE = b"ISOLATION LEVEL READ COMMITTED"
# asyncpg's COMMIT as a simple-protocol query (its text ends with a NUL on the wire).
COMMIT = b"COMMIT;\x00"
RESUME_ITERATIONS = 8


async def test_cut_during_worker_commits(
    database: str, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each iteration cuts the worker's connection at one of its two writes of a demo run,
    after or before the server got it: the statement that takes the run lease and starts the
    episode (`start_run`, a transaction of its own), or the COMMIT of the step commit, which
    carries the run transition (the demo agent has no after_step hook). The run completes
    with exactly one reply, in one episode that began as a start (a lost reply's retry finds
    what the first attempt did: no second episode, no takeover); the store's invariants
    hold."""
    monkeypatch.setenv("THREADLINE_DEMO_DELAY_MS", "0")
    rng = random.Random(8)
    async with make_proxy() as worker_proxy, make_proxy() as service_proxy:
        async with fault_runtime(via(database, service_proxy), via(database, worker_proxy)) as rt:
            fired = {"start": 0, "commit": 0}
            for i in range(STEP_ITERATIONS):
                snapshot = await rt.service.create_thread(ALICE, title=f"cut {i}")
                thread_id = snapshot.thread.id
                await rt.watch(thread_id)
                target = "start" if i % 2 == 0 else "commit"
                forward = rng.random() < 0.7
                if target == "start":
                    # The owner is a parameter of the lease request alone: its Bind message,
                    # the statement's execution (its Parse, once per connection, names none).
                    worker_proxy.cut_at(rt.worker.owner.encode(), forward=forward)
                else:
                    worker_proxy.cut_at(COMMIT, forward=forward, after=WRITE)
                admission = await rt.service.send_message(ALICE, thread_id, f"hello number {i}")
                final = await rt.settle(thread_id)
                fired[target] += worker_proxy.trap_fired.is_set()
                worker_proxy.disarm()
                assert final.run is not None and final.run.status is RunStatus.COMPLETED
                replies = [m for m in final.messages if m.role is MessageRole.ASSISTANT]
                assert len(replies) == 1, final.model_dump()
                assert admission.run_id is not None
                assert (await rt.worker_store.get_run(admission.run_id)).episode == 1
                assert admission.run_id not in rt.observed.takeovers
        report = await check_store(database, rt.observed)
    print(
        f"\ncut during the worker's writes: iterations={STEP_ITERATIONS} faults injected"
        f" at start_run={fired['start']} at COMMIT={fired['commit']} {report.summary()}"
    )
    assert report.violations == []
    # Every iteration's trap meets its write: each run has one start and one commit.
    assert fired == {"start": STEP_ITERATIONS // 2, "commit": STEP_ITERATIONS // 2}


async def test_cut_during_resume_commit(
    database: str, make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resume's COMMIT goes through but its reply is lost: the retry finds its own write,
    so the winner gets its answer (not a conflict naming itself) and the tool runs once."""
    monkeypatch.setenv("THREADLINE_DEMO_DELAY_MS", "0")
    async with make_proxy() as worker_proxy, make_proxy() as service_proxy:
        async with fault_runtime(via(database, service_proxy), via(database, worker_proxy)) as rt:
            for i in range(RESUME_ITERATIONS):
                snapshot = await rt.service.create_thread(ALICE, title=f"resume {i}")
                thread_id = snapshot.thread.id
                await rt.watch(thread_id)
                await rt.service.send_message(ALICE, thread_id, f"email to a{i}@example.com")
                waiting = await rt.wait_waiting(thread_id)
                action = waiting.pending_actions[0]
                service_proxy.cut_at(COMMIT, forward=True, after=WRITE)
                result = await rt.service.resume_action(
                    ALICE, thread_id, action.id, {"approved": True}
                )
                assert service_proxy.trap_fired.is_set()
                assert result.run_resumed
                final = await rt.settle(thread_id)
                assert final.run is not None and final.run.status is RunStatus.COMPLETED
                tools = [p for m in final.messages for p in m.parts if isinstance(p, ToolCallPart)]
                assert len(tools) == 1 and tools[0].output == {
                    "sent": True,
                    "to": f"a{i}@example.com",
                }
                assert tools[0].waiting is not None and tools[0].waiting.resolution is not None
                assert tools[0].waiting.resolution.subject == "alice"
        report = await check_store(database, rt.observed)
    print(
        f"\ncut during resume COMMIT: iterations={RESUME_ITERATIONS}"
        f" faults injected={service_proxy.faults} {report.summary()}"
    )
    assert report.violations == []
