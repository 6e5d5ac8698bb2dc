"""Compose several lifecycles into one AgentLifecycle following the spec's Ordering rules."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

from runtime.lifecycle import (
    AfterStepDecision,
    AgentLifecycle,
    BeforeToolDecision,
    Block,
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
from runtime.providers.model_api import ContextMessage, ModelDelta, ModelRequest
from threadline_wire.chunks import StreamChunk

__all__ = ["HistoryRewrittenErrors", "as_lifecycle", "compose_lifecycle"]

D = TypeVar("D")


class HistoryRewrittenErrors(ExceptionGroup[Exception]):
    """Failures of history_rewritten observers, in observer order. Raised only after every
    observer ran; the rewrite has already committed, so the runtime reports it, never undoes."""

    # The ignore: typeshed's overloads also promise BaseException groups, which split()/subgroup()
    # never derive from a group that holds only Exceptions.
    def derive(self, excs: Sequence[Exception], /) -> HistoryRewrittenErrors:  # type: ignore[override]
        # Keep the type through split()/subgroup() so `except HistoryRewrittenErrors` still works.
        return HistoryRewrittenErrors(self.message, excs)


def compose_lifecycle(*lifecycles: object) -> AgentLifecycle:
    """Fold lifecycles into one; `a` is first/outermost and the last one is closest to the runtime.

    Each argument may be any object with any subset of the hook methods (missing hooks are
    skipped), an AgentLifecycle subclass, or another composed lifecycle. Composition is
    associative: compose(compose(a, b), c) behaves as compose(a, b, c).

    How each hook composes is documented on the hook itself, in runtime.lifecycle.AgentLifecycle
    ("Composed: ..."). An exception raised by a hook other than history_rewritten propagates at
    once and later hooks do not run (the runtime fails the run); a decision of the wrong type
    raises TypeError.
    """
    return _ComposedLifecycle(lifecycles)


def defines_hook(lifecycle: object, name: str) -> bool:
    """Whether `lifecycle` has a `name` hook that can do anything: AgentLifecycle's own no-op
    default does not count, and a composed lifecycle defines one when any of its parts does.
    (The runtime skips a step between phases that only such a hook could observe.)"""
    if isinstance(lifecycle, _ComposedLifecycle):
        return any(defines_hook(part, name) for part in lifecycle.lifecycles)
    hook = getattr(lifecycle, name, None)
    if not callable(hook):
        return False
    return getattr(hook, "__func__", None) is not getattr(AgentLifecycle, name, None)


def as_lifecycle(obj: object) -> AgentLifecycle:
    """A full AgentLifecycle for `obj`, so the runtime can call every hook unconditionally.

    An AgentLifecycle is returned as is; any other object is wrapped as compose_lifecycle(obj),
    so its missing hooks are no-ops. Note the wrapper's "unchanged" results are explicit
    (prepare_model_step returns the request, before_tool_call returns Continue(),
    after_tool_result returns the result) and history_rewritten failures arrive as
    HistoryRewrittenErrors.
    """
    if isinstance(obj, AgentLifecycle):
        return obj
    return _ComposedLifecycle((obj,))


class _MemoizedNext:
    """A `next` for one resolve_model_context layer: the inner chain runs at most once."""

    def __init__(self, inner: ContextNext) -> None:
        self._inner = inner
        # A lock rather than a shared task: the inner chain runs in the caller's task, so
        # cancelling one caller never cancels work another caller is waiting on.
        self._lock = asyncio.Lock()
        self._done = False
        self._result: tuple[ContextMessage, ...] = ()
        self._error: Exception | None = None

    async def __call__(self) -> list[ContextMessage]:
        async with self._lock:
            if not self._done:
                try:
                    self._result = tuple(await self._inner())
                except Exception as exc:
                    self._error = exc
                self._done = True
        if self._error is not None:
            raise self._error
        # A fresh list per call: a layer mutating its copy cannot affect another caller.
        return list(self._result)


def _wrong_decision(hook_name: str, decision: object) -> TypeError:
    return TypeError(f"{hook_name} returned an unexpected decision: {decision!r}")


class _ComposedLifecycle(AgentLifecycle):
    """The result of compose_lifecycle; each hook composes as its AgentLifecycle docstring says."""

    def __init__(self, lifecycles: Sequence[object]) -> None:
        self.lifecycles: tuple[object, ...] = tuple(lifecycles)

    def __repr__(self) -> str:
        return f"compose_lifecycle({', '.join(map(repr, self.lifecycles))})"

    def _hooks(self, name: str) -> list[Callable[..., Any]]:
        # Looked up per call (not cached at construction) so duck-typed objects behave exactly
        # as attribute access on them would.
        hooks = (getattr(lifecycle, name, None) for lifecycle in self.lifecycles)
        return [hook for hook in hooks if callable(hook)]

    async def runtime_context(self, inp: RuntimeContextInput) -> Mapping[str, Any] | None:
        merged: dict[str, Any] = {}
        returned = False
        for hook in self._hooks("runtime_context"):
            state = await hook(inp)
            if state is not None:
                merged.update(state)
                returned = True
        return merged if returned else None

    async def _decisions(self, name: str, kind: type[D], *args: object) -> list[D]:
        """The non-None decisions of every `name` hook, in order, each checked to be a `kind`.
        Every hook gets the same arguments (hooks that accumulate, not transform)."""
        decisions: list[D] = []
        for hook in self._hooks(name):
            decision = await hook(*args)
            if decision is None:
                continue
            if not isinstance(decision, kind):
                raise _wrong_decision(name, decision)
            decisions.append(decision)
        return decisions

    async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
        decisions: list[PrepareRunDecision] = []
        for hook in self._hooks("prepare_run"):
            decision = await hook(ctx)
            if decision is None:
                continue
            if not isinstance(decision, PrepareRunDecision):
                raise _wrong_decision("prepare_run", decision)
            decisions.append(decision)
            if decision.respond is not None:
                break  # the short-circuit rule: a terminal decision ends the phase
        if not decisions:
            return None
        # A fresh dict: merging into a hook's returned mapping would mutate that hook's state.
        context: dict[str, Any] = {}
        for decision in decisions:
            context.update(decision.context)
        return PrepareRunDecision(context=context, respond=decisions[-1].respond)

    async def resolve_model_context(
        self, ctx: RunContext, next: ContextNext
    ) -> list[ContextMessage]:
        chain: ContextNext = _MemoizedNext(next)
        for hook in reversed(self._hooks("resolve_model_context")):
            chain = _MemoizedNext(functools.partial(hook, ctx, chain))
        return await chain()

    async def prepare_model_step(
        self, ctx: StepContext, request: ModelRequest
    ) -> ModelRequest | Respond | Block | None:
        for hook in self._hooks("prepare_model_step"):
            decision = await hook(ctx, request)
            if decision is None:
                continue
            if isinstance(decision, Respond | Block):
                return decision
            if not isinstance(decision, ModelRequest):
                raise _wrong_decision("prepare_model_step", decision)
            request = decision
        return request

    async def around_model_call(
        self, ctx: StepContext, request: ModelRequest, call: ModelCall
    ) -> AsyncIterator[ModelDelta]:
        for hook in reversed(self._hooks("around_model_call")):
            call = _model_call_layer(hook, ctx, call)
        return await call(request)

    async def before_tool_call(
        self, ctx: ToolCallContext, call: ToolCall
    ) -> BeforeToolDecision | None:
        replaced = False
        for hook in self._hooks("before_tool_call"):
            decision = await hook(ctx, call)
            if decision is None or isinstance(decision, Continue):
                continue
            if isinstance(decision, Skip | Reject):
                # The short-circuit rule: the terminal decision with what earlier hooks
                # contributed (a redacted input must not be lost by a later rejection).
                if replaced and decision.input is None:
                    decision = dataclasses.replace(decision, input=call.input)
                return decision
            if not isinstance(decision, ReplaceInput):
                raise _wrong_decision("before_tool_call", decision)
            call = dataclasses.replace(call, input=decision.input)
            replaced = True
        return ReplaceInput(call.input) if replaced else Continue()

    async def after_tool_result(
        self, ctx: ToolCallContext, result: ToolResult
    ) -> ToolResult | None:
        for hook in self._hooks("after_tool_result"):
            replacement = await hook(ctx, result)
            if replacement is None:
                continue
            if not isinstance(replacement, ToolResult):
                raise _wrong_decision("after_tool_result", replacement)
            result = replacement
        return result

    def transform_step_stream(
        self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
    ) -> AsyncIterator[StreamChunk]:
        for hook in self._hooks("transform_step_stream"):
            transformed = hook(ctx, stream)
            if inspect.iscoroutine(transformed):
                # An `async def` returning a stream is a common slip; fail here with a clear
                # message rather than later with "object is not an async iterator".
                transformed.close()
                raise TypeError(
                    "transform_step_stream must be a plain method (or an async generator) "
                    "returning an async iterator, not a coroutine function"
                )
            stream = transformed
        return stream

    async def after_step(self, ctx: StepContext, result: StepResult) -> AfterStepDecision | None:
        decisions = await self._decisions("after_step", AfterStepDecision, ctx, result)
        if not decisions:
            return None
        replace: tuple[ContextMessage, ...] | None = None
        append: tuple[ContextMessage, ...] = ()
        for decision in decisions:
            if decision.replace is not None:
                replace, append = tuple(decision.replace), ()
            append += tuple(decision.append)
        return AfterStepDecision(append=append, replace=replace)

    async def prepare_history_rewrite(self, ctx: RewriteContext) -> MetadataPatch | None:
        patches = await self._decisions("prepare_history_rewrite", MetadataPatch, ctx)
        if not patches:
            return None
        public: dict[str, Any] = {}
        private: dict[str, Any] = {}
        for patch in patches:
            public.update(patch.public)
            private.update(patch.private)
        return MetadataPatch(public=public, private=private)

    async def history_rewritten(self, ctx: RewriteContext, outcome: RewriteOutcome) -> None:
        failures: list[Exception] = []
        for hook in self._hooks("history_rewritten"):
            try:
                await hook(ctx, outcome)
            except HistoryRewrittenErrors as group:
                # Flatten a nested composite's group so nesting stays associative.
                failures.extend(group.exceptions)
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise HistoryRewrittenErrors("history_rewritten observers failed", failures)


def _model_call_layer(hook: Callable[..., Any], ctx: StepContext, inner: ModelCall) -> ModelCall:
    async def call(request: ModelRequest) -> AsyncIterator[ModelDelta]:
        returned = hook(ctx, request, inner)
        # The hook contract is `async def` returning a stream; an async generator hook yields
        # the deltas itself, so its result is already the stream.
        stream: AsyncIterator[ModelDelta] = (
            await returned if inspect.isawaitable(returned) else returned
        )
        return stream

    return call
