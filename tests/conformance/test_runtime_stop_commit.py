"""A stop that lands while a step's or the run's commit is in flight: nothing duplicated, nothing
failed, watchers get the final invalidation."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import Lease, MessageRole, RunStatus, Snapshot, TextPart, ToolCallPart
from runtime.engine.worker import Worker
from runtime.lifecycle import AfterStepDecision, AgentLifecycle, StepContext, StepResult
from runtime.providers.scripted import (
    FunctionModel,
    ScriptedModel,
    text_response,
    tool_call_response,
)
from runtime.storage import SqliteStore, SqlStore
from runtime.storage.store import CommitResult, StepCommit
from runtime.tools import tool
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, Recorder, Runtime, settled


class GatedCommits:
    """A store whose first commit matching `match` pauses until `release` is set: `before` the
    real transaction (the commit is in flight) or `after` it (COMMIT done, the caller does not
    know yet). A stop delivered meanwhile cancels the episode exactly mid-commit."""

    def __init__(self, store: Any, match: Callable[[StepCommit], bool], where: str) -> None:
        self._store = store
        self._match = match
        self._where = where
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self._gated = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def commit(self, lease: Lease, commit: StepCommit) -> CommitResult:
        if self._gated or not self._match(commit):
            return await self._store.commit(lease, commit)
        self._gated = True
        if self._where == "before":
            self.entered.set()
            await self.release.wait()
            return await self._store.commit(lease, commit)
        result = await self._store.commit(lease, commit)
        self.entered.set()
        await self.release.wait()
        return result


def _appends_answer(commit: StepCommit) -> bool:
    return commit.run is None and any(m.role is MessageRole.ASSISTANT for m in commit.append)


def _completes(commit: StepCommit) -> bool:
    return commit.run is not None and commit.run.status is RunStatus.COMPLETED


def _completes_alone(commit: StepCommit) -> bool:
    return _completes(commit) and not commit.append


def _answers_and_completes(commit: StepCommit) -> bool:
    return _completes(commit) and any(m.role is MessageRole.ASSISTANT for m in commit.append)


class ObservesSteps(AgentLifecycle):
    """An after_step hook: the step commit and the run transition are then two commits (the hook
    runs between them); without one, the last step's commit carries the transition."""

    async def after_step(self, ctx: StepContext, result: StepResult) -> AfterStepDecision | None:
        return None


# gate: (the commit it pauses, the run's status after a stop during it, an after_step hook?)
GATES = {
    "step": (_appends_answer, RunStatus.CANCELLED, True),
    "transition": (_completes_alone, None, True),
    "step-and-transition": (_answers_and_completes, None, False),
}


def _assistant_messages(snapshot: Snapshot, run_id: str) -> list[Any]:
    return [m for m in snapshot.messages if m.role is MessageRole.ASSISTANT and m.run_id == run_id]


def _assert_converged(snapshot: Snapshot, rec: Recorder, run_id: str) -> None:
    """next_seq accounts for every chunk of the run; the last invalidation is the final version."""
    assert snapshot.run is not None
    seqs = [c["seq"] for c in rec.chunks(run_id)]
    assert seqs == list(range(len(seqs)))
    assert snapshot.run.next_seq == len(seqs)
    versions = rec.versions()
    assert versions == sorted(versions)
    assert versions and versions[-1] == snapshot.thread.version


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("gate", sorted(GATES))
async def test_stop_during_a_commit_neither_duplicates_nor_fails(
    runtime_for: RuntimeFactory, gate: str, where: str
) -> None:
    match, stopped_status, observed = GATES[gate]
    model = ScriptedModel([text_response("the whole answer", chunks=3)])
    agent = Agent(model=model, lifecycle=ObservesSteps() if observed else AgentLifecycle())
    rt: Runtime = await runtime_for(agent, workers=0)
    gated = GatedCommits(rt.store, match, where)
    worker = Worker(gated, rt.bus, agent, lease_ttl=5.0, poll_interval=0.05)
    await worker.start()
    rt.workers.append(worker)
    thread_id = await rt.thread()
    try:
        async with rt.record(thread_id) as rec:
            admission = await rt.service.send_message(ALICE, thread_id, "hi")
            assert admission.run_id is not None
            await asyncio.wait_for(gated.entered.wait(), 10)
            episode = worker.episodes[admission.run_id]
            stop = await rt.service.stop_run(ALICE, thread_id, admission.run_id)
            if stop.status.is_terminal:
                # COMMIT of the completion went through already (gate `after`), so this request
                # found the run ended; a stop requested a moment earlier would still reach the
                # episode now, the way its control message does.
                episode.stop_requested.set()
            await asyncio.wait_for(episode.stop_requested.wait(), 5)
            # The stop is taken up and the step cancelled within a few loop iterations; no I/O
            # is involved, so this many turns deliver the cancellation into the pending commit.
            for _ in range(50):
                await asyncio.sleep(0)
            await asyncio.sleep(0.02)
            gated.release.set()
            snapshot = await rt.wait_for(thread_id, settled)
            for _ in range(200):  # the episode has finished publishing once it is unregistered
                if admission.run_id not in worker.episodes:
                    break
                await asyncio.sleep(0.01)
    finally:
        gated.release.set()
    assert admission.run_id not in worker.episodes
    assert snapshot.run is not None
    # The step commit could not be torn: a stop during it ends the run cancelled after it; a
    # run transition in flight wins (the run had already finished), also when the step's
    # commit carries it.
    expected = stopped_status or RunStatus.COMPLETED
    assert snapshot.run.status is expected, snapshot.run.error
    assert episode.outcome is expected
    answers = _assistant_messages(snapshot, admission.run_id)
    assert [m.parts for m in answers] == [(TextPart(text="the whole answer"),)]
    _assert_converged(snapshot, rec, admission.run_id)
    model.assert_consumed()


class Note(BaseModel):
    text: str


@tool
async def note(args: Note) -> str:
    return f"noted {args.text}"


async def _two_steps(request: Any) -> Any:
    """A tool step, then a text step once the tool's result is in the context."""
    last = request.messages[-1]
    if last.role is MessageRole.ASSISTANT:
        for delta in text_response("done with it", chunks=3):
            yield delta
    else:
        for delta in tool_call_response("note", {"text": "x"}, f"c{uuid.uuid4().hex[:12]}"):
            yield delta


async def test_send_then_stop_never_duplicates_a_step_nor_fails_the_run(
    runtime_for: RuntimeFactory, sql_store: SqlStore
) -> None:
    iterations = 100 if isinstance(sql_store, SqliteStore) else 30
    rng = random.Random(16)
    rt: Runtime = await runtime_for(Agent(model=FunctionModel(_two_steps), tools=[note]))
    thread_id = await rt.thread()
    run_ids: list[str] = []
    statuses: dict[RunStatus, int] = {}
    violations: list[str] = []
    async with rt.record(thread_id) as rec:
        # One run without a stop measures how long a run takes here; the stops then land
        # anywhere from before the worker claims the run to after it completed.
        started = asyncio.get_running_loop().time()
        await rt.service.send_message(ALICE, thread_id, "warm up")
        await rt.wait_for(thread_id, settled)
        duration = asyncio.get_running_loop().time() - started
        for _ in range(iterations):
            admission = await rt.service.send_message(ALICE, thread_id, "go")
            assert admission.run_id is not None
            run_ids.append(admission.run_id)
            await asyncio.sleep(rng.uniform(0, 1.5 * duration))
            await rt.service.stop_run(ALICE, thread_id, admission.run_id)
            await rt.wait_for(thread_id, settled)
        snapshot = await rt.wait_for(thread_id, settled)
    for run_id in run_ids:
        run = await rt.store.get_run(run_id)
        statuses[run.status] = statuses.get(run.status, 0) + 1
        if run.status not in (RunStatus.CANCELLED, RunStatus.COMPLETED):
            violations.append(f"{run_id} ended {run.status}: {run.error}")
        answers = _assistant_messages(snapshot, run_id)
        # Step 0 holds the tool call, step 1 the text; a duplicated step repeats one of them.
        kinds = [any(isinstance(p, ToolCallPart) for p in m.parts) for m in answers]
        if kinds not in ([], [True], [True, False]):
            violations.append(f"{run_id} has assistant messages {[m.parts for m in answers]}")
        seqs = [c["seq"] for c in rec.chunks(run_id)]
        if seqs != list(range(len(seqs))) or run.next_seq != len(seqs):
            violations.append(f"{run_id}: next_seq {run.next_seq}, chunk seqs {seqs}")
    versions = rec.versions()
    if versions != sorted(versions) or versions[-1] != snapshot.thread.version:
        violations.append(f"invalidations {versions[-5:]} vs version {snapshot.thread.version}")
    print(
        f"send-then-stop: {iterations} iterations (a run takes {duration:.3f} s), outcomes "
        f"{ {s.value: n for s, n in statuses.items()} }, invariant violations {len(violations)}"
    )
    assert violations == []
