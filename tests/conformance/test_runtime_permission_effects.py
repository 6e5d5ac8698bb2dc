"""The permission suite: every destructive command under every rule, as a second user of the
scope (and a backend actor and an admin), over effects on what the first user wrote; a refused
command leaves the snapshot exactly as it was (docs/protocol.md, "Permissions")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import InputPolicy, MessageRole, Principal, Role, RunStatus, Visibility
from runtime.engine.publisher import Publisher
from runtime.errors import Forbidden, InvalidInput
from runtime.providers.model_api import ModelRequest
from runtime.providers.scripted import FunctionModel, ModelDelta, text_response, tool_call_response
from runtime.service.permissions import PermissionPolicy, Who
from runtime.service.thread_service import ThreadService
from runtime.tools import SuspendStep, ToolContext, manual_tool, tool
from tests.conformance.runtime_harness import (
    ALICE,
    BACKEND,
    BOB,
    SCOPE,
    Runtime,
    settled,
)

ADMIN = Principal(subject="root", role=Role.ADMIN, scopes=frozenset({SCOPE}))
ACTORS = {"bob": BOB, "backend": BACKEND, "admin": ADMIN}


class Hold(BaseModel):
    approved: bool


class Lookup(BaseModel):
    account: str


def respond(request: ModelRequest) -> list[ModelDelta]:
    """`wait…` suspends on an approval, `manual…` on a manual result, `client…` on the client
    tool `pick`; anything else (and every tool result) gets a text reply."""
    last = request.messages[-1]
    text = "".join(getattr(part, "text", "") for part in last.parts)
    if last.role is MessageRole.USER:
        for word, name in (("wait", "hold"), ("manual", "lookup"), ("client", "pick")):
            if text.startswith(word):
                args = {"account": "42"} if name == "lookup" else {"approved": True}
                return tool_call_response(name, args if name != "pick" else {}, f"c-{name}")
    return text_response(f"reply to {text or 'a tool'}")


def effects_agent() -> Agent:
    @tool(suspend=SuspendStep(Hold))
    async def hold(args: Hold, ctx: ToolContext) -> dict[str, object]:
        return {"ok": True}

    return Agent(model=FunctionModel(respond), tools=[hold, manual_tool("lookup", Lookup)])


def policy_of(rule: Who) -> PermissionPolicy:
    return PermissionPolicy(regenerate=rule, visibility=rule, stop=rule, cancel_queued=rule)


def documented(rule: Who, actor: Principal, own: bool) -> bool:
    """docs/operations.md, "Permissions": whether `actor` may, `own` when it wrote everything
    the command changes."""
    trusted = actor.role in (Role.BACKEND, Role.ADMIN)
    return {
        Who.SCOPE: True,
        Who.AUTHOR: own or trusted,
        Who.TRUSTED: trusted,
        Who.ADMIN: actor.role is Role.ADMIN,
    }[rule]


@dataclass
class Thread:
    rt: Runtime
    service: ThreadService
    id: str
    ids: dict[str, str]

    async def say(self, who: Principal, text: str, **kwargs: Any) -> Any:
        admission = await self.service.send_message(who, self.id, text, **kwargs)
        if not text.startswith("wait"):
            await self.rt.wait_for(self.id, settled)
        else:
            await self.rt.wait_status(self.id, RunStatus.WAITING)
        return admission

    async def messages(self) -> list[Any]:
        return list((await self.rt.store.snapshot(self.id, [SCOPE], include_hidden=True)).messages)


Setup = Callable[[Thread], Awaitable[None]]
Act = Callable[[Thread, Principal], Awaitable[Any]]


async def cancelled_run_of(t: Thread, author: Principal) -> None:
    admission = await t.say(author, "wait for me")
    await t.rt.service.stop_run(author, t.id, admission.run_id)
    await t.rt.wait_status(t.id, RunStatus.CANCELLED)
    t.ids["run"] = admission.run_id


async def bob_then_alice(t: Thread) -> None:
    await t.say(BOB, "first")
    await t.say(ALICE, "second")
    t.ids["bob_reply"] = (await t.messages())[1].id


async def bob_alone(t: Thread) -> None:
    await t.say(BOB, "first")


async def alice_replied(t: Thread) -> None:
    await t.say(ALICE, "hello")
    t.ids["message"] = (await t.messages())[0].id


async def bob_replied(t: Thread) -> None:
    await t.say(BOB, "hello")
    t.ids["message"] = (await t.messages())[0].id


async def waiting_run_of(t: Thread, author: Principal) -> None:
    t.ids["run"] = (await t.say(author, "wait for me")).run_id


async def alice_queued(t: Thread) -> None:
    await waiting_run_of(t, ALICE)
    queued = await t.service.send_message(ALICE, t.id, "later")
    t.ids["item"] = queued.queued_item_id


@dataclass(frozen=True)
class Case:
    name: str
    setup: Setup
    act: Act
    # Whether Bob wrote everything the command changes.
    own: bool


CASES = [
    Case(
        "retry alice's run",
        lambda t: cancelled_run_of(t, ALICE),
        lambda t, who: t.service.retry(who, t.id, t.ids["run"]),
        own=False,
    ),
    Case(
        "retry bob's run",
        lambda t: cancelled_run_of(t, BOB),
        lambda t, who: t.service.retry(who, t.id, t.ids["run"]),
        own=True,
    ),
    Case(
        "regenerate bob's reply before alice's messages",
        bob_then_alice,
        lambda t, who: t.service.regenerate(who, t.id, t.ids["bob_reply"]),
        own=False,
    ),
    Case(
        "regenerate bob's latest reply",
        bob_alone,
        lambda t, who: t.service.regenerate(who, t.id),
        own=True,
    ),
    Case(
        "hide alice's message",
        alice_replied,
        lambda t, who: t.service.set_visibility(who, t.id, t.ids["message"], Visibility.HIDDEN),
        own=False,
    ),
    Case(
        "hide bob's message",
        bob_replied,
        lambda t, who: t.service.set_visibility(who, t.id, t.ids["message"], Visibility.HIDDEN),
        own=True,
    ),
    Case(
        "stop alice's run",
        lambda t: waiting_run_of(t, ALICE),
        lambda t, who: t.service.stop_run(who, t.id, t.ids["run"]),
        own=False,
    ),
    Case(
        "cancel alice's queued item",
        alice_queued,
        lambda t, who: t.service.cancel_queued(who, t.id, t.ids["item"]),
        own=False,
    ),
    Case(
        "interrupt alice's run",
        lambda t: waiting_run_of(t, ALICE),
        lambda t, who: t.service.send_message(who, t.id, "now", policy=InputPolicy.INTERRUPT),
        own=False,
    ),
    Case(
        "interrupt bob's run",
        lambda t: waiting_run_of(t, BOB),
        lambda t, who: t.service.send_message(who, t.id, "now", policy=InputPolicy.INTERRUPT),
        own=True,
    ),
]
# Backend actors and admins are decided by role alone: the cases over someone else's effects
# are enough for them.
MATRIX = [
    pytest.param(case, actor, id=f"{case.name}-{actor}")
    for case in CASES
    for actor in (ACTORS if not case.own else ["bob"])
]


async def state(t: Thread) -> dict[str, Any]:
    """Everything a snapshot shows, hidden messages included."""
    return (await t.rt.store.snapshot(t.id, [SCOPE], include_hidden=True)).model_dump()


@pytest.mark.parametrize("rule", list(Who))
@pytest.mark.parametrize(("case", "actor"), MATRIX)
async def test_a_destructive_command_is_refused_or_allowed_as_documented(
    runtime_for: Any, rule: Who, case: Case, actor: str
) -> None:
    agent = effects_agent()
    rt = await runtime_for(agent)
    service = ThreadService(rt.store, Publisher(rt.bus), agent, permissions=policy_of(rule))
    thread = Thread(rt, service, await rt.thread(), {})
    await case.setup(thread)
    who = ACTORS[actor]
    before = await state(thread)
    allowed = documented(rule, who, case.own)

    if allowed:
        await case.act(thread, who)
        # It took effect (a stop is committed by the worker that finalises the run).
        version = before["thread"]["version"]
        await rt.wait_for(thread.id, lambda s: s.thread.version > version)
    else:
        with pytest.raises(Forbidden) as refused:
            await case.act(thread, who)
        assert refused.value.details["rule"] == rule.value
        assert await state(thread) == before  # a refusal changes nothing


async def test_retry_and_regenerate_never_make_the_requester_the_author_of_the_input(
    runtime_for: Any,
) -> None:
    agent = effects_agent()
    rt = await runtime_for(agent)
    thread = Thread(rt, rt.service, await rt.thread(), {})
    await cancelled_run_of(thread, ALICE)
    user = (await thread.messages())[0].id
    # The default policy lets anyone of the scope; each new run waits again and Bob stops it.
    for redo in (rt.service.retry, rt.service.regenerate):
        result = await redo(BOB, thread.id)
        await rt.wait_status(thread.id, RunStatus.WAITING)
        await rt.service.stop_run(BOB, thread.id, result.run_id or "")
        await rt.wait_status(thread.id, RunStatus.CANCELLED)
    assert (await rt.store.get_run(result.run_id or "")).started_by == "bob"
    assert await rt.store.message_authors(thread.id, [user]) == {user: "alice"}
    # So under `author` Bob still may not hide Alice's words, nor regenerate over them.
    guarded = ThreadService(rt.store, Publisher(rt.bus), agent, permissions=policy_of(Who.AUTHOR))
    before = await state(thread)
    with pytest.raises(Forbidden):
        await guarded.set_visibility(BOB, thread.id, user, Visibility.HIDDEN)
    with pytest.raises(Forbidden):
        await guarded.regenerate(BOB, thread.id)
    assert await state(thread) == before
    offered = (await guarded.snapshot(BOB, thread.id)).permissions
    assert offered is not None and user not in offered["visibility"]
    assert offered["regenerate"] is False


@pytest.mark.parametrize("word", ["manual", "client"])
async def test_the_generic_resume_keeps_each_action_kinds_own_route(
    runtime_for: Any, word: str
) -> None:
    agent = effects_agent()
    rt = await runtime_for(agent)
    thread = Thread(rt, rt.service, await rt.thread(), {})
    tools = [{"name": "pick", "description": "the browser picks"}] if word == "client" else []
    await rt.service.send_message(ALICE, thread.id, word, client_tools=tools)
    waiting = await rt.wait_status(thread.id, RunStatus.WAITING)
    action = waiting.pending_actions[0]
    before = await state(thread)
    for who in (ALICE, BACKEND, ADMIN):
        # A user may not resolve a manual result at all; the others are sent to its route.
        refusal = Forbidden if word == "manual" and who is ALICE else InvalidInput
        with pytest.raises(refusal):
            await rt.service.resume_action(who, thread.id, action.id, {"output": 1})
    assert await state(thread) == before
    owner = BACKEND if word == "manual" else ALICE
    await rt.service.resume_action(owner, thread.id, action.id, {"output": 1}, kind=action.kind)
    await rt.wait_for(thread.id, settled)
