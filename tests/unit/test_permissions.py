"""The destructive-action policy: who may regenerate, hide, stop and cancel queued items."""

from __future__ import annotations

import pytest

from runtime.domain import Principal, Role
from runtime.service.permissions import Destructive, PermissionPolicy, Who


def who(role: Role, subject: str = "alice") -> Principal:
    return Principal(subject=subject, role=role, scopes=frozenset({"acme"}))


@pytest.mark.parametrize(
    ("rule", "user_author", "user_other", "backend", "admin"),
    [
        (Who.SCOPE, True, True, True, True),
        (Who.AUTHOR, True, False, True, True),
        (Who.TRUSTED, False, False, True, True),
        (Who.ADMIN, False, False, False, True),
    ],
)
def test_each_rule_admits_exactly_its_principals(
    rule: Who, user_author: bool, user_other: bool, backend: bool, admin: bool
) -> None:
    policy = PermissionPolicy(regenerate=rule)
    action = Destructive.REGENERATE
    assert policy.allows(action, who(Role.USER, "alice"), "alice") is user_author
    assert policy.allows(action, who(Role.USER, "bob"), "alice") is user_other
    assert policy.allows(action, who(Role.BACKEND, "svc"), "alice") is backend
    assert policy.allows(action, who(Role.ADMIN, "root"), "alice") is admin


def test_an_unknown_author_is_nobody_and_rules_are_per_action() -> None:
    policy = PermissionPolicy(stop=Who.AUTHOR)
    assert not policy.allows(Destructive.STOP, who(Role.USER), None)
    assert policy.allows(Destructive.CANCEL_QUEUED, who(Role.USER, "bob"), "alice")
    assert PermissionPolicy().model_dump() == {
        "regenerate": "scope",
        "visibility": "scope",
        "stop": "scope",
        "cancel_queued": "scope",
    }
