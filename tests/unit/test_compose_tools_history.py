"""Ordering rules of compose_lifecycle for tool, history and error phases, nesting, duck typing."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from runtime.compose import HistoryRewrittenErrors, as_lifecycle, compose_lifecycle
from runtime.domain import MessageRole, RunTrigger, TextPart, ToolState
from runtime.lifecycle import (
    AfterStepDecision,
    AgentLifecycle,
    BeforeToolDecision,
    ContextNext,
    Continue,
    MetadataPatch,
    ModelCall,
    PrepareRunDecision,
    Reject,
    ReplaceInput,
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
from runtime.providers.model_api import ContextMessage, ModelDelta, ModelRequest, TextDelta
from threadline_wire.chunks import StreamChunk, TextDeltaChunk

# --- builders -------------------------------------------------------------------------------


def run_ctx() -> RunContext:
    return RunContext("t1", "s1", "r1", 1, "u1", RunTrigger.MESSAGE, False, {}, {})


def step_ctx() -> StepContext:
    return StepContext(run=run_ctx(), step=1, local={})


def tool_ctx() -> ToolCallContext:
    return ToolCallContext(step=step_ctx(), tool_call_id="call-1", tool_name="search")


def tool_call(**tool_input: Any) -> ToolCall:
    return ToolCall(tool_call_id="call-1", name="search", input=tool_input)


def rewrite_ctx() -> RewriteContext:
    return RewriteContext("t1", "s1", "regenerate", "m2", "u1", None, {}, {})


def rewrite_outcome() -> RewriteOutcome:
    return RewriteOutcome("t1", 7, "regenerate", "m2", "r2", ("m2",))


def message(text: str) -> ContextMessage:
    return ContextMessage(role=MessageRole.USER, parts=(TextPart(text=text),))


def done(output: Any) -> ToolResult:
    return ToolResult(state=ToolState.OUTPUT_AVAILABLE, output=output)


async def stream_of(*items: Any) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


# --- beforeToolCall passes the patched tool input on ----------------------------------------


class ToolGate:
    def __init__(self, name: str, log: list[tuple[str, Mapping[str, Any]]], decision: Any) -> None:
        self.name, self.log, self.decision = name, log, decision

    async def before_tool_call(self, ctx: ToolCallContext, call: ToolCall) -> BeforeToolDecision:
        self.log.append((self.name, call.input))
        assert (call.tool_call_id, call.name) == ("call-1", "search")
        if self.decision == "tag":
            return ReplaceInput({**call.input, self.name: True})
        return self.decision  # type: ignore[no-any-return]


async def test_before_tool_call_passes_replaced_input_to_later_hooks() -> None:
    log: list[tuple[str, Mapping[str, Any]]] = []
    original = tool_call(q="x")
    composed = compose_lifecycle(
        ToolGate("a", log, "tag"), ToolGate("b", log, Continue()), ToolGate("c", log, "tag")
    )
    decision = await composed.before_tool_call(tool_ctx(), original)
    assert decision == ReplaceInput({"q": "x", "a": True, "c": True})
    assert log == [("a", {"q": "x"}), ("b", {"q": "x", "a": True}), ("c", {"q": "x", "a": True})]
    assert original.input == {"q": "x"}
    unchanged = compose_lifecycle(ToolGate("d", log, None), ToolGate("e", log, Continue()))
    assert await unchanged.before_tool_call(tool_ctx(), original) == Continue()


@pytest.mark.parametrize("stop", [Skip(output={"cached": True}), Reject("not allowed")])
async def test_before_tool_call_skip_or_reject_short_circuits(stop: Skip | Reject) -> None:
    log: list[tuple[str, Mapping[str, Any]]] = []
    composed = compose_lifecycle(
        ToolGate("a", log, "tag"), ToolGate("b", log, stop), ToolGate("c", log, "tag")
    )
    decision = await composed.before_tool_call(tool_ctx(), tool_call(q="x"))
    # The short-circuit rule: the terminal decision with what earlier hooks contributed.
    assert decision == dataclasses.replace(stop, input={"q": "x", "a": True})
    assert [name for name, _ in log] == ["a", "b"]
    # Nobody patched: returned as is; a hook that sets the input itself keeps it.
    alone = compose_lifecycle(ToolGate("b", log, stop), ToolGate("c", log, "tag"))
    assert await alone.before_tool_call(tool_ctx(), tool_call(q="x")) is stop
    own = dataclasses.replace(stop, input={"q": "own"})
    chosen = compose_lifecycle(ToolGate("a", log, "tag"), ToolGate("b", log, own))
    assert await chosen.before_tool_call(tool_ctx(), tool_call(q="x")) is own


# --- afterToolResult passes the patched result on -------------------------------------------


async def test_after_tool_result_passes_replaced_result_to_later_hooks() -> None:
    log: list[tuple[str, Any]] = []

    class Normalizer:
        def __init__(self, name: str, changes: bool) -> None:
            self.name, self.changes = name, changes

        async def after_tool_result(
            self, ctx: ToolCallContext, result: ToolResult
        ) -> ToolResult | None:
            log.append((self.name, result.output))
            return done(f"{result.output}+{self.name}") if self.changes else None

    original = done("raw")
    composed = compose_lifecycle(
        Normalizer("a", True), Normalizer("b", False), Normalizer("c", True)
    )
    assert await composed.after_tool_result(tool_ctx(), original) == done("raw+a+c")
    assert log == [("a", "raw"), ("b", "raw+a"), ("c", "raw+a")]
    untouched = compose_lifecycle(Normalizer("d", False))
    assert await untouched.after_tool_result(tool_ctx(), original) is original


# --- prepareHistoryRewrite merges, historyRewritten aggregates ------------------------------


async def test_prepare_history_rewrite_runs_in_order_and_shallow_merges_patches() -> None:
    log: list[str] = []

    class Patcher:
        def __init__(self, name: str, patch: MetadataPatch | None) -> None:
            self.name, self.patch = name, patch

        async def prepare_history_rewrite(self, ctx: RewriteContext) -> MetadataPatch | None:
            log.append(self.name)
            return self.patch

    composed = compose_lifecycle(
        Patcher("a", MetadataPatch(public={"k": "a", "nested": {"a": 1}}, private={"p": "a"})),
        Patcher("b", None),
        Patcher("c", MetadataPatch(public={"nested": {"c": 1}}, private={"p": "c", "q": "c"})),
    )
    patch = await composed.prepare_history_rewrite(rewrite_ctx())
    # Shallow: c's "nested" replaces a's wholesale; public and private merge separately.
    assert patch == MetadataPatch(
        public={"k": "a", "nested": {"c": 1}}, private={"p": "c", "q": "c"}
    )
    assert log == ["a", "b", "c"]
    assert (
        await compose_lifecycle(Patcher("d", None)).prepare_history_rewrite(rewrite_ctx()) is None
    )


class Observer:
    def __init__(self, name: str, log: list[str], error: Exception | None = None) -> None:
        self.name, self.log, self.error = name, log, error

    async def history_rewritten(self, ctx: RewriteContext, outcome: RewriteOutcome) -> None:
        self.log.append(self.name)
        if self.error is not None:
            raise self.error


async def test_history_rewritten_runs_every_observer_and_aggregates_failures() -> None:
    log: list[str] = []
    b_error, d_error = ValueError("b failed"), KeyError("d failed")
    composed = compose_lifecycle(
        Observer("a", log),
        Observer("b", log, b_error),
        Observer("c", log),
        Observer("d", log, d_error),
    )
    with pytest.raises(HistoryRewrittenErrors) as caught:
        await composed.history_rewritten(rewrite_ctx(), rewrite_outcome())
    assert log == ["a", "b", "c", "d"]
    assert list(caught.value.exceptions) == [b_error, d_error]
    assert isinstance(caught.value, ExceptionGroup)
    values, _ = caught.value.split(ValueError)
    assert isinstance(values, HistoryRewrittenErrors)
    # Returns None: its signature says so and mypy checks the composition against it.
    await compose_lifecycle(Observer("e", log)).history_rewritten(rewrite_ctx(), rewrite_outcome())


# --- thrown errors propagate ----------------------------------------------------------------


async def test_thrown_errors_from_other_hooks_propagate_and_stop_later_hooks() -> None:
    log: list[str] = []

    class Fails:
        async def prepare_run(self, ctx: RunContext) -> None:
            log.append("b")
            raise RuntimeError("quota service down")

    class Later:
        async def prepare_run(self, ctx: RunContext) -> None:
            log.append("c")

    with pytest.raises(RuntimeError, match="quota service down"):
        await compose_lifecycle(object(), Fails(), Later()).prepare_run(run_ctx())
    assert log == ["b"]


async def test_a_decision_of_the_wrong_type_is_a_type_error() -> None:
    class Confused:
        async def before_tool_call(self, ctx: ToolCallContext, call: ToolCall) -> object:
            return {"q": "not a decision"}

    with pytest.raises(TypeError, match="before_tool_call"):
        await compose_lifecycle(Confused()).before_tool_call(tool_ctx(), tool_call())


# --- nesting and duck typing ----------------------------------------------------------------


class Full(AgentLifecycle):
    """Overrides every hook with an observable, name-tagged effect."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    async def runtime_context(self, inp: RuntimeContextInput) -> Mapping[str, Any]:
        return {"k": self.name, self.name: 1}

    async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision:
        respond = None if self.name == "a" else Respond(self.name)
        return PrepareRunDecision(context={"k": self.name}, respond=respond)

    async def resolve_model_context(
        self, ctx: RunContext, next: ContextNext
    ) -> list[ContextMessage]:
        self.log.append(f"{self.name}:context")
        inner = await next()
        assert await next() == inner  # memoized: the leaf still runs once (see the log)
        return [message(self.name), *inner]

    async def prepare_model_step(self, ctx: StepContext, request: ModelRequest) -> ModelRequest:
        return request.model_copy(update={"instructions": request.instructions + self.name})

    async def around_model_call(
        self, ctx: StepContext, request: ModelRequest, call: ModelCall
    ) -> AsyncIterator[ModelDelta]:
        self.log.append(f"{self.name}:before")
        stream = await call(request.model_copy(update={"instructions": request.instructions + "!"}))
        self.log.append(f"{self.name}:after")
        return stream

    async def before_tool_call(self, ctx: ToolCallContext, call: ToolCall) -> ReplaceInput:
        return ReplaceInput({**call.input, "path": f"{call.input.get('path', '')}{self.name}"})

    async def after_tool_result(self, ctx: ToolCallContext, result: ToolResult) -> ToolResult:
        return done(f"{result.output}{self.name}")

    async def transform_step_stream(
        self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
    ) -> AsyncIterator[StreamChunk]:
        async for chunk in stream:
            assert isinstance(chunk, TextDeltaChunk)
            yield TextDeltaChunk(delta=chunk.delta + self.name)

    async def after_step(self, ctx: StepContext, result: StepResult) -> AfterStepDecision:
        if self.name == "b":
            return AfterStepDecision(replace=(message("b"),), append=(message("b+"),))
        return AfterStepDecision(append=(message(self.name),))

    async def prepare_history_rewrite(self, ctx: RewriteContext) -> MetadataPatch:
        return MetadataPatch(public={"k": self.name}, private={self.name: 1})

    async def history_rewritten(self, ctx: RewriteContext, outcome: RewriteOutcome) -> None:
        self.log.append(f"{self.name}:rewritten")
        if self.name != "a":
            raise ValueError(self.name)


async def exercise(lifecycle: AgentLifecycle, log: list[str]) -> list[Any]:
    """Call every hook once; return every observable result (errors by message)."""

    async def durable() -> list[ContextMessage]:
        log.append("leaf")
        return [message("durable")]

    async def model(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        log.append("call")
        return stream_of(TextDelta(text=request.instructions))

    step = StepResult(step=1, text="", tool_results=(), finish_reason="stop", continues=False)
    inp = RuntimeContextInput("t1", "s1", "r1", 1, "u1", {})
    results: list[Any] = [
        await lifecycle.runtime_context(inp),
        await lifecycle.prepare_run(run_ctx()),
        await lifecycle.resolve_model_context(run_ctx(), durable),
        await lifecycle.prepare_model_step(step_ctx(), ModelRequest(messages=())),
        await collect(
            await lifecycle.around_model_call(step_ctx(), ModelRequest(messages=()), model)
        ),
        await lifecycle.before_tool_call(tool_ctx(), tool_call()),
        await lifecycle.after_tool_result(tool_ctx(), done("raw")),
        await collect(
            lifecycle.transform_step_stream(step_ctx(), stream_of(TextDeltaChunk(delta="")))
        ),
        await lifecycle.after_step(step_ctx(), step),
        await lifecycle.prepare_history_rewrite(rewrite_ctx()),
    ]
    with pytest.raises(HistoryRewrittenErrors) as caught:
        await lifecycle.history_rewritten(rewrite_ctx(), rewrite_outcome())
    return [*results, [str(error) for error in caught.value.exceptions], list(log)]


async def test_nested_compose_behaves_as_flat_compose() -> None:
    def build(shape: str) -> tuple[AgentLifecycle, list[str]]:
        log: list[str] = []
        a, b, c = (Full(name, log) for name in "abc")
        nested = {
            "flat": compose_lifecycle(a, b, c),
            "left": compose_lifecycle(compose_lifecycle(a, b), c),
            "right": compose_lifecycle(a, compose_lifecycle(b, c)),
        }
        return nested[shape], log

    flat = await exercise(*build("flat"))
    assert await exercise(*build("left")) == flat
    assert await exercise(*build("right")) == flat
    assert flat[:2] == [
        {"k": "c", "a": 1, "b": 1, "c": 1},
        # b's respond short-circuits: c's prepare_run does not run, at any nesting.
        PrepareRunDecision({"k": "b"}, Respond("b")),
    ]
    assert [part.text for m in flat[2] for part in m.parts] == ["a", "b", "c", "durable"]
    assert flat[3:5] == [ModelRequest(instructions="abc", messages=()), [TextDelta(text="!!!")]]
    assert flat[5:8] == [
        ReplaceInput({"path": "abc"}),
        done("rawabc"),
        [TextDeltaChunk(delta="abc")],
    ]
    assert flat[8] == AfterStepDecision(
        replace=(message("b"),), append=(message("b+"), message("c"))
    )
    assert flat[9] == MetadataPatch(public={"k": "c"}, private={"a": 1, "b": 1, "c": 1})
    assert flat[10] == ["b", "c"]
    assert flat[11] == [
        *["a:context", "b:context", "c:context", "leaf"],
        *["a:before", "b:before", "c:before", "call", "c:after", "b:after", "a:after"],
        *["a:rewritten", "b:rewritten", "c:rewritten"],
    ]


async def test_lifecycles_without_hooks_compose_to_no_ops() -> None:
    class NoHooks:
        prepare_run = "not callable, so not a hook"

    original_request, original_result = ModelRequest(messages=()), done("raw")
    stream = stream_of(TextDeltaChunk(delta="x"))
    model_stream = stream_of(TextDelta(text="m"))

    async def durable() -> list[ContextMessage]:
        return [message("durable")]

    async def model(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        return model_stream

    for lifecycle in (
        compose_lifecycle(),
        compose_lifecycle(object(), NoHooks()),
        as_lifecycle(NoHooks()),
    ):
        assert (
            await lifecycle.runtime_context(RuntimeContextInput("t1", "s1", "r1", 1, "u1", {}))
            is None
        )
        assert await lifecycle.prepare_run(run_ctx()) is None
        assert await lifecycle.resolve_model_context(run_ctx(), durable) == [message("durable")]
        assert await lifecycle.prepare_model_step(step_ctx(), original_request) is original_request
        assert (
            await lifecycle.around_model_call(step_ctx(), original_request, model) is model_stream
        )
        assert await lifecycle.before_tool_call(tool_ctx(), tool_call()) == Continue()
        assert await lifecycle.after_tool_result(tool_ctx(), original_result) is original_result
        assert lifecycle.transform_step_stream(step_ctx(), stream) is stream
        assert await lifecycle.after_step(step_ctx(), StepResult(1, "", (), None, False)) is None
        assert await lifecycle.prepare_history_rewrite(rewrite_ctx()) is None
        await lifecycle.history_rewritten(rewrite_ctx(), rewrite_outcome())  # -> None, typed


async def test_as_lifecycle_wraps_partial_objects_and_keeps_full_lifecycles() -> None:
    full = Full("a", [])
    assert as_lifecycle(full) is full

    class OnlyRewrite:
        async def prepare_history_rewrite(self, ctx: RewriteContext) -> MetadataPatch:
            return MetadataPatch(public={"title": None})

    wrapped = as_lifecycle(OnlyRewrite())
    assert isinstance(wrapped, AgentLifecycle)
    assert await wrapped.prepare_history_rewrite(rewrite_ctx()) == MetadataPatch(
        public={"title": None}
    )
    assert await wrapped.prepare_run(run_ctx()) is None
