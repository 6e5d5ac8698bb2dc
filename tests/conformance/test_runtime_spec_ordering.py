"""One test per Ordering rule of spec/lifecycle-phases.txt (and the one short-circuit rule of
the decision phases), named after it, run through the runtime with composed lifecycles.

Each docstring names a one-line change to the runtime that makes the test fail (each was tried
once)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel, field_validator

from runtime.agent import Agent
from runtime.compose import compose_lifecycle
from runtime.domain import RunStatus, Snapshot, ToolCallPart, ToolState
from runtime.errors import InvalidPayload
from runtime.lifecycle import (
    AfterStepDecision,
    BeforeToolDecision,
    Block,
    ContextNext,
    ModelCall,
    PrepareRunDecision,
    Reject,
    ReplaceInput,
    Respond,
    RunContext,
    Skip,
    StepContext,
    StepResult,
    ToolCall,
    ToolCallContext,
    ToolResult,
)
from runtime.providers.model_api import ContextMessage, ModelDelta, ModelRequest, ProviderError
from runtime.providers.scripted import (
    ScriptedModel,
    ScriptedToolCall,
    fail_mid_stream,
    text_response,
    tool_call_response,
    tool_calls_response,
)
from runtime.tools import SuspendStep, tool
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, SCOPE, Runtime, first_text, run_of, settled
from threadline_wire.chunks import StreamChunk, TextDeltaChunk


class Args(BaseModel):
    n: int = 0


def note(text: str) -> ContextMessage:
    return ContextMessage(role="system", parts=({"type": "text", "text": text},))


def tool_parts(snapshot: Snapshot, index: int = -1) -> list[ToolCallPart]:
    return [p for p in snapshot.messages[index].parts if isinstance(p, ToolCallPart)]


async def start(rt: Runtime, text: str = "go") -> str:
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, text)
    return thread_id


class Layer:
    """One named lifecycle of a composition, logging every hook it runs as `phase:name`."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
        self.log.append(f"prepare_run:{self.name}")
        return PrepareRunDecision(context={self.name: True})

    async def prepare_model_step(
        self, ctx: StepContext, request: ModelRequest
    ) -> ModelRequest | Respond | Block | None:
        self.log.append(f"prepare_model_step:{self.name}")
        return request.model_copy(update={"instructions": request.instructions + self.name})

    def transform_step_stream(
        self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
    ) -> AsyncIterator[StreamChunk]:
        async def run() -> AsyncIterator[Any]:
            async for chunk in stream:
                if isinstance(chunk, TextDeltaChunk):
                    chunk = TextDeltaChunk(delta=chunk.delta + self.name)
                yield chunk

        self.log.append(f"transform_step_stream:{self.name}")
        return run()

    async def before_tool_call(
        self, ctx: ToolCallContext, call: ToolCall
    ) -> BeforeToolDecision | None:
        self.log.append(f"before_tool_call:{self.name}")
        return ReplaceInput({"n": call.input["n"] * 10 + ord(self.name) - ord("a") + 1})

    async def after_tool_result(
        self, ctx: ToolCallContext, result: ToolResult
    ) -> ToolResult | None:
        self.log.append(f"after_tool_result:{self.name}")
        return ToolResult(result.state, output=f"{result.output}{self.name}")

    async def after_step(self, ctx: StepContext, result: StepResult) -> AfterStepDecision | None:
        self.log.append(f"after_step:{self.name}")
        return AfterStepDecision(append=(note(f"{self.name}{result.step}"),))


async def test_ordering_phases_run_a_then_b_then_c(runtime_for: RuntimeFactory) -> None:
    """Rule "prepareRun, prepareModelStep, transformStepStream, beforeToolCall,
    afterToolResult, and afterStep run a, then b, then c".

    Breaks with: compose._ComposedLifecycle._hooks returning its list reversed (`[::-1]`)."""
    log: list[str] = []

    @tool
    async def work(args: Args) -> int:
        return args.n

    model = ScriptedModel([tool_call_response("work", {"n": 0}, "w1"), text_response("x")])
    lifecycle = compose_lifecycle(*(Layer(name, log) for name in "abc"))
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=lifecycle))
    thread_id = await start(rt)
    await rt.wait_status(thread_id, RunStatus.COMPLETED)
    for phase in (
        "prepare_run",
        "prepare_model_step",
        "transform_step_stream",
        "before_tool_call",
        "after_tool_result",
        "after_step",
    ):
        names = [entry.split(":")[1] for entry in log if entry.split(":")[0] == phase]
        assert names[:3] == ["a", "b", "c"], (phase, names)


async def test_ordering_value_transforming_phases_pass_the_patched_value(
    runtime_for: RuntimeFactory,
) -> None:
    """Rule "value-transforming phases pass the patched input, stream, tool input, or tool
    result to later hooks; prepareRun and afterStep instead accumulate child decisions".

    Breaks with: compose.before_tool_call not replacing `call` with the patched input."""
    log: list[str] = []
    seen_local: list[dict[str, Any]] = []

    @tool
    async def work(args: Args) -> int:
        return args.n

    class Local:
        async def prepare_model_step(
            self, ctx: StepContext, request: ModelRequest
        ) -> ModelRequest | Respond | Block | None:
            seen_local.append(dict(ctx.local))
            return None

    model = ScriptedModel([tool_call_response("work", {"n": 0}, "w1"), text_response("x")])
    lifecycle = compose_lifecycle(*(Layer(name, log) for name in "abc"), Local())
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=lifecycle))
    thread_id = await start(rt)
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert model.calls[0].instructions == "abc"
    [part] = tool_parts(done, 1)
    # a: 0*10+1 = 1, b: 1*10+2 = 12, c: 12*10+3 = 123; the result then gets "abc" appended.
    assert (part.input, part.output) == ({"n": 123}, "123abc")
    assert first_text(done.messages[-1]) == "xabc"
    assert seen_local[0] == {"a": True, "b": True, "c": True}
    extra = [m for m in model.calls[1].messages if m.role == "system"]
    assert extra == [note("a0"), note("b0"), note("c0")]


async def test_ordering_resolve_model_context_is_middleware_a_outermost(
    runtime_for: RuntimeFactory,
) -> None:
    """Rule "resolveModelContext is middleware: a is outermost, c is closest to the default
    durable-context leaf, and each layer chooses whether and how to call its memoized next()".

    Breaks with: compose.resolve_model_context wrapping hooks without `reversed(...)`."""
    log: list[str] = []

    class Mw:
        def __init__(self, name: str) -> None:
            self.name = name

        async def resolve_model_context(
            self, ctx: RunContext, next: ContextNext
        ) -> list[ContextMessage]:
            log.append(f"enter:{self.name}")
            messages = await next()
            await next()  # memoized: the inner chain is not evaluated twice
            log.append(f"leave:{self.name}")
            return [*messages, note(self.name)]

    model = ScriptedModel([text_response("x")])
    rt = await runtime_for(Agent(model=model, lifecycle=compose_lifecycle(*map(Mw, "abc"))))
    thread_id = await start(rt, "q")
    await rt.wait_for(thread_id, settled)
    assert log == ["enter:a", "enter:b", "enter:c", "leave:c", "leave:b", "leave:a"]
    assert [first_text(m) for m in model.calls[0].messages] == ["q", "c", "b", "a"]


async def test_ordering_around_model_call_wraps_a_outermost(runtime_for: RuntimeFactory) -> None:
    """Rule "aroundModelCall wraps in the same order, so a is outermost and c is closest to
    the underlying call".

    Breaks with: compose.around_model_call layering hooks without `reversed(...)`."""
    log: list[str] = []

    class Wrap:
        def __init__(self, name: str) -> None:
            self.name = name

        async def around_model_call(
            self, ctx: StepContext, request: ModelRequest, call: ModelCall
        ) -> AsyncIterator[ModelDelta]:
            log.append(f"enter:{self.name}")
            stream = await call(request)
            log.append(f"leave:{self.name}")
            return stream

    model = ScriptedModel([text_response("x")])
    rt = await runtime_for(Agent(model=model, lifecycle=compose_lifecycle(*map(Wrap, "abc"))))
    await rt.wait_for(await start(rt), settled)
    assert log == ["enter:a", "enter:b", "enter:c", "leave:c", "leave:b", "leave:a"]


async def test_ordering_before_tool_call_runs_for_every_call_before_any_ready_tool_starts(
    runtime_for: RuntimeFactory,
) -> None:
    """Rule "within one model step, beforeToolCall runs for every tool call before any ready
    tool starts executing or routing" (several ready tools, one global order of events).

    Breaks with: ToolPhase.run_calls awaiting `self._execute(index, outcome, None)` in its loop
    instead of `ready.append((index, outcome))`."""
    events: list[str] = []

    @tool
    async def work(args: Args) -> int:
        events.append(f"run:{args.n}")
        return args.n

    class Before:
        async def before_tool_call(
            self, ctx: ToolCallContext, call: ToolCall
        ) -> BeforeToolDecision | None:
            events.append(f"before:{call.input['n']}")
            return None

    calls = [ScriptedToolCall("work", {"n": n}, f"w{n}") for n in (1, 2, 3)]
    model = ScriptedModel([tool_calls_response(*calls), text_response("x")])
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=Before()))
    await rt.wait_status(await start(rt), RunStatus.COMPLETED)
    assert events[:3] == ["before:1", "before:2", "before:3"]
    assert sorted(events[3:]) == ["run:1", "run:2", "run:3"]


async def test_ordering_ready_tools_run_in_parallel_in_model_order(
    runtime_for: RuntimeFactory,
) -> None:
    """Rule "ready tools from the same model step run in parallel, while the final transcript
    remains ordered by the model's tool-call order".

    Breaks with: toolcalls._all awaiting each item (`await item`) instead of create_task."""
    both_running = asyncio.Event()
    running: set[int] = set()

    @tool
    async def work(args: Args) -> int:
        running.add(args.n)
        if len(running) == 2:
            both_running.set()
        # Each tool waits until the other started: only a parallel run gets past this.
        await asyncio.wait_for(both_running.wait(), 2)
        await asyncio.sleep(0.05 * (2 - args.n))  # the first call finishes last
        return args.n

    calls = [ScriptedToolCall("work", {"n": n}, f"w{n}") for n in (1, 2)]
    model = ScriptedModel([tool_calls_response(*calls), text_response("x")])
    rt = await runtime_for(Agent(model=model, tools=[work]))
    done = await rt.wait_status(await start(rt), RunStatus.COMPLETED)
    parts = tool_parts(done, 1)
    assert [(p.tool_call_id, p.state, p.output) for p in parts] == [
        ("w1", ToolState.OUTPUT_AVAILABLE, 1),
        ("w2", ToolState.OUTPUT_AVAILABLE, 2),
    ]


async def test_ordering_respond_commits_a_terminal_response_after_canonical_output_policy(
    runtime_for: RuntimeFactory,
) -> None:
    """Rule "respond commits a terminal assistant response and ends the run after canonical
    output policy": the committed and published text is the transformed one.

    Breaks with: phases.respond committing `TextPart(text=text)` instead of `output.text`."""
    log: list[str] = []

    class Responder:
        async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
            return PrepareRunDecision(respond=Respond("cached"))

    lifecycle = compose_lifecycle(Responder(), Layer("z", log))
    rt = await runtime_for(Agent(model=ScriptedModel([]), lifecycle=lifecycle))
    thread_id = await rt.thread()
    async with rt.record(thread_id) as rec:
        await rt.service.send_message(ALICE, thread_id, "q")
        done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert first_text(done.messages[-1]) == "cachedz"
    assert rec.text() == "cachedz"


async def test_ordering_skip_or_reject_skips_execution_or_routing(
    runtime_for: RuntimeFactory,
) -> None:
    """Rule "skip or reject skips execution or routing for that call": a rejected server tool
    never executes, a skipped client tool is never routed to the browser.

    Breaks with: ToolPhase.run_calls testing `elif False:` instead of the Reject decision."""
    executed: list[int] = []

    @tool
    async def work(args: Args) -> int:
        executed.append(args.n)
        return args.n

    class Policy:
        async def before_tool_call(
            self, ctx: ToolCallContext, call: ToolCall
        ) -> BeforeToolDecision | None:
            return Reject("no") if call.name == "work" else Skip(output="cached")

    calls = [ScriptedToolCall("work", {"n": 1}, "w1"), ScriptedToolCall("pick", {}, "p1")]
    model = ScriptedModel([tool_calls_response(*calls), text_response("x")])
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=Policy()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "go", client_tools=[{"name": "pick"}])
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert executed == []
    assert [(p.state, p.output, p.error) for p in tool_parts(done, 1)] == [
        (ToolState.REJECTED, None, "no"),
        (ToolState.SKIPPED, "cached", None),
    ]


class Approval(BaseModel):
    approved: bool
    reason: str = ""

    @field_validator("reason")
    @classmethod
    def explain_refusals(cls, reason: str) -> str:
        if reason and len(reason) < 5:
            raise ValueError("a reason must say something")
        return reason


async def test_ordering_resume_payloads_validate_once_with_the_tools_model(
    runtime_for: RuntimeFactory,
) -> None:
    """Rule "skipped outputs and submitted results still validate" at resolve time: a payload
    failing only a pydantic validator of the tool's payload model is a 422 with its errors and
    changes nothing (no resumed run, no output-error).

    Breaks with: payloads.check_payload validating approvals with `_check_schema(...)`."""

    @tool(suspend=SuspendStep(Approval))
    async def act(args: Args) -> str:
        return "acted"

    model = ScriptedModel([tool_call_response("act", {"n": 1}, "a1"), text_response("done")])
    rt = await runtime_for(Agent(model=model, tools=[act]))
    thread_id = await start(rt)
    waiting = await rt.wait_status(thread_id, RunStatus.WAITING)
    action = waiting.pending_actions[0]
    with pytest.raises(InvalidPayload) as invalid:
        refusal = {"approved": False, "reason": "no"}
        await rt.service.resume_action(ALICE, thread_id, action.id, refusal)
    assert invalid.value.details["errors"][0]["loc"] == ["reason"]
    assert (await rt.store.snapshot(thread_id, [SCOPE])).thread.version == waiting.thread.version
    await rt.service.resume_action(ALICE, thread_id, action.id, {"approved": True})
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert tool_parts(done, 1)[0].output == "acted"


async def test_ordering_thrown_errors_fail_the_run_around_model_call_catches_setup_only(
    runtime_for: RuntimeFactory,
) -> None:
    """Rule "thrown errors fail the run. aroundModelCall may catch setup failures from the call
    it wraps; failures delivered later while consuming the returned stream require
    stream-aware handling".

    Breaks with: streaming.model_call returning `model.stream(request)` unprimed."""

    class Fallback:
        async def around_model_call(
            self, ctx: StepContext, request: ModelRequest, call: ModelCall
        ) -> AsyncIterator[ModelDelta]:
            try:
                return await call(request)
            except ProviderError:

                async def canned() -> AsyncIterator[Any]:
                    for delta in text_response("fallback"):
                        yield delta

                return canned()

    model = ScriptedModel(
        [
            ProviderError("503 at setup", retryable=True),
            fail_mid_stream(text_response("partial", usage=None)[:-1]),
        ]
    )
    rt = await runtime_for(Agent(model=model, lifecycle=Fallback()))
    first = await start(rt)
    completed = await rt.wait_status(first, RunStatus.COMPLETED)
    assert first_text(completed.messages[-1]) == "fallback"
    second = await start(rt)
    failed = await rt.wait_status(second, RunStatus.FAILED)
    assert "mid-stream" in (run_of(failed).error or "")


# --- the short-circuit rule, per decision phase -------------------------------------------------


class Recorder:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
        self.log.append("prepare_run")
        return None

    async def prepare_model_step(
        self, ctx: StepContext, request: ModelRequest
    ) -> ModelRequest | Respond | Block | None:
        self.log.append("prepare_model_step")
        return None

    async def before_tool_call(
        self, ctx: ToolCallContext, call: ToolCall
    ) -> BeforeToolDecision | None:
        self.log.append("before_tool_call")
        return None


async def test_short_circuit_prepare_run_respond_stops_later_hooks(
    runtime_for: RuntimeFactory,
) -> None:
    """The short-circuit rule in prepareRun: after a `respond`, later hooks do not run.

    Breaks with: compose.prepare_run's `break` after a respond replaced by `pass`."""
    log: list[str] = []

    class Stop:
        async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
            return PrepareRunDecision(respond=Respond("no"))

    rt = await runtime_for(
        Agent(model=ScriptedModel([]), lifecycle=compose_lifecycle(Stop(), Recorder(log)))
    )
    await rt.wait_status(await start(rt), RunStatus.COMPLETED)
    assert log == []


async def test_short_circuit_prepare_model_step_block_stops_later_hooks(
    runtime_for: RuntimeFactory,
) -> None:
    """The short-circuit rule in prepareModelStep: after Respond/Block, later hooks do not run.

    Breaks with: compose.prepare_model_step's `return decision` on Respond/Block replaced by
    `continue`."""
    log: list[str] = []

    class Stop:
        async def prepare_model_step(
            self, ctx: StepContext, request: ModelRequest
        ) -> ModelRequest | Respond | Block | None:
            return Block("unsafe", response="refused")

    model = ScriptedModel([text_response("model")])
    lifecycle = compose_lifecycle(Stop(), Recorder(log))
    rt = await runtime_for(Agent(model=model, lifecycle=lifecycle))
    done = await rt.wait_status(await start(rt), RunStatus.COMPLETED)
    assert first_text(done.messages[-1]) == "refused"
    assert log == ["prepare_run"]


async def test_short_circuit_before_tool_call_skip_stops_later_hooks(
    runtime_for: RuntimeFactory,
) -> None:
    """The short-circuit rule in beforeToolCall: after Skip/Reject, later hooks do not run.

    Breaks with: compose.before_tool_call's `return decision` on Skip/Reject replaced by
    `continue`."""
    log: list[str] = []

    @tool
    async def work(args: Args) -> int:
        return args.n

    class Stop:
        async def before_tool_call(
            self, ctx: ToolCallContext, call: ToolCall
        ) -> BeforeToolDecision | None:
            return Skip(output=7)

    model = ScriptedModel([tool_call_response("work", {"n": 1}, "w1"), text_response("x")])
    lifecycle = compose_lifecycle(Stop(), Recorder(log))
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=lifecycle))
    done = await rt.wait_status(await start(rt), RunStatus.COMPLETED)
    assert [(p.state, p.output) for p in tool_parts(done, 1)] == [(ToolState.SKIPPED, 7)]
    assert "before_tool_call" not in log
