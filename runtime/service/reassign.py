"""Reassigning a pending approval through the service: the store's transition, then its news."""

from __future__ import annotations

from runtime.approvals import Reassignment
from runtime.domain import Origin, Principal
from runtime.service.thread_service import ThreadService
from runtime.storage.store import ResolveResult


async def reassign_action(
    service: ThreadService,
    principal: Principal,
    thread_id: str,
    action_id: str,
    *,
    to_subject: str | None,
    to_group: str | None,
    origin: Origin | None = None,
) -> ResolveResult:
    """`principal`, a current decider of an approval whose policy permits delegation, hands it
    to `to_subject` or `to_group`; every snapshot and inbox re-routes on the invalidation."""
    change = Reassignment(
        subject=principal.subject,
        role=principal.role.value,
        groups=principal.groups,
        display_name=principal.name,
        to_subject=to_subject,
        to_group=to_group,
    )
    result = await service.store.reassign_action(
        thread_id, principal.scopes, action_id, change, origin
    )
    await service.publisher.invalidate(thread_id, result.version)
    return result


__all__ = ["reassign_action"]
