"""The phases of an episode, one function each, in the order of spec/lifecycle-phases.txt."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from runtime.domain import (
    Message,
    MessageRole,
    NewMessage,
    RunStatus,
    TextPart,
    Thread,
    ToolCallPart,
)
from runtime.engine.commits import commit, transition
from runtime.engine.durable_context import DurableContext
from runtime.engine.episode_state import EpisodeDeps, EpisodeState, Phase
from runtime.engine.modeltrace import ModelCallTrace
from runtime.engine.streaming import (
    StepOutput,
    model_call,
    model_chunks,
    run_stream,
    step_text_parts,
    text_chunks,
)
from runtime.engine.toolcalls import OnStarted, ToolPhase
from runtime.lifecycle import (
    AfterStepDecision,
    Block,
    Respond,
    RunContext,
    RuntimeContextInput,
    StepContext,
    StepResult,
    ToolCall,
    ToolResult,
)
from runtime.providers.model_api import ContextMessage, ModelRequest
from runtime.storage.store import RunChange, StepCommit, TailUpdate
from runtime.tools import client_tools_from
from threadline_wire.chunks import StepFinishChunk, StepStartChunk


class RunFailed(Exception):
    """Ends the run as failed with a reason (e.g. a Block without response)."""


@dataclass(frozen=True)
class StepOutcome:
    """A committed step: what after_step sees, and whether a tool call now waits for input."""

    result: StepResult
    pending: bool


# --- run-level phases, once per episode -----------------------------------------------------


async def runtime_context(
    deps: EpisodeDeps, state: EpisodeState, thread: Thread, step: int, *, resumed: bool
) -> RunContext:
    """runtime_context: trusted agent-wide state for this episode, read-only from now on."""
    run = state.run
    metadata = MappingProxyType(dict(thread.metadata))
    trusted = await deps.lifecycle.runtime_context(
        RuntimeContextInput(
            thread_id=thread.id,
            scope=thread.scope,
            run_id=run.id,
            episode=run.episode,
            started_by=run.started_by,
            thread_metadata=metadata,
        )
    )
    run_ctx = RunContext(
        thread_id=thread.id,
        scope=thread.scope,
        run_id=run.id,
        episode=run.episode,
        started_by=run.started_by,
        trigger=run.trigger,
        resumed=resumed,
        state=MappingProxyType(dict(trusted or {})),
        thread_metadata=metadata,
    )
    # From here on, tool parts closed by a stop or failure go through after_tool_result.
    state.step = StepContext(run=run_ctx, step=step, local=MappingProxyType({}))
    return run_ctx


async def prepare_run(
    deps: EpisodeDeps, state: EpisodeState, run_ctx: RunContext, step: int
) -> tuple[StepContext, Respond | None]:
    """prepare_run: execution-local context for every step, or a Respond that ends the run."""
    decision = await deps.lifecycle.prepare_run(run_ctx)
    local = MappingProxyType(dict(decision.context) if decision else {})
    state.step = ctx = StepContext(run=run_ctx, step=step, local=local)
    return ctx, decision.respond if decision is not None else None


async def respond(deps: EpisodeDeps, state: EpisodeState, ctx: StepContext, text: str) -> None:
    """A prepare_run Respond: the text passes the canonical transform, then one commit holds
    the assistant message and the run's completion."""
    state.enter(Phase.MODEL_CALL)
    state.output = output = StepOutput()
    await run_stream(deps.lifecycle, ctx, text_chunks(text), state.sink, output)
    state.enter(Phase.COMMIT)
    message = NewMessage(
        role=MessageRole.ASSISTANT,
        parts=tuple(step_text_parts(output.text)) or (TextPart(text=""),),
        run_id=state.run.id,
    )
    change = StepCommit(append=(message,), run=RunChange(status=RunStatus.COMPLETED))
    await commit(deps, state, change)


async def close_tail(
    deps: EpisodeDeps, state: EpisodeState, ctx: StepContext, tail: Message
) -> None:
    """A prepare_run Respond on a resume episode: the tail's open tool calls (the resolved one
    included) end cancelled through after_tool_result, committed before the response, so the
    terminal run leaves no call waiting and later steps see every call finished."""
    state.enter(Phase.RESUMING)
    await load_tools(deps, state)
    phase = _open_tool_phase(deps, state, ctx)
    parts = await phase.cancel_open(tail.parts, error="prepare_run responded instead")
    update = TailUpdate(message_id=tail.id, parts=tuple(parts))
    await commit(deps, state, StepCommit(update_tail=update), Phase.RESUMED)


async def resume(deps: EpisodeDeps, state: EpisodeState, ctx: StepContext, tail: Message) -> None:
    """Continue the resolved actions of the tail (`ToolPhase.resume`) in one commit; back to
    waiting if some are still pending, else the steps follow."""
    state.enter(Phase.RESUMING)
    await load_tools(deps, state)

    async def started(parts: list[Any]) -> None:
        # The resumed tools are committed `running` before they execute; still RESUMING.
        tools = state.tools
        update = TailUpdate(message_id=tail.id, parts=tuple(parts))
        await commit(deps, state, StepCommit(update_tail=update))
        state.tools = tools

    parts = await _open_tool_phase(deps, state, ctx, started=started).resume(tail.parts)
    update = TailUpdate(message_id=tail.id, parts=tuple(parts))
    await commit(deps, state, StepCommit(update_tail=update), Phase.RESUMED)
    if any(isinstance(p, ToolCallPart) and p.is_pending for p in parts):
        await transition(deps, state, RunStatus.WAITING)


# --- the phases of one model step ---------------------------------------------------------------


async def run_step(deps: EpisodeDeps, state: EpisodeState, ctx: StepContext) -> StepOutcome:
    """One model step up to its commit; the caller runs after_step and the run transition."""
    state.step = ctx
    messages = await resolve_context(deps, state, ctx)
    await load_tools(deps, state)
    request = assemble_tools(deps, state, ctx, messages)
    prepared = await prepare(deps, state, ctx, request)
    await call_model(deps, state, ctx, prepared)
    if isinstance(prepared, Respond | Block):
        return await commit_step(deps, state, ctx, [], terminal=True)
    parts = await tool_phase(deps, state, ctx, prepared)
    return await commit_step(deps, state, ctx, parts, terminal=False)


async def resolve_context(
    deps: EpisodeDeps, state: EpisodeState, ctx: StepContext
) -> list[ContextMessage]:
    """resolve_model_context over the committed messages up to the step-start anchor."""
    state.enter(Phase.CONTEXT)
    # The first step after `begin_episode` reuses what it read (`history_current`), once.
    current, state.history_current = state.history_current, False
    leaf = DurableContext(deps.store, deps.thread_id, state.anchor, deps.history, current=current)
    return list(await deps.lifecycle.resolve_model_context(ctx.run, leaf))


async def load_tools(deps: EpisodeDeps, state: EpisodeState) -> None:
    """The tool source's tools (MCP servers) for what follows: the source caches them and
    lists again only when a server says its list changed, or reconnected."""
    if deps.tool_source is not None:
        state.source_tools = tuple(await deps.tool_source.tools())


def assemble_tools(
    deps: EpisodeDeps, state: EpisodeState, ctx: StepContext, messages: Sequence[ContextMessage]
) -> ModelRequest:
    """Tool assembly: the agent's tools, the tool source's (MCP servers) and the client tools
    captured with the run's request. The request is what the step offers: the tool phase
    refuses calls to any other tool."""
    state.enter(Phase.TOOLS)
    client_tools = client_tools_from(state.run.client_tools)
    server_tools = (*deps.agent.tools, *state.source_tools)
    clashes = sorted({t.name for t in client_tools} & {t.name for t in server_tools})
    if clashes:
        # Refused at admission; a run stored before that check must not run the server tool
        # for a call the model meant for the client (or the reverse).
        raise RunFailed(f"client tools collide with server tools: {', '.join(clashes)}")
    return ModelRequest(
        instructions=deps.agent.instructions,
        messages=(*messages, *ctx.extra_messages),
        tools=(*(t.spec for t in server_tools), *(t.spec for t in client_tools)),
    )


async def prepare(
    deps: EpisodeDeps, state: EpisodeState, ctx: StepContext, request: ModelRequest
) -> ModelRequest | Respond | Block:
    """prepare_model_step: a patched request, or a Respond/Block that replaces the model call."""
    state.enter(Phase.PREPARE)
    prepared = await deps.lifecycle.prepare_model_step(ctx, request)
    if isinstance(prepared, Block) and prepared.response is None:
        raise RunFailed(prepared.reason)
    return prepared if prepared is not None else request


async def call_model(
    deps: EpisodeDeps,
    state: EpisodeState,
    ctx: StepContext,
    prepared: ModelRequest | Respond | Block,
) -> None:
    """step-start, then the model call through around_model_call (or the Respond/Block text),
    through transform_step_stream: what it yields is published and becomes the step's output."""
    state.enter(Phase.MODEL_CALL)
    state.output = output = StepOutput()
    await state.sink.emit(StepStartChunk(step=ctx.step))
    if isinstance(prepared, Respond | Block):
        text = prepared.text if isinstance(prepared, Respond) else prepared.response
        await run_stream(deps.lifecycle, ctx, text_chunks(text or ""), state.sink, output)
        return
    trace = ModelCallTrace(deps.agent.model, state.run.id, ctx.step)
    try:
        with trace.waiting():
            call = model_call(deps.agent.model)
            deltas = await deps.lifecycle.around_model_call(ctx, prepared, call)
        raw = model_chunks(deltas, output, trace)
        await run_stream(deps.lifecycle, ctx, raw, state.sink, output)
    except BaseException as exc:
        trace.end(None, exc)  # a no-op when the stream already ended it
        raise
    trace.end(output.finish_reason)  # a transform that stopped reading early


async def tool_phase(
    deps: EpisodeDeps, state: EpisodeState, ctx: StepContext, request: ModelRequest
) -> list[ToolCallPart]:
    """before_tool_call for every call, then ready tools in parallel, suspensions, and
    after_tool_result on every final result (`runtime/engine/toolcalls.py`). Only the tools of the
    step's (prepared) request may run: a call to another one ends as output-error."""
    if not state.output.tool_calls:
        return []
    state.enter(Phase.TOOL_PHASE)
    output = state.output

    async def started(parts: list[Any]) -> None:
        # The step's message, its ready tools `running`, is durable before any tool executes.
        tools = state.tools
        content = [*step_text_parts(output.text), *parts]
        message_id = f"msg_{uuid.uuid4().hex}"
        message = NewMessage(
            role=MessageRole.ASSISTANT, parts=tuple(content), run_id=state.run.id, id=message_id
        )
        await commit(deps, state, StepCommit(append=(message,)), Phase.EXECUTING)
        state.started_message = message_id
        state.tools = tools

    offered = frozenset(t.name for t in request.tools)
    phase = _open_tool_phase(deps, state, ctx, offered, started)
    return await phase.run_calls(output.tool_calls)


async def commit_step(
    deps: EpisodeDeps,
    state: EpisodeState,
    ctx: StepContext,
    parts: list[ToolCallPart],
    terminal: bool,
) -> StepOutcome:
    """step-finish, then one commit: the step's assistant message (text, then tool parts).
    When the step ends the run and no after_step hook runs (`EpisodeDeps.transition_with_step`),
    the same commit carries the run transition (waiting or completed) and the episode ENDS."""
    output = state.output
    await state.sink.emit(StepFinishChunk(step=ctx.step, finish_reason=output.finish_reason))
    content = [*step_text_parts(output.text), *parts]
    pending = any(p.is_pending for p in parts)
    continues = bool(parts) and not pending and not terminal
    run = None
    if not continues and deps.transition_with_step:
        run = RunChange(status=RunStatus.WAITING if pending else RunStatus.COMPLETED)
    if state.phase is Phase.EXECUTING and state.started_message is not None:
        # The message was committed when its tools started: now their results.
        update = TailUpdate(message_id=state.started_message, parts=tuple(content))
        state.started_message = None
        await commit(deps, state, StepCommit(update_tail=update, run=run), Phase.AFTER_STEP)
    else:
        state.enter(Phase.COMMIT)
        message = NewMessage(role=MessageRole.ASSISTANT, parts=tuple(content), run_id=state.run.id)
        change = StepCommit(append=(message,) if content else (), run=run)
        await commit(deps, state, change, Phase.AFTER_STEP)
    results = tuple((ToolCall(p.tool_call_id, p.name, p.input), _result_of(p)) for p in parts)
    result = StepResult(
        step=ctx.step,
        text=output.text,
        tool_results=results,
        finish_reason=output.finish_reason,
        continues=continues,
    )
    return StepOutcome(result=result, pending=pending)


async def after_step(
    deps: EpisodeDeps, ctx: StepContext, outcome: StepOutcome
) -> tuple[ContextMessage, ...]:
    """after_step (the phase is AFTER_STEP since the commit): the next step's extra messages."""
    decision = await deps.lifecycle.after_step(ctx, outcome.result)
    return _apply_after_step(ctx.extra_messages, decision)


def _open_tool_phase(
    deps: EpisodeDeps,
    state: EpisodeState,
    ctx: StepContext,
    offered: frozenset[str] | None = None,
    started: OnStarted | None = None,
) -> ToolPhase:
    """A tool phase with the run's captured client tools, kept in the state so that a stop or
    failure finalises the latest state of its parts."""
    client_tools = client_tools_from(state.run.client_tools)
    state.tools = ToolPhase(
        deps.agent,
        deps.lifecycle,
        state.sink,
        ctx,
        client_tools,
        offered,
        on_started=started,
        source_tools=state.source_tools,
    )
    return state.tools


def _result_of(part: ToolCallPart) -> ToolResult | None:
    if not part.state.is_final:
        return None
    return ToolResult(part.state, output=part.output, error=part.error)


def _apply_after_step(
    current: tuple[ContextMessage, ...], decision: AfterStepDecision | None
) -> tuple[ContextMessage, ...]:
    if decision is None:
        return current
    base = decision.replace if decision.replace is not None else current
    return (*base, *decision.append)
