"""Suspend and resume, exactly-once resolution, client and manual results, stop."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from runtime.agent import Agent
from runtime.domain import Lease, RunStatus, ToolCallPart, ToolState, WaitKind
from runtime.errors import ActionConflict, Forbidden, InvalidPayload, NotFound
from runtime.lifecycle import AgentLifecycle, ToolResult
from runtime.providers.scripted import (
    FunctionModel,
    ScriptedModel,
    text_response,
    tool_call_response,
)
from runtime.tools import SuspendStep, ToolContext, manual_tool, tool
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import (
    ALICE,
    BACKEND,
    BOB,
    OUTSIDER,
    SCOPE,
    Runtime,
    settled,
)


class Approval(BaseModel):
    approved: bool
    note: str | None = None


class Transfer(BaseModel):
    amount: int


class Recording(AgentLifecycle):
    def __init__(self) -> None:
        self.before: list[tuple[str, bool]] = []
        self.after: list[tuple[str, ToolState]] = []

    async def before_tool_call(self, ctx, call):  # type: ignore[no-untyped-def]
        self.before.append((call.name, ctx.resumed))
        return None

    async def after_tool_result(self, ctx, result: ToolResult):  # type: ignore[no-untyped-def]
        self.after.append((ctx.tool_name, result.state))
        return None


def transfer_agent(model: ScriptedModel, lifecycle: AgentLifecycle) -> Agent:
    @tool(suspend=SuspendStep(Approval))
    async def transfer(args: Transfer, ctx: ToolContext) -> dict[str, object]:
        assert isinstance(ctx.payload, Approval)
        return {"sent": ctx.payload.approved, "amount": args.amount}

    return Agent(model=model, tools=[transfer], lifecycle=lifecycle)


async def _pending(rt: Runtime, thread_id: str):  # type: ignore[no-untyped-def]
    snapshot = await rt.wait_status(thread_id, RunStatus.WAITING)
    assert len(snapshot.pending_actions) == 1
    return snapshot.pending_actions[0]


async def test_suspend_then_resume_by_another_principal(runtime_for: RuntimeFactory) -> None:
    hooks = Recording()
    model = ScriptedModel(
        [tool_call_response("transfer", {"amount": 5}, "t1"), text_response("sent it")]
    )
    rt = await runtime_for(transfer_agent(model, hooks))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "pay 5")
    action = await _pending(rt, thread_id)
    assert action.kind is WaitKind.APPROVAL
    assert action.payload_schema["required"] == ["approved"]
    assert hooks.before == [("transfer", False)]
    # The waiting state is committed state: it is in the tail message, not in memory.
    with pytest.raises(InvalidPayload) as invalid:
        await rt.service.resume_action(BOB, thread_id, action.id, {"approved": "maybe"})
    assert invalid.value.details["errors"]
    still = await rt.store.snapshot(thread_id, [SCOPE])
    assert still.pending_actions == (action,)

    await rt.service.resume_action(BOB, thread_id, action.id, {"approved": True})
    snapshot = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    part = snapshot.messages[1].parts[0]
    assert isinstance(part, ToolCallPart) and part.state is ToolState.OUTPUT_AVAILABLE
    assert part.output == {"sent": True, "amount": 5}
    assert part.waiting is not None and part.waiting.resolution is not None
    assert part.waiting.resolution.subject == "bob"
    assert snapshot.pending_actions == ()
    # before_tool_call ran again on resume, before execution continued.
    assert hooks.before == [("transfer", False), ("transfer", True)]
    assert hooks.after == [("transfer", ToolState.OUTPUT_AVAILABLE)]
    assert snapshot.messages[-1].parts[0].text == "sent it"
    model.assert_consumed()


async def test_concurrent_resumes_exactly_one_wins(runtime_for: RuntimeFactory) -> None:
    model = ScriptedModel(
        [tool_call_response("transfer", {"amount": 1}, "t1"), text_response("ok")]
    )
    rt = await runtime_for(transfer_agent(model, Recording()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "pay")
    action = await _pending(rt, thread_id)
    principals = [ALICE, BOB, BACKEND] * 3
    results = await asyncio.gather(
        *(
            rt.service.resume_action(p, thread_id, action.id, {"approved": True})
            for p in principals
        ),
        return_exceptions=True,
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(e, ActionConflict) for e in losers)
    names = {e.details.get("resolved_by") for e in losers}  # type: ignore[union-attr]
    assert len(names) == 1 and names.pop() in {"alice", "bob", "billing-svc"}
    await rt.wait_status(thread_id, RunStatus.COMPLETED)
    with pytest.raises(ActionConflict):
        await rt.service.resume_action(ALICE, thread_id, action.id, {"approved": False})


async def test_resume_outside_scope_is_not_found(runtime_for: RuntimeFactory) -> None:
    model = ScriptedModel([tool_call_response("transfer", {"amount": 1}, "t1")])
    rt = await runtime_for(transfer_agent(model, Recording()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "pay")
    action = await _pending(rt, thread_id)
    with pytest.raises(NotFound):
        await rt.service.resume_action(OUTSIDER, thread_id, action.id, {"approved": True})


async def test_stop_while_waiting_cancels_the_pending_action(runtime_for: RuntimeFactory) -> None:
    hooks = Recording()
    model = ScriptedModel([tool_call_response("transfer", {"amount": 1}, "t1")])
    rt = await runtime_for(transfer_agent(model, hooks))
    thread_id = await rt.thread()
    admission = await rt.service.send_message(ALICE, thread_id, "pay")
    await _pending(rt, thread_id)
    await rt.service.stop_run(BOB, thread_id, admission.run_id)
    snapshot = await rt.wait_status(thread_id, RunStatus.CANCELLED)
    assert snapshot.pending_actions == ()
    part = snapshot.messages[1].parts[0]
    assert isinstance(part, ToolCallPart) and part.state is ToolState.CANCELLED
    assert hooks.after == [("transfer", ToolState.CANCELLED)]


async def test_stop_during_streaming_commits_canonical_text_so_far(
    runtime_for: RuntimeFactory,
) -> None:
    streamed = asyncio.Event()

    async def endless(request):  # type: ignore[no-untyped-def]
        for i in range(2000):
            yield text_response(f"word{i} ")[0]
            if i == 3:
                streamed.set()
            await asyncio.sleep(0.005)

    rt = await runtime_for(Agent(model=FunctionModel(endless)))
    thread_id = await rt.thread()
    async with rt.record(thread_id) as rec:
        admission = await rt.service.send_message(ALICE, thread_id, "talk")
        await asyncio.wait_for(streamed.wait(), 5)
        await rt.service.stop_run(ALICE, thread_id, admission.run_id)
        snapshot = await rt.wait_status(thread_id, RunStatus.CANCELLED)
    committed = snapshot.messages[-1].parts[0].text
    assert committed.startswith("word0 word1 word2 word3")
    # What was committed is exactly what clients saw live.
    assert committed == rec.text(admission.run_id)


async def test_client_tool_result_submitted_by_a_browser(runtime_for: RuntimeFactory) -> None:
    hooks = Recording()
    model = ScriptedModel(
        [tool_call_response("pick_color", {}, "c1"), text_response("you picked blue")]
    )
    rt = await runtime_for(Agent(model=model, lifecycle=hooks))
    thread_id = await rt.thread()
    await rt.service.send_message(
        ALICE, thread_id, "pick", client_tools=[{"name": "pick_color", "description": "ask"}]
    )
    action = await _pending(rt, thread_id)
    assert action.kind is WaitKind.CLIENT_TOOL
    assert model.calls[0].tools[-1].name == "pick_color"
    await rt.service.resume_action(
        ALICE, thread_id, action.id, {"output": "blue"}, kind=WaitKind.CLIENT_TOOL
    )
    snapshot = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    part = snapshot.messages[1].parts[0]
    assert isinstance(part, ToolCallPart) and part.output == "blue"
    assert hooks.after == [("pick_color", ToolState.OUTPUT_AVAILABLE)]


async def test_manual_result_only_from_trusted_actors(runtime_for: RuntimeFactory) -> None:
    class Lookup(BaseModel):
        account: str

    model = ScriptedModel(
        [tool_call_response("lookup", {"account": "42"}, "m1"), text_response("balance known")]
    )
    agent = Agent(model=model, tools=[manual_tool("lookup", Lookup)])
    rt = await runtime_for(agent)
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "balance?")
    action = await _pending(rt, thread_id)
    assert action.kind is WaitKind.MANUAL_RESULT
    with pytest.raises(Forbidden):
        await rt.service.resume_action(ALICE, thread_id, action.id, {"output": 1})
    await rt.service.resume_action(
        BACKEND, thread_id, action.id, {"output": {"balance": 10}}, kind=WaitKind.MANUAL_RESULT
    )
    snapshot = await rt.wait_for(thread_id, settled)
    assert snapshot.run.status is RunStatus.COMPLETED
    part = snapshot.messages[1].parts[0]
    assert isinstance(part, ToolCallPart) and part.output == {"balance": 10}


async def test_invalid_payload_errors_stay_small_for_huge_payloads(
    runtime_for: RuntimeFactory,
) -> None:
    model = ScriptedModel([tool_call_response("transfer", {"amount": 1}, "t1")])
    rt = await runtime_for(transfer_agent(model, Recording()))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "pay")
    action = await _pending(rt, thread_id)
    with pytest.raises(InvalidPayload) as invalid:
        await rt.service.resume_action(ALICE, thread_id, action.id, {"approved": "x" * 100_000})
    errors = invalid.value.details["errors"]
    assert errors and all(len(e["msg"]) <= 200 for e in errors)


async def _episodes_done(rt: Runtime) -> None:
    """Until the worker has ended its episodes (its release, if any, included)."""
    for _ in range(500):
        if not rt.workers[0]._tasks:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the worker's episodes did not end")


async def test_terminal_commit_releases_the_lease_a_wait_is_released_after(
    runtime_for: RuntimeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ScriptedModel(
        [tool_call_response("transfer", {"amount": 2}, "t1"), text_response("sent")]
    )
    rt = await runtime_for(transfer_agent(model, Recording()))
    released: list[Lease] = []
    real = rt.store.release_lease

    async def counting(lease: Lease) -> None:
        released.append(lease)
        await real(lease)

    monkeypatch.setattr(rt.store, "release_lease", counting)
    thread_id = await rt.thread()
    admission = await rt.service.send_message(ALICE, thread_id, "pay 2")
    action = await _pending(rt, thread_id)
    await _episodes_done(rt)
    # Waiting: the worker releases the lease itself once the episode ended.
    assert [lease.resource_id for lease in released] == [admission.run_id]
    await rt.service.resume_action(BOB, thread_id, action.id, {"approved": True})
    await rt.wait_status(thread_id, RunStatus.COMPLETED)
    await _episodes_done(rt)
    # Completed: the terminal commit released the lease in its transaction; no release more.
    assert len(released) == 1
    run_id = admission.run_id or ""
    assert await rt.store.acquire_run_lease(run_id, "other", 10.0) is None  # run ended
    rows = await rt.store._read(  # type: ignore[attr-defined]
        lambda conn: conn.fetch("SELECT token FROM leases WHERE resource_id = $1", run_id)
    )
    assert rows == []
