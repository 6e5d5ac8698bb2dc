"""A test deployment's authorization hook: a user sees only the threads they own or whose
`group` metadata names one of their groups; backend actors and admins see everything.

Groups come from the caller's token (OIDC `groups` claims, `tl_` tokens' `--group`) and from
this deployment's own directory below (the suite mints its `tl_` tokens without groups), as a
hook looking people up in a directory does. Async, to prove the command path awaits a hook
that is."""

from __future__ import annotations

from runtime import AccessKind, Allow, Authorization, Deny, Narrow, Role, ThreadMatch

DIRECTORY: dict[str, frozenset[str]] = {
    "alice": frozenset({"sales"}),
    "bob": frozenset({"finance"}),
    "carol": frozenset({"finance"}),
}
# Auditors read what their groups see, and change nothing (a refusal code of the hook's own).
AUDITORS = frozenset({"carol"})


async def authorize(request: Authorization) -> Allow | Deny | Narrow:
    principal = request.principal
    if principal.role is not Role.USER:
        return Allow()
    if principal.subject in AUDITORS and request.action in (AccessKind.WRITE, AccessKind.CREATE):
        return Deny("auditors read, they change nothing", code="read_only")
    groups = principal.groups | DIRECTORY.get(principal.subject, frozenset())
    return Narrow(
        any_of=(
            ThreadMatch(owner=principal.subject),
            *(ThreadMatch(metadata={"group": group}) for group in sorted(groups)),
        )
    )
