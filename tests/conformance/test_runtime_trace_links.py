"""The episode span links to the request that started (or resumed) its run, whichever way a
worker takes the run: here always by its poll, the request's wakeup published before any worker
listened (the trace context stored with the run, migration 0015)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import RunStatus
from runtime.providers.model_api import ModelDelta, ModelRequest
from runtime.providers.scripted import (
    FunctionModel,
    ScriptedModel,
    text_response,
    tool_call_response,
)
from runtime.tools import SuspendStep, ToolContext, tool
from tests import otel
from tests.conformance.conftest_bus import eventually
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, BOB, Runtime, settled


def _links(telemetry: otel.Telemetry, run_id: str) -> list[list[tuple[int, int]]]:
    """Per finished episode span of `run_id`: its links as (trace id, span id)."""
    return [
        [(link.context.trace_id, link.context.span_id) for link in span.links]
        for span in telemetry.spans_where("threadline.episode", run_id=run_id)
    ]


async def _episodes(telemetry: otel.Telemetry, run_id: str, count: int) -> list[Any]:
    await eventually(
        lambda: len(telemetry.spans_where("threadline.episode", run_id=run_id)) >= count
    )
    return _links(telemetry, run_id)


async def test_a_polled_run_links_to_the_request_that_sent_it(
    runtime_for: RuntimeFactory,
) -> None:
    """Breaks with: the worker's `_claim` not passing the polled run's `traceparent`."""
    telemetry = otel.install()
    tracer = telemetry.tracer_provider.get_tracer("test-requests")
    rt = await runtime_for(Agent(model=ScriptedModel([text_response("hi")])), workers=0)
    thread_id = await rt.thread()
    with tracer.start_as_current_span("POST /v1/threads/{thread_id}/messages") as request:
        admission = await rt.service.send_message(ALICE, thread_id, "hello")
    assert admission.run_id is not None
    # The wakeup went out before any worker subscribed: the poll is the only way in.
    await rt.start_worker()
    await rt.wait_for(thread_id, settled)
    context = request.get_span_context()
    assert await _episodes(telemetry, admission.run_id, 1) == [
        [(context.trace_id, context.span_id)]
    ]


async def test_queued_input_links_its_run_to_the_request_that_queued_it(
    runtime_for: RuntimeFactory,
) -> None:
    """The run admitted from queued input (in the previous run's terminal commit, inside its
    episode) links to the request that queued the input, not to that episode.

    Breaks with: `admit_next` passing `instruments.current_traceparent()` instead of the item's."""
    telemetry = otel.install()
    tracer = telemetry.tracer_provider.get_tracer("test-requests")
    model = ScriptedModel([text_response("first"), text_response("second")])
    rt = await runtime_for(Agent(model=model), workers=0)
    thread_id = await rt.thread()
    with tracer.start_as_current_span("first request") as first:
        admitted = await rt.service.send_message(ALICE, thread_id, "one")
    with tracer.start_as_current_span("second request") as second:
        queued = await rt.service.send_message(ALICE, thread_id, "two")
    assert admitted.run_id is not None and queued.queued_item_id is not None
    await rt.start_worker()
    snapshot = await rt.wait_for(
        thread_id, lambda s: settled(s) and s.run is not None and s.run.id != admitted.run_id
    )
    assert snapshot.run is not None
    one, two = first.get_span_context(), second.get_span_context()
    assert await _episodes(telemetry, admitted.run_id, 1) == [[(one.trace_id, one.span_id)]]
    assert await _episodes(telemetry, snapshot.run.id, 1) == [[(two.trace_id, two.span_id)]]
    model.assert_consumed()


class Approval(BaseModel):
    approved: bool


class Transfer(BaseModel):
    amount: int


async def _stop_workers(rt: Runtime) -> None:
    for worker in rt.workers:
        await worker.stop()
    rt.workers.clear()


async def test_a_resumed_run_links_its_next_episode_to_the_resume(
    runtime_for: RuntimeFactory,
) -> None:
    """Breaks with: the resume's UPDATE not setting `traceparent` (the next episode would link
    to the request that sent the message)."""

    @tool(suspend=SuspendStep(Approval))
    async def transfer(args: Transfer, ctx: ToolContext) -> dict[str, object]:
        return {"amount": args.amount}

    telemetry = otel.install()
    tracer = telemetry.tracer_provider.get_tracer("test-requests")
    model = ScriptedModel(
        [tool_call_response("transfer", {"amount": 5}, "t1"), text_response("sent")]
    )
    rt = await runtime_for(Agent(model=model, tools=[transfer]), workers=0)
    thread_id = await rt.thread()
    with tracer.start_as_current_span("send") as send:
        admission = await rt.service.send_message(ALICE, thread_id, "pay 5")
    assert admission.run_id is not None
    await rt.start_worker()
    snapshot = await rt.wait_status(thread_id, RunStatus.WAITING)
    [action] = snapshot.pending_actions
    await _stop_workers(rt)  # the resume's wakeup finds nobody listening
    with tracer.start_as_current_span("resume") as resume:
        await rt.service.resume_action(BOB, thread_id, action.id, {"approved": True})
    await rt.start_worker()
    await rt.wait_status(thread_id, RunStatus.COMPLETED)
    sent, resumed = send.get_span_context(), resume.get_span_context()
    links = await _episodes(telemetry, admission.run_id, 2)
    assert links == [[(sent.trace_id, sent.span_id)], [(resumed.trace_id, resumed.span_id)]]
    model.assert_consumed()


async def test_a_taken_over_run_links_every_episode_to_the_request(
    runtime_for: RuntimeFactory,
) -> None:
    """A worker whose heartbeat froze loses the run; the worker that takes it over (by its
    poll: no wakeup names a takeover) links its episode to the request too.

    Breaks with: the worker's `_claim` not passing the polled run's `traceparent` (SQLite; on
    Postgres the lease request reads it with the start as well)."""
    from runtime.engine.worker import Worker
    from tests.conformance.test_runtime_takeover import FrozenHeartbeat

    telemetry = otel.install()
    tracer = telemetry.tracer_provider.get_tracer("test-requests")
    release, started = asyncio.Event(), asyncio.Event()

    async def model(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        if not started.is_set():
            started.set()
            await asyncio.wait_for(release.wait(), 20)
        yield text_response("answer")[0]

    agent = Agent(model=FunctionModel(model))
    rt = await runtime_for(agent, workers=0, lease_ttl=0.6)
    stale = Worker(FrozenHeartbeat(rt.store), rt.bus, agent, lease_ttl=0.6, poll_interval=0.05)
    await stale.start()
    rt.workers.append(stale)
    thread_id = await rt.thread()
    with tracer.start_as_current_span("send") as send:
        admission = await rt.service.send_message(ALICE, thread_id, "hello")
    assert admission.run_id is not None
    await asyncio.wait_for(started.wait(), 10)
    await rt.start_worker()
    await rt.wait_for(thread_id, settled, timeout=15)
    release.set()
    run = await rt.store.get_run(admission.run_id)
    assert run.episode >= 2  # taken over at least once
    context = send.get_span_context()
    links = await _episodes(telemetry, admission.run_id, run.episode)
    assert links == [[(context.trace_id, context.span_id)]] * run.episode
