"""One test per row of the phase table of spec/lifecycle-phases.txt, named after the row.

Each docstring names a one-line change to the runtime that makes the test fail (each was tried
once). Every test also ends on the runtime_for invariant: a terminal run leaves no tool part
awaiting action or running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import RunStatus, Snapshot, ToolCallPart, ToolState, WaitKind
from runtime.errors import InvalidInput
from runtime.lifecycle import (
    AfterStepDecision,
    AgentLifecycle,
    BeforeToolDecision,
    Block,
    ContextNext,
    ModelCall,
    PrepareRunDecision,
    Respond,
    RunContext,
    RuntimeContextInput,
    Skip,
    StepContext,
    StepResult,
    ToolCall,
    ToolCallContext,
    ToolResult,
)
from runtime.providers.model_api import ContextMessage, ModelDelta, ModelRequest
from runtime.providers.scripted import (
    ScriptedModel,
    ScriptedToolCall,
    text_response,
    tool_call_response,
    tool_calls_response,
)
from runtime.storage import SqlStore
from runtime.storage.sql.core import Conn
from runtime.tools import SuspendStep, ToolContext, manual_tool, tool
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import (
    ALICE,
    BACKEND,
    SCOPE,
    Runtime,
    first_text,
    run_of,
    settled,
)
from threadline_wire.chunks import StreamChunk, TextDeltaChunk

MANUAL = WaitKind.MANUAL_RESULT


class Args(BaseModel):
    n: int = 0


class Approval(BaseModel):
    approved: bool


def note(text: str) -> ContextMessage:
    return ContextMessage(role="system", parts=({"type": "text", "text": text},))


def tool_parts(snapshot: Snapshot, index: int = -1) -> list[ToolCallPart]:
    return [p for p in snapshot.messages[index].parts if isinstance(p, ToolCallPart)]


async def start(rt: Runtime, text: str = "go", **kwargs: Any) -> str:
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, text, **kwargs)
    return thread_id


# --- runtimeContext ---------------------------------------------------------------------------


async def test_runtime_context_builds_trusted_state_for_one_episode(
    runtime_for: RuntimeFactory,
) -> None:
    """Row `runtimeContext`: its state reaches hooks and tools read-only, per episode; an error
    it throws fails the run.

    Breaks with: phases.runtime_context passing `state=MappingProxyType({})` to RunContext."""
    seen: list[Any] = []

    @tool
    async def probe(args: Args, ctx: ToolContext) -> str:
        seen.append(("tool", dict(ctx.state)))
        return "ok"

    class Trusted(AgentLifecycle):
        async def runtime_context(self, inp: RuntimeContextInput) -> Mapping[str, Any] | None:
            if inp.thread_metadata.get("broken"):
                raise RuntimeError("secrets store down")
            return {"tenant": inp.scope, "episode": inp.episode}

        async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
            seen.append(("prepare_run", dict(ctx.state)))
            return None

    model = ScriptedModel([tool_call_response("probe", {"n": 1}, "p1"), text_response("done")])
    rt = await runtime_for(Agent(model=model, tools=[probe], lifecycle=Trusted()))
    thread_id = await start(rt)
    await rt.wait_status(thread_id, RunStatus.COMPLETED)
    state = {"tenant": SCOPE, "episode": 1}
    assert seen == [("prepare_run", state), ("tool", state)]
    broken = await rt.service.create_thread(ALICE, metadata={"broken": True})
    await rt.service.send_message(ALICE, broken.thread.id, "go")
    failed = await rt.wait_status(broken.thread.id, RunStatus.FAILED)
    assert run_of(failed).error == "secrets store down"


# --- prepareRun -------------------------------------------------------------------------------


async def test_prepare_run_respond_on_resume_finalises_the_resolved_call(
    runtime_for: RuntimeFactory,
) -> None:
    """Row `prepareRun` ("only through respond; runs again on resume"): a respond on the
    resume episode ends the run, and the resolved call ends cancelled through
    after_tool_result instead of staying awaiting-action.

    Breaks with: episode._body skipping `await close_tail(deps, state, ctx, resumable)`."""
    after: list[tuple[str, ToolState]] = []

    @tool(suspend=SuspendStep(Approval))
    async def act(args: Args) -> str:
        raise AssertionError("a respond must keep the tool from running")

    class Quota(AgentLifecycle):
        async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
            return PrepareRunDecision(respond=Respond("quota used up")) if ctx.resumed else None

        async def after_tool_result(
            self, ctx: ToolCallContext, result: ToolResult
        ) -> ToolResult | None:
            after.append((ctx.tool_call_id, result.state))
            return None

    model = ScriptedModel([tool_call_response("act", {"n": 1}, "a1")])
    rt = await runtime_for(Agent(model=model, tools=[act], lifecycle=Quota()))
    thread_id = await start(rt)
    waiting = await rt.wait_status(thread_id, RunStatus.WAITING)
    await rt.service.resume_action(
        ALICE, thread_id, waiting.pending_actions[0].id, {"approved": True}
    )
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert [m.role for m in done.messages] == ["user", "assistant", "assistant"]
    assert [p.state for p in tool_parts(done, 1)] == [ToolState.CANCELLED]
    assert first_text(done.messages[-1]) == "quota used up"
    assert after == [("a1", ToolState.CANCELLED)]
    assert done.pending_actions == ()


# --- resolveModelContext ----------------------------------------------------------------------


async def test_resolve_model_context_is_capped_at_the_step_start_anchor(
    runtime_for: RuntimeFactory,
) -> None:
    """Row `resolveModelContext`: history is capped at the step-start physical anchor, so a
    message appended after the anchor while the step runs is not in the model context.

    Breaks with: DurableContext.__call__ reading `up_to_position=None`."""
    store_box: dict[str, SqlStore] = {}

    class Intruder(AgentLifecycle):
        async def resolve_model_context(
            self, ctx: RunContext, next: ContextNext
        ) -> list[ContextMessage]:
            await append_raw_message(store_box["store"], ctx.thread_id, "appended later")
            return await next()

    model = ScriptedModel([text_response("answer")])
    rt = await runtime_for(Agent(model=model, lifecycle=Intruder()))
    assert isinstance(rt.store, SqlStore)  # the intruder writes SQL behind the runtime's back
    store_box["store"] = rt.store
    thread_id = await start(rt, "question")
    done = await rt.wait_for(thread_id, settled)
    assert [first_text(m) for m in model.calls[0].messages] == ["question"]
    # The intruder is committed, before the step's message: it really was after the anchor.
    assert [first_text(m) for m in done.messages] == ["question", "appended later", "answer"]


async def append_raw_message(store: SqlStore, thread_id: str, text: str) -> None:
    """A message committed behind the runtime's back (another writer), after the anchor."""
    import orjson

    async def insert(conn: Conn) -> None:
        position = await conn.fetchval(
            "SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE thread_id = $1", thread_id
        )
        now = await conn.now()
        await conn.execute(
            "INSERT INTO messages (id, thread_id, position, role, parts, visibility, run_id,"
            " client_request_id, created_at, updated_at)"
            " VALUES ($1, $2, $3, 'user', $4, 'visible', NULL, NULL, $5, $5)",
            f"msg_intruder_{position}",
            thread_id,
            position,
            orjson.dumps([{"type": "text", "text": text}]).decode(),
            now,
        )

    await store._write(insert)


# --- Tool assembly ----------------------------------------------------------------------------


async def test_tool_assembly_selects_the_tools_a_step_may_call(runtime_for: RuntimeFactory) -> None:
    """Row `Tool assembly` ("can change model input by selecting tools"): the step's request is
    enforced, so a tool prepare_model_step removed is not executed even if the model calls it;
    a client tool named like a server tool is refused at admission.

    Breaks with: phases.tool_phase passing `offered=None` to the tool phase."""
    executed: list[int] = []

    @tool
    async def work(args: Args) -> int:
        executed.append(args.n)
        return args.n

    class NoTools(AgentLifecycle):
        async def prepare_model_step(
            self, ctx: StepContext, request: ModelRequest
        ) -> ModelRequest | Respond | Block | None:
            return request.model_copy(update={"tools": ()})

    model = ScriptedModel([tool_call_response("work", {"n": 1}, "w1"), text_response("ok")])
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=NoTools()))
    thread_id = await start(rt)
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert model.calls[0].tools == ()
    assert executed == []
    [part] = tool_parts(done, 1)
    assert part.state is ToolState.OUTPUT_ERROR and "not offered" in (part.error or "")
    with pytest.raises(InvalidInput) as clash:
        await rt.service.send_message(
            ALICE, thread_id, "again", client_tools=[{"name": "work"}, {"name": "x"}]
        )
    assert clash.value.details["errors"][0]["loc"] == ["client_tools", "0", "name"]
    assert len((await rt.store.snapshot(thread_id, [SCOPE])).messages) == len(done.messages)


# --- prepareModelStep -------------------------------------------------------------------------


async def test_prepare_model_step_respond_commits_without_calling_the_model(
    runtime_for: RuntimeFactory,
) -> None:
    """Row `prepareModelStep` ("only through respond or block with response"): a Respond at
    runtime commits the canonical response as the step, the model is never called.

    Breaks with: phases.prepare returning `request` instead of `prepared`."""

    class Cached(AgentLifecycle):
        async def prepare_model_step(
            self, ctx: StepContext, request: ModelRequest
        ) -> ModelRequest | Respond | Block | None:
            return Respond("from cache")

        def transform_step_stream(
            self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
        ) -> AsyncIterator[StreamChunk]:
            async def upper() -> AsyncIterator[StreamChunk]:
                async for chunk in stream:
                    assert isinstance(chunk, TextDeltaChunk)  # a `respond` streams text only
                    yield TextDeltaChunk(delta=chunk.delta.upper())

            return upper()

    model = ScriptedModel([text_response("model answer")])
    rt = await runtime_for(Agent(model=model, lifecycle=Cached()))
    thread_id = await start(rt)
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert first_text(done.messages[-1]) == "FROM CACHE"
    assert model.calls == []


# --- aroundModelCall --------------------------------------------------------------------------


async def test_around_model_call_changes_input_and_returns_the_stream(
    runtime_for: RuntimeFactory,
) -> None:
    """Row `aroundModelCall` ("narrow model-call wrapper; persisted through the returned
    stream"): the request it passes on is what the model sees, the stream it returns is what
    is committed.

    Breaks with: phases.call_model passing `prepared` to model_call directly (no wrapper)."""

    class Wrapper(AgentLifecycle):
        async def around_model_call(
            self, ctx: StepContext, request: ModelRequest, call: ModelCall
        ) -> AsyncIterator[ModelDelta]:
            stream = await call(request.model_copy(update={"instructions": "wrapped"}))

            async def suffixed() -> AsyncIterator[Any]:
                async for delta in stream:
                    yield delta
                for delta in text_response(" (checked)", usage=None)[:-1]:
                    yield delta

            return suffixed()

    model = ScriptedModel([text_response("answer")])
    rt = await runtime_for(Agent(model=model, lifecycle=Wrapper()))
    thread_id = await start(rt)
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert model.calls[0].instructions == "wrapped"
    assert first_text(done.messages[-1]) == "answer (checked)"


# --- beforeToolCall ---------------------------------------------------------------------------


async def test_before_tool_call_changes_tool_input_only(runtime_for: RuntimeFactory) -> None:
    """Row `beforeToolCall` ("tool input only; continue, replace input, skip or reject"): a
    replaced input is what the tool runs with and what the tool part stores.

    Breaks with: ToolPhase.run_calls dropping `self.parts[index] = part` after ReplaceInput."""
    from runtime.lifecycle import ReplaceInput

    ran: list[int] = []

    @tool
    async def work(args: Args) -> int:
        ran.append(args.n)
        return args.n

    class Clamp(AgentLifecycle):
        async def before_tool_call(
            self, ctx: ToolCallContext, call: ToolCall
        ) -> BeforeToolDecision | None:
            return ReplaceInput({"n": min(call.input["n"], 10)})

    model = ScriptedModel([tool_call_response("work", {"n": 99}, "w1"), text_response("ok")])
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=Clamp()))
    thread_id = await start(rt)
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert ran == [10]
    [part] = tool_parts(done, 1)
    assert (part.input, part.output) == ({"n": 10}, 10)


# --- afterToolResult --------------------------------------------------------------------------


async def test_after_tool_result_normalises_failures_and_manual_results(
    runtime_for: RuntimeFactory,
) -> None:
    """Row `afterToolResult` ("normalizes any tool result before the model sees it"): it runs
    on a tool failure and on a manual result, and its replacement is what is committed and
    what the next step sees.

    Breaks with: ToolPhase._finish ignoring `changed` (keeping the raw result)."""
    seen: list[tuple[str, ToolState]] = []

    @tool
    async def explode(args: Args) -> int:
        raise ValueError("boom")

    class Normalise(AgentLifecycle):
        async def after_tool_result(
            self, ctx: ToolCallContext, result: ToolResult
        ) -> ToolResult | None:
            seen.append((ctx.tool_name, result.state))
            if result.state is ToolState.OUTPUT_ERROR:
                return ToolResult(ToolState.OUTPUT_ERROR, error="the tool is unavailable")
            return ToolResult(result.state, output={"normalised": result.output})

    calls = [ScriptedToolCall("explode", {}, "e1"), ScriptedToolCall("lookup", {"n": 2}, "l1")]
    model = ScriptedModel([tool_calls_response(*calls), text_response("done")])
    agent = Agent(model=model, tools=[explode, manual_tool("lookup", Args)], lifecycle=Normalise())
    rt = await runtime_for(agent)
    thread_id = await start(rt)
    waiting = await rt.wait_status(thread_id, RunStatus.WAITING)
    action = waiting.pending_actions[0]
    await rt.service.resume_action(BACKEND, thread_id, action.id, {"output": 42}, kind=MANUAL)
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    failed, manual = tool_parts(done, 1)
    assert (failed.state, failed.error) == (ToolState.OUTPUT_ERROR, "the tool is unavailable")
    assert (manual.state, manual.output) == (ToolState.OUTPUT_AVAILABLE, {"normalised": 42})
    assert seen == [("explode", ToolState.OUTPUT_ERROR), ("lookup", ToolState.OUTPUT_AVAILABLE)]


async def test_after_tool_result_failure_cancels_siblings_once(runtime_for: RuntimeFactory) -> None:
    """Row `afterToolResult` with a thrown error: the run fails, a sibling still executing is
    cancelled (its side effect never happens, nothing says output-available), and every call
    gets exactly one after_tool_result.

    Breaks with: toolcalls._all using `asyncio.gather(*work)` instead of a TaskGroup."""
    calls_seen: list[str] = []
    side_effects: list[str] = []
    started = asyncio.Event()

    @tool
    async def fast(args: Args) -> int:
        await asyncio.wait_for(started.wait(), 5)
        return 1

    @tool
    async def slow(args: Args) -> int:
        started.set()
        await asyncio.sleep(0.5)
        side_effects.append("charged the card")
        return 2

    class Fragile(AgentLifecycle):
        async def after_tool_result(
            self, ctx: ToolCallContext, result: ToolResult
        ) -> ToolResult | None:
            calls_seen.append(ctx.tool_call_id)
            if ctx.tool_name == "fast":
                raise RuntimeError("normaliser crashed")
            return None

    calls = [ScriptedToolCall("fast", {}, "f1"), ScriptedToolCall("slow", {}, "s1")]
    model = ScriptedModel([tool_calls_response(*calls)])
    rt = await runtime_for(Agent(model=model, tools=[fast, slow], lifecycle=Fragile()))
    thread_id = await rt.thread()
    async with rt.record(thread_id) as rec:
        await rt.service.send_message(ALICE, thread_id, "go")
        failed = await rt.wait_status(thread_id, RunStatus.FAILED)
        await asyncio.sleep(0.8)  # long enough for a leaked sibling to finish
    assert run_of(failed).error == "normaliser crashed"
    assert side_effects == []
    assert sorted(calls_seen) == ["f1", "s1"]
    states = [p.state for p in tool_parts(failed)]
    assert states == [ToolState.CANCELLED, ToolState.CANCELLED]
    published = [c["chunk"] for c in rec.chunks()]
    assert "output-available" not in [c.get("state") for c in published]


# --- transformStepStream ----------------------------------------------------------------------


async def test_transform_step_stream_error_fails_the_run(runtime_for: RuntimeFactory) -> None:
    """Row `transformStepStream` ("canonical stream boundary"): an error thrown in it fails the
    run; the text it had let through before the error is what the failed run committed.

    Breaks with: streaming.run_stream iterating `raw` instead of the transformed stream."""

    class Breaks(AgentLifecycle):
        def transform_step_stream(
            self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
        ) -> AsyncIterator[StreamChunk]:
            async def run() -> AsyncIterator[Any]:
                texts = 0
                async for chunk in stream:
                    if isinstance(chunk, TextDeltaChunk):
                        texts += 1
                        if texts == 2:
                            raise RuntimeError("redactor crashed")
                    yield chunk

            return run()

    model = ScriptedModel([text_response("fine then secret", chunks=3)])
    rt = await runtime_for(Agent(model=model, lifecycle=Breaks()))
    thread_id = await start(rt)
    failed = await rt.wait_status(thread_id, RunStatus.FAILED)
    assert run_of(failed).error == "redactor crashed"
    # split_text cuts "fine then secret" into "fine t", "hen s", "ecret".
    assert first_text(failed.messages[-1]) == "fine t"


# --- afterStep --------------------------------------------------------------------------------


async def test_after_step_replace_resets_the_next_step_context(runtime_for: RuntimeFactory) -> None:
    """Row `afterStep` ("can append or replace execution-local next-step model context"): a
    replace drops what earlier steps appended; nothing of it is persisted.

    Breaks with: phases._apply_after_step using `current` instead of `decision.replace`."""

    @tool
    async def work(args: Args) -> int:
        return args.n

    class Steer(AgentLifecycle):
        async def after_step(
            self, ctx: StepContext, result: StepResult
        ) -> AfterStepDecision | None:
            if result.step == 0:
                return AfterStepDecision(append=(note("first"),))
            return AfterStepDecision(replace=(note("only this"),))

    model = ScriptedModel(
        [
            tool_call_response("work", {"n": 1}, "w1"),
            tool_call_response("work", {"n": 2}, "w2"),
            text_response("done"),
        ]
    )
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=Steer()))
    thread_id = await start(rt)
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    systems = [[m for m in call.messages if m.role == "system"] for call in model.calls]
    assert systems == [[], [note("first")], [note("only this")]]
    assert all(m.role != "system" for m in done.messages)


async def test_after_step_runs_after_the_step_commit_and_before_the_run_transition(
    runtime_for: RuntimeFactory,
) -> None:
    """Row `afterStep` ("runs after the canonical step commit and before the run transition"):
    the hook finds the step's message committed and the run still running, and the
    transition is a commit of its own after it. Without an after_step hook nothing runs
    between the two, so the last step's commit carries the transition: one version fewer,
    the same committed messages.

    Breaks with: EpisodeDeps.transition_with_step returning True whatever the lifecycle."""
    seen: list[tuple[RunStatus, list[str]]] = []
    stores: list[Any] = []

    class Watch(AgentLifecycle):
        async def after_step(
            self, ctx: StepContext, result: StepResult
        ) -> AfterStepDecision | None:
            snapshot = await stores[0].snapshot(ctx.run.thread_id, [SCOPE])
            seen.append((snapshot.run.status, [m.role.value for m in snapshot.messages]))
            return None

    ended = []
    for lifecycle in (Watch(), AgentLifecycle()):
        model = ScriptedModel([text_response("the answer")])
        rt = await runtime_for(Agent(model=model, lifecycle=lifecycle))
        stores[:] = [rt.store]
        thread_id = await start(rt)
        ended.append(await rt.wait_status(thread_id, RunStatus.COMPLETED))
        model.assert_consumed()
        for worker in rt.workers:  # one store: the next agent's run is not this worker's
            await worker.stop()
        rt.workers.clear()
    assert seen == [(RunStatus.RUNNING, ["user", "assistant"])]
    watched, plain = ended
    assert [m.parts for m in plain.messages] == [m.parts for m in watched.messages]
    assert plain.thread.version == watched.thread.version - 1


# --- Commit -----------------------------------------------------------------------------------


async def test_commit_finalises_open_tool_parts_of_a_stopped_run(
    runtime_for: RuntimeFactory,
) -> None:
    """Row `Commit` ("the owner-fenced run/thread transition and any required terminal tool
    finalization"): a stop while a tool runs commits the call cancelled with the run.

    Breaks with: commits._close_parts returning `parts` unchanged when hooks are used."""
    running = asyncio.Event()

    @tool
    async def hang(args: Args) -> int:
        running.set()
        await asyncio.sleep(30)
        return 0

    model = ScriptedModel([tool_call_response("hang", {}, "h1")])
    rt = await runtime_for(Agent(model=model, tools=[hang]))
    thread_id = await start(rt)
    await asyncio.wait_for(running.wait(), 10)
    snapshot = await rt.store.snapshot(thread_id, [SCOPE])
    await rt.service.stop_run(ALICE, thread_id, run_of(snapshot).id)
    done = await rt.wait_status(thread_id, RunStatus.CANCELLED)
    assert [p.state for p in tool_parts(done)] == [ToolState.CANCELLED]


# --- skipped outputs and submitted results validate -------------------------------------------


class Balance(BaseModel):
    balance: int


async def test_skipped_outputs_and_submitted_results_validate(runtime_for: RuntimeFactory) -> None:
    """Rule "skipped outputs and submitted results still validate and run afterToolResult": a
    skipped output that does not match the tool's output model ends as output-error (after
    after_tool_result), and a manual result that does not is a 422 that changes nothing.

    Breaks with: toolcalls._validated reading `output_model = None`."""
    from runtime.errors import InvalidPayload

    seen: list[ToolState] = []

    @tool
    async def quote(args: Args) -> Balance:
        return Balance(balance=args.n)

    class Cache(AgentLifecycle):
        async def before_tool_call(
            self, ctx: ToolCallContext, call: ToolCall
        ) -> BeforeToolDecision | None:
            return Skip(output={"balance": "lots"}) if call.name == "quote" else None

        async def after_tool_result(
            self, ctx: ToolCallContext, result: ToolResult
        ) -> ToolResult | None:
            seen.append(result.state)
            return None

    calls = [ScriptedToolCall("quote", {"n": 1}, "q1"), ScriptedToolCall("ledger", {}, "l1")]
    model = ScriptedModel([tool_calls_response(*calls), text_response("done")])
    ledger = manual_tool("ledger", Args, output_model=Balance)
    rt = await runtime_for(Agent(model=model, tools=[quote, ledger], lifecycle=Cache()))
    thread_id = await start(rt)
    waiting = await rt.wait_status(thread_id, RunStatus.WAITING)
    action = waiting.pending_actions[0]
    with pytest.raises(InvalidPayload) as invalid:
        await rt.service.resume_action(
            BACKEND, thread_id, action.id, {"output": {"x": 1}}, kind=MANUAL
        )
    assert invalid.value.details["errors"][0]["loc"] == ["output", "balance"]
    unchanged = await rt.store.snapshot(thread_id, [SCOPE])
    assert unchanged.thread.version == waiting.thread.version
    await rt.service.resume_action(
        BACKEND, thread_id, action.id, {"output": {"balance": 5}}, kind=MANUAL
    )
    done = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    skipped, manual = tool_parts(done, 1)
    assert skipped.state is ToolState.OUTPUT_ERROR and "invalid tool output" in (
        skipped.error or ""
    )
    assert (manual.state, manual.output) == (ToolState.OUTPUT_AVAILABLE, {"balance": 5})
    # after_tool_result sees the validated result: the invalid skipped output as an error.
    assert seen == [ToolState.OUTPUT_ERROR, ToolState.OUTPUT_AVAILABLE]
