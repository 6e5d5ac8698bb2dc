"""One episode of one run under a run lease: start, run-level phases, the step loop, its end."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from runtime import instruments, log_context
from runtime.agent import Agent
from runtime.domain import (
    Lease,
    Message,
    MessageRole,
    Run,
    RunStatus,
    ToolCallPart,
    ToolState,
)
from runtime.engine.commits import commit, end, transition
from runtime.engine.episode_state import EpisodeDeps, EpisodeState, Phase, StopSignal
from runtime.engine.message_cache import HistoryCache
from runtime.engine.phases import (
    RunFailed,
    after_step,
    close_tail,
    prepare_run,
    respond,
    resume,
    run_step,
    runtime_context,
)
from runtime.engine.publisher import Publisher
from runtime.engine.shielding import runtime_cancelled, stray
from runtime.engine.streaming import ChunkSink
from runtime.engine.trace_links import request_links
from runtime.errors import LeaseLost, Unavailable
from runtime.lifecycle import AgentLifecycle, StepContext
from runtime.storage.store import (
    EngineStore,
    EpisodeStart,
    RunChange,
    RunStart,
    StepCommit,
)
from runtime.tools import ToolSource
from threadline_wire.chunks import RunTakeoverChunk

log = logging.getLogger(__name__)

__all__ = ["Episode", "start_kind"]

_TERMINAL = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class Episode:
    """Executes one run until it waits, finishes, fails, is stopped or loses its lease.

    The worker drives it through `run`, `stop_requested`, `lose_lease` and `lease` (renewed by
    its heartbeat). Everything that changes while the run executes is in `state`."""

    def __init__(
        self,
        store: EngineStore,
        publisher: Publisher,
        agent: Agent,
        lifecycle: AgentLifecycle,
        lease: Lease,
        history: HistoryCache | None = None,
        *,
        start: RunStart | None = None,
        history_from: int | None = None,
        tool_source: ToolSource | None = None,
        traceparent: str | None = None,
    ) -> None:
        # The trace context of the request that started (or resumed) the run, if one was traced.
        self.traceparent = traceparent
        self.deps = EpisodeDeps(
            store, publisher, agent, lifecycle, lease, history or HistoryCache(), tool_source
        )
        # What `Store.start_run` did with the lease (None, or `started` None: `_begin` makes the
        # start), and where its read of the thread's messages started (`HistoryCache.read_from`
        # then; None: the whole thread).
        self._run_start = start
        self._history_from = history_from
        self.run_id = lease.resource_id
        self.thread_id = lease.thread_id
        self.stop_requested = StopSignal()
        self.lease_lost = False
        # None until start_episode has committed.
        self.state: EpisodeState | None = None
        # Why this episode failed its run, if it did (for the episode span's status).
        self.failure: BaseException | None = None
        # The thread's messages as the episode started (None: to be read).
        self._messages: list[Message] | None = None
        # Whether the commit that failed the run before it started released the lease.
        self._released_unstarted = False

    @property
    def lease(self) -> Lease:
        return self.deps.lease

    @lease.setter
    def lease(self, lease: Lease) -> None:
        self.deps.lease = lease

    @property
    def outcome(self) -> RunStatus | None:
        """The run status this episode committed last (waiting or terminal), if any."""
        return self.state.outcome if self.state is not None else None

    @property
    def released(self) -> bool:
        """Whether the commit that ended the run released the run lease with it (a terminal
        one does): there is no lease left for the worker to release."""
        return self._released_unstarted or (self.state is not None and self.state.released)

    @property
    def admitted(self) -> bool:
        """Whether the commit that ended the run admitted queued input as a new run."""
        return self.state is not None and self.state.admitted

    def lose_lease(self) -> None:
        """Called by the heartbeat: from now on this episode must not write anything."""
        self.lease_lost = True
        self.stop_requested.set()

    async def run(self) -> RunStatus | None:
        with log_context.bound(run_id=self.run_id, thread_id=self.thread_id):
            return await self._traced()

    async def _traced(self) -> RunStatus | None:
        attributes = {"run_id": self.run_id, "thread_id": self.thread_id}
        # A new trace of its own (a run outlives its request), linked to the request's.
        with instruments.linked_span(
            "threadline.episode", request_links(self.traceparent), attributes
        ) as span:
            try:
                outcome = await self._run()
            finally:
                # Chunks still queued (an episode that lost its lease commits nothing more).
                if self.state is not None:
                    await self.state.sink.drain()
            # Errors are handled inside (the run fails, it does not raise): the span says so.
            if outcome is not None:
                span.set_attribute("threadline.run.outcome", outcome.value)
                if self.state is not None and outcome in _TERMINAL:
                    # created_at is the database's clock; workers and database share NTP time.
                    elapsed = time.time() - self.state.run.created_at
                    instruments.safe_record(
                        instruments.RUN_DURATION, max(elapsed, 0.0), {"outcome": outcome.value}
                    )
            if self.failure is not None:
                instruments.fail_span(span, self.failure)
            # One line per episode: what an operator greps a run's id for; inside the span, so
            # it carries the episode's trace id too.
            log.info("episode ended: %s", outcome.value if outcome is not None else "lease lost")
            return outcome

    async def _run(self) -> RunStatus | None:
        # start_episode runs before the stop is watched: nothing cancels it, and a stop that
        # arrives meanwhile is seen right after.
        try:
            started = await self._begin()
            self.state = state = await self._start(started)
        except (LeaseLost, Unavailable):
            self.lease_lost = True
            return None
        except Exception as exc:
            log.exception("run %s: the episode could not start", self.run_id)
            self.failure = exc
            await self._fail_unstarted(exc)
            return None
        if state.ended:
            return None  # the run ended (stopped while queued) before this episode started it
        body = asyncio.create_task(self._guarded(self._body(state, started), state))
        # Until the body ends or a stop is requested (callbacks: no task waits for the stop).
        first = asyncio.get_running_loop().create_future()

        def done(*_: object) -> None:
            if not first.done():
                first.set_result(None)

        body.add_done_callback(done)
        self.stop_requested.on_set(done)
        try:
            await first
        finally:
            self.stop_requested.discard(done)
        if not body.done():
            # Commits are shielded: cancelling waits for one in flight, so `state.phase` below
            # says what is committed, whatever moment the stop arrived at.
            body.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await body
        if not state.ended and self.stop_requested.is_set() and not self.lease_lost:
            await self._finish_stopped(state)
        return state.outcome

    # --- start -----------------------------------------------------------------------------

    async def _begin(self) -> EpisodeStart:
        """start_episode and the reads the episode starts from, in one transaction
        (`begin_episode`); the thread's messages are read from its tail cached by the worker
        (`HistoryCache`). Where `Store.start_run` made the start with the lease, only the
        messages are left, read with it or now: after the start, which changes none (while the
        run is active input is queued, not appended, and a rewrite moves the history epoch,
        which the cache checks)."""
        deps, start = self.deps, self._run_start
        if start is None or start.started is None:
            history_from = deps.history.read_from(self.thread_id)
            began = await deps.store.begin_episode(deps.lease, history_from or 0)
            self._messages = deps.history.apply(self.thread_id, history_from, began.history)
            return began
        if start.history is not None:  # read with the start, from where the cache said then
            history_from, history = self._history_from, start.history
        else:
            history_from = deps.history.read_from(self.thread_id)
            history = await deps.store.read_history(self.thread_id, history_from or 0)
        self._messages = deps.history.apply(self.thread_id, history_from, history)
        return EpisodeStart(**dict(start.started), history=history)

    async def _start(self, started: EpisodeStart) -> EpisodeState:
        """start_episode: fenced, +1 episode, queued -> running (+1 version when it changed)."""
        deps, before, run, version = self.deps, started.before, started.run, started.version
        deps.publisher.known_scope(self.thread_id, started.thread.scope)
        sink = ChunkSink(deps.publisher, self.thread_id, self.run_id, run.next_seq, run.episode)
        # The messages `_begin` took into the worker's cache are current (None: a rewrite since
        # the cache was filled; `_body` reads them).
        state = EpisodeState(
            run=run, sink=sink, anchor=-1, history_current=self._messages is not None
        )
        if run.status.is_terminal:
            # Ended (stopped while queued) after the lease was taken: nothing is left to do.
            state.phase = Phase.ENDED
        else:
            # Counted with the commit that starts the episode, whatever happens to it next.
            instruments.safe_add(instruments.RUNS, 1, {"event": start_kind(before)})
            if run.status is not before.status:
                await deps.publisher.invalidate(self.thread_id, version)
        return state

    # --- body ------------------------------------------------------------------------------

    async def _fail_unstarted(self, exc: Exception) -> None:
        failed = RunChange(status=RunStatus.FAILED, error=str(exc) or type(exc).__name__)
        try:
            committed = await self.deps.store.commit(self.deps.lease, StepCommit(run=failed))
        except Exception:
            log.exception("run %s: could not record failure", self.run_id)
            return
        self._released_unstarted = committed.released
        # Not through `commits.commit` (no episode state yet), which counts every other end.
        instruments.safe_add(instruments.RUNS, 1, {"event": RunStatus.FAILED.value})
        await self.deps.publisher.invalidate(self.thread_id, committed.version)

    async def _guarded(self, work: Coroutine[Any, Any, None], state: EpisodeState) -> None:
        try:
            await work
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
            await self._finish_failed(state, exc)
        except asyncio.CancelledError as exc:
            if runtime_cancelled():
                raise  # a stop, a shutdown or a lost lease: handled by `_run`
            # Raised by a hook (or what it awaited), not by the runtime: were it let through,
            # the lease would be released and a takeover would redo the step, forever.
            log.exception("run %s failed", self.run_id)
            await self._finish_failed(state, stray(exc))

    async def _body(self, state: EpisodeState, started: EpisodeStart) -> None:
        """The run-level phases (runtime_context, prepare_run), then a resume or the steps."""
        deps, run, before, thread = self.deps, state.run, started.before, started.thread
        messages = self._messages
        if messages is None:  # a history rewrite since the worker cached the thread
            messages = await deps.history.messages(deps.store, self.thread_id)
        tail = messages[-1] if messages else None
        state.anchor = tail.position if tail is not None else -1
        resumable = _resumable(tail, run.id)
        if start_kind(before) == "takeover":
            # The dead episode's uncommitted chunks reuse the seqs the redo is about to emit
            # (a resuming run's too: its tool states, results, a prepare_run answer): clients
            # drop them on this chunk, late joiners must not get them replayed.
            await deps.publisher.clear_replay(self.thread_id)
            await state.sink.emit(RunTakeoverChunk(episode=run.episode))
        step = _steps_taken(messages, run)
        run_ctx = await runtime_context(deps, state, thread, step, resumed=resumable is not None)
        if run.stop_requested:
            # A stop that arrived while no worker held the run: only finalisation is left.
            self.stop_requested.set()
            return
        ctx, answer = await prepare_run(deps, state, run_ctx, step)
        if answer is not None:
            if resumable is not None:
                await close_tail(deps, state, ctx, resumable)
            await respond(deps, state, ctx, answer.text)
            return
        if resumable is not None:
            await resume(deps, state, ctx, resumable)
            if state.ended:
                return  # back to waiting
        await self._loop(state, ctx)

    async def _loop(self, state: EpisodeState, ctx: StepContext) -> None:
        """Steps until one suspends (-> waiting) or ends the run (-> completed)."""
        extra = ctx.extra_messages
        step = ctx.step
        while True:
            if step >= self.deps.agent.max_steps:
                raise RunFailed(f"the run exceeded max_steps={self.deps.agent.max_steps}")
            step_ctx = StepContext(run=ctx.run, step=step, local=ctx.local, extra_messages=extra)
            began = time.perf_counter()
            outcome = await run_step(self.deps, state, step_ctx)
            instruments.safe_record(instruments.STEP_DURATION, time.perf_counter() - began)
            if state.ended:  # the step's commit carried the run transition: no after_step
                return
            extra = await after_step(self.deps, step_ctx, outcome)
            if outcome.pending:
                await transition(self.deps, state, RunStatus.WAITING)
                return
            if not outcome.result.continues:
                await transition(self.deps, state, RunStatus.COMPLETED)
                return
            step += 1

    # --- stop and failure ----------------------------------------------------------------------

    async def _finish_stopped(self, state: EpisodeState) -> None:
        """Stop: commit what was streamed but not committed, cancel open tool parts, end
        cancelled. What is left to commit is read from `state.phase` (see `Finalisation`)."""
        try:
            await end(self.deps, state, RunStatus.CANCELLED)
        except (LeaseLost, Unavailable):
            self.lease_lost = True
        except Exception:
            log.exception("run %s: could not finalise the stop", self.run_id)
            await self._finish_failed(state, RuntimeError("stop finalisation failed"))

    async def _finish_failed(self, state: EpisodeState, exc: BaseException) -> None:
        self.failure = exc
        reason = str(exc) or type(exc).__name__
        # Open tool parts are cancelled with after_tool_result; if a hook is what failed, they
        # are cancelled without hooks, and as a last resort only the run is marked failed.
        for cancel_hooks in (True, False):
            try:
                await end(self.deps, state, RunStatus.FAILED, reason, cancel_hooks=cancel_hooks)
                return
            except (LeaseLost, Unavailable):
                self.lease_lost = True
                return
            except Exception:
                log.exception("run %s: could not record failure with partial output", self.run_id)
        try:
            await commit(
                self.deps, state, StepCommit(run=RunChange(status=RunStatus.FAILED, error=reason))
            )
        except Exception:
            log.exception("run %s: could not record failure", self.run_id)


def start_kind(before: Run) -> str:
    """How an episode begins its run, judged from the run before `start_episode`: `started`
    (queued), `resumed` (waiting, or resumed from waiting with no episode since), or
    `takeover` (running, and an episode began since it started or was resumed: that episode
    died or stalled without ending it, so this one redoes what it left uncommitted)."""
    if before.status is RunStatus.QUEUED:
        return "started"
    if before.status is RunStatus.RUNNING and before.episode > before.resumed_episode:
        return "takeover"
    return "resumed"


def _steps_taken(messages: list[Message], run: Run) -> int:
    """The run's assistant messages so far. They all follow its input message (a run appends
    only while it is active, after its input), so the count stops there when the run has one."""
    steps = 0
    for message in reversed(messages):
        if message.id == run.input_message_id:
            break
        if message.run_id == run.id and message.role is MessageRole.ASSISTANT:
            steps += 1
    return steps


def _resumable(tail: Message | None, run_id: str) -> Message | None:
    """The tail, when it is this run's and holds resolved actions to continue, or tools an
    earlier episode committed as started without their result (a takeover settles them)."""
    if tail is None or tail.run_id != run_id:
        return None
    resolved = any(
        isinstance(p, ToolCallPart)
        and (
            p.state is ToolState.RUNNING
            or (
                p.state is ToolState.AWAITING_ACTION
                and p.waiting is not None
                and p.waiting.resolution is not None
            )
        )
        for p in tail.parts
    )
    return tail if resolved else None
