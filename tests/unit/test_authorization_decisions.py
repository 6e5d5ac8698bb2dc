"""The authorization hook's decisions: matching, what a decision does to a command, and what a
broken hook does (it denies). No storage: the commands here name no existing thread."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.authorization import (
    AccessKind,
    Allow,
    Authorization,
    Decision,
    Deny,
    Narrow,
    ThreadMatch,
    ThreadResource,
    load_authorize_hook,
)
from runtime.domain import Principal, Role
from server.protocol.authorizer import Authorizer, ForbiddenByPolicy
from server.protocol.inputs import CreateThread, ListThreads, NoInput, ScopeRef
from server.protocol.wire_errors import wire_error
from server.settings import Settings

ALICE = Principal(subject="alice", role=Role.USER, scopes=frozenset({"acme"}))
THREAD = ThreadResource("th_1", "acme", "bob", {"group": "finance", "n": 1})


class NoThreads:
    """A store for commands that name no thread: reading one would be the bug under test."""

    async def get_thread(self, thread_id: str, scopes: Any) -> Any:
        raise AssertionError(f"read thread {thread_id} for a command that names none")


def authorizer(hook: Any) -> Authorizer:
    return Authorizer(hook, NoThreads())  # type: ignore[arg-type]


def test_a_match_needs_every_condition_it_names() -> None:
    assert ThreadMatch(owner="bob").matches(THREAD)
    assert not ThreadMatch(owner="alice").matches(THREAD)
    assert ThreadMatch(metadata={"group": "finance"}).matches(THREAD)
    assert not ThreadMatch(owner="bob", metadata={"group": "sales"}).matches(THREAD)
    assert not ThreadMatch(metadata={"n": "1"}).matches(THREAD)  # 1 is not the string "1"
    assert ThreadMatch().matches(THREAD)
    assert not ThreadMatch(owner="bob").matches(ThreadResource("th_2", "acme", None))
    with pytest.raises(TypeError):
        ThreadMatch(metadata={"n": 1})  # type: ignore[dict-item]


def test_a_narrowing_keeps_what_any_match_keeps_and_none_keeps_nothing() -> None:
    assert Narrow((ThreadMatch(owner="alice"), ThreadMatch(owner="bob"))).matches(THREAD)
    assert not Narrow((ThreadMatch(owner="alice"),)).matches(THREAD)
    assert not Narrow().matches(THREAD)


async def test_sync_and_async_hooks_are_both_asked_once() -> None:
    asked: list[Authorization] = []

    def sync(request: Authorization) -> Decision:
        asked.append(request)
        return Allow()

    async def asynchronous(request: Authorization) -> Decision:
        asked.append(request)
        return Deny("no", code="custom")

    assert await authorizer(sync).admit(ALICE, "me", NoInput()) is None
    with pytest.raises(ForbiddenByPolicy) as refused:
        await authorizer(asynchronous).admit(ALICE, "ping", NoInput())
    assert refused.value.code == "custom" and refused.value.message == "no"
    await authorizer(sync).admit(ALICE, "token.list", NoInput())
    assert [(r.command, r.action) for r in asked] == [
        ("me", AccessKind.SESSION),
        ("ping", AccessKind.SESSION),
        ("token.list", AccessKind.ADMIN),
    ]
    # A code of the hook's own is a refusal, 403, like forbidden_by_policy.
    assert wire_error(refused.value).status == 403
    assert wire_error(ForbiddenByPolicy("x")).code == "forbidden_by_policy"


@pytest.mark.parametrize(
    "hook",
    [
        pytest.param(lambda r: 1 / 0, id="raises"),
        pytest.param(lambda r: None, id="answers-none"),
        pytest.param(lambda r: True, id="answers-a-bool"),
    ],
)
async def test_a_broken_hook_denies(hook: Any) -> None:
    with pytest.raises(ForbiddenByPolicy):
        await authorizer(hook).admit(ALICE, "me", NoInput())


async def test_a_list_gets_the_narrowing() -> None:
    narrow = Narrow((ThreadMatch(owner="alice"),))
    gate = authorizer(lambda r: narrow)
    assert await gate.admit(ALICE, "thread.list", ListThreads()) == narrow.any_of
    assert await gate.admit(ALICE, "actions.subscribe", ScopeRef()) == narrow.any_of
    # A command that names no thread has nothing to narrow: it runs.
    assert await gate.admit(ALICE, "me", NoInput()) is None
    assert await authorizer(lambda r: Allow()).admit(ALICE, "thread.list", ListThreads()) is None


async def test_a_creation_is_asked_about_the_thread_it_would_make() -> None:
    asked: list[Authorization] = []

    def hook(request: Authorization) -> Decision:
        asked.append(request)
        return Narrow((ThreadMatch(metadata={"group": "sales"}),))

    gate = authorizer(hook)
    await gate.admit(ALICE, "thread.create", CreateThread(metadata={"group": "sales"}))
    with pytest.raises(ForbiddenByPolicy):
        await gate.admit(ALICE, "thread.create", CreateThread(metadata={"group": "finance"}))
    first = asked[0]
    assert first.action is AccessKind.CREATE and first.thread is not None
    assert (first.thread.id, first.thread.scope, first.owner) == (None, "acme", "alice")
    assert first.metadata == {"group": "sales"}


def test_the_hook_is_named_module_colon_callable() -> None:
    hook = load_authorize_hook("runtime.authorization:allow_all")
    assert isinstance(hook(Authorization(ALICE, "me", AccessKind.SESSION)), Allow)
    with pytest.raises(ValueError):
        load_authorize_hook("runtime.authorization")
    with pytest.raises(TypeError):
        load_authorize_hook("runtime.authorization:FORBIDDEN_BY_POLICY")
    assert Settings(authorize="tests.e2e.authz_hook:authorize").authorize
    with pytest.raises(ValueError):
        Settings(authorize="not a spec")
    assert Settings().authorize is None
