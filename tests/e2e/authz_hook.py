"""A test deployment's authorization hook: a user sees only the threads they own or whose
`group` metadata names one of their groups; backend actors and admins see everything.

Groups come from the caller's token (OIDC `groups` claims) and from this deployment's own
directory below: `tl_` tokens carry no groups, and a hook looking people up is what a real
deployment does. Async, to prove the command path awaits a hook that is."""

from __future__ import annotations

from runtime import Allow, Authorization, Narrow, Role, ThreadMatch

DIRECTORY: dict[str, frozenset[str]] = {
    "alice": frozenset({"sales"}),
    "bob": frozenset({"finance"}),
    "carol": frozenset({"finance"}),
}


async def authorize(request: Authorization) -> Allow | Narrow:
    principal = request.principal
    if principal.role is not Role.USER:
        return Allow()
    groups = principal.groups | DIRECTORY.get(principal.subject, frozenset())
    return Narrow(
        any_of=(
            ThreadMatch(owner=principal.subject),
            *(ThreadMatch(metadata={"group": group}) for group in sorted(groups)),
        )
    )
