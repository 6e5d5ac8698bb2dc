"""What a caller may decide: the inbox's `assigned=me` filter and a snapshot's `decide` map."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from runtime.approvals import approval_from_wire, decide_refusal
from runtime.domain import InboxEntry, PendingAction, Principal


class InboxPage(BaseModel):
    """A page of the inbox. `next_cursor` comes from the threads read, not the ones kept: a
    filtered page may hold fewer than `limit` threads and still have more behind it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entries: tuple[InboxEntry, ...]
    next_cursor: str | None


def refusal(principal: Principal, action: PendingAction) -> str | None:
    """Why `principal` may not decide `action` now (an error code), or None when it may."""
    return decide_refusal(
        action.allowed_roles,
        action.approval,
        principal.subject,
        principal.role,
        principal.groups,
    )


def wire_refusal(principal: Principal, action: dict[str, Any]) -> str | None:
    """`refusal` of an action in its wire form (an inbox frame's `action`)."""
    approval = action.get("approval")
    return decide_refusal(
        action.get("allowed_roles") or (),
        approval_from_wire(approval) if isinstance(approval, dict) else None,
        principal.subject,
        principal.role,
        principal.groups,
    )


def assigned_to(principal: Principal, entries: Iterable[InboxEntry]) -> list[InboxEntry]:
    """The entries with only the actions `principal` may decide now; threads left without
    any are dropped."""
    kept: list[InboxEntry] = []
    for entry in entries:
        actions = tuple(a for a in entry.actions if refusal(principal, a) is None)
        if actions:
            kept.append(entry.model_copy(update={"actions": actions}))
    return kept


def inbox_page(
    principal: Principal, entries: Sequence[InboxEntry], limit: int, assigned: bool
) -> InboxPage:
    # A full page read may have more behind it; the cursor is the last thread read.
    cursor = entries[-1].thread_id if len(entries) >= limit and entries else None
    kept = assigned_to(principal, entries) if assigned else list(entries)
    return InboxPage(entries=tuple(kept), next_cursor=cursor)


def decide_map(principal: Principal, actions: Iterable[PendingAction]) -> dict[str, Any]:
    """Per pending action, whether this reader may decide it and if not why: what a card
    shows instead of an enabled button."""
    result: dict[str, Any] = {}
    for action in actions:
        reason = refusal(principal, action)
        result[action.id] = {"allowed": reason is None, "reason": reason}
    return result
