"""Tools: async functions with a pydantic input model, optionally suspending for a typed payload."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError

from runtime.approvals import ApprovalDecision, ApprovalPolicy
from runtime.domain import Role, WaitKind
from runtime.providers.model_api import ToolSpec

ALL_ROLES: tuple[Role, ...] = (Role.USER, Role.BACKEND, Role.ADMIN)
TRUSTED_ROLES: tuple[Role, ...] = (Role.BACKEND, Role.ADMIN)


class ResultPayload(BaseModel):
    """Resume payload of client-tool and manual-result actions: the tool's output or an error."""

    model_config = ConfigDict(extra="forbid")
    output: Any = None
    error: str | None = None


# A denial rule: the reason a validated resume payload refuses the call, or None (it approves).
DenialRule = Callable[[BaseModel], str | None]


@dataclass(frozen=True)
class SuspendStep:
    """Declares that a tool waits for a human or a trusted actor before it executes.

    `payload` is the pydantic model of the resume payload; `allowed_roles` may resolve it.
    `denial` (approvals only) says which payloads refuse the call: for those the tool never
    runs and the call ends `rejected` with the reason (what an AI SDK client shows as
    `output-denied`); without it, every valid payload runs the tool, which decides itself.
    `policy` routes an approval: its deciders, a quorum of distinct ones, four-eyes.
    """

    payload: type[BaseModel]
    allowed_roles: tuple[Role, ...] = ALL_ROLES
    kind: WaitKind = WaitKind.APPROVAL
    denial: DenialRule | None = None
    # Approvals only: who decides, how many must, four-eyes (runtime.approvals); None: the
    # first allowed resolution settles the action, as before policies existed.
    policy: ApprovalPolicy | None = None

    def __post_init__(self) -> None:
        # What an auto-approving deadline resumes the tool with must be a valid payload.
        if self.policy is not None and self.policy.on_expiry == "approve":
            try:
                self.payload.model_validate(self.policy.approve_payload)
            except ValidationError as exc:
                raise ValueError(
                    f"approve_payload is not a valid {self.payload.__name__}:"
                    f" {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}"
                ) from None


DENIED = "denied"


def denied_unless_approved(payload: BaseModel) -> str | None:
    """The denial rule of a payload with an `approved` flag: `approved: false` is a denial,
    its reason "denied", or "denied: <note>" when the payload has a `note` or `reason`."""
    if getattr(payload, "approved", None) is not False:
        return None
    note = getattr(payload, "note", None) or getattr(payload, "reason", None)
    return f"{DENIED}: {note}" if note else DENIED


# Reports a running tool's progress: (progress, total or None, message or None).
ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]


@dataclass(frozen=True)
class ToolContext:
    """What a tool sees: its call id, the run, and the validated resume payload if it waited.

    `idempotency_key` is stable for this call across episodes (a takeover that re-runs an
    idempotent tool passes the same key): hand it to external APIs that deduplicate.
    `report_progress` streams a `tool-progress` chunk to every client watching the thread."""

    tool_call_id: str
    run_id: str
    thread_id: str
    payload: BaseModel | None = None
    state: Mapping[str, Any] = field(default_factory=dict)
    progress: ProgressFn | None = None
    # Under an approval policy: every decider's decision, in commit order (the last one's
    # payload is `payload`).
    decisions: tuple[ApprovalDecision, ...] = ()

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.tool_call_id}"

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        if self.progress is not None:
            await self.progress(progress, total, message)


ToolFn = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_model: type[BaseModel]
    fn: ToolFn | None
    suspend: SuspendStep | None = None
    takes_context: bool = False
    # The declared output model (a BaseModel return annotation, or `output=`): every output of
    # the tool, executed, skipped or submitted, must validate against it.
    output_model: type[BaseModel] | None = None
    # Declared by the author: running the tool twice for one call is harmless. Only such a tool
    # is re-run when a takeover finds it started without a committed result (docs/architecture.md,
    # "Tools and side effects"); any other tool then ends with an "interrupted" error.
    idempotent: bool = False

    @functools.cached_property
    def spec(self) -> ToolSpec:
        # Built once per tool: generating a JSON schema is costly, and every step offers it.
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters=self.input_model.model_json_schema(),
        )

    def validate_input(self, raw: Mapping[str, Any]) -> BaseModel:
        return self.input_model.model_validate(dict(raw))

    async def execute(self, args: BaseModel, ctx: ToolContext) -> Any:
        if self.fn is None:
            raise RuntimeError(f"tool {self.name} has no executor (manual-result tool)")
        if self.takes_context:
            return await self.fn(args, ctx)
        return await self.fn(args)


class ToolSource(Protocol):
    """Tools that are not known when the agent is declared (an MCP server's): the episode
    asks before each step and offers them next to the agent's own."""

    async def tools(self) -> Sequence[Tool]: ...


@overload
def tool(fn: ToolFn, /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    suspend: SuspendStep | None = None,
    output: type[BaseModel] | None = None,
    idempotent: bool = False,
) -> Callable[[ToolFn], Tool]: ...


def tool(
    fn: ToolFn | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    suspend: SuspendStep | None = None,
    output: type[BaseModel] | None = None,
    idempotent: bool = False,
) -> Tool | Callable[[ToolFn], Tool]:
    """Decorator: `@tool`, `@tool(idempotent=True)` or `@tool(suspend=SuspendStep(Approval))` on
    `async def f(args: Model[, ctx: ToolContext])`. A pydantic model as return annotation (or
    `output=`) declares the tool's output model."""

    def wrap(f: ToolFn, localns: dict[str, Any] | None = None) -> Tool:
        params = list(inspect.signature(f).parameters.values())
        # Annotations may name models defined next to the tool inside a function body.
        hints = get_type_hints(f, localns=localns or sys._getframe(1).f_locals)
        if not params or not (
            isinstance(hints.get(params[0].name), type)
            and issubclass(hints[params[0].name], BaseModel)
        ):
            raise TypeError(f"tool {f.__name__}: first parameter must be a pydantic model")
        returned = hints.get("return")
        declared = output or (
            returned if isinstance(returned, type) and issubclass(returned, BaseModel) else None
        )
        return Tool(
            name=name or f.__name__,
            description=description or inspect.getdoc(f) or "",
            input_model=hints[params[0].name],
            fn=f,
            suspend=suspend,
            takes_context=len(params) > 1,
            output_model=declared,
            idempotent=idempotent,
        )

    return wrap(fn, sys._getframe(1).f_locals) if fn is not None else wrap


def manual_tool(
    name: str,
    input_model: type[BaseModel],
    description: str = "",
    allowed_roles: tuple[Role, ...] = TRUSTED_ROLES,
    output_model: type[BaseModel] | None = None,
) -> Tool:
    """A tool whose output a trusted actor supplies (no executor runs here); a submitted
    output must match `output_model` when one is given."""
    return Tool(
        name=name,
        description=description,
        input_model=input_model,
        fn=None,
        suspend=SuspendStep(ResultPayload, allowed_roles, WaitKind.MANUAL_RESULT),
        output_model=output_model,
    )


class ClientToolDef(BaseModel):
    """A frontend-defined tool captured with the request: a browser executes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)


def client_tools_from(raw: Sequence[Mapping[str, Any]]) -> list[ClientToolDef]:
    return [ClientToolDef.model_validate(dict(item)) for item in raw]
