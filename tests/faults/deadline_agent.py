"""The demo agent with a send_email under a 2 s deadline that escalates to finance, then is
denied by itself; the first worker to fire its deadline lingers first (inside the fire's
transaction, before the transition), so that a test can SIGKILL it while it holds the lease."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from runtime import Agent, ApprovalPolicy, SuspendStep, ToolContext, denied_unless_approved, tool
from runtime.approvals import Escalation
from runtime.demo import INSTRUCTIONS, DemoModel, EmailApproval, EmailInput
from runtime.storage.hooks_store import DueTimer
from runtime.storage.sql.actions_tx import DEADLINE_KIND
from runtime.storage.sql.core import Conn
from runtime.storage.sql.timers_tx import TIMER_KINDS, TimerKind, TimerOutcome, register_timer_kind
from runtime.storage.store import AdmissionLimits

# A file the first firing worker creates before it lingers: later fires go straight on.
MARKER_ENV = "FAULT_DEADLINE_MARKER"
LINGER_SECONDS = 60.0
POLICY = ApprovalPolicy(
    groups=("ops",),
    deadline=2.0,
    escalations=(Escalation(groups=("finance",), deadline=2.0),),
    on_expiry="deny",
    expiry_reason="expired: neither ops nor finance answered",
)


class LingeringDeadline:
    """The approval-deadline kind, with a pause before its first fire anywhere."""

    def __init__(self, inner: TimerKind) -> None:
        self.name = inner.name
        self._inner = inner

    async def fire(
        self, conn: Conn, timer: DueTimer, limits: AdmissionLimits | None
    ) -> TimerOutcome:
        marker = os.environ.get(MARKER_ENV)
        if marker is not None and await asyncio.to_thread(_first_here, marker):
            # Hangs in the fire's transaction, its lease held; the test kills it meanwhile.
            await asyncio.sleep(LINGER_SECONDS)
        return await self._inner.fire(conn, timer, limits)


def _first_here(marker: str) -> bool:
    """Whether this process is the first to fire (it creates the marker)."""
    try:
        with open(marker, "x", encoding="utf-8") as created:
            created.write(str(os.getpid()))
    except FileExistsError:
        return False
    return True


register_timer_kind(LingeringDeadline(TIMER_KINDS[DEADLINE_KIND]))


@tool(suspend=SuspendStep(payload=EmailApproval, denial=denied_unless_approved, policy=POLICY))
async def send_email(args: EmailInput, ctx: ToolContext) -> dict[str, Any]:
    """Send an e-mail (after ops, or finance once escalated, approves it)."""
    return {"sent": True, "to": args.to}


def agent() -> Agent:
    return Agent(model=DemoModel(), instructions=INSTRUCTIONS, tools=[send_email], name="deadline")
