"""The tool phase of a step: before_tool_call for every call, parallel execution, suspension,
resumption with a typed payload, and after_tool_result on every final model-visible result."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from runtime import instruments
from runtime.agent import Agent
from runtime.approvals import ApprovalDecision, ApprovalState
from runtime.domain import ToolCallPart, ToolState, Waiting, WaitKind
from runtime.engine.shielding import runtime_cancelled, stray
from runtime.engine.streaming import ChunkSink
from runtime.lifecycle import (
    AgentLifecycle,
    Reject,
    ReplaceInput,
    Skip,
    StepContext,
    ToolCall,
    ToolCallContext,
    ToolResult,
)
from runtime.tools import (
    ALL_ROLES,
    ClientToolDef,
    ProgressFn,
    ResultPayload,
    SuspendStep,
    Tool,
    ToolContext,
)
from threadline_wire.chunks import ToolCallChunk, ToolProgressChunk, ToolStateChunk

# The model-visible result of a tool that a takeover found started without a committed result
# and that does not declare itself idempotent: it may or may not have had its effect.
INTERRUPTED = "interrupted; may or may not have run"

# Commits the parts (ready tools `running`) before any of them executes.
OnStarted = Callable[[list[Any]], Awaitable[None]]


class ToolPhase:
    """Runs the tool calls of one step. `parts` always holds the latest state of every call in
    the model's order, so a stop or failure can finalise whatever is still open."""

    def __init__(
        self,
        agent: Agent,
        lifecycle: AgentLifecycle,
        sink: ChunkSink,
        step: StepContext,
        client_tools: Sequence[ClientToolDef],
        offered: frozenset[str] | None = None,
        on_started: OnStarted | None = None,
        source_tools: Sequence[Tool] = (),
    ) -> None:
        self.agent = agent
        # Tools of the episode's tool source (MCP servers), looked up after the agent's own.
        self.source_tools = {t.name: t for t in source_tools}
        self.on_started = on_started
        self.lifecycle = lifecycle
        self.sink = sink
        self.step = step
        self.client_tools = {t.name: t for t in client_tools}
        self.parts: list[ToolCallPart] = []
        # Tool assembly: the names of the step's request after prepare_model_step; a call to
        # any other tool is refused, even if the agent has it. None: no request (a resume).
        self.offered = offered
        # Calls whose after_tool_result was invoked: a stop or failure closing the phase never
        # invokes it a second time (exactly one after_tool_result per call).
        self.hooked: set[str] = set()

    # --- a fresh step ----------------------------------------------------------------------

    async def run_calls(self, calls: Sequence[ToolCallChunk]) -> list[ToolCallPart]:
        self.parts = [
            ToolCallPart(tool_call_id=c.tool_call_id, name=c.name, input=c.input) for c in calls
        ]
        ready: list[tuple[int, Tool]] = []
        finals: list[tuple[int, ToolResult]] = []
        # Spec: before_tool_call runs for every call of the step before any tool starts.
        for index, part in enumerate(list(self.parts)):
            decision = await self.lifecycle.before_tool_call(
                self._ctx(part), ToolCall(part.tool_call_id, part.name, part.input)
            )
            part, refused = _decided(part, decision)
            self.parts[index] = part
            if refused is not None:
                finals.append((index, refused))
            else:
                outcome = self._route(index, part)
                if isinstance(outcome, ToolResult):
                    finals.append((index, outcome))
                elif outcome is not None:
                    ready.append((index, outcome))
        await _all(*(self._finish(index, result) for index, result in finals))
        await self._start([index for index, _ in ready], list(self.parts))
        await _all(*(self._execute(index, tool_, None) for index, tool_ in ready))
        return list(self.parts)

    def _route(self, index: int, part: ToolCallPart) -> Tool | ToolResult | None:
        """Classify a call: a ready tool, a suspension (None: part now waits) or a final error."""
        if "__invalid_arguments__" in part.input:
            problem = part.input["__invalid_arguments__"]
            return ToolResult(ToolState.OUTPUT_ERROR, error=f"invalid arguments: {problem}")
        if self.offered is not None and part.name not in self.offered:
            return ToolResult(
                ToolState.OUTPUT_ERROR, error=f"tool {part.name!r} was not offered in this step"
            )
        client = self.client_tools.get(part.name)
        tool_ = self._tool(part.name)
        if tool_ is None and client is None:
            return ToolResult(ToolState.OUTPUT_ERROR, error=f"unknown tool {part.name!r}")
        if tool_ is not None:
            try:
                tool_.validate_input(part.input)
            except ValidationError as exc:
                return ToolResult(ToolState.OUTPUT_ERROR, error=f"invalid input: {exc}")
            if tool_.suspend is None:
                return tool_
            policy = tool_.suspend.policy
            waiting = Waiting(
                action_id=_action_id(),
                kind=tool_.suspend.kind,
                payload_schema=tool_.suspend.payload.model_json_schema(),
                allowed_roles=tool_.suspend.allowed_roles,
                # The requester is fixed when the action is asked for: four-eyes compares
                # each decider with the run's starter, whoever resumes the run later.
                approval=None
                if policy is None or tool_.suspend.kind is not WaitKind.APPROVAL
                else ApprovalState(
                    policy=policy,
                    requester=self.step.run.started_by,
                    waiting_for=policy.stage_deciders(0).label(),
                ),
            )
        else:
            waiting = Waiting(
                action_id=_action_id(),
                kind=WaitKind.CLIENT_TOOL,
                payload_schema=ResultPayload.model_json_schema(),
                allowed_roles=ALL_ROLES,
            )
        self.parts[index] = part.transition(ToolState.AWAITING_ACTION, waiting=waiting)
        return None

    # --- resumption --------------------------------------------------------------------

    async def resume(self, parts: Sequence[Any]) -> list[Any]:
        """Continue resolved waiting parts of the tail message; returns all parts in order."""
        all_parts = list(parts)
        self.parts = [p for p in all_parts if isinstance(p, ToolCallPart)]
        ready: list[tuple[int, Tool, BaseModel | None]] = []
        finals: list[tuple[int, ToolResult]] = []
        for index, part in enumerate(list(self.parts)):
            waiting = part.waiting
            if part.state is ToolState.RUNNING:
                interrupted = self._interrupted(part)
                if isinstance(interrupted, ToolResult):
                    finals.append((index, interrupted))
                    continue
                # A re-execution is execution continuing: before_tool_call runs first, as on a
                # resume (docs/architecture.md, "Tools and side effects").
                ctx = self._ctx(part, resumed=part.waiting is not None, takeover=True)
                decision = await self.lifecycle.before_tool_call(
                    ctx, ToolCall(part.tool_call_id, part.name, part.input)
                )
                self.parts[index], refused = _decided(part, decision)
                if refused is not None:
                    # Started by the dead episode, so it may have had its effect: not "skipped".
                    why = refused.error if refused.state is ToolState.REJECTED else "skipped"
                    error = f"{INTERRUPTED} (not run again: {why})"
                    finals.append((index, ToolResult(ToolState.OUTPUT_ERROR, error=error)))
                else:
                    ready.append((index, *interrupted))
                continue
            if part.state is not ToolState.AWAITING_ACTION or waiting is None:
                continue
            if waiting.resolution is None:
                continue
            payload = waiting.resolution.payload
            if waiting.kind is not WaitKind.APPROVAL:
                finals.append((index, _submitted_result(payload)))
                continue
            if waiting.resolution.by_deadline == "deny":
                # Expired: ended as a denial is, the tool never runs, the model sees why.
                reason = waiting.resolution.reason or "expired"
                finals.append((index, ToolResult(ToolState.REJECTED, error=reason)))
                continue
            tool_ = self._tool(part.name)
            if tool_ is None or tool_.suspend is None:
                finals.append((index, ToolResult(ToolState.OUTPUT_ERROR, error="tool is gone")))
                continue
            denied = _denial(tool_.suspend, payload)
            if denied is not None:
                # A denial is not execution continuing: the tool never runs (before_tool_call
                # neither), and after_tool_result sees the rejection like any other.
                finals.append((index, ToolResult(ToolState.REJECTED, error=denied)))
                continue
            # Spec: before_tool_call runs again on resume, before execution continues.
            ctx = self._ctx(part, resumed=True)
            decision = await self.lifecycle.before_tool_call(
                ctx, ToolCall(part.tool_call_id, part.name, part.input)
            )
            self.parts[index], refused = _decided(part, decision)
            if refused is not None:
                finals.append((index, refused))
                continue
            try:
                typed = tool_.suspend.payload.model_validate(payload)
            except ValidationError as exc:
                finals.append((index, ToolResult(ToolState.OUTPUT_ERROR, error=str(exc))))
                continue
            ready.append((index, tool_, typed))
        await _all(*(self._finish(index, result) for index, result in finals))
        await self._start([index for index, _, _ in ready], self._merge(all_parts))
        await _all(*(self._execute(index, tool_, typed) for index, tool_, typed in ready))
        return self._merge(all_parts)

    def _interrupted(self, part: ToolCallPart) -> ToolResult | tuple[Tool, BaseModel | None]:
        """A tool an earlier episode committed as started but not finished: re-run it only if
        it declares itself idempotent, else a model-visible error (it may have had its
        effect, e.g. an e-mail sent, before that episode died)."""
        tool_ = self._tool(part.name)
        if tool_ is None or not tool_.idempotent or tool_.fn is None:
            return ToolResult(ToolState.OUTPUT_ERROR, error=INTERRUPTED)
        typed: BaseModel | None = None
        if part.waiting is not None and part.waiting.resolution is not None and tool_.suspend:
            try:
                typed = tool_.suspend.payload.model_validate(part.waiting.resolution.payload)
            except ValidationError:
                return ToolResult(ToolState.OUTPUT_ERROR, error=INTERRUPTED)
        return tool_, typed

    async def _start(self, ready: list[int], parts: list[Any]) -> None:
        """Mark the ready tools `running` and have that committed before any executes, so a
        takeover knows which tools may have had their effect."""
        if not ready:
            return
        for index in ready:
            part = self.parts[index]
            if part.state is not ToolState.RUNNING:
                self.parts[index] = part = part.transition(ToolState.RUNNING)
                await self.sink.emit(
                    ToolStateChunk(tool_call_id=part.tool_call_id, state=part.state)
                )
        if self.on_started is not None:
            await self.on_started(overlay_parts(parts, self.parts))

    async def cancel_open(self, parts: Sequence[Any], error: str = "cancelled") -> list[Any]:
        """Finalise every open tool part as cancelled: through after_tool_result, unless it was
        already invoked for that call (then the part is closed without it)."""
        all_parts = list(parts)
        self.parts = [p for p in all_parts if isinstance(p, ToolCallPart)]
        for index, part in enumerate(self.parts):
            if not part.state.is_final and part.tool_call_id in self.hooked:
                self.parts[index] = part.transition(ToolState.CANCELLED, error=error)
        await _all(
            *(
                self._finish(index, ToolResult(ToolState.CANCELLED, error=error))
                for index, part in enumerate(self.parts)
                if not part.state.is_final
            )
        )
        return self._merge(all_parts)

    def _merge(self, all_parts: list[Any]) -> list[Any]:
        return overlay_parts(all_parts, self.parts)

    # --- execution and finalisation ----------------------------------------------------------

    async def _execute(self, index: int, tool_: Tool, payload: BaseModel | None) -> None:
        part = self.parts[index]
        started = time.perf_counter()
        report, close = self._progress(part.tool_call_id)
        context = ToolContext(
            tool_call_id=part.tool_call_id,
            run_id=self.step.run.run_id,
            thread_id=self.step.run.thread_id,
            payload=payload,
            state=self.step.run.state,
            progress=report,
            decisions=_decisions(part),
        )
        try:
            # GenAI conventions: `execute_tool {name}` (`tool` kept for existing dashboards).
            with instruments.span(
                f"execute_tool {tool_.name}",
                tool=tool_.name,
                **{
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool_.name,
                    "gen_ai.tool.call.id": part.tool_call_id,
                    "gen_ai.tool.type": "function",
                },
            ):
                output = await tool_.execute(tool_.validate_input(part.input), context)
            if isinstance(output, BaseModel):
                output = output.model_dump(mode="json")
            result = ToolResult(ToolState.OUTPUT_AVAILABLE, output=output)
        except asyncio.CancelledError as exc:
            if runtime_cancelled():
                raise
            # The tool itself raised it (or an awaited future of its own was cancelled): a
            # failing tool, not a stop. Let through, the task group would drop it silently.
            instruments.safe_add(instruments.TOOL_ERRORS, 1, {"tool": tool_.name})
            result = ToolResult(ToolState.OUTPUT_ERROR, error=f"CancelledError: {exc}")
        except Exception as exc:  # a failing tool is a model-visible result, not a crash
            instruments.safe_add(instruments.TOOL_ERRORS, 1, {"tool": tool_.name})
            result = ToolResult(ToolState.OUTPUT_ERROR, error=f"{type(exc).__name__}: {exc}")
        finally:
            close()
            instruments.safe_record(
                instruments.TOOL_CALL_DURATION, time.perf_counter() - started, {"tool": tool_.name}
            )
        await self._finish(index, result)

    async def _finish(self, index: int, result: ToolResult) -> None:
        part = self.parts[index]
        result = _validated(result, self._tool(part.name))
        self.hooked.add(part.tool_call_id)
        changed = await self.lifecycle.after_tool_result(
            self._ctx(part, resumed=part.waiting is not None), result
        )
        if changed is not None:
            result = _validated(changed, self._tool(part.name))
        if not result.state.is_final:
            raise ValueError(f"after_tool_result returned non-final state {result.state}")
        self.parts[index] = part = part.transition(
            result.state, output=result.output, error=result.error
        )
        await self.sink.emit(
            ToolStateChunk(
                tool_call_id=part.tool_call_id,
                state=part.state,
                output=part.output,
                error=part.error,
            )
        )

    def _tool(self, name: str) -> Tool | None:
        return self.agent.tool(name) or self.source_tools.get(name)

    def _progress(self, tool_call_id: str) -> tuple[ProgressFn, Callable[[], None]]:
        """A progress reporter for one execution, and what closes it: a notification that
        arrives after the call ended is dropped (its part is final, maybe committed)."""
        open_ = True

        async def report(progress: float, total: float | None, message: str | None) -> None:
            if open_:
                chunk = ToolProgressChunk(
                    tool_call_id=tool_call_id, progress=progress, total=total, message=message
                )
                await self.sink.emit(chunk)

        def close() -> None:
            nonlocal open_
            open_ = False

        return report, close

    def _ctx(
        self, part: ToolCallPart, *, resumed: bool = False, takeover: bool = False
    ) -> ToolCallContext:
        return ToolCallContext(
            step=self.step,
            tool_call_id=part.tool_call_id,
            tool_name=part.name,
            resumed=resumed,
            resolution=part.waiting.resolution if part.waiting else None,
            takeover=takeover,
        )


def _decisions(part: ToolCallPart) -> tuple[ApprovalDecision, ...]:
    resolution = part.waiting.resolution if part.waiting is not None else None
    return () if resolution is None else resolution.decisions


def _decided(part: ToolCallPart, decision: object) -> tuple[ToolCallPart, ToolResult | None]:
    """A before_tool_call decision applied to `part`: the part with the input the decision
    leaves it with (a Skip or Reject carries the input earlier hooks patched, so a redaction
    is stored even when a later hook refuses the call), and the final result of a refusal
    (None: the call goes on)."""
    patched = decision.input if isinstance(decision, ReplaceInput | Skip | Reject) else None
    if patched is not None:
        part = part.model_copy(update={"input": dict(patched)})
    if isinstance(decision, Skip):
        return part, ToolResult(ToolState.SKIPPED, output=decision.output)
    if isinstance(decision, Reject):
        return part, ToolResult(ToolState.REJECTED, error=decision.reason)
    return part, None


def _denial(suspend: SuspendStep, payload: Mapping[str, Any]) -> str | None:
    """The reason `payload` denies the call under the tool's `denial` rule (None: it does not,
    or the payload is invalid, which the execution path reports)."""
    if suspend.denial is None:
        return None
    try:
        typed = suspend.payload.model_validate(dict(payload))
    except ValidationError:
        return None
    return suspend.denial(typed)


def overlay_parts(parts: Sequence[Any], updated: Sequence[ToolCallPart]) -> list[Any]:
    """`parts` in order, each tool part replaced by its updated version (matched by call id)."""
    by_id = {p.tool_call_id: p for p in updated}
    return [by_id.get(p.tool_call_id, p) if isinstance(p, ToolCallPart) else p for p in parts]


def _submitted_result(payload: Mapping[str, Any]) -> ToolResult:
    """A client-tool or manual result; validated like any other result."""
    try:
        submitted = ResultPayload.model_validate(dict(payload))
    except ValidationError as exc:
        return ToolResult(ToolState.OUTPUT_ERROR, error=f"invalid submitted result: {exc}")
    if submitted.error is not None:
        return ToolResult(ToolState.OUTPUT_ERROR, output=submitted.output, error=submitted.error)
    return ToolResult(ToolState.OUTPUT_AVAILABLE, output=submitted.output)


def _validated(result: ToolResult, tool_: Tool | None = None) -> ToolResult:
    """Outputs must be JSON: they are stored, published and shown to the next model step. An
    output (executed, skipped or submitted) must also match the tool's declared output model."""
    output_model = tool_.output_model if tool_ is not None else None
    if output_model is not None and result.state in _CHECKED_STATES:
        try:
            typed = output_model.model_validate(result.output)
        except ValidationError as exc:
            return ToolResult(ToolState.OUTPUT_ERROR, error=f"invalid tool output: {exc}")
        result = ToolResult(result.state, output=typed.model_dump(mode="json"))
    try:
        orjson.dumps(result.output)
    except TypeError as exc:
        return ToolResult(ToolState.OUTPUT_ERROR, error=f"tool output is not JSON: {exc}")
    return result


# Results that carry an output the model will read as the tool's answer.
_CHECKED_STATES = frozenset({ToolState.OUTPUT_AVAILABLE, ToolState.SKIPPED})


async def _all(*work: Coroutine[Any, Any, None]) -> None:
    """Run the calls of a step in parallel; the first failure cancels (and awaits) the others,
    so no sibling keeps running, executing or publishing after the step has failed."""
    try:
        async with asyncio.TaskGroup() as group:
            for item in work:
                group.create_task(_failing_if_stray(item))
    except BaseExceptionGroup as failures:
        # The run fails with the first real failure, not with the group's summary.
        raise _first(failures) from None


async def _failing_if_stray(work: Coroutine[Any, Any, None]) -> None:
    """A task group takes a child's CancelledError for a cancellation and ignores it; one that
    a hook raised itself is a failure of the run (the spec's "thrown errors fail the run")."""
    try:
        await work
    except asyncio.CancelledError as exc:
        if runtime_cancelled():
            raise
        raise stray(exc) from None


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    inner = group.exceptions[0]
    return _first(inner) if isinstance(inner, BaseExceptionGroup) else inner


def _action_id() -> str:
    return f"act_{uuid.uuid4().hex}"
