"""Per-deployment approval policies: parsed from JSON or a file, checked against the agent."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from runtime.agent import Agent
from runtime.approval_overrides import apply_policies, parse_policies
from runtime.approvals import ApprovalPolicy
from runtime.demo import DemoModel, EmailApproval, EmailInput
from runtime.tools import SuspendStep, ToolContext, tool
from server.settings import Settings


@tool(suspend=SuspendStep(EmailApproval, policy=ApprovalPolicy(quorum=1)))
async def send_email(args: EmailInput, ctx: ToolContext) -> dict[str, bool]:
    """Send an e-mail."""
    return {"sent": True}


@tool
async def lookup(args: EmailInput, ctx: ToolContext) -> dict[str, bool]:
    """Not an approval tool."""
    return {"found": True}


AGENT = Agent(model=DemoModel(), tools=[send_email, lookup], name="t")
OVERRIDE = '{"send_email": {"quorum": 2, "groups": ["finance"], "deadline": 3600}}'


def test_a_json_object_or_a_file_parses(tmp_path: Path) -> None:
    policies = parse_policies(OVERRIDE)
    assert policies == {"send_email": ApprovalPolicy(quorum=2, groups=("finance",), deadline=3600)}
    path = tmp_path / "policies.json"
    path.write_text(OVERRIDE)
    assert parse_policies(str(path)) == policies


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("{not json", "the value is not JSON"),
        ('{"send_email": {"quorum": 0}}', "send_email.quorum: Input should be greater"),
        ('{"send_email": {"escalations": [{"deadline": 5}]}}', "need a deadline"),
        ('{"send_email": {"quorom": 2}}', "send_email.quorom: Extra inputs are not permitted"),
        ("/nonexistent/policies.json", "neither a JSON object nor a readable file"),
    ],
)
def test_a_bad_value_names_its_problem(raw: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_policies(raw)
    with pytest.raises(ValidationError, match="approval_policies"):
        Settings(approval_policies=raw)


def test_the_override_replaces_the_declared_policy() -> None:
    applied = apply_policies(AGENT, parse_policies(OVERRIDE))
    suspended = applied.tool("send_email")
    assert suspended is not None and suspended.suspend is not None
    assert suspended.suspend.policy == ApprovalPolicy(quorum=2, groups=("finance",), deadline=3600)
    assert suspended.suspend.payload is EmailApproval
    # The declared agent is left as it was.
    assert send_email.suspend is not None and send_email.suspend.policy == ApprovalPolicy()
    assert apply_policies(AGENT, {}) is AGENT


def test_a_name_that_is_no_approval_tool_is_refused() -> None:
    with pytest.raises(ValueError, match=r"names lookup, not an approval tool.*send_email"):
        apply_policies(AGENT, {"lookup": ApprovalPolicy()})


def test_an_auto_approve_payload_must_fit_the_tool() -> None:
    bad = ApprovalPolicy(deadline=5, on_expiry="approve", approve_payload={"approved": "maybe"})
    with pytest.raises(ValueError, match="send_email: approve_payload is not a valid Email"):
        apply_policies(AGENT, {"send_email": bad})
    good = bad.model_copy(update={"approve_payload": {"approved": True}})
    assert apply_policies(AGENT, {"send_email": good}).tool("send_email") is not None
