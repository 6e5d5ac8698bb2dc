"""Domain model: threads, messages and parts, runs, queued items, leases, principals, snapshots."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from runtime.approvals import ApprovalDecision, ApprovalState, ExpiryOutcome
from runtime.errors import IllegalTransition
from threadline_wire import AdmissionAnswer
from threadline_wire import enums as _wire
from threadline_wire import message_parts as parts

# The wire's enumerations, declared once in threadline_wire (the client reads the same ones).
InputPolicy = _wire.InputPolicy
MessageRole = _wire.MessageRole
Role = _wire.Role
RunStatus = _wire.RunStatus
ToolState = _wire.ToolState
Visibility = _wire.Visibility
WaitKind = _wire.WaitKind

# Documented limits (docs/architecture.md). Larger input is refused with `too_large`.
MAX_TEXT_CHARS = 64 * 1024
MAX_TITLE_CHARS = 500
MAX_METADATA_BYTES = 64 * 1024
MAX_PARTS_PER_MESSAGE = 256


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# Distinct scope and group sets of principals, shared: a thousand people with the same scopes
# hold one frozenset, not a thousand (about 200 bytes each). Bounded; past it, sets are not shared.
_SHARED_SETS: dict[frozenset[str], frozenset[str]] = {}
_MAX_SHARED_SETS = 4096


def shared_set(items: Iterable[str]) -> frozenset[str]:
    """`frozenset(items)`, the same object for equal sets (up to a bound)."""
    made = frozenset(items)
    found = _SHARED_SETS.get(made)
    if found is not None:
        return found
    if len(_SHARED_SETS) < _MAX_SHARED_SETS:
        _SHARED_SETS[made] = made
    return made


class Principal(_Frozen):
    subject: str
    role: Role
    scopes: frozenset[str]
    display_name: str | None = None  # what people see (presence); the subject when unset
    # Groups from the caller's token claims: approval policies name their deciders by them.
    groups: frozenset[str] = frozenset()
    # A JWT's verified claims, for authorization hooks that decide by them (a department, a
    # tenant); empty for `tl_` tokens. Never serialised: not part of any answer or record.
    claims: dict[str, Any] = Field(default_factory=dict, exclude=True, repr=False)

    @field_validator("scopes", "groups")
    @classmethod
    def _shared(cls, value: frozenset[str]) -> frozenset[str]:
        return shared_set(value)

    @property
    def name(self) -> str:
        return self.display_name or self.subject

    def can_access(self, scope: str) -> bool:
        return scope in self.scopes


# --- tool-call part state machine -------------------------------------------------------


_FINAL_TOOL_STATES = frozenset(state for state in ToolState if state.is_final)
_TOOL_TRANSITIONS: dict[ToolState, frozenset[ToolState]] = {
    ToolState.INPUT_AVAILABLE: frozenset(
        {ToolState.AWAITING_ACTION, ToolState.RUNNING} | _FINAL_TOOL_STATES
    ),
    # A resolved action re-enters the pipeline (before_tool_call runs again) or ends directly
    # (client-tool / manual results, refusal, cancellation).
    ToolState.AWAITING_ACTION: frozenset({ToolState.RUNNING} | _FINAL_TOOL_STATES),
    ToolState.RUNNING: frozenset(
        {ToolState.OUTPUT_AVAILABLE, ToolState.OUTPUT_ERROR, ToolState.CANCELLED}
    ),
}


def check_tool_transition(current: ToolState, target: ToolState) -> None:
    if target not in _TOOL_TRANSITIONS.get(current, frozenset()):
        raise IllegalTransition(f"tool part cannot go from {current} to {target}")


class Origin(_Frozen):
    """Where a command came from, for the audit log: never stored in a snapshot."""

    transport: str
    client_address: str | None = None
    user_agent: str | None = None
    token_id: str | None = None


class Resolution(_Frozen):
    """Who resolved a pending action, and with what payload. Under an approval policy it is one
    decider's decision; `decisions` holds every decision once the policy settled it."""

    subject: str
    role: Role
    payload: dict[str, Any]
    at: float
    display_name: str | None = None
    decisions: tuple[ApprovalDecision, ...] = ()
    # Set when the action's deadline ended it (the system resolved it): the policy's
    # `on_expiry` and the recorded reason (runtime.approvals).
    by_deadline: ExpiryOutcome | None = None
    reason: str | None = None
    # What the store reads for the decision record and the audit entry; never persisted.
    decision: ApprovalDecision | None = Field(default=None, exclude=True)
    origin: Origin | None = Field(default=None, exclude=True)


class Waiting(parts.Waiting):
    """What a suspended tool part waits for. Projected as a PendingAction while unresolved."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    resolution: Resolution | None = None
    # The tool's approval policy and the decisions committed so far (None: one resolution).
    approval: ApprovalState | None = None


# The parts the wire carries (threadline_wire.message_parts, which the client reads), strict here.
class TextPart(parts.TextPart):
    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = Field(max_length=MAX_TEXT_CHARS)


class ToolCallPart(parts.ToolCallPart):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tool_call_id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    waiting: Waiting | None = None

    def transition(self, target: ToolState, **changes: Any) -> ToolCallPart:
        """A copy in state `target`; raises IllegalTransition for an out-of-order change."""
        check_tool_transition(self.state, target)
        return self.model_copy(update={"state": target, **changes})

    @property
    def is_pending(self) -> bool:
        return (
            self.state is ToolState.AWAITING_ACTION
            and self.waiting is not None
            and self.waiting.resolution is None
        )


Part = Annotated[TextPart | ToolCallPart, Field(discriminator="type")]
PartsAdapter: TypeAdapter[list[Part]] = TypeAdapter(list[Part])


class Message(_Frozen):
    id: str
    thread_id: str
    position: int
    role: MessageRole
    parts: tuple[Part, ...] = Field(max_length=MAX_PARTS_PER_MESSAGE)
    visibility: Visibility = Visibility.VISIBLE
    run_id: str | None = None
    client_request_id: str | None = None
    created_at: float
    updated_at: float

    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))


class NewMessage(_Frozen):
    """A message to append; the store assigns id, position and timestamps."""

    role: MessageRole
    parts: tuple[Part, ...] = Field(max_length=MAX_PARTS_PER_MESSAGE)
    run_id: str | None = None
    client_request_id: str | None = None
    id: str | None = None


class Thread(_Frozen):
    id: str
    scope: str
    title: str
    version: int
    metadata: dict[str, Any]
    private_metadata: dict[str, Any]
    created_at: float
    updated_at: float
    # The subject of the principal that created it (None: created before owners were kept,
    # or by a schedule): committed state an authorization hook may decide by.
    owner: str | None = None


# --- runs ------------------------------------------------------------------------------


_RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.RUNNING: frozenset(
        {RunStatus.WAITING, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}
    ),
    # waiting -> running happens when every pending action of the run is resolved.
    RunStatus.WAITING: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
}


def check_run_transition(current: RunStatus, target: RunStatus) -> None:
    if target not in _RUN_TRANSITIONS.get(current, frozenset()):
        raise IllegalTransition(f"run cannot go from {current} to {target}")


class RunTrigger(StrEnum):
    MESSAGE = "message"
    QUEUED = "queued"
    REGENERATE = "regenerate"
    RETRY = "retry"


class Run(_Frozen):
    id: str
    thread_id: str
    scope: str
    status: RunStatus
    trigger: RunTrigger
    started_by: str
    input_message_id: str | None
    episode: int = 0
    # `episode` when the run was last resumed from waiting: a running run whose episode count
    # is higher was left by an episode that started and died (`is_takeover`).
    resumed_episode: int = 0
    # Chunks [0, next_seq) of this run are committed; live chunks continue from here.
    next_seq: int = 0
    stop_requested: bool = False
    error: str | None = None
    # Frontend-defined client tools captured with the request that started the run.
    client_tools: tuple[dict[str, Any], ...] = ()
    created_at: float
    updated_at: float
    # The W3C trace context of the request that started the run (its episodes link to it);
    # internal: never in a snapshot (`RunView`).
    traceparent: str | None = None


class QueuedItemStatus(StrEnum):
    QUEUED = "queued"
    ADMITTED = "admitted"
    CANCELLED = "cancelled"


class QueuedItem(_Frozen):
    id: str
    thread_id: str
    text: str
    submitted_by: str
    client_request_id: str | None
    status: QueuedItemStatus
    interrupt: bool = False
    client_tools: tuple[dict[str, Any], ...] = ()
    position: int
    created_at: float


class Admission(AdmissionAnswer):
    """Outcome of queue admission for one input: the wire answer of `message.send` (declared
    in threadline_wire, which the client reads too) and what stays inside the server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # With policy `interrupt`, the active run that must be stopped before the input is admitted.
    interrupted_run_id: str | None = None


# --- leases ----------------------------------------------------------------------------


class LeaseKind(StrEnum):
    RUN = "run"
    ADMIN = "admin"


class Lease(_Frozen):
    """Exclusive expiring ownership. `resource_id` is a run id (run lease) or thread id (admin)."""

    kind: LeaseKind
    resource_id: str
    thread_id: str
    owner: str
    token: int
    expires_at: float


# --- projections -----------------------------------------------------------------------


class PendingAction(parts.PendingAction):
    """The wire's pending action (threadline_wire), strict: every field the projection sets."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    run_id: str | None
    message_id: str
    input: dict[str, Any]
    payload_schema: dict[str, Any] = Field(alias="schema")
    allowed_roles: tuple[Role, ...]
    # Policy and progress of an approval under a policy: decisions so far, approvals needed.
    approval: ApprovalState | None = None


class ThreadView(_Frozen):
    id: str
    scope: str
    title: str
    version: int
    metadata: dict[str, Any]
    owner: str | None = None

    @classmethod
    def of(cls, thread: Thread) -> ThreadView:
        """What a snapshot shows of `thread`: its public fields (never its private metadata)."""
        return cls(
            id=thread.id,
            scope=thread.scope,
            title=thread.title,
            version=thread.version,
            metadata=thread.metadata,
            owner=thread.owner,
        )


class MessageView(_Frozen):
    id: str
    role: MessageRole
    visibility: Visibility
    parts: tuple[Part, ...]
    run_id: str | None = None


class RunView(parts.RunView):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QueuedItemView(parts.QueuedItemView):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Snapshot(_Frozen):
    """Projected thread state read from committed storage at exactly one version."""

    thread: ThreadView
    messages: tuple[MessageView, ...]
    pending_actions: tuple[PendingAction, ...]
    run: RunView | None
    queue: tuple[QueuedItemView, ...]
    # What the reading principal may do (runtime.service.permissions); set per reader.
    permissions: dict[str, Any] | None = None
    # Set for a bounded snapshot: `{"limit", "before"}`; `before` is the cursor of the older
    # messages (None: the snapshot holds the thread's first message).
    page: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def of_new_thread(cls, thread: Thread, message_limit: int | None) -> Snapshot:
        """The snapshot of a thread just created, as storage would read it (bounded by
        `message_limit`, None: whole): nothing but the thread itself."""
        page = None if message_limit is None else {"limit": message_limit, "before": None}
        return cls(
            thread=ThreadView.of(thread),
            messages=(),
            pending_actions=(),
            run=None,
            queue=(),
            page=page,
        )


def pending_actions_of(message: Message) -> list[PendingAction]:
    """Project the unresolved suspended tool parts of a (tail) message."""
    actions = []
    for part in message.parts:
        if isinstance(part, ToolCallPart) and part.is_pending and part.waiting is not None:
            actions.append(
                PendingAction(
                    id=part.waiting.action_id,
                    kind=part.waiting.kind,
                    run_id=message.run_id,
                    message_id=message.id,
                    tool_call_id=part.tool_call_id,
                    tool_name=part.name,
                    input=part.input,
                    payload_schema=part.waiting.payload_schema,
                    allowed_roles=part.waiting.allowed_roles,
                    approval=part.waiting.approval,
                )
            )
    return actions


class InboxEntry(_Frozen):
    """One thread's pending actions in the scope-wide inbox, with the version they were read at
    and when their (tail) message was committed."""

    thread_id: str
    scope: str
    thread_version: int
    created_at: float
    actions: tuple[PendingAction, ...]
    # The thread's owner and public metadata, for an authorization hook's narrowing of the
    # live inbox (server/live/inbox.py); never on the wire, which `to_wire` shapes.
    thread_owner: str | None = None
    thread_metadata: dict[str, Any] = Field(default_factory=dict)

    def to_wire(self) -> list[dict[str, Any]]:
        """One inbox item per action: the snapshot's action plus where and when it waits."""
        return [
            {
                **action.model_dump(mode="json", by_alias=True),
                "thread_id": self.thread_id,
                "scope": self.scope,
                "thread_version": self.thread_version,
                "created_at": self.created_at,
            }
            for action in self.actions
        ]
