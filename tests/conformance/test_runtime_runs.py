"""Runtime end to end on each store: streaming, tools in parallel, queueing, failures."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import InputPolicy, RunStatus, TextPart, ToolCallPart, ToolState
from runtime.errors import RunActive
from runtime.lifecycle import AgentLifecycle
from runtime.providers.model_api import ProviderError
from runtime.providers.scripted import (
    FunctionModel,
    ScriptedModel,
    ScriptedToolCall,
    fail_mid_stream,
    text_response,
    tool_calls_response,
)
from runtime.tools import tool
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, BOB, SCOPE, settled


async def test_text_run_streams_gap_free_chunks_and_commits(runtime_for: RuntimeFactory) -> None:
    model = ScriptedModel([text_response("Hello there, friend!", chunks=4)])
    rt = await runtime_for(Agent(model=model))
    thread_id = await rt.thread()
    async with rt.record(thread_id) as rec:
        admission = await rt.service.send_message(ALICE, thread_id, "hi")
        snapshot = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert admission.run_id == snapshot.run.id
    chunks = rec.chunks(admission.run_id)
    assert [c["seq"] for c in chunks] == list(range(len(chunks)))
    assert rec.text(admission.run_id) == "Hello there, friend!"
    assert len([c for c in chunks if c["chunk"]["type"] == "text-delta"]) == 4
    assert [m.role for m in snapshot.messages] == ["user", "assistant"]
    assert snapshot.messages[1].parts == (TextPart(text="Hello there, friend!"),)
    versions = rec.versions()
    assert versions == sorted(versions) and versions[-1] == snapshot.thread.version
    assert snapshot.run.next_seq == len(chunks)
    model.assert_consumed()


async def test_ready_tools_run_in_parallel_and_keep_model_order(
    runtime_for: RuntimeFactory,
) -> None:
    started: dict[str, asyncio.Event] = {"a": asyncio.Event(), "b": asyncio.Event()}

    class Args(BaseModel):
        name: str
        other: str

    @tool
    async def rendezvous(args: Args) -> str:
        # Each call waits for the other to start: only parallel execution can finish.
        started[args.name].set()
        await asyncio.wait_for(started[args.other].wait(), 5)
        return f"done {args.name}"

    model = ScriptedModel(
        [
            tool_calls_response(
                ScriptedToolCall("rendezvous", {"name": "a", "other": "b"}, "c1"),
                ScriptedToolCall("rendezvous", {"name": "b", "other": "a"}, "c2"),
            ),
            text_response("both done"),
        ]
    )
    rt = await runtime_for(Agent(model=model, tools=[rendezvous]))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "go")
    snapshot = await rt.wait_status(thread_id, RunStatus.COMPLETED, RunStatus.FAILED)
    assert snapshot.run.status is RunStatus.COMPLETED, snapshot.run.error
    calls = [p for p in snapshot.messages[1].parts if isinstance(p, ToolCallPart)]
    assert [(c.tool_call_id, c.state, c.output) for c in calls] == [
        ("c1", ToolState.OUTPUT_AVAILABLE, "done a"),
        ("c2", ToolState.OUTPUT_AVAILABLE, "done b"),
    ]
    # The next model step saw both results.
    last = model.calls[-1].messages[-1]
    assert [p.output for p in last.parts if isinstance(p, ToolCallPart)] == ["done a", "done b"]
    model.assert_consumed()


async def test_input_during_a_run_is_queued_and_admitted_in_order(
    runtime_for: RuntimeFactory,
) -> None:
    release = asyncio.Event()

    async def slow(request):  # type: ignore[no-untyped-def]
        text = request.messages[-1].parts[0].text
        if text == "first":
            await asyncio.wait_for(release.wait(), 10)
        yield text_response(f"echo {text}")[0]

    rt = await runtime_for(Agent(model=FunctionModel(slow)))
    thread_id = await rt.thread()
    first = await rt.service.send_message(ALICE, thread_id, "first")
    await rt.wait_status(thread_id, RunStatus.RUNNING)
    second = await rt.service.send_message(BOB, thread_id, "second")
    third = await rt.service.send_message(ALICE, thread_id, "third")
    assert first.run_id and second.queued_item_id and third.queued_item_id
    queued = await rt.store.snapshot(thread_id, [SCOPE])
    assert [q.text for q in queued.queue] == ["second", "third"]
    with pytest.raises(RunActive):
        await rt.service.send_message(ALICE, thread_id, "nope", policy=InputPolicy.REJECT)
    release.set()
    snapshot = await rt.wait_for(thread_id, settled)
    texts = [m.parts[0].text for m in snapshot.messages]
    assert texts == ["first", "echo first", "second", "echo second", "third", "echo third"]


async def test_admitted_input_runs_without_waiting_for_a_poll(
    runtime_for: RuntimeFactory, monkeypatch
) -> None:
    """The terminal commit that admits queued input wakes the worker at once; a run that
    admitted nothing leaves the worker waiting for the next wakeup (no poll of its own)."""
    release = asyncio.Event()

    async def slow(request):  # type: ignore[no-untyped-def]
        text = request.messages[-1].parts[0].text
        if text == "first":
            await asyncio.wait_for(release.wait(), 10)
        yield text_response(f"echo {text}")[0]

    rt = await runtime_for(Agent(model=FunctionModel(slow)), workers=0)
    await rt.start_worker(poll_interval=60.0)
    polls = [0]
    find = rt.store.find_runnable_runs

    async def counting(limit: int = 10):  # type: ignore[no-untyped-def]
        polls[0] += 1
        return await find(limit)

    monkeypatch.setattr(rt.store, "find_runnable_runs", counting)
    thread_id = await rt.thread()
    await asyncio.sleep(0.1)  # the worker's first poll, as it starts
    polls[0] = 0
    await rt.service.send_message(ALICE, thread_id, "first")
    await rt.wait_status(thread_id, RunStatus.RUNNING)
    await rt.service.send_message(ALICE, thread_id, "second")  # queued: no wakeup
    release.set()
    snapshot = await asyncio.wait_for(rt.wait_for(thread_id, settled), 5)
    texts = [m.parts[0].text for m in snapshot.messages]
    assert texts == ["first", "echo first", "second", "echo second"]
    # The admission's wakeup names its run: taken by id, without a poll. The admitting
    # commit's names none: one poll. None after the last run.
    await asyncio.sleep(0.05)
    assert polls[0] == 1


async def test_a_named_wakeup_without_a_free_slot_waits_for_the_poll(
    runtime_for: RuntimeFactory, monkeypatch
) -> None:
    """A wakeup names its run, but the worker's one slot is taken: the run is not leased by
    id (it would jump the poll's fair order); it runs once the slot frees, after a poll."""
    release = asyncio.Event()

    async def slow(request):  # type: ignore[no-untyped-def]
        text = request.messages[-1].parts[0].text
        if text == "first":
            await asyncio.wait_for(release.wait(), 10)
        yield text_response(f"echo {text}")[0]

    rt = await runtime_for(Agent(model=FunctionModel(slow)), workers=0)
    await rt.start_worker(poll_interval=60.0, max_concurrent_runs=1)
    leased: list[str] = []
    start_run = rt.store.start_run  # the worker's lease request

    async def recording(run_id: str, owner: str, ttl: float, **kwargs):  # type: ignore[no-untyped-def]
        leased.append(run_id)
        return await start_run(run_id, owner, ttl, **kwargs)

    monkeypatch.setattr(rt.store, "start_run", recording)
    first, second = await rt.thread(), await rt.thread()
    await asyncio.sleep(0.1)  # the worker's first poll, as it starts
    one = await rt.service.send_message(ALICE, first, "first")
    await rt.wait_status(first, RunStatus.RUNNING)
    two = await rt.service.send_message(ALICE, second, "second")
    await asyncio.sleep(0.1)
    assert leased == [one.run_id]  # no lease asked for the second run while the slot is busy
    release.set()
    snapshot = await asyncio.wait_for(rt.wait_for(second, settled), 5)
    assert [m.parts[0].text for m in snapshot.messages] == ["second", "echo second"]
    assert leased == [one.run_id, two.run_id]


async def test_interrupt_policy_stops_the_active_run_first(runtime_for: RuntimeFactory) -> None:
    async def endless(request):  # type: ignore[no-untyped-def]
        text = request.messages[-1].parts[0].text
        if text == "long":
            for i in range(1000):
                yield text_response(f"w{i} ")[0]
                await asyncio.sleep(0.01)
        else:
            yield text_response("short answer")[0]

    rt = await runtime_for(Agent(model=FunctionModel(endless)))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "long")
    await rt.wait_for(thread_id, lambda s: s.run is not None and s.run.status is RunStatus.RUNNING)
    await asyncio.sleep(0.1)
    admission = await rt.service.send_message(ALICE, thread_id, "now", policy=InputPolicy.INTERRUPT)
    assert admission.interrupted_run_id
    snapshot = await rt.wait_for(thread_id, settled)
    assert snapshot.messages[-1].parts[0].text == "short answer"
    first_run = await rt.store.get_run(admission.interrupted_run_id)
    assert first_run.status is RunStatus.CANCELLED


async def test_a_thrown_hook_error_fails_the_run_visibly(runtime_for: RuntimeFactory) -> None:
    class Boom(AgentLifecycle):
        async def after_step(self, ctx, result):  # type: ignore[no-untyped-def]
            raise RuntimeError("after_step exploded")

    model = ScriptedModel([text_response("partial answer")])
    rt = await runtime_for(Agent(model=model, lifecycle=Boom()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "hi")
    snapshot = await rt.wait_status(thread_id, RunStatus.FAILED)
    assert "after_step exploded" in (snapshot.run.error or "")
    # Canonical output committed before the failure stays.
    assert snapshot.messages[-1].parts[0].text == "partial answer"


async def test_a_provider_failure_mid_stream_fails_the_run_keeping_canonical_text(
    runtime_for: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [fail_mid_stream(text_response("half of it", chunks=2)[:2], ProviderError("socket"))]
    )
    rt = await runtime_for(Agent(model=model))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "hi")
    snapshot = await rt.wait_status(thread_id, RunStatus.FAILED)
    assert "socket" in (snapshot.run.error or "")
    assert snapshot.messages[-1].parts[0].text == "half of it"


async def test_idempotent_client_request_id(runtime_for: RuntimeFactory) -> None:
    rt = await runtime_for(Agent(model=ScriptedModel([text_response("once")])))
    thread_id = await rt.thread()
    first = await rt.service.send_message(ALICE, thread_id, "x", client_request_id="req-1")
    again = await rt.service.send_message(ALICE, thread_id, "x", client_request_id="req-1")
    assert again.duplicate and again.run_id == first.run_id
    assert again.message_id == first.message_id
    snapshot = await rt.wait_for(thread_id, settled)
    assert len(snapshot.messages) == 2


async def test_a_stop_while_the_lease_request_is_in_flight_is_obeyed(
    runtime_for: RuntimeFactory, monkeypatch
) -> None:
    """A stop that commits after the worker's lease request went through but before its reply
    came back: on Postgres that request started the episode (`Store.start_run`), so no read of
    the episode sees the stop; the stop signal the worker got meanwhile must stop it."""
    rt = await runtime_for(Agent(model=ScriptedModel([text_response("never sent")])), workers=0)
    await rt.start_worker(poll_interval=60.0)
    real = rt.store.start_run
    replied = asyncio.Event()
    stopped = asyncio.Event()

    async def slow_reply(run_id: str, owner: str, ttl: float, **kwargs):  # type: ignore[no-untyped-def]
        start = await real(run_id, owner, ttl, **kwargs)
        replied.set()
        await asyncio.wait_for(stopped.wait(), 10)  # the stop commits while the reply travels
        await asyncio.sleep(0.1)  # and its signal reaches the worker first
        return start

    monkeypatch.setattr(rt.store, "start_run", slow_reply)
    thread_id = await rt.thread()
    admission = await rt.service.send_message(ALICE, thread_id, "hi")
    assert admission.run_id is not None
    await asyncio.wait_for(replied.wait(), 5)
    await rt.service.stop_run(ALICE, thread_id, admission.run_id)
    stopped.set()
    snapshot = await rt.wait_status(thread_id, RunStatus.CANCELLED, RunStatus.COMPLETED)
    # Cancelled (what the episode streamed before the stop reached it is kept, as for any
    # stop), not completed.
    assert snapshot.run is not None and snapshot.run.status is RunStatus.CANCELLED
