"""An approval's deadline in a running runtime: its expiry ends the call with a model-visible
result through after_tool_result, as a denial does, or runs it when the policy auto-approves."""

from __future__ import annotations

from pydantic import BaseModel

from runtime.agent import Agent
from runtime.approvals import ApprovalPolicy
from runtime.domain import RunStatus, ToolCallPart, ToolState
from runtime.engine.publisher import Publisher
from runtime.hooks.timer_loop import TimerLoop
from runtime.lifecycle import (
    AgentLifecycle,
    BeforeToolDecision,
    ToolCall,
    ToolCallContext,
    ToolResult,
)
from runtime.providers.model_api import ModelRequest
from runtime.providers.scripted import ScriptedModel, text_response, tool_call_response
from runtime.storage.sql.hooks_sql import SqlHooks
from runtime.storage.sql.sql_store import SqlStore
from runtime.tools import SuspendStep, ToolContext, denied_unless_approved, tool
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import ALICE, Runtime


class Approval(BaseModel):
    approved: bool
    note: str | None = None


class Transfer(BaseModel):
    amount: int


class Recording(AgentLifecycle):
    def __init__(self) -> None:
        self.before: list[bool] = []
        self.after: list[tuple[ToolState, str | None]] = []

    async def before_tool_call(
        self, ctx: ToolCallContext, call: ToolCall
    ) -> BeforeToolDecision | None:
        self.before.append(ctx.resumed)
        return None

    async def after_tool_result(
        self, ctx: ToolCallContext, result: ToolResult
    ) -> ToolResult | None:
        self.after.append((result.state, result.error))
        return None


def agent(policy: ApprovalPolicy, model: ScriptedModel, hooks: Recording, ran: list[str]) -> Agent:
    @tool(suspend=SuspendStep(Approval, denial=denied_unless_approved, policy=policy))
    async def transfer(args: Transfer, ctx: ToolContext) -> dict[str, object]:
        assert isinstance(ctx.payload, Approval)
        ran.append(ctx.payload.note or "")
        return {"sent": args.amount}

    return Agent(model=model, tools=[transfer], lifecycle=hooks)


def tool_results(request: ModelRequest) -> list[object]:
    return [
        part.output if part.error is None else part.error
        for message in request.messages
        for part in message.parts
        if isinstance(part, ToolCallPart) and part.state.is_final
    ]


async def run_to_end(rt: Runtime) -> ToolCallPart:
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "pay 5")
    waiting = await rt.wait_status(thread_id, RunStatus.WAITING)
    [action] = waiting.pending_actions
    assert action.approval is not None and action.approval.due_at is not None
    assert isinstance(rt.store, SqlStore)
    async with TimerLoop(SqlHooks(rt.store), Publisher(rt.bus), poll_interval=0.05):
        snapshot = await rt.wait_status(thread_id, RunStatus.COMPLETED)
    part = snapshot.messages[1].parts[0]
    assert isinstance(part, ToolCallPart)
    return part


async def test_an_expired_action_is_denied_and_the_run_goes_on(
    runtime_for: RuntimeFactory,
) -> None:
    hooks, ran = Recording(), list[str]()
    model = ScriptedModel(
        [tool_call_response("transfer", {"amount": 5}, "t1"), text_response("not sent")]
    )
    policy = ApprovalPolicy(deadline=0.3, expiry_reason="expired: nobody approved in time")
    rt = await runtime_for(agent(policy, model, hooks, ran))
    part = await run_to_end(rt)
    assert part.state is ToolState.REJECTED
    assert part.error == "expired: nobody approved in time"
    assert ran == [] and hooks.before == [False]  # never executed, never resumed
    assert hooks.after == [(ToolState.REJECTED, "expired: nobody approved in time")]
    # The model saw the expiry as the call's result.
    assert tool_results(model.last_request()) == ["expired: nobody approved in time"]
    model.assert_consumed()


async def test_an_auto_approved_action_runs_with_the_policy_payload(
    runtime_for: RuntimeFactory,
) -> None:
    hooks, ran = Recording(), list[str]()
    model = ScriptedModel(
        [tool_call_response("transfer", {"amount": 5}, "t1"), text_response("sent")]
    )
    policy = ApprovalPolicy(
        deadline=0.3, on_expiry="approve", approve_payload={"approved": True, "note": "auto"}
    )
    rt = await runtime_for(agent(policy, model, hooks, ran))
    part = await run_to_end(rt)
    assert part.state is ToolState.OUTPUT_AVAILABLE and part.output == {"sent": 5}
    assert ran == ["auto"] and hooks.before == [False, True]
    assert hooks.after == [(ToolState.OUTPUT_AVAILABLE, None)]
    model.assert_consumed()
