"""Lifecycle phases of the spec as a base class of no-op async hooks, and their decision types."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from runtime.domain import Resolution, RunTrigger, ToolState, Visibility
from runtime.providers.model_api import ContextMessage, ModelDelta, ModelRequest
from threadline_wire.chunks import StreamChunk

# What agent authors get from `runtime` (it star-imports this list; RewriteKind stays internal).
__all__ = [
    "AfterStepDecision",
    "AgentLifecycle",
    "BeforeToolDecision",
    "Block",
    "ContextNext",
    "Continue",
    "MetadataPatch",
    "ModelCall",
    "PrepareRunDecision",
    "Reject",
    "ReplaceInput",
    "Respond",
    "RewriteContext",
    "RewriteOutcome",
    "RunContext",
    "RuntimeContextInput",
    "Skip",
    "StepContext",
    "StepResult",
    "ToolCall",
    "ToolCallContext",
    "ToolResult",
]

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
    # True when before_tool_call runs again because a takeover is about to re-execute an
    # idempotent tool that a dead episode committed as started (`@tool(idempotent=True)`).
    takeover: bool = False


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


RewriteKind = Literal["regenerate", "retry", "visibility"]


@dataclass(frozen=True)
class RewriteContext:
    """A rewrite about to commit. `metadata`, `private_metadata` and `version` are read under
    the rewrite's admin lease, and the rewrite commits only if the thread is still at
    `version`: a patch computed from this metadata cannot lose a concurrent update."""

    thread_id: str
    scope: str
    kind: RewriteKind
    # regenerate: the first removed message; visibility: the message; retry: the retried run's
    # input message ("" when it had none).
    message_id: str
    requested_by: str
    visibility: Visibility | None
    metadata: Mapping[str, Any]
    private_metadata: Mapping[str, Any]
    version: int = 0
    # retry: the failed or cancelled run being retried.
    retried_run_id: str | None = None


@dataclass(frozen=True)
class RewriteOutcome:
    thread_id: str
    version: int
    kind: RewriteKind
    message_id: str
    run_id: str | None
    removed_message_ids: tuple[str, ...]

    @property
    def rewrite_id(self) -> str:
        """Stable id of this rewrite (one commit of one thread) for idempotent reconciliation."""
        return f"{self.thread_id}@{self.version}"


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
    """Do not execute or route the call; `output` becomes its (validated) skipped output.
    `input`, when set, is the input the call is stored (and shown to later steps) with."""

    output: Any = None
    input: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Reject:
    """Do not execute or route the call; it ends `rejected` with `reason`. `input`, when set,
    is the input the call is stored (and shown to later steps) with."""

    reason: str
    input: Mapping[str, Any] | None = None


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

    Each hook's docstring gives its row of the spec's phase table (what it may change) and its
    rule under `compose_lifecycle(a, b, c)` (runtime/compose.py): the runtime always calls the
    composed lifecycle, so a lifecycle may also be any object with a subset of these methods.
    Unless a hook says otherwise, an exception it raises propagates at once (later hooks do not
    run and the run fails), and a decision of the wrong type raises TypeError.

    The short-circuit rule, the same for every decision phase: a terminal decision (prepare_run
    `respond`, prepare_model_step `Respond`/`Block`, before_tool_call `Skip`/`Reject`) ends its
    phase at once. The hooks after the one that returned it do not run, and it is the phase's
    decision together with what the earlier hooks contributed (context, patched request or
    input). Non-terminal decisions never stop later hooks.
    """

    async def runtime_context(self, inp: RuntimeContextInput) -> Mapping[str, Any] | None:
        """Build trusted agent-wide state for one execution episode (`runtimeContext`).

        Spec: model input indirectly; persisted transcript no; tools no. Called once per
        episode; the mapping becomes `RunContext.state` and `ToolContext.state` (read-only).

        Composed: a, b, c; returned mappings shallow-merged (later keys win); None when every
        hook returned None.
        """
        return None

    async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
        """Per-episode guardrails, quota, cache and limits (`prepareRun`); runs again on resume.

        Spec: model input only the initial execution-local context (`decision.context` becomes
        `StepContext.local`); persisted transcript only through `respond` (a terminal assistant
        answer that ends the run); tools no.

        Composed: a, b, c, each with the same ctx. Decisions accumulate without mutating the
        input: contexts shallow-merged in order (later keys win). A `respond` short-circuits:
        later hooks do not run, and it is returned with the contexts merged so far. None when
        every hook returned None.
        """
        return None

    async def resolve_model_context(
        self, ctx: RunContext, next: ContextNext
    ) -> list[ContextMessage]:
        """Choose the durable/base messages of a model step (`resolveModelContext`).

        Spec: model input chooses durable/base messages; persisted transcript no; tools no.
        Lazy middleware over provider-backed history capped at the step-start anchor: `next()`
        returns the committed visible messages up to it.

        Composed: middleware, a outermost, c closest to the runtime's leaf. Every layer's `next`
        is memoized: the inner chain is evaluated at most once (a raised Exception is cached and
        re-raised too; a cancellation is not) and each call returns a fresh copy of the list. A
        layer that never calls `next` keeps the inner layers from running.
        """
        return await next()

    async def prepare_model_step(
        self, ctx: StepContext, request: ModelRequest
    ) -> ModelRequest | Respond | Block | None:
        """Patch the request of one model step (`prepareModelStep`), after tool assembly.

        Spec: model input yes (an ephemeral per-step patch: return a new ModelRequest);
        persisted transcript only through `Respond` or `Block` with a response; tools no.
        `Block` without a response fails the run with its reason.

        Composed: a, b, c; a returned ModelRequest becomes the next hook's request.
        Respond/Block short-circuits: later hooks do not run, and it is returned. Otherwise
        returns the final request (the original object when nobody changed it). The tools of
        the final request are the only ones the step may call (tool assembly is enforced).
        """
        return None

    async def around_model_call(
        self, ctx: StepContext, request: ModelRequest, call: ModelCall
    ) -> AsyncIterator[ModelDelta]:
        """Wrap the model call (`aroundModelCall`): `await call(request)` returns its stream.

        Spec: model input yes; persisted transcript through the returned model stream; tools
        no. It may catch setup failures of the call it wraps; failures delivered later while
        the stream is consumed need stream-aware handling. An async generator yielding the
        deltas itself is accepted too.

        Composed: a outermost, c closest to the underlying call.
        """
        return await call(request)

    async def before_tool_call(
        self, ctx: ToolCallContext, call: ToolCall
    ) -> BeforeToolDecision | None:
        """Validate one model-created tool call before it executes or routes (`beforeToolCall`).

        Spec: model input tool input only; persisted transcript through the tool part; tools
        no. Return Continue (or None), ReplaceInput, Skip (its output is validated and becomes
        the result) or Reject. Within one step it runs for every call before any ready tool
        starts, again on backend resume (`ctx.resumed`), and again before a takeover re-executes
        an idempotent tool an earlier episode started (`ctx.takeover`; a Skip or Reject then
        ends the call as interrupted, since the tool may have had its effect). Not the suspend
        mechanism: a tool that needs a person declares a SuspendStep.

        Composed: a, b, c; ReplaceInput hands later hooks a ToolCall with the patched input;
        Skip/Reject short-circuits: later hooks do not run, and it is returned with the input
        patched so far as its `input` (unless the hook set one itself), so a redaction by an
        earlier hook is what the rejected call is stored with. Otherwise ReplaceInput(final
        input) if any hook replaced the input, else Continue().
        """
        return None

    async def after_tool_result(
        self, ctx: ToolCallContext, result: ToolResult
    ) -> ToolResult | None:
        """Normalise a final tool result before the model sees it (`afterToolResult`).

        Spec: model input tool result only; persisted transcript through the tool part; tools
        no. Runs for every final model-visible result: completion, skipped output, rejection,
        submitted client result, manual result, failure or cancellation. A replacement must
        stay final and JSON-serialisable.

        Composed: a, b, c; a returned ToolResult replaces the one later hooks see. Always
        returns the final ToolResult (the original object when nobody changed it).
        """
        return None

    def transform_step_stream(
        self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
    ) -> AsyncIterator[StreamChunk]:
        """Transform a step's chunk stream at the canonical boundary (`transformStepStream`).

        Spec: model input future steps only; persisted transcript yes; tools no. What the
        composed chain yields is canonical: published live, committed, and seen by the next
        step (a redaction here holds everywhere). A plain method or an async generator, never
        an `async def` returning a stream.

        Composed: c(b(a(stream))): a sees the raw stream, c yields the canonical chunks.
        """
        return stream

    async def after_step(self, ctx: StepContext, result: StepResult) -> AfterStepDecision | None:
        """Observe a committed step and steer the next one (`afterStep`).

        Spec: model input future steps only; persisted transcript no direct rewrite; tools no.
        Runs after the canonical step commit and before the run transition; it can append or
        replace execution-local next-step model context (`StepContext.extra_messages`).

        Composed: a, b, c, each with the same StepResult. Decisions fold in order: a `replace`
        resets the accumulated messages (dropping earlier appends), an `append` adds after
        them; next-step extra context = (replace if not None else the current one) + append.
        None when every hook returned None.
        """
        return None

    async def prepare_history_rewrite(self, ctx: RewriteContext) -> MetadataPatch | None:
        """Prepare a regenerate, retry or visibility rewrite (`prepareHistoryRewrite`).

        Spec: returns thread metadata patches that commit in the same transaction as the
        history change; it cannot change model input or the transcript otherwise. It runs
        under the rewrite's admin lease, with `ctx.metadata` read under it; the rewrite commits
        only if the thread is still at `ctx.version` (else a 409 conflict, nothing changed).

        Composed: a, b, c; public and private patches shallow-merged separately (later keys
        win). None when every hook returned None.
        """
        return None

    async def history_rewritten(self, ctx: RewriteContext, outcome: RewriteOutcome) -> None:
        """Observe a committed rewrite for idempotent external reconciliation (`historyRewritten`).

        Spec: a best-effort fact after commit; it cannot change model input or the transcript.
        Its failures are reported (a log line, an event on the `threadline.history_rewrite`
        span and the `threadline.history_rewritten.failures` counter, with
        `outcome.rewrite_id`) and never undo the rewrite.

        Composed: every observer runs in order even if some raise; then, if any raised,
        HistoryRewrittenErrors carrying all failures (nested groups flattened).
        """
        return None
