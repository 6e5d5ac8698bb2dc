"""Telemetry observes runs without changing them, even when an exporter fails."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import RunStatus, Visibility
from runtime.lifecycle import (
    AgentLifecycle,
    PrepareRunDecision,
    RewriteContext,
    RewriteOutcome,
    RunContext,
    StepContext,
)
from runtime.providers.model_api import FinishDelta, ModelDelta, ModelRequest, TextDelta
from runtime.providers.scripted import (
    FunctionModel,
    ScriptedModel,
    text_response,
    tool_call_response,
)
from runtime.tools import tool
from tests import otel
from tests.conformance.conftest_bus import eventually
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, first_text, settled
from threadline_wire.chunks import StreamChunk


class BrokenExporter(SpanExporter):
    """Fails every export while `broken`; global providers outlive a test, so it is switched
    off afterwards instead of removed."""

    broken = True

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.broken:
            raise ConnectionError("collector unreachable")
        return SpanExportResult.SUCCESS


class Args(BaseModel):
    x: int


@tool
async def explode(args: Args) -> int:
    raise ValueError("tool broke")


async def test_runs_models_and_tools_are_traced_and_counted(runtime_for: RuntimeFactory) -> None:
    """Spans of this run with their attributes, and counter deltas of this test only (the
    MeterProvider is process-global: the other store parametrisation counted before)."""
    telemetry = otel.install()
    mark = telemetry.mark(
        "threadline.runs",
        "threadline.tokens",
        "threadline.tool_call.errors",
        "threadline.realtime.published",
        "gen_ai.client.token.usage",
    )
    model = ScriptedModel(
        [tool_call_response("explode", {"x": 1}, "e1"), text_response("sorry", usage=(7, 3))],
        name="scripted-7b",
    )
    rt = await runtime_for(Agent(model=model, tools=[explode]))
    thread_id = await rt.thread()
    admission = await rt.service.send_message(ALICE, thread_id, "go")
    await rt.wait_status(thread_id, RunStatus.COMPLETED)
    run_id = admission.run_id
    # The episode's span ends just after its last commit, which a client may see first.
    await eventually(lambda: bool(telemetry.spans_where("threadline.episode", run_id=run_id)))
    [episode] = telemetry.spans_where("threadline.episode", run_id=run_id)
    assert episode.attributes["threadline.run.outcome"] == "completed"
    assert episode.status.status_code is StatusCode.UNSET
    calls = telemetry.spans_where("chat scripted-7b", **{"threadline.run_id": run_id})
    assert [span.attributes["threadline.step"] for span in calls] == [0, 1]
    last = calls[1].attributes
    assert last["gen_ai.request.model"] == "scripted-7b"
    assert last["gen_ai.operation.name"] == "chat"
    assert last["gen_ai.provider.name"] == "threadline"  # a scripted model has no provider
    assert calls[1].kind is SpanKind.CLIENT
    assert (last["gen_ai.usage.input_tokens"], last["gen_ai.usage.output_tokens"]) == (7, 3)
    assert tuple(last["gen_ai.response.finish_reasons"]) == ("stop",)
    assert tuple(calls[0].attributes["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    [tool] = [
        span
        for span in telemetry.spans_where("execute_tool explode", **{"gen_ai.tool.call.id": "e1"})
        if span.context.trace_id == episode.context.trace_id
    ]
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.parent is not None and tool.parent.span_id == episode.context.span_id
    assert mark.delta("threadline.runs", event="started") == 1
    assert mark.delta("threadline.runs", event="completed") == 1
    model_attr = {"gen_ai.request.model": "scripted-7b"}
    assert mark.delta("threadline.tokens", kind="input", **model_attr) == 1 + 7
    assert mark.delta("threadline.tokens", kind="output", **model_attr) == 1 + 3
    usage = {"gen_ai.token.type": "input", **model_attr}
    assert mark.delta("gen_ai.client.token.usage", **usage) == 1 + 7
    assert mark.delta("threadline.tool_call.errors", tool="explode") == 1
    assert mark.delta("threadline.realtime.published") > 0


async def test_the_model_call_span_measures_only_the_provider(runtime_for: RuntimeFactory) -> None:
    """The step transforms and publishes between the provider's deltas; that time is not the
    model's. The awaited intervals and the transform's are disjoint parts of the call's wall
    time, so the span's duration plus the transform's time fits in it (plus clock slack).

    Breaks with: ModelCallTrace.end calling `self.span.end()` (the span ends when the provider
    stream is closed, the transform's time included)."""
    telemetry = otel.install()
    provider_pause, transform_pause = 0.02, 0.15
    transformed: list[float] = []

    async def model(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        for piece in ("one ", "two ", "three"):
            await asyncio.sleep(provider_pause)
            yield TextDelta(text=piece)
        yield FinishDelta(reason="stop")

    class SlowTransform(AgentLifecycle):
        async def transform_step_stream(
            self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
        ) -> AsyncIterator[StreamChunk]:
            async for chunk in stream:
                started = time.perf_counter()
                await asyncio.sleep(transform_pause)
                transformed.append(time.perf_counter() - started)
                yield chunk

    agent = Agent(model=FunctionModel(model, name="slow-7b"), lifecycle=SlowTransform())
    rt = await runtime_for(agent)
    thread_id = await rt.thread()
    admission = await rt.service.send_message(ALICE, thread_id, "go")
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert first_text(done.messages[-1]) == "one two three"
    by_run = {"threadline.run_id": admission.run_id}
    [span] = telemetry.spans_where("chat slow-7b", **by_run)
    duration = (span.end_time - span.start_time) / 1e9
    attributes = span.attributes
    assert duration == pytest.approx(attributes["threadline.model_call.wait_s"], abs=1e-6)
    assert duration >= 3 * provider_pause * 0.9
    # Three deltas transformed inside the call (step-start/finish are not in the model stream).
    assert len(transformed) >= 3
    assert duration + sum(transformed[:3]) <= attributes["threadline.model_call.elapsed_s"] + 1e-3
    assert tuple(attributes["gen_ai.response.finish_reasons"]) == ("stop",)


async def test_a_failed_run_sets_an_error_status_on_its_episode_span(
    runtime_for: RuntimeFactory,
) -> None:
    """The episode span records the run's failure, although the episode handles it.

    Breaks with: Episode.run skipping `telemetry.fail_span(span, self.failure)`."""
    telemetry = otel.install()

    class Broken(AgentLifecycle):
        async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
            raise RuntimeError("guardrail crashed")

    rt = await runtime_for(Agent(model=ScriptedModel([]), lifecycle=Broken()))
    thread_id = await rt.thread()
    admission = await rt.service.send_message(ALICE, thread_id, "go")
    await rt.wait_status(thread_id, RunStatus.FAILED)
    [episode] = await _eventually(
        lambda: telemetry.spans_where("threadline.episode", run_id=admission.run_id)
    )
    assert episode.status.status_code is StatusCode.ERROR
    assert episode.status.description == "guardrail crashed"
    assert episode.attributes["threadline.run.outcome"] == "failed"


async def test_a_takeover_is_not_counted_as_a_run_start(runtime_for: RuntimeFactory) -> None:
    """A takeover continues a started run: `event=takeover`, not a second `started`.

    Breaks with: `episode.start_kind` returning "started" for a running run."""
    from runtime.engine.worker import Worker
    from tests.conformance.test_runtime_takeover import FrozenHeartbeat

    telemetry = otel.install()
    mark = telemetry.mark("threadline.runs")
    release = asyncio.Event()
    started = asyncio.Event()

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
    await rt.service.send_message(ALICE, thread_id, "hello")
    await asyncio.wait_for(started.wait(), 10)
    await rt.start_worker()
    done = await rt.wait_for(thread_id, settled, timeout=15)
    release.set()
    # The counter follows the commit only once the store call returns (on Postgres the pool
    # resets the connection after COMMIT first): the snapshot can show the end before that.
    await _eventually(lambda: mark.delta("threadline.runs", event="completed") == 1 or None)
    assert done.run is not None
    run = await rt.store.get_run(done.run.id)
    assert mark.delta("threadline.runs", event="started") == 1
    # Under load an episode may lose its 0.6 s lease by its own clock and be taken over once
    # more: every episode after the first is a takeover, none is a start.
    assert run.episode >= 2
    assert mark.delta("threadline.runs", event="takeover") == run.episode - 1
    assert mark.delta("threadline.runs", event="completed") == 1


async def test_history_rewritten_failures_are_recorded_with_the_rewrite_id(
    runtime_for: RuntimeFactory,
) -> None:
    """A failing history_rewritten observer: an event on the rewrite span and a counter, with
    the rewrite's id; the rewrite stays committed.

    Breaks with: rewrites.rewrite putting `"threadline.rewrite.id": kind` on the event."""
    telemetry = otel.install()
    mark = telemetry.mark("threadline.history_rewritten.failures")

    class Webhook:
        async def history_rewritten(self, ctx: RewriteContext, outcome: RewriteOutcome) -> None:
            raise ConnectionError("webhook down")

    model = ScriptedModel([text_response("x")])
    rt = await runtime_for(Agent(model=model, lifecycle=Webhook()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "go")
    done = await rt.wait_for(thread_id, settled)
    result = await rt.service.set_visibility(
        ALICE, thread_id, done.messages[1].id, Visibility.HIDDEN
    )
    rewrite_id = f"{thread_id}@{result.version}"
    by_id = {"threadline.rewrite.id": rewrite_id}
    [span] = telemetry.spans_where("threadline.history_rewrite", **by_id)
    [event] = [e for e in span.events if e.name == "history_rewritten.failed"]
    assert event.attributes["threadline.rewrite.id"] == rewrite_id
    assert tuple(event.attributes["error.type"]) == ("ConnectionError",)
    kind = {"threadline.rewrite.kind": "visibility"}
    assert mark.delta("threadline.history_rewritten.failures", **kind) == 1


T = TypeVar("T")


async def _eventually(read: Callable[[], T], timeout: float = 5.0) -> T:
    """The episode span ends just after the run's last commit: poll briefly for it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = read()
        if found or asyncio.get_running_loop().time() > deadline:
            return found
        await asyncio.sleep(0.02)


async def test_a_failing_exporter_never_changes_a_run(runtime_for: RuntimeFactory) -> None:
    telemetry = otel.install()
    exporter = BrokenExporter()
    telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        model = ScriptedModel([text_response("still fine")])
        rt = await runtime_for(Agent(model=model))
        thread_id = await rt.thread()
        await rt.service.send_message(ALICE, thread_id, "go")
        snapshot = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    finally:
        exporter.broken = False
    assert first_text(snapshot.messages[-1]) == "still fine"
