"""Ordering rules of compose_lifecycle for the run and model-step phases (spec: Ordering)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import pytest

from runtime.compose import as_lifecycle, compose_lifecycle, defines_hook
from runtime.domain import MessageRole, RunTrigger, TextPart
from runtime.lifecycle import (
    AfterStepDecision,
    AgentLifecycle,
    Block,
    ContextNext,
    ModelCall,
    PrepareRunDecision,
    Respond,
    RunContext,
    RuntimeContextInput,
    StepContext,
    StepResult,
)
from runtime.providers.model_api import (
    ContextMessage,
    FinishDelta,
    ModelDelta,
    ModelRequest,
    ProviderError,
    TextDelta,
)
from threadline_wire.chunks import StreamChunk, TextDeltaChunk

# --- builders -------------------------------------------------------------------------------


def run_ctx(state: Mapping[str, Any] | None = None) -> RunContext:
    return RunContext(
        thread_id="t1",
        scope="s1",
        run_id="r1",
        episode=1,
        started_by="u1",
        trigger=RunTrigger.MESSAGE,
        resumed=False,
        state=state if state is not None else {},
        thread_metadata={},
    )


def step_ctx() -> StepContext:
    return StepContext(run=run_ctx(), step=1, local={})


def message(text: str) -> ContextMessage:
    return ContextMessage(role=MessageRole.USER, parts=(TextPart(text=text),))


def texts(messages: Iterable[ContextMessage]) -> list[str]:
    return [part.text for m in messages for part in m.parts if isinstance(part, TextPart)]


def model_request(instructions: str = "") -> ModelRequest:
    return ModelRequest(instructions=instructions, messages=(message("hi"),))


async def stream_of(*items: Any) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


# --- runtime_context ------------------------------------------------------------------------


async def test_runtime_context_runs_in_order_and_later_keys_win() -> None:
    log: list[str] = []

    class Layer:
        def __init__(self, name: str, state: Mapping[str, Any] | None) -> None:
            self.name, self.state = name, state

        async def runtime_context(self, inp: RuntimeContextInput) -> Mapping[str, Any] | None:
            log.append(self.name)
            return self.state

    composed = compose_lifecycle(
        Layer("a", {"k": "a", "a": 1}), Layer("b", None), Layer("c", {"k": "c"})
    )
    inp = RuntimeContextInput("t1", "s1", "r1", 1, "u1", {})
    assert await composed.runtime_context(inp) == {"k": "c", "a": 1}
    assert log == ["a", "b", "c"]
    assert await compose_lifecycle(Layer("d", None)).runtime_context(inp) is None


# --- resolveModelContext is middleware with a memoized next ---------------------------------


class ContextLayer:
    """Prepends its name to whatever the inner chain resolves, logging around `next`."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    async def resolve_model_context(
        self, ctx: RunContext, next: ContextNext
    ) -> list[ContextMessage]:
        self.log.append(f"{self.name}:before")
        inner = await next()
        self.log.append(f"{self.name}:after")
        return [message(self.name), *inner]


def leaf(log: list[str]) -> ContextNext:
    async def durable_context() -> list[ContextMessage]:
        log.append("leaf")
        return [message("durable")]

    return durable_context


async def test_resolve_model_context_is_middleware_a_outermost_c_closest_to_leaf() -> None:
    log: list[str] = []
    composed = compose_lifecycle(*(ContextLayer(name, log) for name in "abc"))
    result = await composed.resolve_model_context(run_ctx(), leaf(log))
    assert texts(result) == ["a", "b", "c", "durable"]
    assert log == ["a:before", "b:before", "c:before", "leaf", "c:after", "b:after", "a:after"]


async def test_resolve_model_context_next_is_memoized() -> None:
    log: list[str] = []
    seen: list[list[ContextMessage]] = []

    class CallsNextTwice:
        async def resolve_model_context(
            self, ctx: RunContext, next: ContextNext
        ) -> list[ContextMessage]:
            first = await next()
            first.append(message("mutated by a"))
            second = await next()
            seen.extend([first, second])
            return second

    composed = compose_lifecycle(CallsNextTwice(), ContextLayer("b", log))
    result = await composed.resolve_model_context(run_ctx(), leaf(log))
    # The inner chain and the leaf ran once; the second call got an unmutated copy.
    assert log == ["b:before", "leaf", "b:after"]
    assert texts(result) == ["b", "durable"]
    assert seen[0] is not seen[1]


async def test_resolve_model_context_memoizes_a_failing_inner_chain() -> None:
    calls: list[str] = []

    async def failing_leaf() -> list[ContextMessage]:
        calls.append("leaf")
        raise RuntimeError("storage down")

    class RetriesNext:
        async def resolve_model_context(
            self, ctx: RunContext, next: ContextNext
        ) -> list[ContextMessage]:
            for _ in range(2):
                with pytest.raises(RuntimeError, match="storage down"):
                    await next()
            return [message("fallback")]

    result = await compose_lifecycle(RetriesNext()).resolve_model_context(run_ctx(), failing_leaf)
    assert texts(result) == ["fallback"]
    assert calls == ["leaf"]


async def test_resolve_model_context_layer_may_not_call_next() -> None:
    log: list[str] = []

    class Cached:
        async def resolve_model_context(
            self, ctx: RunContext, next: ContextNext
        ) -> list[ContextMessage]:
            log.append("b:cached")
            return [message("cached")]

    composed = compose_lifecycle(ContextLayer("a", log), Cached(), ContextLayer("c", log))
    result = await composed.resolve_model_context(run_ctx(), leaf(log))
    assert texts(result) == ["a", "cached"]
    assert log == ["a:before", "b:cached", "a:after"]


# --- prepareRun accumulates without mutating the shared input -------------------------------


async def test_prepare_run_runs_a_b_c_and_accumulates_without_mutating_shared_input() -> None:
    seen: list[tuple[str, RunContext]] = []

    class Guard:
        def __init__(self, name: str, decision: PrepareRunDecision | None) -> None:
            self.name, self.decision = name, decision

        async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
            seen.append((self.name, ctx))
            return self.decision

    a_context = {"x": "a", "y": "a"}
    composed = compose_lifecycle(
        Guard("a", PrepareRunDecision(context=a_context)),
        Guard("b", PrepareRunDecision(context={"y": "b"}, respond=Respond("quota hit"))),
        Guard("none", None),
        Guard("c", PrepareRunDecision(context={"z": "c"}, respond=Respond("cache hit"))),
    )
    ctx = run_ctx(MappingProxyType({"quota": 3}))
    decision = await composed.prepare_run(ctx)
    # The short-circuit rule: the first respond ends the phase with the contexts so far.
    quota = Respond("quota hit")
    assert decision == PrepareRunDecision(context={"x": "a", "y": "b"}, respond=quota)
    assert [name for name, _ in seen] == ["a", "b"]
    no_respond = compose_lifecycle(
        Guard("a", PrepareRunDecision(context=a_context)), Guard("none", None)
    )
    assert await no_respond.prepare_run(ctx) == PrepareRunDecision(context=a_context)
    assert [name for name, _ in seen] == ["a", "b", "a", "none"]
    assert all(got is ctx for _, got in seen)
    assert ctx == run_ctx(MappingProxyType({"quota": 3}))
    assert a_context == {"x": "a", "y": "a"}
    assert await compose_lifecycle(Guard("d", None)).prepare_run(ctx) is None


# --- prepareModelStep passes the patched request on -----------------------------------------


class StepPatch:
    def __init__(self, name: str, log: list[tuple[str, str]], decision: object = "patch") -> None:
        self.name, self.log, self.decision = name, log, decision

    async def prepare_model_step(
        self, ctx: StepContext, request: ModelRequest
    ) -> ModelRequest | Respond | Block | None:
        self.log.append((self.name, request.instructions))
        if self.decision == "patch":
            return request.model_copy(update={"instructions": request.instructions + self.name})
        return self.decision  # type: ignore[return-value]


async def test_prepare_model_step_passes_patched_request_to_later_hooks() -> None:
    log: list[tuple[str, str]] = []
    original = model_request(">")
    composed = compose_lifecycle(
        StepPatch("a", log), StepPatch("b", log, None), StepPatch("c", log)
    )
    result = await composed.prepare_model_step(step_ctx(), original)
    assert isinstance(result, ModelRequest)
    assert result.instructions == ">ac"
    assert log == [("a", ">"), ("b", ">a"), ("c", ">a")]
    assert original.instructions == ">"
    unchanged = compose_lifecycle(StepPatch("d", log, None))
    assert await unchanged.prepare_model_step(step_ctx(), original) is original


@pytest.mark.parametrize("stop", [Respond("cached answer"), Block("over quota")])
async def test_prepare_model_step_respond_or_block_short_circuits(stop: Respond | Block) -> None:
    log: list[tuple[str, str]] = []
    composed = compose_lifecycle(
        StepPatch("a", log), StepPatch("b", log, stop), StepPatch("c", log)
    )
    assert await composed.prepare_model_step(step_ctx(), model_request()) is stop
    assert [name for name, _ in log] == ["a", "b"]


# --- aroundModelCall wraps with a outermost -------------------------------------------------


class Wrapper:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    async def around_model_call(
        self, ctx: StepContext, request: ModelRequest, call: ModelCall
    ) -> AsyncIterator[ModelDelta]:
        self.log.append(f"{self.name}:before")
        patched = request.model_copy(update={"instructions": request.instructions + self.name})
        stream = await call(patched)
        self.log.append(f"{self.name}:after")
        return stream


def underlying(log: list[str], *deltas: ModelDelta) -> ModelCall:
    async def call(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        log.append("call")
        return stream_of(TextDelta(text=request.instructions), *deltas)

    return call


async def test_around_model_call_wraps_a_outermost_c_closest_to_call() -> None:
    log: list[str] = []
    composed = compose_lifecycle(*(Wrapper(name, log) for name in "abc"))
    stream = await composed.around_model_call(step_ctx(), model_request(">"), underlying(log))
    assert await collect(stream) == [TextDelta(text=">abc")]
    assert log == ["a:before", "b:before", "c:before", "call", "c:after", "b:after", "a:after"]


async def test_around_model_call_may_catch_setup_failure_of_wrapped_call() -> None:
    log: list[str] = []

    async def refused(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        raise ProviderError("connection refused", retryable=True)

    class Fallback:
        async def around_model_call(
            self, ctx: StepContext, request: ModelRequest, call: ModelCall
        ) -> AsyncIterator[ModelDelta]:
            try:
                return await call(request)
            except ProviderError:
                return stream_of(TextDelta(text="fallback"), FinishDelta(reason="stop"))

    composed = compose_lifecycle(Wrapper("a", log), Fallback(), Wrapper("c", log))
    stream = await composed.around_model_call(step_ctx(), model_request(), refused)
    assert await collect(stream) == [TextDelta(text="fallback"), FinishDelta(reason="stop")]
    assert log == ["a:before", "c:before", "a:after"]


async def test_around_model_call_mid_stream_failure_needs_stream_aware_handling() -> None:
    log: list[str] = []

    async def breaks_mid_stream(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        async def deltas() -> AsyncIterator[ModelDelta]:
            yield TextDelta(text="par")
            raise ProviderError("stream reset")

        return deltas()

    class StreamAware:
        async def around_model_call(
            self, ctx: StepContext, request: ModelRequest, call: ModelCall
        ) -> AsyncIterator[ModelDelta]:
            stream = await call(request)

            async def guarded() -> AsyncIterator[ModelDelta]:
                try:
                    async for delta in stream:
                        yield delta
                except ProviderError:
                    yield FinishDelta(reason="error")

            return guarded()

    # Wrapper "c" only guards setup: the failure passes it during iteration and reaches "b".
    composed = compose_lifecycle(Wrapper("a", log), StreamAware(), Wrapper("c", log))
    stream = await composed.around_model_call(step_ctx(), model_request(), breaks_mid_stream)
    assert log == ["a:before", "c:before", "c:after", "a:after"]
    assert await collect(stream) == [TextDelta(text="par"), FinishDelta(reason="error")]

    unguarded = compose_lifecycle(Wrapper("a", log), Wrapper("c", log))
    stream = await unguarded.around_model_call(step_ctx(), model_request(), breaks_mid_stream)
    with pytest.raises(ProviderError, match="stream reset"):
        await collect(stream)


async def test_around_model_call_accepts_an_async_generator_layer() -> None:
    log: list[str] = []

    class Tagger:
        async def around_model_call(
            self, ctx: StepContext, request: ModelRequest, call: ModelCall
        ) -> AsyncIterator[ModelDelta]:
            async for delta in await call(request):
                yield delta
            yield FinishDelta(reason="tagged")

    composed = compose_lifecycle(Wrapper("a", log), Tagger(), Wrapper("c", log))
    stream = await composed.around_model_call(step_ctx(), model_request(">"), underlying(log))
    # A generator layer defers its inner setup to iteration, so "a:after" comes first.
    assert log == ["a:before", "a:after"]
    assert await collect(stream) == [TextDelta(text=">ac"), FinishDelta(reason="tagged")]
    assert log == ["a:before", "a:after", "c:before", "call", "c:after"]


# --- transformStepStream is c(b(a(stream))) -------------------------------------------------


async def test_transform_step_stream_passes_transformed_stream_to_later_hooks() -> None:
    log: list[str] = []

    class Transform:
        def __init__(self, name: str) -> None:
            self.name = name

        async def transform_step_stream(
            self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
        ) -> AsyncIterator[StreamChunk]:
            async for chunk in stream:
                assert isinstance(chunk, TextDeltaChunk)
                log.append(f"{self.name} saw {chunk.delta}")
                yield TextDeltaChunk(delta=chunk.delta.replace("secret", "***") + self.name)

    composed = compose_lifecycle(Transform("a"), object(), Transform("b"), Transform("c"))
    stream = composed.transform_step_stream(step_ctx(), stream_of(TextDeltaChunk(delta="secret")))
    assert await collect(stream) == [TextDeltaChunk(delta="***abc")]
    assert log == ["a saw secret", "b saw ***a", "c saw ***ab"]


async def test_transform_step_stream_rejects_a_coroutine_hook() -> None:
    class Mistaken:
        async def transform_step_stream(
            self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
        ) -> AsyncIterator[StreamChunk]:
            return stream

    with pytest.raises(TypeError, match="transform_step_stream"):
        compose_lifecycle(Mistaken()).transform_step_stream(step_ctx(), stream_of())


# --- afterStep accumulates without mutating the shared input --------------------------------


def next_step_extra(current: tuple[ContextMessage, ...], d: AfterStepDecision) -> list[str]:
    """The documented meaning of a composed decision for the next step's extra context."""
    return texts((d.replace if d.replace is not None else current) + d.append)


async def test_after_step_runs_a_b_c_and_accumulates_without_mutating_shared_input() -> None:
    seen: list[tuple[str, StepResult]] = []

    class Observer:
        def __init__(self, name: str, decision: AfterStepDecision | None) -> None:
            self.name, self.decision = name, decision

        async def after_step(self, ctx: StepContext, result: StepResult) -> AfterStepDecision:
            seen.append((self.name, result))
            return self.decision  # type: ignore[return-value]

    result = StepResult(step=1, text="ok", tool_results=(), finish_reason="stop", continues=True)
    composed = compose_lifecycle(
        Observer("a", AfterStepDecision(append=(message("a1"),))),
        Observer("b", AfterStepDecision(replace=(message("b-summary"),))),
        Observer("none", None),
        Observer("c", AfterStepDecision(append=(message("c1"), message("c2")))),
    )
    decision = await composed.after_step(step_ctx(), result)
    assert decision is not None
    # b's replace dropped a's earlier append; c's append lands after the replacement.
    assert texts(decision.replace or ()) == ["b-summary"]
    assert texts(decision.append) == ["c1", "c2"]
    assert next_step_extra((message("old"),), decision) == ["b-summary", "c1", "c2"]
    assert [name for name, _ in seen] == ["a", "b", "none", "c"]
    assert all(got is result for _, got in seen)

    appends_only = compose_lifecycle(
        Observer("a", AfterStepDecision(append=(message("a1"),))),
        Observer("c", AfterStepDecision(append=(message("c1"),))),
    )
    decision = await appends_only.after_step(step_ctx(), result)
    assert decision is not None and decision.replace is None
    assert next_step_extra((message("old"),), decision) == ["old", "a1", "c1"]
    assert await compose_lifecycle(Observer("d", None)).after_step(step_ctx(), result) is None


# --- defines_hook: which hooks can do anything --------------------------------------------


def test_defines_hook_ignores_the_no_op_defaults_and_looks_into_compositions() -> None:
    class Steps(AgentLifecycle):
        async def after_step(self, ctx: StepContext, result: StepResult) -> None:
            return None

    class Duck:
        async def after_step(self, ctx: StepContext, result: StepResult) -> None:
            return None

    class Other:
        async def prepare_run(self, ctx: RunContext) -> None:
            return None

    assert not defines_hook(AgentLifecycle(), "after_step")
    assert defines_hook(Steps(), "after_step")
    assert defines_hook(Duck(), "after_step")
    assert not defines_hook(Other(), "after_step")
    assert not defines_hook(compose_lifecycle(AgentLifecycle(), Other()), "after_step")
    nested = compose_lifecycle(compose_lifecycle(Other(), AgentLifecycle()), Steps())
    assert defines_hook(nested, "after_step")
    assert defines_hook(compose_lifecycle(Other(), compose_lifecycle(Duck())), "after_step")
    assert not defines_hook(as_lifecycle(Other()), "after_step")
