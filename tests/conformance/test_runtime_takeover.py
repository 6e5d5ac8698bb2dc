"""Lease takeover: a stalled worker's run is redone by another; the stale worker writes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import Lease, RunStatus, ToolCallPart, ToolState
from runtime.engine.worker import Worker
from runtime.errors import LeaseLost
from runtime.providers.model_api import ModelDelta, ModelRequest
from runtime.providers.scripted import (
    FunctionModel,
    ScriptedModel,
    text_response,
    tool_call_response,
)
from runtime.storage.store import CommitResult, RunLeaseRenewal, StepCommit, Store
from runtime.tools import SuspendStep, ToolContext, tool
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, Runtime, first_text, run_of, settled


class FrozenHeartbeat:
    """A store whose lease renewals silently do nothing, like a worker stuck in a GC pause."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def renew_run_leases(self, leases: Sequence[Lease], ttl: float) -> list[RunLeaseRenewal]:
        return [RunLeaseRenewal(lease, False) for lease in leases]


async def test_stalled_worker_is_taken_over_without_loss_or_duplicates(
    runtime_for: RuntimeFactory,
) -> None:
    stale_may_finish = asyncio.Event()
    calls: list[int] = []
    stale_started = asyncio.Event()

    async def model(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        calls.append(len(calls))
        if len(calls) == 1:
            stale_started.set()
            yield text_response("stale ")[0]
            await asyncio.wait_for(stale_may_finish.wait(), 20)
            yield text_response("stale answer")[0]
        else:
            yield text_response("fresh answer")[0]

    agent = Agent(model=FunctionModel(model))
    rt: Runtime = await runtime_for(agent, workers=0, lease_ttl=0.6)
    stale = Worker(FrozenHeartbeat(rt.store), rt.bus, agent, lease_ttl=0.6, poll_interval=0.05)
    await stale.start()
    rt.workers.append(stale)
    thread_id = await rt.thread()
    async with rt.record(thread_id) as rec:
        admission = await rt.service.send_message(ALICE, thread_id, "hello")
        assert admission.run_id is not None
        await rt.wait_status(thread_id, RunStatus.RUNNING)
        await asyncio.wait_for(stale_started.wait(), 10)
        await rt.start_worker()  # the healthy worker takes over after the lease expires
        done = await rt.wait_for(thread_id, settled, timeout=15)
        stale_may_finish.set()
        await asyncio.sleep(0.3)  # the stale worker now tries to commit and must fail
    snapshot = await rt.wait_for(thread_id, settled)
    assert run_of(done).status is RunStatus.COMPLETED
    assert [first_text(m) for m in snapshot.messages] == ["hello", "fresh answer"]
    assert snapshot.thread.version == done.thread.version
    takeovers = [c for c in rec.chunks(admission.run_id) if c["chunk"]["type"] == "run-takeover"]
    assert len(takeovers) == 1
    versions = rec.versions()
    assert versions == sorted(versions)
    run = await rt.store.get_run(admission.run_id)
    assert run.episode == 2


class StallsBeforeToolsStart:
    """A store that, once armed, stalls the commit marking resumed tools started, and from then
    on renews no lease: a worker frozen after streaming its tool's `running` state, before that
    state is committed."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.armed = False
        self.stalled = asyncio.Event()
        self.release = asyncio.Event()
        self.failures: list[BaseException] = []
        self.failed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def renew_run_leases(self, leases: Sequence[Lease], ttl: float) -> list[RunLeaseRenewal]:
        if self.stalled.is_set():
            return [RunLeaseRenewal(lease, False) for lease in leases]
        result: list[RunLeaseRenewal] = await self._store.renew_run_leases(leases, ttl)
        return result

    async def commit(self, lease: Lease, change: StepCommit) -> CommitResult:
        update = change.update_tail
        if (
            self.armed
            and update is not None
            and any(
                isinstance(p, ToolCallPart) and p.state is ToolState.RUNNING for p in update.parts
            )
        ):
            self.armed = False
            self.stalled.set()
            await self.release.wait()
            try:
                return await self._store.commit(lease, change)
            except BaseException as exc:
                self.failures.append(exc)
                self.failed.set()
                raise
        return await self._store.commit(lease, change)


class Approval(BaseModel):
    approved: bool


class Transfer(BaseModel):
    amount: int


async def test_takeover_of_a_resuming_run_is_announced(runtime_for: RuntimeFactory) -> None:
    """A run resumed from an approval whose worker streamed the tool's `running` state and then
    stalled before committing it: the next episode is a takeover and says so (`run-takeover`,
    reusing the dead episode's seq, so clients drop its chunks); the tool runs once; the stale
    worker's commit fails. The resuming episode before it is not a takeover.

    Breaks with: `start_kind` testing `before.episode > 0` (the resume is announced as a
    takeover too) or the resolve not setting `resumed_episode = episode` (likewise); before
    `resumed_episode` existed, no takeover chunk was published at all."""
    executed: list[int] = []

    @tool(suspend=SuspendStep(Approval))
    async def transfer(args: Transfer, ctx: ToolContext) -> dict[str, object]:
        executed.append(args.amount)
        return {"sent": args.amount}

    model = ScriptedModel(
        [tool_call_response("transfer", {"amount": 5}, "t1"), text_response("sent it")]
    )
    agent = Agent(model=model, tools=[transfer])
    rt: Runtime = await runtime_for(agent, workers=0, lease_ttl=1.0)
    stalling = StallsBeforeToolsStart(rt.store)
    stale = Worker(stalling, rt.bus, agent, lease_ttl=1.0, poll_interval=0.05)
    await stale.start()
    rt.workers.append(stale)
    thread_id = await rt.thread()
    async with rt.record(thread_id) as rec:
        admission = await rt.service.send_message(ALICE, thread_id, "pay 5")
        assert admission.run_id is not None
        waiting = await rt.wait_status(thread_id, RunStatus.WAITING)
        stalling.armed = True
        await rt.service.resume_action(
            ALICE, thread_id, waiting.pending_actions[0].id, {"approved": True}
        )
        await asyncio.wait_for(stalling.stalled.wait(), 10)
        resuming = (await rt.store.get_run(admission.run_id)).episode
        await rt.start_worker()  # takes the run over once the stalled worker's lease expires
        done = await rt.wait_for(thread_id, settled, timeout=15)
        stalling.release.set()
        await asyncio.wait_for(stalling.failed.wait(), 10)
    assert [type(e) for e in stalling.failures] == [LeaseLost]
    assert done.run is not None and done.run.status is RunStatus.COMPLETED
    assert executed == [5]
    assert first_text(done.messages[-1]) == "sent it"
    chunks = rec.chunks(admission.run_id)
    takeovers = {c["episode"]: c for c in chunks if c["chunk"]["type"] == "run-takeover"}
    assert resuming not in takeovers  # the resume itself is not a takeover
    [stale_running] = [
        c
        for c in chunks
        if c["episode"] == resuming
        and (c["chunk"]["type"], c["chunk"]["state"]) == ("tool-state", "running")
    ]
    assert takeovers[resuming + 1]["seq"] == stale_running["seq"]
    versions = rec.versions()
    assert versions == sorted(versions)
