"""MCP tools as Threadline tools: names, rules from annotations and overrides, outputs, inputs,
secrets and the deployment's JSON."""

from __future__ import annotations

from pathlib import Path

import mcp.types as types
import pytest
from pydantic import ValidationError

from runtime.mcp.config import (
    MCPHttp,
    MCPServersAdapter,
    MCPStdio,
    SecretUnavailable,
    ToolRule,
    http_headers,
    resolve_secret,
)
from runtime.mcp.mcp_session import MCPConnection
from runtime.mcp.mcp_tools import (
    MCPApproval,
    MCPToolError,
    build_tools,
    may_rerun,
    needs_approval,
    tool_name,
    tool_output,
)

RO = types.ToolAnnotations(read_only_hint=True)
DESTRUCTIVE = types.ToolAnnotations(destructive_hint=True)
IDEMPOTENT = types.ToolAnnotations(destructive_hint=True, idempotent_hint=True)


def test_names_are_namespaced_and_valid_for_models() -> None:
    assert tool_name("jira", "create issue.v2") == "jira__create_issue_v2"
    assert len(tool_name("s", "x" * 100)) == 64


def test_only_read_only_runs_at_once_unless_overridden() -> None:
    assert needs_approval(None, ToolRule())
    assert needs_approval(DESTRUCTIVE, ToolRule())
    assert not needs_approval(RO, ToolRule())
    assert needs_approval(RO, ToolRule(approval=True))
    assert not needs_approval(DESTRUCTIVE, ToolRule(approval=False))


def test_only_idempotent_or_read_only_may_rerun_unless_overridden() -> None:
    assert not may_rerun(None, ToolRule())
    assert not may_rerun(DESTRUCTIVE, ToolRule())
    assert may_rerun(IDEMPOTENT, ToolRule())
    assert may_rerun(RO, ToolRule())
    assert not may_rerun(RO, ToolRule(idempotent=False))


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


def test_outputs_structured_text_error_and_cut() -> None:
    structured = types.CallToolResult(content=[text("{}")], structured_content={"a": 1})
    assert tool_output(structured, 1000) == {"a": 1}
    assert tool_output(types.CallToolResult(content=[text("a"), text("b")]), 1000) == "a\nb"
    with pytest.raises(MCPToolError, match="boom"):
        tool_output(types.CallToolResult(content=[text("boom")], is_error=True), 1000)
    cut = tool_output(types.CallToolResult(content=[text("x" * 500)]), 300)
    assert cut.startswith("x" * 300) and "cut at 300 of 500" in cut
    image = types.ImageContent(type="image", data="QUJD", mime_type="image/png")
    assert tool_output(types.CallToolResult(content=[text("t"), image]), 1000) == [
        "t",
        {"type": "image", "mime_type": "image/png", "base64_chars": 4},
    ]


def listed(name: str, annotations: types.ToolAnnotations | None) -> types.Tool:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    return types.Tool(name=name, input_schema=schema, annotations=annotations)


def test_built_tools_carry_schema_rules_and_validate_input() -> None:
    server = MCPStdio(
        name="s", command="x", tools={"hidden": ToolRule(enabled=False), "*": ToolRule()}
    )
    taken = {"s__taken"}
    tools = build_tools(
        MCPConnection(server),
        [listed("go", DESTRUCTIVE), listed("look", RO), listed("hidden", RO), listed("taken", RO)],
        taken,
    )
    assert [t.name for t in tools] == ["s__go", "s__look"]
    go, look = tools
    assert go.suspend is not None and go.suspend.payload is MCPApproval and not go.idempotent
    assert look.suspend is None and look.idempotent
    assert go.spec.parameters["required"] == ["n"]
    assert go.validate_input({"n": 3}).model_dump() == {"n": 3}
    with pytest.raises(ValidationError):
        go.validate_input({"n": "three"})


def test_secrets_are_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_UNIT_TOKEN", "s3cret")
    (tmp_path / "key").write_text("from-file\n")
    assert resolve_secret("env:MCP_UNIT_TOKEN") == "s3cret"
    assert resolve_secret(f"file:{tmp_path / 'key'}") == "from-file"
    for bad in ("s3cret", "env:MCP_UNIT_MISSING", f"file:{tmp_path / 'none'}"):
        with pytest.raises(SecretUnavailable):
            resolve_secret(bad)
    server = MCPHttp(
        name="h",
        url="http://127.0.0.1:1/mcp",
        headers={"X-Team": "a"},
        secret_headers={"Authorization": "env:MCP_UNIT_TOKEN"},
    )
    assert http_headers(server) == {"X-Team": "a", "Authorization": "Bearer s3cret"}
    assert "s3cret" not in server.model_dump_json()


def test_the_deployment_json() -> None:
    servers = MCPServersAdapter.validate_json(
        '[{"type": "stdio", "name": "time", "command": "python"},'
        ' {"type": "http", "name": "jira", "url": "https://jira/mcp",'
        '  "tools": {"delete": {"approval": true}}}]'
    )
    assert isinstance(servers[0], MCPStdio) and isinstance(servers[1], MCPHttp)
    assert servers[1].rule("delete").approval is True
    for bad in ('[{"type": "http", "name": "a__b", "url": "https://x"}]', '[{"type": "ftp"}]'):
        with pytest.raises(ValidationError):
            MCPServersAdapter.validate_json(bad)
