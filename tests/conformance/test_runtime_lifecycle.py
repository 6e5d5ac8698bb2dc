"""Each lifecycle phase applied by the runtime, with exactly the capabilities of the spec."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import RunStatus, ToolCallPart, ToolState, Visibility
from runtime.errors import RunActive
from runtime.lifecycle import (
    AfterStepDecision,
    AgentLifecycle,
    BeforeToolDecision,
    Block,
    MetadataPatch,
    ModelCall,
    PrepareRunDecision,
    Reject,
    Respond,
    RewriteContext,
    RewriteOutcome,
    RunContext,
    RuntimeContextInput,
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
    text_response,
    tool_calls_response,
)
from runtime.tools import SuspendStep, tool
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, SCOPE, first_text, run_of, settled
from threadline_wire.chunks import StreamChunk, TextDeltaChunk

EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


class Upper(AgentLifecycle):
    def transform_step_stream(
        self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
    ) -> AsyncIterator[StreamChunk]:
        async def run() -> AsyncIterator[StreamChunk]:
            async for chunk in stream:
                if isinstance(chunk, TextDeltaChunk):
                    chunk = TextDeltaChunk(delta=chunk.delta.upper())
                yield chunk

        return run()


async def test_prepare_run_respond_passes_the_canonical_transform(
    runtime_for: RuntimeFactory,
) -> None:
    class Quota(Upper):
        async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
            return PrepareRunDecision(respond=Respond("quota exceeded"))

    rt = await runtime_for(Agent(model=ScriptedModel([]), lifecycle=Quota()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "hi")
    snapshot = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert first_text(snapshot.messages[-1]) == "QUOTA EXCEEDED"


async def test_prepare_model_step_block_with_and_without_response(
    runtime_for: RuntimeFactory,
) -> None:
    class Guard(AgentLifecycle):
        async def prepare_model_step(
            self, ctx: StepContext, request: ModelRequest
        ) -> ModelRequest | Respond | Block | None:
            text = first_text(request.messages[-1])
            if text == "polite":
                return Block("unsafe", response="I can't help with that.")
            return Block("unsafe")

    rt = await runtime_for(Agent(model=ScriptedModel([]), lifecycle=Guard()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "polite")
    snapshot = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert first_text(snapshot.messages[-1]) == "I can't help with that."
    other = await rt.thread()
    await rt.service.send_message(ALICE, other, "rude")
    failed = await rt.wait_status(other, RunStatus.FAILED)
    assert run_of(failed).error == "unsafe" and len(failed.messages) == 1


async def test_before_tool_call_skip_and_reject_still_run_after_tool_result(
    runtime_for: RuntimeFactory,
) -> None:
    executed: list[str] = []
    seen: list[tuple[str, ToolState]] = []

    class Args(BaseModel):
        n: int

    @tool
    async def work(args: Args) -> int:
        executed.append(str(args.n))
        return args.n

    class Policy(AgentLifecycle):
        async def before_tool_call(
            self, ctx: ToolCallContext, call: ToolCall
        ) -> BeforeToolDecision | None:
            executed.append(f"before:{call.input['n']}")
            if call.input["n"] == 1:
                return Skip(output="cached 1")
            if call.input["n"] == 2:
                return Reject("not allowed")
            return None

        async def after_tool_result(
            self, ctx: ToolCallContext, result: ToolResult
        ) -> ToolResult | None:
            seen.append((ctx.tool_call_id, result.state))
            return None

    calls = [ScriptedToolCall("work", {"n": n}, f"c{n}") for n in (1, 2, 3)]
    model = ScriptedModel([tool_calls_response(*calls), text_response("fine")])
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=Policy()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "go")
    snapshot = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    # Only call 3 executes; the order of hooks and several ready tools is tested by
    # test_runtime_spec_ordering.py::test_ordering_before_tool_call_runs_for_every_call_...
    assert executed == ["before:1", "before:2", "before:3", "3"]
    parts = [p for p in snapshot.messages[1].parts if isinstance(p, ToolCallPart)]
    assert [(p.state, p.output, p.error) for p in parts] == [
        (ToolState.SKIPPED, "cached 1", None),
        (ToolState.REJECTED, None, "not allowed"),
        (ToolState.OUTPUT_AVAILABLE, 3, None),
    ]
    assert sorted(seen) == [
        ("c1", ToolState.SKIPPED),
        ("c2", ToolState.REJECTED),
        ("c3", ToolState.OUTPUT_AVAILABLE),
    ]


async def test_after_step_context_reaches_only_the_next_model_step(
    runtime_for: RuntimeFactory,
) -> None:
    class Args(BaseModel):
        q: str

    @tool
    async def search(args: Args) -> str:
        return "result"

    note = ContextMessage(role="system", parts=({"type": "text", "text": "be brief"},))

    class Coach(AgentLifecycle):
        async def after_step(
            self, ctx: StepContext, result: StepResult
        ) -> AfterStepDecision | None:
            return AfterStepDecision(append=(note,))

    model = ScriptedModel(
        [tool_calls_response(ScriptedToolCall("search", {"q": "x"}, "s1")), text_response("ok")]
    )
    rt = await runtime_for(Agent(model=model, tools=[search], lifecycle=Coach()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "go")
    snapshot = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert model.calls[1].messages[-1] == note
    assert note not in model.calls[0].messages
    # Execution-local: never persisted.
    assert all(m.role != "system" for m in snapshot.messages)


async def test_model_context_skips_hidden_messages(runtime_for: RuntimeFactory) -> None:
    """Hidden messages never reach a model. (The anchor cap, with a message appended after the
    anchor while the step runs: test_runtime_spec_phases.py::test_resolve_model_context_...)"""
    model = ScriptedModel([text_response("one"), text_response("two")])
    rt = await runtime_for(Agent(model=model))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "first")
    first = await rt.wait_for(thread_id, settled)
    await rt.service.set_visibility(ALICE, thread_id, first.messages[0].id, Visibility.HIDDEN)
    await rt.service.send_message(ALICE, thread_id, "second")
    await rt.wait_for(thread_id, lambda s: settled(s) and len(s.messages) == 3)
    texts = [first_text(m) for m in model.calls[1].messages]
    assert texts == ["one", "second"]


async def test_around_model_call_may_catch_setup_failures(runtime_for: RuntimeFactory) -> None:
    class Fallback(AgentLifecycle):
        async def around_model_call(
            self, ctx: StepContext, request: ModelRequest, call: ModelCall
        ) -> AsyncIterator[ModelDelta]:
            try:
                return await call(request)
            except ProviderError:

                async def canned() -> AsyncIterator[ModelDelta]:
                    for delta in text_response("fallback answer"):
                        yield delta

                return canned()

    model = ScriptedModel([ProviderError("503 at setup", retryable=True)])
    rt = await runtime_for(Agent(model=model, lifecycle=Fallback()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "hi")
    snapshot = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert first_text(snapshot.messages[-1]) == "fallback answer"


async def test_prepare_run_and_runtime_context_run_again_on_resume(
    runtime_for: RuntimeFactory,
) -> None:
    episodes: list[tuple[int, bool, str]] = []

    class Approval(BaseModel):
        approved: bool

    class Args(BaseModel):
        x: int

    @tool(suspend=SuspendStep(Approval))
    async def act(args: Args) -> str:
        return "acted"

    class Track(AgentLifecycle):
        async def runtime_context(self, inp: RuntimeContextInput) -> Mapping[str, Any] | None:
            return {"tenant": inp.scope}

        async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
            episodes.append((ctx.episode, ctx.resumed, ctx.state["tenant"]))
            return None

    model = ScriptedModel(
        [tool_calls_response(ScriptedToolCall("act", {"x": 1}, "a1")), text_response("done")]
    )
    rt = await runtime_for(Agent(model=model, tools=[act], lifecycle=Track()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "go")
    waiting = await rt.wait_status(thread_id, RunStatus.WAITING)
    await rt.service.resume_action(
        ALICE, thread_id, waiting.pending_actions[0].id, {"approved": True}
    )
    await rt.wait_status(thread_id, RunStatus.COMPLETED)
    assert episodes == [(1, False, SCOPE), (2, True, SCOPE)]


async def test_regenerate_and_visibility_rewrites_with_metadata_patches(
    runtime_for: RuntimeFactory,
) -> None:
    observed: list[str] = []

    class Rewrites(AgentLifecycle):
        async def prepare_history_rewrite(self, ctx: RewriteContext) -> MetadataPatch | None:
            return MetadataPatch(
                public={"last_rewrite": ctx.kind}, private={"by": ctx.requested_by}
            )

    class Flaky:
        async def history_rewritten(self, ctx: RewriteContext, outcome: RewriteOutcome) -> None:
            raise RuntimeError("webhook down")

    class Observer:
        async def history_rewritten(self, ctx: RewriteContext, outcome: RewriteOutcome) -> None:
            observed.append(f"{outcome.kind}:{outcome.version}")

    from runtime.compose import compose_lifecycle

    model = ScriptedModel([text_response("first try"), text_response("second try")])
    lifecycle = compose_lifecycle(Rewrites(), Flaky(), Observer())
    rt = await runtime_for(Agent(model=model, lifecycle=lifecycle))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "q")
    done = await rt.wait_for(thread_id, settled)
    result = await rt.service.regenerate(ALICE, thread_id)
    assert result.removed_message_ids == (done.messages[1].id,)
    again = await rt.wait_for(
        thread_id, lambda s: settled(s) and first_text(s.messages[-1]) == "second try"
    )
    assert again.thread.metadata["last_rewrite"] == "regenerate"
    thread = await rt.store.get_thread(thread_id, [SCOPE])
    assert thread.private_metadata == {"by": "alice"}
    # The failing observer did not stop the next one, nor undo the rewrite.
    assert observed == [f"regenerate:{result.version}"]
    hidden = await rt.service.set_visibility(
        ALICE, thread_id, again.messages[0].id, Visibility.HIDDEN
    )
    after = await rt.store.snapshot(thread_id, [SCOPE])
    assert after.thread.version == hidden.version
    assert after.thread.metadata["last_rewrite"] == "visibility"
    assert [m.id for m in after.messages] == [again.messages[1].id]
    everything = await rt.store.snapshot(thread_id, [SCOPE], include_hidden=True)
    assert [(m.id, m.visibility) for m in everything.messages] == [
        (again.messages[0].id, Visibility.HIDDEN),
        (again.messages[1].id, Visibility.VISIBLE),
    ]


async def test_rewrite_during_an_active_run_is_refused(runtime_for: RuntimeFactory) -> None:
    release = asyncio.Event()

    class Gate(AgentLifecycle):
        async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
            await asyncio.wait_for(release.wait(), 10)
            return None

    rt = await runtime_for(Agent(model=ScriptedModel([text_response("x")]), lifecycle=Gate()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "q")
    snapshot = await rt.wait_status(thread_id, RunStatus.RUNNING)
    with pytest.raises(RunActive):
        await rt.service.set_visibility(
            ALICE, thread_id, snapshot.messages[0].id, Visibility.HIDDEN
        )
    release.set()
    await rt.wait_for(thread_id, settled)


async def test_demo_redaction_never_leaks_an_address(runtime_for: RuntimeFactory) -> None:
    from runtime.demo import demo_agent

    rt = await runtime_for(demo_agent())
    thread_id = await rt.thread()
    async with rt.record(thread_id) as rec:
        await rt.service.send_message(ALICE, thread_id, "please repeat carol.smith@example.org ok")
        snapshot = await rt.wait_for(thread_id, settled)
    assert "[redacted email]" in rec.text()
    for frame in rec.chunks():
        assert not EMAIL.search(str(frame["chunk"].get("delta", "")))
    assistant = [m for m in snapshot.messages if m.role == "assistant"]
    assert assistant and all(not EMAIL.search(first_text(m)) for m in assistant)


async def test_redaction_split_across_chunks_reaches_no_chunk_store_or_next_step(
    runtime_for: RuntimeFactory,
) -> None:
    from runtime.demo.redact import RedactEmails

    secret = "dana.lee@example.com"
    # The address is cut into many small deltas so it straddles chunk boundaries.
    model = ScriptedModel(
        [text_response(f"Write to {secret} today.", chunks=12), text_response("noted")]
    )
    rt = await runtime_for(Agent(model=model, lifecycle=RedactEmails()))
    thread_id = await rt.thread()
    async with rt.record(thread_id) as rec:
        await rt.service.send_message(ALICE, thread_id, "who?")
        await rt.wait_for(thread_id, settled)
        await rt.service.send_message(ALICE, thread_id, "thanks")
        snapshot = await rt.wait_for(thread_id, lambda s: settled(s) and len(s.messages) == 4)
    deltas = [c["chunk"].get("delta", "") for c in rec.chunks()]
    assert all("@" not in d for d in deltas)
    assert rec.text().startswith("Write to [redacted email] today.")
    assert first_text(snapshot.messages[1]) == "Write to [redacted email] today."
    seen_by_model = [first_text(m) for m in model.calls[1].messages]
    assert "Write to [redacted email] today." in seen_by_model
    assert not any(secret in text for text in seen_by_model)


async def test_a_run_failure_cancels_open_tool_parts_through_after_tool_result(
    runtime_for: RuntimeFactory,
) -> None:
    seen: list[tuple[str, ToolState]] = []

    class Args(BaseModel):
        n: int

    @tool
    async def work(args: Args) -> int:
        return args.n

    class Fragile(AgentLifecycle):
        async def before_tool_call(
            self, ctx: ToolCallContext, call: ToolCall
        ) -> BeforeToolDecision | None:
            if call.input["n"] == 2:
                raise RuntimeError("policy service down")
            return None

        async def after_tool_result(
            self, ctx: ToolCallContext, result: ToolResult
        ) -> ToolResult | None:
            seen.append((ctx.tool_call_id, result.state))
            return None

    calls = [ScriptedToolCall("work", {"n": n}, f"c{n}") for n in (1, 2)]
    model = ScriptedModel([tool_calls_response(*calls)])
    rt = await runtime_for(Agent(model=model, tools=[work], lifecycle=Fragile()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "go")
    snapshot = await rt.wait_status(thread_id, RunStatus.FAILED)
    assert "policy service down" in (run_of(snapshot).error or "")
    parts = [p for p in snapshot.messages[-1].parts if isinstance(p, ToolCallPart)]
    assert [p.state for p in parts] == [ToolState.CANCELLED, ToolState.CANCELLED]
    assert sorted(seen) == [("c1", ToolState.CANCELLED), ("c2", ToolState.CANCELLED)]
    assert snapshot.pending_actions == ()
