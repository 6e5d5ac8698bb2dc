"""How an MCP server is declared: a stdio command or a Streamable HTTP URL, plus per-tool rules."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

# A server's name prefixes its tools' names (`time__get_current_time`), so it must be valid in
# model tool names (providers accept [A-Za-z0-9_-]) and must not contain the separator.
SERVER_NAME = r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$"
SEPARATOR = "__"


class ToolRule(BaseModel):
    """The deployment's override of what a tool's own annotations say (None: keep them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # True: suspend for approval before every call; False: run at once.
    approval: bool | None = None
    # True: a takeover may re-run a call that started without a committed result.
    idempotent: bool | None = None
    # False: the tool is not offered to the model at all.
    enabled: bool = True


class _Server(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=SERVER_NAME, max_length=24)
    # Seconds one tools/call may take; past it the call is cancelled (MCP cancellation) and
    # the model sees a timeout error.
    call_timeout: float = Field(default=60.0, gt=0)
    # Seconds a call waits for the server to be (re)connected before it answers unavailable.
    connect_timeout: float = Field(default=10.0, gt=0)
    # Longest pause between reconnection attempts (the backoff doubles up to it).
    max_backoff: float = Field(default=5.0, gt=0)
    # Characters of tool output the model and the transcript get; more is cut with a note.
    max_output_chars: int = Field(default=32 * 1024, ge=256)
    # Rules by the server's tool name; "*" applies to every tool without its own rule.
    tools: dict[str, ToolRule] = Field(default_factory=dict)

    def rule(self, tool_name: str) -> ToolRule:
        return self.tools.get(tool_name) or self.tools.get("*") or ToolRule()


class MCPStdio(_Server):
    """A server started as a child process of each worker, spoken to over stdin/stdout.

    `env` values are passed as they are; `secret_env` maps a variable of the child to a secret
    reference (`env:NAME` or `file:/path`), resolved when the process starts."""

    type: Literal["stdio"] = "stdio"
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None


class MCPHttp(_Server):
    """A server reached over Streamable HTTP. `secret_headers` maps a header to a secret
    reference (`env:NAME` or `file:/path`, e.g. `{"Authorization": "env:JIRA_TOKEN"}`; a
    `bearer_` prefix in the reference's name is not special). Secrets are read when the
    session connects: they are never part of a thread, a tool part or a log line."""

    type: Literal["http"] = "http"
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    secret_headers: dict[str, str] = Field(default_factory=dict)
    # Prepended to the secret of an `Authorization` header ("Bearer " by default).
    auth_scheme: str = "Bearer"


MCPServer = Annotated[MCPStdio | MCPHttp, Field(discriminator="type")]
# THREADLINE_MCP_SERVERS is a JSON list of these (docs/operations.md, "MCP servers").
MCPServersAdapter: TypeAdapter[list[MCPStdio | MCPHttp]] = TypeAdapter(list[MCPServer])


class SecretUnavailable(Exception):
    """A secret reference names a variable or file that is not there."""


def resolve_secret(reference: str) -> str:
    """The value a secret reference names: `env:NAME` (a variable of the worker's
    environment) or `file:/path` (e.g. a mounted secret; one trailing newline dropped)."""
    kind, _, where = reference.partition(":")
    if kind == "env" and where:
        value = os.environ.get(where)
        if value is None:
            raise SecretUnavailable(f"environment variable {where} is not set")
        return value
    if kind == "file" and where:
        try:
            return Path(where).read_text().removesuffix("\n")
        except OSError as exc:
            raise SecretUnavailable(f"secret file {where}: {exc.strerror}") from None
    raise SecretUnavailable("a secret reference is env:NAME or file:/path")


def http_headers(server: MCPHttp) -> dict[str, str]:
    """The headers of every request to the server, secrets resolved."""
    headers = dict(server.headers)
    for header, reference in server.secret_headers.items():
        secret = resolve_secret(reference)
        if header.lower() == "authorization" and server.auth_scheme:
            secret = f"{server.auth_scheme} {secret}"
        headers[header] = secret
    return headers


def stdio_env(server: MCPStdio) -> dict[str, str]:
    """The child's extra environment, secrets resolved."""
    env = dict(server.env)
    env.update({name: resolve_secret(ref) for name, ref in server.secret_env.items()})
    return env
