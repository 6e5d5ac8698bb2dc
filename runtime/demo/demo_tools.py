"""Demo tools: a deterministic fake weather lookup and an e-mail sender that waits for approval."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runtime.demo.redact import EMAIL
from runtime.tools import ALL_ROLES, SuspendStep, ToolContext, denied_unless_approved, tool

_COLD = ("snowy", "foggy", "cloudy", "sunny")
_MILD = ("sunny", "cloudy", "rainy", "windy", "partly cloudy", "stormy")


class WeatherInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(min_length=1, max_length=100)


def fake_weather(city: str) -> dict[str, Any]:
    """The same city (ignoring case and surrounding space) always gets the same weather."""
    name = city.strip()
    digest = hashlib.sha256(name.casefold().encode()).digest()
    temperature = digest[0] % 36 - 5
    choices = _COLD if temperature <= 2 else _MILD
    return {
        "city": name,
        "conditions": choices[digest[1] % len(choices)],
        "temperature_c": temperature,
    }


@tool(idempotent=True)
async def get_weather(args: WeatherInput) -> dict[str, Any]:
    """Get the current weather for a city."""
    return fake_weather(args.city)


class EmailInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str = Field(pattern=f"^{EMAIL.pattern}$", max_length=254)
    body: str = Field(default="", max_length=10_000)


class EmailApproval(BaseModel):
    """Resume payload of `send_email`: whether a person approved sending it."""

    model_config = ConfigDict(extra="forbid")
    approved: bool
    note: str | None = Field(default=None, max_length=2_000)


@tool(
    suspend=SuspendStep(
        payload=EmailApproval, allowed_roles=ALL_ROLES, denial=denied_unless_approved
    )
)
async def send_email(args: EmailInput, ctx: ToolContext) -> dict[str, Any]:
    """Send an e-mail (after a person approves it; a denial never runs it)."""
    # Nothing is sent: the demo only shows the approval round trip.
    approval = ctx.payload
    if approval is not None and not isinstance(approval, EmailApproval):
        approval = EmailApproval.model_validate(approval.model_dump())
    if approval is not None and approval.approved:
        return {"sent": True, "to": args.to}
    result: dict[str, Any] = {"sent": False, "to": args.to, "reason": "refused"}
    if approval is None:
        result["reason"] = "not approved"
    elif approval.note:
        result["note"] = approval.note
    return result
