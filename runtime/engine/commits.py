"""Every write an episode makes after its start: shielded commits and the final commit of a stop."""

from __future__ import annotations

from typing import Any

from runtime import instruments
from runtime.domain import (
    MessageRole,
    NewMessage,
    RunStatus,
    ToolCallPart,
    ToolState,
)
from runtime.engine.episode_state import (
    EpisodeDeps,
    EpisodeState,
    Finalisation,
    Phase,
    finalisation,
)
from runtime.engine.shielding import uncancellable
from runtime.engine.streaming import step_text_parts
from runtime.engine.toolcalls import ToolPhase, overlay_parts
from runtime.storage.store import (
    RunChange,
    StepCommit,
    TailUpdate,
)


async def commit(
    deps: EpisodeDeps, state: EpisodeState, change: StepCommit, then: Phase | None = None
) -> int:
    """The owner-fenced commit of step work or of a run transition, shielded from cancellation.

    A stop cancels the episode at any await. Were the commit cancellable, COMMIT could succeed
    while the episode believes it did not: the stop would then append the step a second time,
    or end a run that already ended (`InvariantViolation`), and watchers would miss the
    invalidation. So the write, the state update that records it and the invalidation run to
    their end; the stop is handled afterwards, from the phase the commit left.

    `then` is the phase a durable commit moves to; a commit carrying a run change ends the
    episode's work (ENDED) whatever phase it came from.
    """
    change = change.model_copy(update={"next_seq": state.sink.seq})
    # Taken with `next_seq`, before any await: a flusher started by the last emit would take
    # them first, and then they would cost a round trip of their own.
    chunks = state.sink.hold()
    return await uncancellable(_commit(deps, state, change, then, chunks))


async def _commit(
    deps: EpisodeDeps,
    state: EpisodeState,
    change: StepCommit,
    then: Phase | None,
    chunks: list[bytes],
) -> int:
    # Whatever happens to it, the commit may change messages the worker's cache holds.
    state.history_current = False
    published = False
    try:
        # The batch already on the wire first: seq order.
        await state.sink.settle()
        committed = await deps.store.commit(deps.lease, change)
        version = committed.version
        # Recorded in the same uninterrupted task as the write, before anything can observe it.
        state.anchor += len(change.append)
        state.tools = None
        if change.run is not None:
            state.phase = Phase.ENDED
            state.outcome = change.run.status
            state.admitted = committed.admitted
            state.released = committed.released
            instruments.safe_add(instruments.RUNS, 1, {"event": change.run.status.value})
        elif then is not None:
            state.enter(then)
        # The chunks the commit holds that are not published yet, its invalidation, and the
        # replay cleared (the commit holds every chunk so far: late joiners get the snapshot,
        # not a replay), in one bus operation.
        published = True
        await deps.publisher.committed(deps.thread_id, version, chunks)
        return version
    finally:
        if not published:
            # Nothing durable, no invalidation: the held chunks still go out, on their own.
            await deps.publisher.chunks(deps.thread_id, chunks)
        state.sink.release()


async def transition(
    deps: EpisodeDeps, state: EpisodeState, status: RunStatus, error: str | None = None
) -> None:
    """The run transition commit (waiting, completed, failed) after the last step's commit."""
    state.enter(Phase.TRANSITION)
    await commit(deps, state, StepCommit(run=RunChange(status=status, error=error)))


async def end(
    deps: EpisodeDeps,
    state: EpisodeState,
    status: RunStatus,
    error: str | None = None,
    *,
    cancel_hooks: bool = True,
) -> None:
    """End the run after a stop or failure in one commit: whatever was streamed but not committed
    is appended, open tool parts are cancelled (through after_tool_result when `cancel_hooks`),
    and the run ends with `status`."""
    kind = finalisation(state.phase)
    if kind is Finalisation.NOTHING:
        return
    work = await _final_work(deps, state, kind, cancel_hooks)
    run_end = RunChange(status=status, error=error)
    await commit(deps, state, work.model_copy(update={"run": run_end}))


async def _final_work(
    deps: EpisodeDeps, state: EpisodeState, kind: Finalisation, cancel_hooks: bool
) -> StepCommit:
    if kind is Finalisation.APPEND_STEP:
        parts: list[Any] = list(state.tools.parts) if state.tools is not None else []
        parts = await _close_parts(deps, state, parts, cancel_hooks)
        text = state.output.text
        content = [*step_text_parts(text), *parts]
        if not content:
            return StepCommit()
        message = NewMessage(role=MessageRole.ASSISTANT, parts=tuple(content), run_id=state.run.id)
        return StepCommit(append=(message,))
    # The committed tail is the truth; a resume in progress overlays its uncommitted parts.
    messages = await deps.store.list_messages(deps.thread_id)
    tail = messages[-1] if messages else None
    if tail is None or tail.run_id != state.run.id:
        return StepCommit()
    parts = list(tail.parts)
    if kind is Finalisation.UPDATE_RESUMED_TAIL and state.tools is not None:
        parts = overlay_parts(parts, state.tools.parts)
    # Nothing to write only when nothing is open and nothing differs from the committed tail:
    # tools that finished after their `running` commit, but before the step's, must have
    # their results committed, or the ended run would keep them `running`.
    if parts == list(tail.parts) and not any(
        isinstance(p, ToolCallPart) and not p.state.is_final for p in parts
    ):
        return StepCommit()
    closed = await _close_parts(deps, state, parts, cancel_hooks)
    return StepCommit(update_tail=TailUpdate(message_id=tail.id, parts=tuple(closed)))


async def _close_parts(
    deps: EpisodeDeps, state: EpisodeState, parts: list[Any], cancel_hooks: bool
) -> list[Any]:
    if cancel_hooks and state.step is not None:
        # The open phase itself when there is one: it knows which calls already had their
        # after_tool_result, so none gets a second one.
        phase = state.tools or ToolPhase(deps.agent, deps.lifecycle, state.sink, state.step, ())
        return await phase.cancel_open(parts)
    return [
        p.transition(ToolState.CANCELLED, error="the run failed")
        if isinstance(p, ToolCallPart) and not p.state.is_final
        else p
        for p in parts
    ]
