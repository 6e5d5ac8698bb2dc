"""Per-deployment approval policies (THREADLINE_APPROVAL_POLICIES): tool name -> policy, replacing
the policies declared with the tools; parsed and checked against the agent at startup."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
from pydantic import TypeAdapter, ValidationError

from runtime.agent import Agent
from runtime.approvals import ApprovalPolicy
from runtime.domain import WaitKind

_POLICIES = TypeAdapter(dict[str, ApprovalPolicy])


def parse_policies(raw: str) -> dict[str, ApprovalPolicy]:
    """`raw` is a JSON object (it starts with `{`) or the path of a file holding one. A
    ValueError names what is wrong: an unreadable file, bad JSON, an invalid policy field."""
    text = raw.strip()
    source = "the value"
    if not text.startswith("{"):
        source = f"file {text}"
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"neither a JSON object nor a readable file: {exc}") from None
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{source} is not JSON: {exc}") from None
    try:
        return _POLICIES.validate_python(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise ValueError(f"{source}: {problems}") from None


def apply_policies(agent: Agent, policies: dict[str, ApprovalPolicy]) -> Agent:
    """`agent` with each named tool's approval policy replaced. A name that is not one of the
    agent's approval tools, or an auto-approve payload the tool's payload model refuses, is a
    ValueError that lists what may be named."""
    if not policies:
        return agent
    approvals = {
        t.name: t
        for t in agent.tools
        if t.suspend is not None and t.suspend.kind is WaitKind.APPROVAL
    }
    unknown = sorted(set(policies) - set(approvals))
    if unknown:
        known = ", ".join(sorted(approvals)) or "none"
        raise ValueError(
            f"THREADLINE_APPROVAL_POLICIES names {', '.join(unknown)}, not an approval tool of"
            f" agent {agent.name!r} (its approval tools: {known})"
        )
    tools = []
    for tool_ in agent.tools:
        policy = policies.get(tool_.name)
        if policy is not None and tool_.suspend is not None:
            try:
                suspend = dataclasses.replace(tool_.suspend, policy=policy)
            except ValueError as exc:
                raise ValueError(f"THREADLINE_APPROVAL_POLICIES: {tool_.name}: {exc}") from None
            tool_ = dataclasses.replace(tool_, suspend=suspend)
        tools.append(tool_)
    return dataclasses.replace(agent, tools=tools)


__all__ = ["apply_policies", "parse_policies"]
