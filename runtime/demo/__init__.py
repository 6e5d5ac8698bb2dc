"""The demo agent (the default agent): deterministic model, two tools, e-mail redaction."""

from __future__ import annotations

from runtime.agent import Agent
from runtime.demo.demo_model import DemoModel, decide
from runtime.demo.demo_tools import EmailApproval, EmailInput, WeatherInput, get_weather, send_email
from runtime.demo.redact import EMAIL, REDACTED, EmailRedactor, RedactEmails

# What THREADLINE_AGENT defaults to (`module:attribute`, loaded by runtime.agent.load_agent).
DEMO_AGENT_SPEC = "runtime.demo:demo_agent"

INSTRUCTIONS = (
    "You are the Threadline demo agent. Answer questions about the weather with get_weather, "
    "send e-mail only with send_email (a person approves it first), and otherwise repeat what "
    "the user said."
)

# `redact` (the function) stays in runtime.demo.redact: exporting it here would shadow that
# submodule as an attribute of the package.
__all__ = [
    "DEMO_AGENT_SPEC",
    "EMAIL",
    "INSTRUCTIONS",
    "REDACTED",
    "DemoModel",
    "EmailApproval",
    "EmailInput",
    "EmailRedactor",
    "RedactEmails",
    "WeatherInput",
    "decide",
    "demo_agent",
    "get_weather",
    "send_email",
]


def demo_agent() -> Agent:
    """A fresh demo agent (its lifecycle keeps no state between steps, but stays per agent)."""
    return Agent(
        model=DemoModel(),
        instructions=INSTRUCTIONS,
        tools=[get_weather, send_email],
        lifecycle=RedactEmails(),
        name="demo",
    )
