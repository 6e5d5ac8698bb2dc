"""Telemetry observes runs without changing them, even when an exporter fails."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import RunStatus
from runtime.providers.scripted import ScriptedModel, text_response, tool_call_response
from runtime.tools import tool
from tests import otel
from tests.conformance.runtime_harness import ALICE


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


async def test_runs_models_and_tools_are_traced_and_counted(runtime_for) -> None:
    telemetry = otel.install()
    telemetry.spans.clear()
    model = ScriptedModel(
        [tool_call_response("explode", {"x": 1}, "e1"), text_response("sorry", usage=(7, 3))]
    )
    rt = await runtime_for(Agent(model=model, tools=[explode]))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "go")
    await rt.wait_status(thread_id, RunStatus.COMPLETED)
    names = telemetry.span_names()
    assert {"threadline.episode", "threadline.model_call", "threadline.tool_call"} <= set(names)
    runs = telemetry.counter_points("threadline.runs")
    assert any(attrs.get("event") == "completed" for attrs, _ in runs)
    assert any(attrs.get("event") == "started" for attrs, _ in runs)
    tokens = dict(
        (attrs["kind"], value) for attrs, value in telemetry.counter_points("threadline.tokens")
    )
    assert tokens["input"] >= 7 and tokens["output"] >= 3
    errors = telemetry.counter_points("threadline.tool_call.errors")
    assert any(attrs.get("tool") == "explode" for attrs, _ in errors)
    assert telemetry.counter_points("threadline.realtime.published")


async def test_a_failing_exporter_never_changes_a_run(runtime_for) -> None:
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
    assert snapshot.messages[-1].parts[0].text == "still fine"
