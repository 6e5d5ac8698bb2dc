"""The demo agent with a `send_email` that has an effect: each execution appends its call id to
the file THREADLINE_TEST_EFFECTS names, so a test counts what ran (served by tests/e2e)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from runtime import Agent, SuspendStep, ToolContext, denied_unless_approved, tool
from runtime.demo import INSTRUCTIONS, DemoModel, EmailApproval, EmailInput, get_weather
from runtime.demo.redact import RedactEmails

EFFECTS_ENV = "THREADLINE_TEST_EFFECTS"


def _record(tool_call_id: str) -> None:
    with open(os.environ[EFFECTS_ENV], "a", encoding="utf-8") as effects:
        effects.write(f"{tool_call_id}\n")


@tool(suspend=SuspendStep(payload=EmailApproval, denial=denied_unless_approved))
async def send_email(args: EmailInput, ctx: ToolContext) -> dict[str, Any]:
    """Send an e-mail (after a person approves it)."""
    await asyncio.to_thread(_record, ctx.tool_call_id)
    return {"sent": True, "to": args.to}


def agent() -> Agent:
    return Agent(
        model=DemoModel(),
        instructions=INSTRUCTIONS,
        tools=[get_weather, send_email],
        lifecycle=RedactEmails(),
        name="effects",
    )
