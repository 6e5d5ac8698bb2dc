"""The episode's phase order and what a stop or failure finalises from each phase."""

from __future__ import annotations

import pytest

from realtime.memory import MemoryBus
from runtime.domain import Run, RunStatus, RunTrigger
from runtime.engine.episode_state import EpisodeState, Finalisation, Phase, finalisation
from runtime.engine.publisher import Publisher
from runtime.engine.streaming import ChunkSink


def _state() -> EpisodeState:
    run = Run(
        id="run_1",
        thread_id="th_1",
        scope="acme",
        status=RunStatus.RUNNING,
        trigger=RunTrigger.MESSAGE,
        started_by="alice",
        input_message_id=None,
        created_at=0.0,
        updated_at=0.0,
    )
    sink = ChunkSink(Publisher(MemoryBus()), "th_1", "run_1", 0)
    return EpisodeState(run=run, sink=sink, anchor=0)


# The spec's order for a run of two steps, the second ending it.
SPEC_ORDER = [
    Phase.CONTEXT,
    Phase.TOOLS,
    Phase.PREPARE,
    Phase.MODEL_CALL,
    Phase.TOOL_PHASE,
    Phase.COMMIT,
    Phase.AFTER_STEP,
    Phase.CONTEXT,
    Phase.TOOLS,
    Phase.PREPARE,
    Phase.MODEL_CALL,
    Phase.COMMIT,
    Phase.AFTER_STEP,
    Phase.TRANSITION,
    Phase.ENDED,
]


def test_the_spec_order_is_accepted() -> None:
    state = _state()
    for phase in SPEC_ORDER:
        state.enter(phase)
    assert state.phase is Phase.ENDED


def test_a_resume_continues_into_steps_or_back_to_waiting() -> None:
    for after in (Phase.CONTEXT, Phase.TRANSITION):
        state = _state()
        for phase in (Phase.RESUMING, Phase.RESUMED, after):
            state.enter(phase)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (Phase.STARTING, Phase.TOOLS),  # tool assembly before resolve_model_context
        (Phase.CONTEXT, Phase.MODEL_CALL),  # a model call without prepare_model_step
        (Phase.MODEL_CALL, Phase.AFTER_STEP),  # after_step before the step's commit
        (Phase.TOOL_PHASE, Phase.TRANSITION),  # a run transition before the step commit
        (Phase.RESUMING, Phase.CONTEXT),  # a step before the resume is committed
        (Phase.ENDED, Phase.CONTEXT),  # anything after the run's end
    ],
)
def test_out_of_order_phases_are_refused(current: Phase, target: Phase) -> None:
    state = _state()
    state.phase = current
    with pytest.raises(RuntimeError, match="cannot follow"):
        state.enter(target)
    assert state.phase is current


def test_every_phase_says_what_a_stop_finalises() -> None:
    expected = {
        Phase.STARTING: Finalisation.CLOSE_COMMITTED_TAIL,
        Phase.RESUMING: Finalisation.UPDATE_RESUMED_TAIL,
        Phase.RESUMED: Finalisation.CLOSE_COMMITTED_TAIL,
        Phase.CONTEXT: Finalisation.CLOSE_COMMITTED_TAIL,
        Phase.TOOLS: Finalisation.CLOSE_COMMITTED_TAIL,
        Phase.PREPARE: Finalisation.CLOSE_COMMITTED_TAIL,
        # Chunks of the step were published and no commit holds them yet.
        Phase.MODEL_CALL: Finalisation.APPEND_STEP,
        Phase.TOOL_PHASE: Finalisation.APPEND_STEP,
        # The step's message is committed with its tools running; their results are not.
        Phase.EXECUTING: Finalisation.UPDATE_RESUMED_TAIL,
        # Only reached after a failed commit: a durable one has moved on to AFTER_STEP.
        Phase.COMMIT: Finalisation.APPEND_STEP,
        # The step commit is durable: appending the step again would duplicate it.
        Phase.AFTER_STEP: Finalisation.CLOSE_COMMITTED_TAIL,
        Phase.TRANSITION: Finalisation.CLOSE_COMMITTED_TAIL,
        Phase.ENDED: Finalisation.NOTHING,
    }
    assert set(expected) == set(Phase)
    assert {phase: finalisation(phase) for phase in Phase} == expected
