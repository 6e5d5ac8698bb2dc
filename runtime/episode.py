"""One episode of one run under a run lease: the lifecycle phases, the step loop and commits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import MappingProxyType
from typing import Any

from runtime import telemetry
from runtime.agent import Agent
from runtime.chunks import RunTakeoverChunk, StepFinishChunk, StepStartChunk
from runtime.context import DurableContext
from runtime.errors import LeaseLost, Unavailable
from runtime.lifecycle import (
    AfterStepDecision,
    AgentLifecycle,
    Block,
    Respond,
    RunContext,
    RuntimeContextInput,
    StepContext,
    StepResult,
    ToolCall,
    ToolResult,
)
from runtime.models import (
    Lease,
    Message,
    MessageRole,
    NewMessage,
    Run,
    RunStatus,
    TextPart,
    ToolCallPart,
    ToolState,
)
from runtime.providers.base import ContextMessage, ModelRequest
from runtime.publisher import Publisher
from runtime.storage.base import RunChange, StepCommit, Store, TailUpdate
from runtime.streaming import (
    ChunkSink,
    StepOutput,
    model_call,
    model_chunks,
    run_stream,
    text_chunks,
)
from runtime.toolcalls import ToolPhase, overlay_parts
from runtime.tools import client_tools_from

log = logging.getLogger(__name__)


class RunFailed(Exception):
    """Ends the run as failed with a reason (e.g. a Block without response)."""


class Episode:
    """Executes one run until it waits, finishes, fails, is stopped or loses its lease."""

    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        agent: Agent,
        lifecycle: AgentLifecycle,
        lease: Lease,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.agent = agent
        self.lifecycle = lifecycle
        self.lease = lease
        self.run_id = lease.resource_id
        self.thread_id = lease.thread_id
        self.stop_requested = asyncio.Event()
        self.lease_lost = False
        self.outcome: RunStatus | None = None
        self._sink: ChunkSink | None = None
        # Uncommitted work of the step in progress, finalised on stop or failure.
        self._output: StepOutput | None = None
        self._phase: ToolPhase | None = None
        # Position of the thread's last committed message (the next step's anchor).
        self._anchor = -1
        # The latest step context, for hooks that finalise tool parts on stop or failure.
        self._step_ctx: StepContext | None = None

    async def run(self) -> RunStatus | None:
        with telemetry.span("threadline.episode", run_id=self.run_id, thread_id=self.thread_id):
            return await self._run()

    async def _run(self) -> RunStatus | None:
        body = asyncio.create_task(self._guarded_body())
        stop = asyncio.create_task(self.stop_requested.wait())
        try:
            await asyncio.wait({body, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not body.done():
            body.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await body
        if self.outcome is None and self.stop_requested.is_set() and not self.lease_lost:
            await self._finish_stopped()
        return self.outcome

    def lose_lease(self) -> None:
        """Called by the heartbeat: from now on this episode must not write anything."""
        self.lease_lost = True
        self.stop_requested.set()

    # --- body ------------------------------------------------------------------------------

    async def _guarded_body(self) -> None:
        try:
            await self._body()
        except LeaseLost:
            self.lease_lost = True
            log.warning("run %s: lease lost, stopping without writing", self.run_id)
        except Unavailable:
            # Storage is down: recording a failure would fail too, or worse, succeed just after
            # recovery and end a run that a takeover can finish. Abandon the episode instead.
            self.lease_lost = True
            log.warning("run %s: storage unavailable, leaving the run to a takeover", self.run_id)
        except Exception as exc:  # a thrown hook/model error fails the run, never hangs it
            log.exception("run %s failed", self.run_id)
            await self._finish_failed(exc)

    async def _body(self) -> None:
        before = await self.store.get_run(self.run_id)
        run, version = await self.store.start_episode(self.lease)
        if run.status is not before.status:
            await self.publisher.invalidate(self.thread_id, version)
        self._sink = sink = ChunkSink(self.publisher, self.thread_id, self.run_id, run.next_seq)
        thread = await self.store.get_thread(self.thread_id, [run.scope])
        messages = await self.store.list_messages(self.thread_id)
        tail = messages[-1] if messages else None
        self._anchor = tail.position if tail is not None else -1
        resuming = tail is not None and tail.run_id == run.id and _has_resolved(tail)
        if before.status is RunStatus.RUNNING and before.episode > 0 and not resuming:
            # The dead episode's uncommitted chunks reuse the seqs the redo is about to emit:
            # late joiners must not get them replayed (nor have live chunks deduplicated away).
            await self.publisher.clear_replay(self.thread_id)
            await sink.emit(RunTakeoverChunk(episode=run.episode))
        telemetry.safe_add(telemetry.RUNS, 1, {"event": "resumed" if resuming else "started"})

        state = await self.lifecycle.runtime_context(
            RuntimeContextInput(
                thread_id=thread.id,
                scope=thread.scope,
                run_id=run.id,
                episode=run.episode,
                started_by=run.started_by,
                thread_metadata=MappingProxyType(dict(thread.metadata)),
            )
        )
        run_ctx = RunContext(
            thread_id=thread.id,
            scope=thread.scope,
            run_id=run.id,
            episode=run.episode,
            started_by=run.started_by,
            trigger=run.trigger,
            resumed=resuming,
            state=MappingProxyType(dict(state or {})),
            thread_metadata=MappingProxyType(dict(thread.metadata)),
        )
        step = sum(1 for m in messages if m.run_id == run.id and m.role is MessageRole.ASSISTANT)
        self._step_ctx = StepContext(run=run_ctx, step=step, local=MappingProxyType({}))
        if run.stop_requested:
            # A stop that arrived while no worker held the run: only finalisation is left.
            self.stop_requested.set()
            return
        decision = await self.lifecycle.prepare_run(run_ctx)
        local = MappingProxyType(dict(decision.context) if decision else {})
        step_ctx = self._step_ctx = StepContext(run=run_ctx, step=step, local=local)
        if decision is not None and decision.respond is not None:
            await self._respond(step_ctx, decision.respond.text)
            return
        if resuming and tail is not None and await self._resume(step_ctx, run, tail):
            return
        await self._loop(step_ctx, run)

    async def _resume(self, ctx: StepContext, run: Run, tail: Message) -> bool:
        """Continue resolved actions in the tail. True when the run waits again."""
        self._phase = phase = self._tool_phase(ctx, run)
        parts = await phase.resume(tail.parts)
        update = TailUpdate(message_id=tail.id, parts=tuple(parts))
        await self._commit(StepCommit(update_tail=update))
        self._phase = None
        if any(isinstance(p, ToolCallPart) and p.is_pending for p in parts):
            await self._transition(RunStatus.WAITING)
            return True
        return False

    async def _loop(self, ctx: StepContext, run: Run) -> None:
        extra: tuple[ContextMessage, ...] = ()
        step = ctx.step
        while True:
            if step >= self.agent.max_steps:
                raise RunFailed(f"the run exceeded max_steps={self.agent.max_steps}")
            step_ctx = StepContext(run=ctx.run, step=step, local=ctx.local, extra_messages=extra)
            self._step_ctx = step_ctx
            result, pending = await self._step(step_ctx, run)
            decision = await self.lifecycle.after_step(step_ctx, result)
            extra = _apply_after_step(extra, decision)
            if pending:
                await self._transition(RunStatus.WAITING)
                return
            if not result.continues:
                await self._transition(RunStatus.COMPLETED)
                return
            step += 1

    async def _step(self, ctx: StepContext, run: Run) -> tuple[StepResult, bool]:
        assert self._sink is not None
        # The step-start physical anchor: the tail as of now. Only this run appends to the
        # thread while it is active (input is queued), so it is tracked, not re-read.
        durable = await self.lifecycle.resolve_model_context(
            ctx.run, DurableContext(self.store, self.thread_id, self._anchor)
        )
        client_tools = client_tools_from(run.client_tools)
        request = ModelRequest(
            instructions=self.agent.instructions,
            messages=(*durable, *ctx.extra_messages),
            tools=(
                *(t.spec for t in self.agent.tools),
                *(t.spec for t in client_tools),
            ),
        )
        prepared = await self.lifecycle.prepare_model_step(ctx, request)
        terminal = isinstance(prepared, Respond | Block)
        if isinstance(prepared, Block) and prepared.response is None:
            raise RunFailed(prepared.reason)
        self._output = output = StepOutput()
        await self._sink.emit(StepStartChunk(step=ctx.step))
        if isinstance(prepared, Respond | Block):
            text = prepared.text if isinstance(prepared, Respond) else prepared.response
            await run_stream(self.lifecycle, ctx, text_chunks(text or ""), self._sink, output)
        else:
            model_name = getattr(self.agent.model, "name", "model")
            with telemetry.span("threadline.model_call", model=model_name, step=ctx.step):
                deltas = await self.lifecycle.around_model_call(
                    ctx, prepared or request, model_call(self.agent.model)
                )
                raw = model_chunks(deltas, output, model_name)
                await run_stream(self.lifecycle, ctx, raw, self._sink, output)
        parts: list[ToolCallPart] = []
        if output.tool_calls and not terminal:
            self._phase = phase = self._tool_phase(ctx, run)
            parts = await phase.run_calls(output.tool_calls)
        await self._sink.emit(StepFinishChunk(step=ctx.step, finish_reason=output.finish_reason))
        content = ([TextPart(text=output.text)] if output.text else []) + parts
        append = (NewMessage(role=MessageRole.ASSISTANT, parts=tuple(content), run_id=run.id),)
        await self._commit(StepCommit(append=append if content else ()))
        self._output = self._phase = None
        pending = any(p.is_pending for p in parts)
        results = tuple(
            (ToolCall(p.tool_call_id, p.name, p.input), _result_of(p)) for p in parts
        )
        result = StepResult(
            step=ctx.step,
            text=output.text,
            tool_results=results,
            finish_reason=output.finish_reason,
            continues=bool(parts) and not pending and not terminal,
        )
        return result, pending

    async def _respond(self, ctx: StepContext, text: str) -> None:
        """A prepare_run Respond: the text passes the canonical transform, then the run ends."""
        assert self._sink is not None
        self._output = output = StepOutput()
        await run_stream(self.lifecycle, ctx, text_chunks(text), self._sink, output)
        append = (
            NewMessage(
                role=MessageRole.ASSISTANT, parts=(TextPart(text=output.text),), run_id=self.run_id
            ),
        )
        await self._commit(StepCommit(append=append, run=RunChange(status=RunStatus.COMPLETED)))
        self._output = None
        self._record_end(RunStatus.COMPLETED)

    # --- commits --------------------------------------------------------------------------

    async def _commit(self, commit: StepCommit) -> int:
        assert self._sink is not None
        commit = commit.model_copy(update={"next_seq": self._sink.seq})
        version = await self.store.commit(self.lease, commit)
        self._anchor += len(commit.append)
        await self.publisher.invalidate(self.thread_id, version)
        await self.publisher.clear_replay(self.thread_id)
        return version

    async def _transition(self, status: RunStatus, error: str | None = None) -> None:
        await self._commit(StepCommit(run=RunChange(status=status, error=error)))
        self._record_end(status)

    def _record_end(self, status: RunStatus) -> None:
        self.outcome = status
        telemetry.safe_add(telemetry.RUNS, 1, {"event": status.value})

    async def _finish_stopped(self) -> None:
        """Stop: commit the canonical output so far, cancel open tool parts, end cancelled."""
        try:
            commit = await self._final_commit(cancel_hooks=True)
            await self._commit(
                commit.model_copy(update={"run": RunChange(status=RunStatus.CANCELLED)})
            )
            self._record_end(RunStatus.CANCELLED)
        except LeaseLost:
            self.lease_lost = True
        except Exception:
            log.exception("run %s: could not finalise the stop", self.run_id)
            await self._finish_failed(RuntimeError("stop finalisation failed"))

    async def _finish_failed(self, exc: BaseException) -> None:
        reason = str(exc) or type(exc).__name__
        failed = RunChange(status=RunStatus.FAILED, error=reason)
        # Open tool parts are cancelled with after_tool_result; if a hook is what failed, they
        # are cancelled without hooks, and as a last resort only the run is marked failed.
        for cancel_hooks in (True, False):
            try:
                commit = await self._final_commit(cancel_hooks=cancel_hooks)
                await self._commit(commit.model_copy(update={"run": failed}))
                self._record_end(RunStatus.FAILED)
                return
            except (LeaseLost, Unavailable):
                self.lease_lost = True
                return
            except Exception:
                log.exception("run %s: could not record failure with partial output", self.run_id)
        try:
            await self._transition(RunStatus.FAILED, reason)
        except Exception:
            log.exception("run %s: could not record failure", self.run_id)

    async def _final_commit(self, *, cancel_hooks: bool) -> StepCommit:
        """What a stop or failure commits: partial canonical text and finalised tool parts."""
        if self._sink is None:
            run = await self.store.get_run(self.run_id)
            self._sink = ChunkSink(self.publisher, self.thread_id, self.run_id, run.next_seq)
        if self._output is not None:
            parts: list[Any] = list(self._phase.parts) if self._phase else []
            parts = await self._close_parts(parts, cancel_hooks)
            content = ([TextPart(text=self._output.text)] if self._output.text else []) + parts
            if content:
                message = NewMessage(
                    role=MessageRole.ASSISTANT, parts=tuple(content), run_id=self.run_id
                )
                return StepCommit(append=(message,))
            return StepCommit()
        messages = await self.store.list_messages(self.thread_id)
        tail = messages[-1] if messages else None
        if tail is None or tail.run_id != self.run_id:
            return StepCommit()
        # Outside a step, a tool phase only exists while resolved actions are being resumed.
        base = self._phase.parts if self._phase else None
        parts = overlay_parts(tail.parts, base) if base else list(tail.parts)
        if not any(isinstance(p, ToolCallPart) and not p.state.is_final for p in parts):
            return StepCommit()
        closed = await self._close_parts(parts, cancel_hooks)
        return StepCommit(update_tail=TailUpdate(message_id=tail.id, parts=tuple(closed)))

    async def _close_parts(self, parts: list[Any], cancel_hooks: bool) -> list[Any]:
        if cancel_hooks and self._sink is not None and self._step_ctx is not None:
            phase = ToolPhase(self.agent, self.lifecycle, self._sink, self._step_ctx, ())
            return await phase.cancel_open(parts)
        return [
            p.transition(ToolState.CANCELLED, error="the run failed")
            if isinstance(p, ToolCallPart) and not p.state.is_final
            else p
            for p in parts
        ]

    def _tool_phase(self, ctx: StepContext, run: Run) -> ToolPhase:
        assert self._sink is not None
        return ToolPhase(
            self.agent, self.lifecycle, self._sink, ctx, client_tools_from(run.client_tools)
        )


def _has_resolved(message: Message) -> bool:
    return any(
        isinstance(p, ToolCallPart)
        and p.state is ToolState.AWAITING_ACTION
        and p.waiting is not None
        and p.waiting.resolution is not None
        for p in message.parts
    )


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

