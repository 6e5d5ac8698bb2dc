"""The permission policy, enforced by the service on both stores: refusals and the snapshot's
account of what each reader may do agree."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import Message, Principal, RunStatus, Snapshot, TextPart, Visibility
from runtime.engine.publisher import Publisher
from runtime.errors import Forbidden
from runtime.providers.scripted import ScriptedModel, text_response, tool_call_response
from runtime.service.permissions import Destructive, PermissionPolicy, Who
from runtime.service.thread_service import ThreadService
from runtime.tools import SuspendStep, ToolContext, tool
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, BACKEND, BOB, Runtime, settled

AUTHORS_ONLY = PermissionPolicy(
    regenerate=Who.AUTHOR, visibility=Who.AUTHOR, stop=Who.AUTHOR, cancel_queued=Who.AUTHOR
)


class Approval(BaseModel):
    approved: bool


def approval_agent(model: ScriptedModel) -> Agent:
    @tool(suspend=SuspendStep(Approval))
    async def transfer(args: Approval, ctx: ToolContext) -> dict[str, object]:
        return {"ok": True}

    return Agent(model=model, tools=[transfer])


def guarded(rt: Runtime, agent: Agent, policy: PermissionPolicy) -> ThreadService:
    """A second service on the same store and bus, with `policy` (the gateway's, in real use)."""
    return ThreadService(rt.store, Publisher(rt.bus), agent, permissions=policy)


async def permissions_of(service: ThreadService, reader: Principal, thread_id: str) -> dict:  # type: ignore[type-arg]
    snapshot = await service.snapshot(reader, thread_id)
    assert snapshot.permissions is not None
    return dict(snapshot.permissions)


async def test_authors_only_refuses_another_user_and_says_so_in_the_snapshot(
    runtime_for: RuntimeFactory,
) -> None:
    agent = Agent(model=ScriptedModel([text_response("hello alice")] * 2))
    rt = await runtime_for(agent)
    service = guarded(rt, agent, AUTHORS_ONLY)
    thread_id = await rt.thread()
    await service.send_message(ALICE, thread_id, "hi")
    done = await rt.wait_for(thread_id, settled)
    user, reply = (m.id for m in done.messages)

    with pytest.raises(Forbidden) as refused:
        await service.regenerate(BOB, thread_id)
    assert refused.value.details == {"action": "regenerate", "rule": "author"}
    with pytest.raises(Forbidden):
        await service.set_visibility(BOB, thread_id, user, Visibility.HIDDEN)
    bob = await permissions_of(service, BOB, thread_id)
    assert (bob["regenerate"], bob["visibility"]) == (False, [])
    alice = await permissions_of(service, ALICE, thread_id)
    assert (alice["regenerate"], alice["visibility"]) == (True, [user, reply])
    backend = await permissions_of(service, BACKEND, thread_id)
    assert (backend["regenerate"], backend["visibility"]) == (True, [user, reply])

    # Refused means unchanged: the same committed version and messages.
    assert (await rt.service.snapshot(ALICE, thread_id)).thread.version == done.thread.version
    await service.set_visibility(ALICE, thread_id, reply, Visibility.HIDDEN)
    hidden = await rt.service.snapshot(ALICE, thread_id)
    assert [m.id for m in hidden.messages] == [user]


async def test_stop_and_cancel_queued_follow_the_run_and_item_authors(
    runtime_for: RuntimeFactory,
) -> None:
    model = ScriptedModel([tool_call_response("transfer", {"approved": True}, "t1")])
    agent = approval_agent(model)
    rt = await runtime_for(agent)
    service = guarded(rt, agent, AUTHORS_ONLY)
    thread_id = await rt.thread()
    started = await service.send_message(ALICE, thread_id, "pay")
    await rt.wait_status(thread_id, RunStatus.WAITING)
    queued = await service.send_message(ALICE, thread_id, "and then this")
    assert started.run_id is not None and queued.queued_item_id is not None
    before = await rt.service.snapshot(ALICE, thread_id)

    with pytest.raises(Forbidden):
        await service.stop_run(BOB, thread_id, started.run_id)
    with pytest.raises(Forbidden):
        await service.cancel_queued(BOB, thread_id, queued.queued_item_id)
    after = await rt.service.snapshot(ALICE, thread_id)
    assert after.thread.version == before.thread.version
    assert [item.id for item in after.queue] == [queued.queued_item_id]
    bob = await permissions_of(service, BOB, thread_id)
    assert (bob["stop"], bob["cancel_queued"]) == (False, [])
    alice = await permissions_of(service, ALICE, thread_id)
    assert (alice["stop"], alice["cancel_queued"]) == (True, [queued.queued_item_id])

    await service.cancel_queued(ALICE, thread_id, queued.queued_item_id)
    await service.stop_run(BACKEND, thread_id, started.run_id)
    ended = await rt.wait_for(thread_id, settled)
    assert ended.run is not None and ended.run.status is RunStatus.CANCELLED
    assert ended.queue == ()


async def test_the_default_policy_lets_every_user_of_the_scope(runtime_for: RuntimeFactory) -> None:
    agent = Agent(model=ScriptedModel([text_response("one"), text_response("two")]))
    rt = await runtime_for(agent)
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "hi")
    await rt.wait_for(thread_id, settled)
    bob = await permissions_of(rt.service, BOB, thread_id)
    assert bob["regenerate"] is True and len(bob["visibility"]) == 2
    assert all(rule == "scope" for rule in bob["policy"].values())
    assert PermissionPolicy().rule(Destructive.STOP) is Who.SCOPE
    await rt.service.regenerate(BOB, thread_id)

    def redone(snapshot: Snapshot) -> bool:
        return settled(snapshot) and text_of(snapshot.messages[-1]) == "two"

    regenerated = await rt.wait_for(thread_id, redone)
    assert len(regenerated.messages) == 2


def text_of(message: Message) -> str:
    return "".join(part.text for part in message.parts if isinstance(part, TextPart))
