"""What one episode works with and the state it keeps while it runs, in the spec's phase order."""

from __future__ import annotations

import asyncio
import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.agent import Agent
from runtime.compose import defines_hook
from runtime.domain import Lease, Run, RunStatus
from runtime.engine.message_cache import HistoryCache
from runtime.engine.publisher import Publisher
from runtime.engine.streaming import ChunkSink, StepOutput
from runtime.engine.toolcalls import ToolPhase
from runtime.lifecycle import AgentLifecycle, StepContext
from runtime.storage.store import EngineStore
from runtime.tools import Tool, ToolSource


class Phase(enum.Enum):
    """Where an episode is. Each phase function enters its phase first; a commit moves on to the
    phase after it when (and only when) its write is durable. Stop and failure handling decide
    from the phase what is committed and what was streamed but is not (`finalisation`)."""

    # start_episode, runtime_context, prepare_run: no step is open.
    STARTING = "starting"
    # Resolved actions of the tail continue: their tool parts changed but are not committed.
    RESUMING = "resuming"
    # The resume commit is durable; the step loop or the transition to `waiting` follows.
    RESUMED = "resumed"
    # The step phases, in the spec's order. Up to PREPARE nothing of the step was published.
    CONTEXT = "context"
    TOOLS = "tools"
    PREPARE = "prepare"
    # step-start was published; the model (or a Respond/Block text) streams canonical chunks.
    MODEL_CALL = "model-call"
    TOOL_PHASE = "tool-phase"
    # The step's message is committed with its ready tools `running` (before any executed);
    # their results are not committed yet. Like RESUMING, the tail's tool parts changed.
    EXECUTING = "executing"
    # The step commit is in flight. It is shielded: it always ends durable (-> AFTER_STEP or
    # ENDED) or failed (stays COMMIT, the step's output is still uncommitted).
    COMMIT = "commit"
    AFTER_STEP = "after-step"
    # The run transition commit is in flight (shielded, like COMMIT).
    TRANSITION = "transition"
    # This episode committed the run's transition (waiting or terminal): nothing is left to do.
    ENDED = "ended"


# The order the spec gives; `EpisodeState.enter` refuses anything else, so a phase function
# called out of order fails loudly instead of committing the wrong thing on a stop.
_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.RESUMING, Phase.CONTEXT, Phase.MODEL_CALL}),
    Phase.RESUMING: frozenset({Phase.RESUMED}),
    # MODEL_CALL: a prepare_run Respond after the tail's open calls were closed (`close_tail`).
    Phase.RESUMED: frozenset({Phase.CONTEXT, Phase.TRANSITION, Phase.MODEL_CALL}),
    Phase.CONTEXT: frozenset({Phase.TOOLS}),
    Phase.TOOLS: frozenset({Phase.PREPARE}),
    Phase.PREPARE: frozenset({Phase.MODEL_CALL}),
    Phase.MODEL_CALL: frozenset({Phase.TOOL_PHASE, Phase.COMMIT}),
    Phase.TOOL_PHASE: frozenset({Phase.COMMIT, Phase.EXECUTING}),
    Phase.EXECUTING: frozenset({Phase.AFTER_STEP}),
    Phase.COMMIT: frozenset({Phase.AFTER_STEP, Phase.ENDED}),
    Phase.AFTER_STEP: frozenset({Phase.CONTEXT, Phase.TRANSITION}),
    Phase.TRANSITION: frozenset({Phase.ENDED}),
    Phase.ENDED: frozenset(),
}


class Finalisation(enum.Enum):
    """What a stop or a failure must commit besides the run's end, decided from the phase."""

    # Chunks of the open step were published but no commit holds them: append the step's
    # canonical output, its open tool parts cancelled.
    APPEND_STEP = "append-step"
    # Resumed tool parts changed but are not committed: update the tail with them, the open
    # ones cancelled.
    UPDATE_RESUMED_TAIL = "update-resumed-tail"
    # Everything this episode did is committed: only tool parts still open in the committed tail
    # (a waiting action, a suspended step) are cancelled.
    CLOSE_COMMITTED_TAIL = "close-committed-tail"
    # This episode already committed the run's end.
    NOTHING = "nothing"


def finalisation(phase: Phase) -> Finalisation:
    if phase in (Phase.MODEL_CALL, Phase.TOOL_PHASE, Phase.COMMIT):
        return Finalisation.APPEND_STEP
    if phase in (Phase.RESUMING, Phase.EXECUTING):
        return Finalisation.UPDATE_RESUMED_TAIL
    if phase is Phase.ENDED:
        return Finalisation.NOTHING
    return Finalisation.CLOSE_COMMITTED_TAIL


@dataclass
class EpisodeDeps:
    """What an episode works with; none of it changes while it runs, except the lease's expiry,
    which the worker's heartbeat renews (same owner and fencing token)."""

    store: EngineStore
    publisher: Publisher
    agent: Agent
    lifecycle: AgentLifecycle
    lease: Lease
    # Parsed messages of the thread, shared by the worker's episodes: reads are tail reads.
    history: HistoryCache = field(default_factory=HistoryCache)
    # Tools besides the agent's own (the worker's MCP servers), asked before each step.
    tool_source: ToolSource | None = None

    @functools.cached_property
    def transition_with_step(self) -> bool:
        """Whether a step that ends the run (it suspends, or nothing follows it) commits the
        run transition in its own commit: when no after_step hook is defined, nothing runs
        between the two (the spec: afterStep runs after the canonical step commit and before
        the run transition), so one owner-fenced commit writes both, a commit fewer."""
        return not defines_hook(self.lifecycle, "after_step")

    @property
    def run_id(self) -> str:
        return self.lease.resource_id

    @property
    def thread_id(self) -> str:
        return self.lease.thread_id


class StopSignal(asyncio.Event):
    """An episode's stop request: an `asyncio.Event` that also calls back when set, so the
    episode waits for its body or a stop without a task waiting on the event."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the signal is set (soon, from the loop, when it already is)."""
        if self.is_set():
            asyncio.get_running_loop().call_soon(callback)
        else:
            self._callbacks.append(callback)

    def discard(self, callback: Callable[[], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)


@dataclass
class EpisodeState:
    """Everything an episode knows that changes while it runs; built once `start_episode` has
    committed. Only phase functions and commits (`runtime/engine/commits.py`) change it."""

    # The run as `start_episode` returned it: scope, trigger, captured client tools, episode.
    run: Run
    # Numbers and publishes chunks; continues the run's committed `next_seq`. Its `seq` is what
    # every commit stores as the run's `next_seq`.
    sink: ChunkSink
    # Position of the thread's last committed message: the next step's physical anchor. Only
    # this run appends while it is active (input is queued), so it is tracked, not re-read.
    anchor: int
    # Whether the worker's `HistoryCache` holds the thread's messages as `begin_episode` read
    # them, with nothing committed since: the first step's context is then taken from it
    # without a read. Only this run writes messages while it is active (input is queued, a
    # history rewrite is refused), so the change since would be the episode's own commit
    # (`commits.commit` clears this). The one exception, a resolution landing on a tail action
    # a dead episode left unsuspended, races with the step either way: the context is then as
    # of the episode's start, as if the resolution had come a moment later.
    history_current: bool = False
    # Where the episode is; moved forward by `enter` and by durable commits only.
    phase: Phase = Phase.STARTING
    # The latest step context (run context, step number, execution-local state). None until
    # runtime_context has run: tool parts closed before that are cancelled without hooks.
    step: StepContext | None = None
    # Canonical output the open step has published so far (reset when a step starts streaming).
    # Meaningful while `finalisation(phase)` is APPEND_STEP; the step commit then holds it.
    output: StepOutput = field(default_factory=StepOutput)
    # The tool phase of the open step, or of a resume: the latest state of each tool part, in
    # the model's order. None when no tool phase has started since the last commit.
    tools: ToolPhase | None = None
    # The tool source's tools as of the latest step or resume (`phases.load_tools`).
    source_tools: tuple[Tool, ...] = ()
    # The id of the open step's message once committed with its tools started (EXECUTING).
    started_message: str | None = None
    # The run status this episode committed last (waiting or terminal); None while the run is
    # still this episode's to finish.
    outcome: RunStatus | None = None
    # Whether the commit that ended the run admitted queued input as a new run: the worker
    # then wakes workers to run it.
    admitted: bool = False
    # Whether that commit released the run lease too (a terminal one does): the worker then
    # has none left to release.
    released: bool = False

    @property
    def ended(self) -> bool:
        """True once this episode's work is committed to its end: nothing is left to finalise."""
        return self.phase is Phase.ENDED

    def enter(self, phase: Phase) -> None:
        if phase not in _NEXT[self.phase]:
            raise RuntimeError(f"episode phase {phase.value} cannot follow {self.phase.value}")
        self.phase = phase
