"""Who may take destructive actions on a thread: a per-deployment policy the service enforces."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from runtime.domain import Principal, Role


class Who(StrEnum):
    """Who may take an action, from the most to the least permissive.

    `scope`: any principal of the thread's scope. `author`: the subject who wrote the message,
    started the run or queued the item, and backend actors and admins. `trusted`: backend
    actors and admins only. `admin`: admins only.
    """

    SCOPE = "scope"
    AUTHOR = "author"
    TRUSTED = "trusted"
    ADMIN = "admin"


class Destructive(StrEnum):
    REGENERATE = "regenerate"
    VISIBILITY = "visibility"  # hide and unhide
    STOP = "stop"
    CANCEL_QUEUED = "cancel_queued"


class PermissionPolicy(BaseModel):
    """One rule per destructive action. The default (`scope` everywhere) is the behaviour of a
    server without a policy; a public deployment should choose `author` (docs/operations.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    regenerate: Who = Who.SCOPE
    visibility: Who = Who.SCOPE
    stop: Who = Who.SCOPE
    cancel_queued: Who = Who.SCOPE

    def rule(self, action: Destructive) -> Who:
        rule: Who = getattr(self, action.value)
        return rule

    def needs_author(self, action: Destructive) -> bool:
        return self.rule(action) is Who.AUTHOR

    def allows(self, action: Destructive, principal: Principal, author: str | None) -> bool:
        """Whether `principal` (already checked to be in the thread's scope) may do it."""
        rule = self.rule(action)
        if rule is Who.SCOPE:
            return True
        if rule is Who.ADMIN:
            return principal.role is Role.ADMIN
        if principal.role in (Role.BACKEND, Role.ADMIN):
            return True
        return rule is Who.AUTHOR and author is not None and author == principal.subject


__all__ = ["Destructive", "PermissionPolicy", "Who"]
