"""Lifecycle phases of the spec as a base class of no-op async hooks, and their decision types."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from runtime.chunks import StreamChunk
from runtime.models import Resolution, RunTrigger, ToolState, Visibility
from runtime.providers.base import ContextMessage, ModelDelta, ModelRequest

# --- contexts handed to hooks (read-only views; hooks never touch storage) ------------------


@dataclass(frozen=True)
class RuntimeContextInput:
    thread_id: str
    scope: str
    run_id: str
    episode: int
    started_by: str
    thread_metadata: Mapping[str, Any]


@dataclass(frozen=True)
class RunContext:
    """One episode of one run. `state` is the trusted runtime_context result."""

    thread_id: str
    scope: str
    run_id: str
    episode: int
    started_by: str
    trigger: RunTrigger
    resumed: bool
    state: Mapping[str, Any]
    thread_metadata: Mapping[str, Any]


@dataclass(frozen=True)
class StepContext:
    run: RunContext
    step: int
    # Execution-local context from prepare_run (and later after_step decisions' bookkeeping).
    local: Mapping[str, Any]
    # Execution-local extra model messages for this step (after_step appends/replaces them).
    extra_messages: tuple[ContextMessage, ...] = ()


@dataclass(frozen=True)
class ToolCall:
    tool_call_id: str
    name: str
    input: Mapping[str, Any]


@dataclass(frozen=True)
class ToolCallContext:
    step: StepContext
    tool_call_id: str
    tool_name: str
    # True when before_tool_call runs again after a pending action was resolved.
    resumed: bool = False
    resolution: Resolution | None = None


@dataclass(frozen=True)
class ToolResult:
    """A final model-visible tool result: completion, skip, rejection, client/manual result,
    failure or cancellation. `state` is the final tool-part state."""

    state: ToolState
    output: Any = None
    error: str | None = None


@dataclass(frozen=True)
class StepResult:
    step: int
    text: str
    tool_results: tuple[tuple[ToolCall, ToolResult | None], ...]
    finish_reason: str | None
    # True when the run continues with another model step.
    continues: bool


@dataclass(frozen=True)
class RewriteContext:
    thread_id: str
    scope: str
    kind: Literal["regenerate", "visibility"]
    message_id: str
    requested_by: str
    visibility: Visibility | None
    metadata: Mapping[str, Any]
    private_metadata: Mapping[str, Any]


@dataclass(frozen=True)
class RewriteOutcome:
    thread_id: str
    version: int
    kind: Literal["regenerate", "visibility"]
    message_id: str
    run_id: str | None
    removed_message_ids: tuple[str, ...]


# --- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Respond:
    """Commit `text` as the terminal assistant response (after transform_step_stream) and end
    the run as completed."""

    text: str


@dataclass(frozen=True)
class Block:
    """Do not run the step. With `response`, it behaves like Respond; without, the run fails with
    `reason`."""

    reason: str
    response: str | None = None


@dataclass(frozen=True)
class Continue:
    pass


@dataclass(frozen=True)
class ReplaceInput:
    input: Mapping[str, Any]


@dataclass(frozen=True)
class Skip:
    """Do not execute or route the call; `output` becomes its (validated) skipped output."""

    output: Any = None


@dataclass(frozen=True)
class Reject:
    reason: str


@dataclass(frozen=True)
class PrepareRunDecision:
    context: Mapping[str, Any] = field(default_factory=dict)
    respond: Respond | None = None


@dataclass(frozen=True)
class AfterStepDecision:
    append: tuple[ContextMessage, ...] = ()
    replace: tuple[ContextMessage, ...] | None = None


@dataclass(frozen=True)
class MetadataPatch:
    public: Mapping[str, Any] = field(default_factory=dict)
    private: Mapping[str, Any] = field(default_factory=dict)


BeforeToolDecision = Continue | ReplaceInput | Skip | Reject
ModelCall = Callable[[ModelRequest], Awaitable[AsyncIterator[ModelDelta]]]
ContextNext = Callable[[], Awaitable[list[ContextMessage]]]


class AgentLifecycle:
    """Every phase of the spec; each hook does nothing by default. Subclass and override some.

    Hooks return decisions; the runtime applies them. They never write storage, never see raw
    provider records, and are never used for queueing, leases, stop, wakeups or publishing.
    """

    async def runtime_context(self, inp: RuntimeContextInput) -> Mapping[str, Any] | None:
        return None

    async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
        return None

    async def resolve_model_context(
        self, ctx: RunContext, next: ContextNext
    ) -> list[ContextMessage]:
        return await next()

    async def prepare_model_step(
        self, ctx: StepContext, request: ModelRequest
    ) -> ModelRequest | Respond | Block | None:
        return None

    async def around_model_call(
        self, ctx: StepContext, request: ModelRequest, call: ModelCall
    ) -> AsyncIterator[ModelDelta]:
        return await call(request)

    async def before_tool_call(
        self, ctx: ToolCallContext, call: ToolCall
    ) -> BeforeToolDecision | None:
        return None

    async def after_tool_result(
        self, ctx: ToolCallContext, result: ToolResult
    ) -> ToolResult | None:
        return None

    def transform_step_stream(
        self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
    ) -> AsyncIterator[StreamChunk]:
        return stream

    async def after_step(self, ctx: StepContext, result: StepResult) -> AfterStepDecision | None:
        return None

    async def prepare_history_rewrite(self, ctx: RewriteContext) -> MetadataPatch | None:
        return None

    async def history_rewritten(self, ctx: RewriteContext, outcome: RewriteOutcome) -> None:
        return None
