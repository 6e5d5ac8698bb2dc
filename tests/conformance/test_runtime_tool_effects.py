"""Tools and side effects: a tool is committed `running` before it executes; a takeover re-runs
it only if it declares itself idempotent, else it ends with a model-visible interrupted error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import RunStatus, ToolCallPart, ToolState
from runtime.engine.toolcalls import INTERRUPTED
from runtime.lifecycle import AgentLifecycle, ToolCallContext, ToolResult
from runtime.providers.scripted import ScriptedModel, text_response, tool_call_response
from runtime.tools import ToolContext, tool
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, Runtime, settled


class Args(BaseModel):
    to: str


class SeesResults(AgentLifecycle):
    def __init__(self) -> None:
        self.results: list[ToolResult] = []

    async def after_tool_result(
        self, ctx: ToolCallContext, result: ToolResult
    ) -> ToolResult | None:
        self.results.append(result)
        return None


@pytest.mark.parametrize("idempotent", [False, True])
async def test_takeover_of_a_started_tool(runtime_for: RuntimeFactory, idempotent: bool) -> None:
    keys: list[str] = []
    first_run_may_end = asyncio.Event()
    effect_started = asyncio.Event()

    async def effect(args: Args, ctx: ToolContext) -> dict[str, Any]:
        keys.append(ctx.idempotency_key)
        effect_started.set()
        if len(keys) == 1:
            await first_run_may_end.wait()  # the worker "dies" here, the effect happened
        return {"sent": args.to}

    send = tool(name="send", idempotent=idempotent)(effect)
    model = ScriptedModel(
        [tool_call_response("send", {"to": "bob"}, id="call-1"), text_response("noted")]
    )
    lifecycle = SeesResults()
    agent = Agent(model=model, tools=[send], lifecycle=lifecycle)
    rt: Runtime = await runtime_for(agent, workers=1, lease_ttl=0.6)
    thread_id = await rt.thread()
    recording = rt.record(thread_id)
    rec = await recording.__aenter__()
    admission = await rt.service.send_message(ALICE, thread_id, "go")

    def started(snapshot: Any) -> bool:
        return any(
            isinstance(p, ToolCallPart) and p.state is ToolState.RUNNING
            for m in snapshot.messages
            for p in m.parts
        )

    # Committed `running` before the tool executes (the snapshot may show it a moment before
    # the worker's task gets to run the tool: wait for the effect, do not assume it).
    await rt.wait_for(thread_id, started)
    await asyncio.wait_for(effect_started.wait(), 10)
    assert len(keys) == 1
    await rt.workers[0].stop()  # abandons the episode without writing, like a crash
    await rt.start_worker()
    final = await rt.wait_for(thread_id, settled, timeout=15)
    first_run_may_end.set()
    await recording.__aexit__(None, None, None)
    # The takeover announced itself although it resumed the run (not a redo of a step).
    kinds = [c["chunk"]["type"] for c in rec.chunks(admission.run_id)]
    assert kinds.count("run-takeover") == 1
    assert final.run is not None and final.run.status is RunStatus.COMPLETED
    part = next(p for m in final.messages for p in m.parts if isinstance(p, ToolCallPart))
    if idempotent:
        assert part.state is ToolState.OUTPUT_AVAILABLE and part.output == {"sent": "bob"}
        assert len(keys) == 2 and keys[0] == keys[1]  # the same key on the re-run
    else:
        assert part.state is ToolState.OUTPUT_ERROR and part.error == INTERRUPTED
        assert len(keys) == 1
        assert [r.error for r in lifecycle.results] == [INTERRUPTED]
    # The model's next step saw the tool's final result.
    assert final.messages[-1].parts[-1].text == "noted"  # type: ignore[union-attr]
    seen = model.calls[-1].messages[-1].parts
    assert any(isinstance(p, ToolCallPart) and p.state.is_final for p in seen)
