"""An act: several commands on one thread (resolutions, stops, a message) that commit whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.domain import InputPolicy, Origin, Principal, WaitKind
from runtime.storage.store import ActOp, ActResult, InputOp, ResolveOp, StopOp

if TYPE_CHECKING:
    from runtime.service.thread_service import ThreadService


@dataclass(frozen=True)
class ResolvePart:
    """`resume_action`'s arguments: `kind` is the kind of action its command resolves."""

    action_id: str
    payload: Mapping[str, Any]
    kind: WaitKind | None = None
    expected_version: int | None = None


@dataclass(frozen=True)
class StopPart:
    """`stop_run`'s argument."""

    run_id: str


@dataclass(frozen=True)
class InputPart:
    """`send_message`'s arguments."""

    text: str
    client_request_id: str | None = None
    policy: InputPolicy = InputPolicy.ENQUEUE
    client_tools: Sequence[Mapping[str, Any]] = field(default_factory=tuple)


ActPart = ResolvePart | StopPart | InputPart


async def act(
    service: ThreadService,
    principal: Principal,
    thread_id: str,
    parts: Sequence[ActPart],
    origin: Origin | None = None,
) -> ActResult:
    """Check every part as its own service method does, then commit them in one store
    transaction (`Store.act`) and publish once: all of them happen, or none.

    What only the store can decide (an action resolved by a concurrent actor meanwhile, a full
    queue, a run that ended) is decided inside that transaction, so a late refusal of any part
    rolls back the parts before it too.
    """
    ops: list[ActOp] = []
    for part in parts:
        if isinstance(part, ResolvePart):
            await service.check_resume(
                principal, thread_id, part.action_id, part.payload, kind=part.kind
            )
            resolution = await service.resolution(
                principal, thread_id, part.action_id, part.payload, part.kind, origin
            )
            ops.append(
                ResolveOp(
                    action_id=part.action_id,
                    resolution=resolution,
                    expected_version=part.expected_version,
                )
            )
        elif isinstance(part, StopPart):
            await service.access.require_stop(principal, thread_id, part.run_id)
            ops.append(StopOp(run_id=part.run_id))
        else:
            tools = service.client_tools(part.client_tools)
            ops.append(
                InputOp(
                    text=part.text,
                    submitted_by=principal.subject,
                    client_request_id=part.client_request_id,
                    policy=await service.access.admit_policy(principal, thread_id, part.policy),
                    client_tools=tuple(tools),
                )
            )
    result = await service.store.act(thread_id, principal.scopes, ops, service.limits)
    await _publish(service, result)
    return result


async def _publish(service: ThreadService, result: ActResult) -> None:
    """One invalidation for the whole act, then the control signals its parts need (a stop
    of a run that is still running, a wakeup of a resumed or new run)."""
    stops = [s.run_id for s in result.stopped if not s.status.is_terminal]
    admission = result.admission
    if admission is not None and admission.interrupted_run_id:
        stops.append(admission.interrupted_run_id)
    wakeups = [r.run_id for r in result.resolved if r.run_resumed and r.run_id]
    wakeups += stops  # the worker owning a stopped run (or the next to lease it) finalises it
    if admission is not None and admission.run_id and not admission.duplicate:
        wakeups.append(admission.run_id)
    stops, wakeups = list(dict.fromkeys(stops)), list(dict.fromkeys(wakeups))
    publisher = service.publisher
    if result.changed:
        await publisher.invalidate(
            result.thread_id,
            result.version,
            stop=stops.pop(0) if stops else None,
            wakeup=wakeups.pop(0) if wakeups else None,
        )
    for run_id in stops:
        await publisher.stop(run_id)
    for run_id in wakeups:
        await publisher.wakeup(run_id, result.thread_id)


__all__ = ["ActPart", "InputPart", "ResolvePart", "StopPart", "act"]
