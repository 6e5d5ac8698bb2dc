"""An MCP server's tools as Threadline tools: namespaced names, their JSON Schemas, approval and
re-run rules from their annotations (or the deployment's rules), results mapped to outputs."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import mcp.types as types
import orjson
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from runtime.mcp.config import SEPARATOR, MCPHttp, MCPStdio, ToolRule
from runtime.mcp.mcp_session import MCPConnection
from runtime.providers.model_api import ToolSpec
from runtime.tools import ALL_ROLES, SuspendStep, Tool, ToolContext

log = logging.getLogger(__name__)

# What model APIs accept as a tool name (OpenAI's rule, the strictest of the providers).
MAX_NAME = 64
_INVALID = re.compile(r"[^A-Za-z0-9_-]")


class MCPArguments(BaseModel):
    """A call's arguments as the model gave them; the server's JSON Schema checks them."""

    model_config = ConfigDict(extra="allow")


class MCPApproval(BaseModel):
    """The resume payload of an MCP tool that waits for approval."""

    model_config = ConfigDict(extra="forbid")
    approved: bool
    note: str | None = None


class MCPToolError(Exception):
    """The server answered the call with `isError`: the model sees the server's message."""


class MCPCallDeclined(Exception):
    """The call waited for approval and was refused: the server is not called."""


@dataclass(frozen=True)
class MCPTool(Tool):
    """A tool of an MCP server. The input model accepts any object; `parameters` (the
    server's input schema) is what the model is offered and what validates the input."""

    server: str = ""
    remote_name: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    read_only: bool = False

    @functools.cached_property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name, description=self.description, parameters=dict(self.parameters)
        )

    @functools.cached_property
    def _validator(self) -> jsonschema.protocols.Validator:
        cls = jsonschema.validators.validator_for(self.parameters)
        return cls(self.parameters)

    def validate_input(self, raw: Mapping[str, Any]) -> BaseModel:
        errors = sorted(self._validator.iter_errors(dict(raw)), key=lambda e: list(e.path))
        if errors:
            # A pydantic error, as for local tools: the tool phase turns it into the model's
            # "invalid input" result.
            details = [
                InitErrorDetails(
                    type=PydanticCustomError("json_schema", "{message}", {"message": e.message}),
                    loc=tuple(str(p) for p in e.path),
                    input=e.instance,
                )
                for e in errors[:10]
            ]
            raise ValidationError.from_exception_data(self.name, details)
        return MCPArguments.model_validate(dict(raw))


def tool_name(server: str, remote: str) -> str:
    """`server__tool`, with characters model APIs refuse replaced and cut to their limit."""
    return f"{server}{SEPARATOR}{_INVALID.sub('_', remote)}"[:MAX_NAME]


def needs_approval(annotations: types.ToolAnnotations | None, rule: ToolRule) -> bool:
    """By default only a tool its server marks read-only runs at once: MCP's defaults are
    destructive (`destructiveHint` true) and not read-only."""
    if rule.approval is not None:
        return rule.approval
    read_only = annotations is not None and annotations.read_only_hint is True
    return not read_only


def may_rerun(annotations: types.ToolAnnotations | None, rule: ToolRule) -> bool:
    """Whether a takeover may call it again after an episode died during the call: a
    read-only tool, or one its server marks idempotent; otherwise "interrupted"."""
    if rule.idempotent is not None:
        return rule.idempotent
    if annotations is None:
        return False
    return annotations.read_only_hint is True or annotations.idempotent_hint is True


def build_tools(
    connection: MCPConnection, listed: list[types.Tool], taken: set[str]
) -> list[MCPTool]:
    """The server's listed tools, minus the ones the deployment disabled and any whose
    namespaced name another tool already has (`taken`, updated)."""
    server = connection.server
    built: list[MCPTool] = []
    for remote in listed:
        rule = server.rule(remote.name)
        if not rule.enabled:
            continue
        name = tool_name(server.name, remote.name)
        if name in taken:
            log.warning("mcp server %s: tool %s skipped, %s is taken", server.name, remote, name)
            continue
        taken.add(name)
        annotations = remote.annotations
        built.append(
            MCPTool(
                name=name,
                description=remote.description or remote.title or remote.name,
                input_model=MCPArguments,
                fn=_caller(connection, remote.name, server),
                suspend=SuspendStep(MCPApproval, ALL_ROLES)
                if needs_approval(annotations, rule)
                else None,
                takes_context=True,
                idempotent=may_rerun(annotations, rule),
                server=server.name,
                remote_name=remote.name,
                parameters=remote.input_schema,
                read_only=annotations is not None and annotations.read_only_hint is True,
            )
        )
    return built


def _caller(connection: MCPConnection, remote: str, server: MCPStdio | MCPHttp) -> Any:
    async def call(args: MCPArguments, ctx: ToolContext) -> Any:
        if isinstance(ctx.payload, MCPApproval) and not ctx.payload.approved:
            raise MCPCallDeclined(ctx.payload.note or "the call was not approved")
        arguments = args.model_dump()
        result = await connection.call(remote, arguments, ctx.report_progress)
        return tool_output(result, server.max_output_chars)

    return call


def tool_output(result: types.CallToolResult, limit: int) -> Any:
    """Structured content when the server gives it, else the text of the content blocks
    (other blocks described, their bytes left out); `isError` raises with the text."""
    blocks = [_block(b) for b in result.content]
    text = "\n".join(b for b in blocks if isinstance(b, str))
    if result.is_error:
        raise MCPToolError(_cut(text or "the tool failed", limit))
    output: Any
    if result.structured_content is not None:
        output = result.structured_content
    elif all(isinstance(b, str) for b in blocks):
        output = text
    else:
        output = blocks
    encoded = output if isinstance(output, str) else orjson.dumps(output).decode()
    if len(encoded) > limit:
        return _cut(encoded, limit)
    return output


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[output cut at {limit} of {len(text)} characters]"


def _block(block: types.ContentBlock) -> str | dict[str, Any]:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return {"type": block.type, "mime_type": block.mime_type, "base64_chars": len(block.data)}
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return resource.text
        return {"type": "resource", "uri": str(resource.uri), "mime_type": resource.mime_type}
    return {"type": "resource_link", "uri": str(block.uri), "name": block.name}
