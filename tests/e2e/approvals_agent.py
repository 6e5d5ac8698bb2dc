"""The demo agent with a routed `send_email`: two distinct approvals, never the requester's
(four-eyes); each execution appends its call id to THREADLINE_TEST_EFFECTS (as effects_agent)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from runtime import Agent, ApprovalPolicy, SuspendStep, ToolContext, denied_unless_approved, tool
from runtime.demo import INSTRUCTIONS, DemoModel, EmailApproval, EmailInput, get_weather
from runtime.demo.redact import RedactEmails

EFFECTS_ENV = "THREADLINE_TEST_EFFECTS"
POLICY = ApprovalPolicy(quorum=2, exclude_requester=True)


def _record(tool_call_id: str) -> None:
    with open(os.environ[EFFECTS_ENV], "a", encoding="utf-8") as effects:
        effects.write(f"{tool_call_id}\n")


@tool(suspend=SuspendStep(payload=EmailApproval, denial=denied_unless_approved, policy=POLICY))
async def send_email(args: EmailInput, ctx: ToolContext) -> dict[str, Any]:
    """Send an e-mail (after two people other than the requester approve it)."""
    if EFFECTS_ENV in os.environ:
        await asyncio.to_thread(_record, ctx.tool_call_id)
    return {"sent": True, "to": args.to, "approvers": [d.subject for d in ctx.decisions]}


def agent() -> Agent:
    return Agent(
        model=DemoModel(),
        instructions=INSTRUCTIONS,
        tools=[get_weather, send_email],
        lifecycle=RedactEmails(),
        name="approvals",
    )
