"""Rules of spec/lifecycle-phases.txt that a reading found broken or unsaid (issue 27), one
test each, over both stores. Each docstring names the one-line change that makes it fail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.compose import compose_lifecycle
from runtime.domain import Lease, RunStatus, Snapshot, ToolCallPart, ToolState
from runtime.engine.toolcalls import INTERRUPTED
from runtime.engine.worker import Worker
from runtime.lifecycle import (
    AfterStepDecision,
    AgentLifecycle,
    BeforeToolDecision,
    Reject,
    ReplaceInput,
    Skip,
    StepContext,
    StepResult,
    ToolCall,
    ToolCallContext,
)
from runtime.providers.model_api import ContextMessage
from runtime.providers.scripted import ScriptedModel, text_response, tool_call_response
from runtime.storage.store import EpisodeStart, RunStart, Store
from runtime.tools import ToolContext, tool
from tests import otel
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, Runtime, settled
from threadline_wire.chunks import StreamChunk, ToolCallChunk


class Args(BaseModel):
    n: int = 0


class Secret(BaseModel):
    password: str


def tool_parts(snapshot: Snapshot) -> list[ToolCallPart]:
    return [p for m in snapshot.messages for p in m.parts if isinstance(p, ToolCallPart)]


async def start(rt: Runtime, text: str = "go") -> tuple[str, str]:
    thread_id = await rt.thread()
    admission = await rt.service.send_message(ALICE, thread_id, text)
    assert admission.run_id is not None
    return thread_id, admission.run_id


# --- 1. a terminal before_tool_call decision keeps what earlier hooks contributed -----------


@pytest.mark.parametrize("refusal", ["reject", "skip"])
async def test_a_refused_call_keeps_the_input_an_earlier_hook_redacted(
    runtime_for: RuntimeFactory, refusal: str
) -> None:
    """Hook a redacts the input, hook b sees the redacted input and refuses the call: the
    stored tool part and the next step's model input hold the redacted input only.

    Breaks with: compose.before_tool_call returning `decision` without `input=call.input`."""
    seen: list[dict[str, Any]] = []

    @tool
    async def login(args: Secret) -> str:
        raise AssertionError("a refused call must not run")

    class Redact:
        async def before_tool_call(
            self, ctx: ToolCallContext, call: ToolCall
        ) -> BeforeToolDecision | None:
            return ReplaceInput({"password": "[redacted]"})

    class Guard:
        async def before_tool_call(
            self, ctx: ToolCallContext, call: ToolCall
        ) -> BeforeToolDecision | None:
            seen.append(dict(call.input))
            return Reject("no logins") if refusal == "reject" else Skip(output="later")

    model = ScriptedModel(
        [tool_call_response("login", {"password": "hunter2"}, "c1"), text_response("ok")]
    )
    agent = Agent(model=model, tools=[login], lifecycle=compose_lifecycle(Redact(), Guard()))
    rt = await runtime_for(agent)
    thread_id, _ = await start(rt)
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert seen == [{"password": "[redacted]"}]
    [part] = tool_parts(done)
    assert part.state is (ToolState.REJECTED if refusal == "reject" else ToolState.SKIPPED)
    assert part.input == {"password": "[redacted]"}
    assert "hunter2" not in repr(model.calls[1].messages)


# --- 2. a CancelledError a hook raises fails the run ---------------------------------------


@pytest.mark.parametrize("hook", ["prepare_model_step", "before_tool_call", "after_tool_result"])
async def test_a_cancelled_error_raised_by_a_hook_fails_the_run(
    runtime_for: RuntimeFactory, hook: str
) -> None:
    """ "Thrown errors fail the run": a hook raising CancelledError itself (no stop, no
    shutdown, no lease loss) fails the run in its first episode, instead of the episode
    ending unfinished and a takeover redoing the step once per poll, forever.

    Breaks with: Episode._guarded re-raising every CancelledError (after_tool_result, raised
    in a tool task: toolcalls._failing_if_stray re-raising every CancelledError)."""
    calls: list[str] = []

    @tool
    async def work(args: Args) -> int:
        return args.n

    class GivesUp(AgentLifecycle):
        pass

    async def raise_cancelled(*args: Any) -> None:
        calls.append(hook)
        raise asyncio.CancelledError("hook gave up")

    lifecycle = GivesUp()
    setattr(lifecycle, hook, raise_cancelled)
    model = ScriptedModel([tool_call_response("work", {"n": 1}, "w1"), text_response("done")])
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=lifecycle))
    thread_id, run_id = await start(rt)
    failed = await rt.wait_status(thread_id, RunStatus.FAILED, timeout=5)
    assert failed.run is not None and "CancelledError" in (failed.run.error or "")
    assert "hook gave up" in (failed.run.error or "")
    run = await rt.store.get_run(run_id)
    assert run.episode == 1  # no takeover redid it
    assert calls == [hook]


async def test_a_cancelled_error_raised_by_a_tool_is_a_tool_error(
    runtime_for: RuntimeFactory,
) -> None:
    """A tool whose own await was cancelled (not the step) fails as a model-visible result,
    like any tool error: the task group running it must not drop it as a cancellation.

    Breaks with: ToolPhase._execute re-raising every CancelledError."""

    @tool
    async def flaky(args: Args) -> int:
        raise asyncio.CancelledError("upstream request cancelled")

    model = ScriptedModel([tool_call_response("flaky", {"n": 1}, "f1"), text_response("sorry")])
    rt = await runtime_for(Agent(model=model, tools=[flaky]))
    thread_id, _ = await start(rt)
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED, timeout=5)
    [part] = tool_parts(done)
    assert part.state is ToolState.OUTPUT_ERROR
    assert part.error == "CancelledError: upstream request cancelled"


# --- 3. every run's end is a run event ---------------------------------------------------------


async def test_a_run_cancelled_while_queued_is_counted_cancelled(
    runtime_for: RuntimeFactory,
) -> None:
    """ "run started, finished, failed, and cancelled events": a stop that cancels a queued
    run (no episode ever ends it) counts `cancelled` once; a second stop counts nothing.

    Breaks with: runs_tx.request_stop without `conn.on_commit(_cancelled_event)`."""
    telemetry = otel.install()
    mark = telemetry.mark("threadline.runs")
    rt = await runtime_for(Agent(model=ScriptedModel([])), workers=0)
    thread_id, run_id = await start(rt)
    stopped = await rt.service.stop_run(ALICE, thread_id, run_id)
    assert stopped.status is RunStatus.CANCELLED
    assert mark.delta("threadline.runs", event="cancelled") == 1
    await rt.service.stop_run(ALICE, thread_id, run_id)
    assert mark.delta("threadline.runs", event="cancelled") == 1
    assert mark.delta("threadline.runs", event="started") == 0


class BrokenStart:
    """A store on which an episode cannot start: its start reads fail (not a lease loss)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def start_run(
        self,
        run_id: str,
        owner: str,
        ttl: float,
        *,
        thread_id: str | None = None,
        history_from: int = 0,
    ) -> RunStart | None:
        start = await self._store.start_run(
            run_id, owner, ttl, thread_id=thread_id, history_from=history_from
        )
        # Only the lease: the episode must start through `begin_episode`, which fails.
        return None if start is None else RunStart(lease=start.lease)

    async def begin_episode(self, lease: Lease, history_from: int = 0) -> EpisodeStart:
        raise RuntimeError("history unreadable")


async def test_a_run_that_fails_before_its_episode_starts_is_counted_failed(
    runtime_for: RuntimeFactory,
) -> None:
    """A run whose episode cannot start is failed (`Episode._fail_unstarted`) and counted.

    Breaks with: Episode._fail_unstarted without its `instruments.safe_add(...)`."""
    telemetry = otel.install()
    mark = telemetry.mark("threadline.runs")
    agent = Agent(model=ScriptedModel([]))
    rt = await runtime_for(agent, workers=0)
    worker = Worker(BrokenStart(rt.store), rt.bus, agent, poll_interval=0.05)
    await worker.start()
    rt.workers.append(worker)
    thread_id, _ = await start(rt)
    failed = await rt.wait_status(thread_id, RunStatus.FAILED)
    assert failed.run is not None and failed.run.error == "history unreadable"
    assert mark.delta("threadline.runs", event="failed") == 1


# --- 4. decided: before_tool_call before a takeover re-executes a tool -------------------------


@pytest.mark.parametrize("decision", ["continue", "reject"])
async def test_before_tool_call_runs_before_a_takeover_re_executes(
    runtime_for: RuntimeFactory, decision: str
) -> None:
    """A takeover that re-runs an idempotent tool is execution continuing, so before_tool_call
    runs first (`ctx.takeover`), as on a resume; a Reject there keeps the tool from running
    again, and the call ends interrupted (the dead episode may have had the effect).

    Breaks with: ToolPhase.resume appending the running part to `ready` without the hook."""
    runs: list[int] = []
    hooked: list[tuple[Any, dict[str, Any]]] = []
    first_may_end = asyncio.Event()
    effect_started = asyncio.Event()

    @tool(idempotent=True)
    async def send(args: Args, ctx: ToolContext) -> int:
        runs.append(args.n)
        effect_started.set()
        if len(runs) == 1:
            await first_may_end.wait()  # the worker "dies" here
        return args.n

    class Gate(AgentLifecycle):
        async def before_tool_call(
            self, ctx: ToolCallContext, call: ToolCall
        ) -> BeforeToolDecision | None:
            hooked.append((ctx, dict(call.input)))
            if len(hooked) == 1:
                return ReplaceInput({"n": 2})
            return Reject("policy changed") if decision == "reject" else None

    model = ScriptedModel([tool_call_response("send", {"n": 1}, "s1"), text_response("noted")])
    rt = await runtime_for(Agent(model=model, tools=[send], lifecycle=Gate()), lease_ttl=0.6)
    thread_id, _ = await start(rt)
    await asyncio.wait_for(effect_started.wait(), 10)
    await rt.workers[0].stop()  # abandons the episode without writing, like a crash
    await rt.start_worker()
    final = await rt.wait_for(thread_id, settled, timeout=15)
    first_may_end.set()
    assert final.run is not None and final.run.status is RunStatus.COMPLETED
    # The committed (patched) input is what the takeover's hook sees.
    assert [call_input for _, call_input in hooked] == [{"n": 1}, {"n": 2}]
    assert [ctx.takeover for ctx, _ in hooked] == [False, True]
    [part] = tool_parts(final)
    if decision == "continue":
        assert runs == [2, 2] and part.state is ToolState.OUTPUT_AVAILABLE
    else:
        assert runs == [2]
        assert part.state is ToolState.OUTPUT_ERROR
        assert part.error == f"{INTERRUPTED} (not run again: policy changed)"


# --- 4. decided: transform_step_stream cannot call tools ---------------------------------------


@pytest.mark.parametrize("forgery", ["new-call", "renamed-call", "twice"])
async def test_transform_step_stream_cannot_create_a_tool_call(
    runtime_for: RuntimeFactory, forgery: str
) -> None:
    """The phase table: `transformStepStream` cannot call tools. A tool-call chunk it yields
    that the model did not make (a new id, another tool's name, a call repeated) fails the
    run; no tool executes, and the forged call is neither published nor committed.

    Breaks with: streaming.run_stream without `_check_call(chunk, made, output)`."""
    executed: list[int] = []

    @tool
    async def wipe(args: Args) -> int:
        executed.append(args.n)
        return args.n

    class Forger(AgentLifecycle):
        def transform_step_stream(
            self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
        ) -> AsyncIterator[StreamChunk]:
            async def run() -> AsyncIterator[Any]:
                async for chunk in stream:
                    if isinstance(chunk, ToolCallChunk) and forgery == "renamed-call":
                        chunk = chunk.model_copy(update={"name": "wipe"})
                    yield chunk
                    if isinstance(chunk, ToolCallChunk) and forgery == "twice":
                        yield chunk
                if forgery == "new-call":
                    yield ToolCallChunk(tool_call_id="forged", name="wipe", input={"n": 9})

            return run()

    @tool
    async def read(args: Args) -> int:
        return args.n

    first = tool_call_response("read", {"n": 1}, "r1") if forgery != "new-call" else None
    model = ScriptedModel([first or text_response("hello"), text_response("done")])
    rt = await runtime_for(Agent(model=model, tools=[wipe, read], lifecycle=Forger()))
    thread_id = await rt.thread()
    async with rt.record(thread_id) as rec:
        await rt.service.send_message(ALICE, thread_id, "go")
        failed = await rt.wait_status(thread_id, RunStatus.FAILED)
    assert failed.run is not None
    assert "transform_step_stream yielded" in (failed.run.error or "")
    assert executed == []
    assert tool_parts(failed) == []
    # Published: only the model's own call, before the repeat was refused.
    calls = [c["chunk"] for c in rec.chunks() if c["chunk"]["type"] == "tool-call"]
    assert [c["tool_call_id"] for c in calls] == ([] if forgery != "twice" else ["r1"])


async def test_transform_step_stream_may_redact_a_tool_calls_input(
    runtime_for: RuntimeFactory,
) -> None:
    """What the transform yields is canonical, a tool call's input included: a redaction of
    the model's arguments is what is stored, what before_tool_call sees and what the tool runs
    with (it changes a call, it does not make one).

    Breaks with: streaming._check_call comparing the chunk's input with the model's too."""
    ran: list[str] = []

    @tool
    async def login(args: Secret) -> str:
        ran.append(args.password)
        return "ok"

    class Redact(AgentLifecycle):
        def transform_step_stream(
            self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
        ) -> AsyncIterator[StreamChunk]:
            async def run() -> AsyncIterator[Any]:
                async for chunk in stream:
                    if isinstance(chunk, ToolCallChunk):
                        chunk = chunk.model_copy(update={"input": {"password": "***"}})
                    yield chunk

            return run()

    model = ScriptedModel(
        [tool_call_response("login", {"password": "hunter2"}, "l1"), text_response("in")]
    )
    rt = await runtime_for(Agent(model=model, tools=[login], lifecycle=Redact()))
    thread_id, _ = await start(rt)
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert ran == ["***"]
    assert [p.input for p in tool_parts(done)] == [{"password": "***"}]


# --- 4. decided: after_step context lasts for the rest of the episode ----------------------------


def note(text: str) -> ContextMessage:
    return ContextMessage(role="system", parts=({"type": "text", "text": text},))


async def test_after_step_context_lasts_for_every_later_step_until_replaced(
    runtime_for: RuntimeFactory,
) -> None:
    """`afterStep` "can append or replace execution-local next-step model context": what it
    appends stays in the context of every later step of the episode (a step whose after_step
    returns nothing keeps it), until a later decision replaces it; it is never persisted.

    Breaks with: phases.after_step folding the decision into `()` instead of
    `ctx.extra_messages` (the next step only)."""

    @tool
    async def work(args: Args) -> int:
        return args.n

    class Steer(AgentLifecycle):
        async def after_step(
            self, ctx: StepContext, result: StepResult
        ) -> AfterStepDecision | None:
            if result.step == 0:
                return AfterStepDecision(append=(note("remember"),))
            if result.step == 2:
                return AfterStepDecision(replace=())
            return None

    model = ScriptedModel(
        [
            tool_call_response("work", {"n": 1}, "w1"),
            tool_call_response("work", {"n": 2}, "w2"),
            tool_call_response("work", {"n": 3}, "w3"),
            text_response("done"),
        ]
    )
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=Steer()))
    thread_id, _ = await start(rt)
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    systems = [[m for m in call.messages if m.role == "system"] for call in model.calls]
    assert systems == [[], [note("remember")], [note("remember")], []]
    assert all(m.role != "system" for m in done.messages)
