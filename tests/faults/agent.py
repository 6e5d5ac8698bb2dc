"""An agent for fault scenarios: the demo model with a non-idempotent tool that records its
side effect in a file, then lingers so that a test can kill its process before the commit."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pydantic import BaseModel, ConfigDict

from runtime import Agent, ToolContext, tool
from runtime.demo.demo_model import DemoModel

EFFECTS_ENV = "FAULT_EFFECTS_FILE"
LINGER_ENV = "FAULT_TOOL_LINGER"


class EmailInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str
    body: str = ""


@tool
async def send_email(args: EmailInput, ctx: ToolContext) -> dict[str, Any]:
    """Send an e-mail: not idempotent, each execution is one more e-mail."""
    await asyncio.to_thread(_record, f"{ctx.idempotency_key} {args.to}\n")
    # The effect happened; the result is not committed until this returns.
    await asyncio.sleep(float(os.environ.get(LINGER_ENV, "0")))
    return {"sent": True, "to": args.to}


def _record(line: str) -> None:
    with open(os.environ[EFFECTS_ENV], "a", encoding="utf-8") as effects:
        effects.write(line)


def fault_agent() -> Agent:
    return Agent(model=DemoModel(), instructions="", tools=[send_email], name="faults")
